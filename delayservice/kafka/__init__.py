"""Kafka tooling: client configuration, topic management and a local broker."""
