"""Prometheus metrics and the /metrics, /healthz, /readyz endpoint."""
