"""The checks the settings' validators call: each refuses a bad value with one
`ConfigError` naming the setting. Those of one value take the value and return it (or
what it stands for); those that relate several settings take the settings whole."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Protocol

from delayservice.client_keys import refusal_in
from delayservice.errors import ConfigError
from delayservice.levels import format_duration_ms, parse_duration_ms
from delayservice.topic_names import invalid_reason

if TYPE_CHECKING:
    from delayservice.levels import LevelSet


class SettingsFields(Protocol):
    """The fields the checks across fields read (`settings.Settings` gives them): named
    here so this module does not import the class that calls it."""

    @property
    def dead_letter_topic(self) -> str: ...

    @property
    def instance_name(self) -> str: ...

    @property
    def level_workers(self) -> str: ...

    @property
    def pause_high_water(self) -> int: ...

    @property
    def pause_low_water(self) -> int: ...

    @property
    def precise(self) -> bool: ...

    @property
    def precise_member(self) -> int: ...

    @property
    def precise_members(self) -> int: ...

    @property
    def processes(self) -> int: ...

    @property
    def replicas(self) -> int: ...

    @property
    def retry_backoff_max_s(self) -> float: ...

    @property
    def retry_backoff_s(self) -> float: ...

    def level_set(self) -> LevelSet: ...

    def marker_topics(self) -> tuple[str, str]: ...

    def precise_topics(self) -> tuple[str, ...]: ...


MAX_INSTANCE_ID = 249
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
MAX_CANCEL_LEAD_MS = 60_000
"""A longer lead would let a reader a minute behind forward; past that, a stall is an
outage (the read-behind alerts fire at 30 s)."""
_LEGAL_ID = re.compile(r"[a-zA-Z0-9._-]+")
_PRINTABLE_WORD = re.compile(r"[^\s\x00-\x1f\x7f]+")
"""A value with no whitespace and no control characters: a host list, a group id."""


def servers_listed(value: str) -> str:
    """librdkafka takes an empty list and then never connects: the daemon would
    report not-ready forever instead of saying what is wrong."""
    servers = value.split(",")
    if not value or not all(_PRINTABLE_WORD.fullmatch(s) for s in servers):
        raise ConfigError(
            "bootstrap_servers",
            f"{value!r} is not a comma-separated list of host:port with no spaces",
        )
    return value


def group_id_printable(value: str) -> str:
    if _PRINTABLE_WORD.fullmatch(value) is None:
        raise ConfigError("group_id", f"{value!r} must be non-empty, with no spaces")
    return value


def metrics_host_printable(value: str) -> str:
    if value and _PRINTABLE_WORD.fullmatch(value) is None:
        raise ConfigError("metrics_host", f"{value!r} is not an address")
    return value


def dead_letter_topic_legal(value: str) -> str:
    reason = invalid_reason(value)
    if reason is not None:
        raise ConfigError("dead_letter_topic", f"{value!r}: {reason}")
    return value


def data_dir_named(value: Any) -> Any:
    """`Path("")` is the working directory: an empty setting would put the wheel's
    files wherever the daemon happens to start."""
    text = str(value) if isinstance(value, str | os.PathLike) else None
    if text is not None and (not text.strip() or "\x00" in text):
        raise ConfigError("data_dir", f"{text!r} is not a directory name")
    return value


def client_keys_not_owned(value: Any, setting: str) -> Any:
    """A key the daemon owns (`client_keys`), in any spelling librdkafka takes, is
    refused before its type is checked, so a nested `default.topic.config` is named
    for what it would set."""
    reason = refusal_in(value)
    if reason is not None:
        raise ConfigError(setting, reason)
    return value


def client_keys_named(value: dict[str, str], setting: str) -> dict[str, str]:
    bad = [key for key in value if _PRINTABLE_WORD.fullmatch(key) is None]
    if bad:
        raise ConfigError(setting, f"{bad[0]!r} is not a librdkafka key")
    return value


def duration_parses(value: str, name: str) -> str:
    try:
        delay_ms = parse_duration_ms(value)
    except ValueError as exc:
        raise ConfigError(name, str(exc)) from None
    if delay_ms <= 0:
        raise ConfigError(name, "must be longer than 0")
    return value


def lead_in_seconds(value: object) -> object:
    """A bare number is seconds, as the SDK reads delays (`cancel_lead = 0`)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError("cancel_lead", f"{value!r} is not a duration like 1s or 250ms")
    if isinstance(value, int | float) or _NUMBER.fullmatch(value):
        seconds = float(value)
        if seconds < 0:
            raise ConfigError("cancel_lead", "must not be negative")
        return format_duration_ms(round(seconds * 1000))
    return value


