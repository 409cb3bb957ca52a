"""Level mode: per level, a consumer thread -> per-partition queues -> the forwarder."""
