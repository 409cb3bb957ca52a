"""Per-level worker: consumer thread -> DelayQueue-style buffer -> forwarder thread."""