def lead_parses(value: str) -> str:
    try:
        lead_ms = parse_duration_ms(value)
    except ValueError as exc:
        raise ConfigError("cancel_lead", str(exc)) from None
    if lead_ms > MAX_CANCEL_LEAD_MS:
        raise ConfigError(
            "cancel_lead", f"{value} is longer than {format_duration_ms(MAX_CANCEL_LEAD_MS)}"
        )
    return value


def water_marks_in_order(settings: SettingsFields) -> None:
    if settings.pause_low_water >= settings.pause_high_water:
        raise ConfigError("pause_low_water", "must be below pause_high_water")


def backoffs_in_order(settings: SettingsFields) -> None:
    if settings.retry_backoff_max_s < settings.retry_backoff_s:
        raise ConfigError(
            "retry_backoff_max_s",
            f"is {settings.retry_backoff_max_s:g}, below retry_backoff_s "
            f"({settings.retry_backoff_s:g}); the longest retry delay comes after the first",
        )


def level_topics_legal(settings: SettingsFields) -> None:
    """Every level topic is a name Kafka takes, and none is the dead-letter topic: a
    dead letter written to a level topic would be read back as a delayed record."""
    for level in settings.level_set():
        reason = invalid_reason(level.topic)
        if reason is not None:
            raise ConfigError("topic_prefix", f"level topic {level.topic!r}: {reason}")
        if level.topic == settings.dead_letter_topic:
            raise ConfigError(
                "dead_letter_topic", f"{level.topic} is also level {level.name}'s topic"
            )


def instance_ids_legal(settings: SettingsFields) -> None:
    """Each level worker joins as `{instance_name}-levels` (`{instance_name}-{level
    topic}` per level), which the broker takes only as a legal name of at most 249
    characters: refuse it here, at start-up."""
    if _LEGAL_ID.fullmatch(settings.instance_name) is None:
        raise ConfigError("instance_name", "use only ASCII letters, digits, '.', '_' and '-'")
    worker = f"-p{settings.processes - 1}" if settings.processes > 1 else ""
    per_level = settings.level_workers == "per-level"
    suffix = settings.level_set().levels[-1].topic if per_level else ""
    longest = f"{settings.instance_name}{worker}-{max(suffix, 'levels', key=len)}"
    if len(longest) > MAX_INSTANCE_ID:
        raise ConfigError(
            "instance_name",
            f"with the level topics it makes ids of {len(longest)} characters; "
            f"Kafka allows {MAX_INSTANCE_ID}",
        )


def precise_topics_legal(settings: SettingsFields) -> None:
    """Checked even when `precise` is off, because producers send to the precise
    topic whatever this instance runs. A collision with a level or dead-letter topic
    would feed one kind of record to a reader that expects the other."""
    for name in settings.precise_topics():
        reason = invalid_reason(name)
        if reason is not None:
            raise ConfigError("precise_topic", f"{name!r}: {reason}")
    own = {level.topic: f"level {level.name}'s topic" for level in settings.level_set()}
    own[settings.dead_letter_topic] = "the dead-letter topic"
    for name in settings.precise_topics():
        if name in own:
            raise ConfigError("precise_topic", f"{name} is also {own[name]}")


def marker_topics_legal(settings: SettingsFields) -> None:
    """The level markers topic and its outcomes topic are names Kafka takes, and
    neither is a topic of another kind: a marker read as a delayed record (or one
    read as a marker) would be dead-lettered or ignored."""
    own = {level.topic: f"level {level.name}'s topic" for level in settings.level_set()}
    own[settings.dead_letter_topic] = "the dead-letter topic"
    own.update(dict.fromkeys(settings.precise_topics(), "a precise-mode topic"))
    for name in settings.marker_topics():
        reason = invalid_reason(name)
        if reason is not None:
            raise ConfigError("markers_topic", f"{name!r}: {reason}")
        if name in own:
            raise ConfigError("markers_topic", f"{name} is also {own[name]}")


def precise_membership_valid(settings: SettingsFields) -> None:
    """A member index outside the group would own no partition, and a second copy
    on the owner itself would not survive the loss of its disk."""
    if settings.precise_member >= settings.precise_members:
        raise ConfigError(
            "precise_member",
            f"is {settings.precise_member}, must be below precise_members "
            f"({settings.precise_members})",
        )
    if settings.replicas == 2 and settings.precise_members < 2:
        raise ConfigError(
            "replicas", "2 copies need at least 2 instances: set precise_members >= 2"
        )
    if settings.precise and settings.processes > 1:
        # Every worker process would be the same member over the same data directory.
        raise ConfigError(
            "processes", "precise mode runs in one process: set processes = 1 with precise"
        )
