"""Precise mode: a single-layer timing wheel of 1 s slots kept in append-only files."""
