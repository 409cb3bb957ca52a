"""The `delayservice` command line."""
