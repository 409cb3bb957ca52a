"""Which librdkafka keys hold secrets, and how they are shown: as `<redacted>`, in
`repr()` and `str()` of the settings and in `delayservice settings`."""

from __future__ import annotations

from typing import Any

REDACTED = "<redacted>"
_SECRET_WORDS = ("password", "secret", "jaas", "token", "key.pem", "ssl.key", "credentials")


def is_secret(key: str) -> bool:
    """librdkafka keys whose values must never reach a log line, an error or a repr."""
    lowered = key.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in config.items()}
