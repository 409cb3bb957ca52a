"""The settings shared by the daemon, the producer wrapper and the CLI: each field with
its default, range and `DELAYSERVICE_*` name, the checks that refuse a bad value with one
`ConfigError` naming the setting, and what follows from them (the level set, the topic
names, the commit interval). `settings_loading` reads them from their sources.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from delayservice.client_keys import refusal_in
from delayservice.errors import ConfigError
from delayservice.levels import (
    DEFAULT_LEVELS,
    DEFAULT_TOPIC_PREFIX,
    LevelSet,
    format_duration_ms,
    parse_duration_ms,
)
from delayservice.redaction import redacted
from delayservice.topic_names import invalid_reason

log = logging.getLogger(__name__)

ENV_PREFIX = "DELAYSERVICE_"

MiB = 1024 * 1024
MAX_INSTANCE_ID = 249
_NUMBER = re.compile(r"-?\d+(\.\d+)?")
MAX_CANCEL_LEAD_MS = 60_000
"""A longer lead would let a reader a minute behind forward; past that, a stall is an
outage (the read-behind alerts fire at 30 s)."""
_LEGAL_ID = re.compile(r"[a-zA-Z0-9._-]+")
_PRINTABLE_WORD = re.compile(r"[^\s\x00-\x1f\x7f]+")
"""A value with no whitespace and no control characters: a host list, a group id."""
MAX_WAIT_S = 86_400.0
"""The longest timeout a setting may give a wait: threading refuses timeouts beyond
`threading.TIMEOUT_MAX` with OverflowError, at the first wait rather than at start-up."""


class _EnvSource(EnvSettingsSource):
    """The environment, with a dict setting that is not a JSON object refused as that
    setting's error: pydantic-settings raises a bare SettingsError (a traceback, exit 1)
    for `DELAYSERVICE_KAFKA='security.protocol=SSL'`."""

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        variable = f"{ENV_PREFIX}{field_name.upper()}"
        try:
            prepared = super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError:
            prepared = _UNPARSED
        if field_name not in _DICT_SETTINGS or value is None or isinstance(prepared, dict):
            if prepared is _UNPARSED:
                raise ConfigError(field_name, f"{variable} does not parse") from None
            return prepared
        raise ConfigError(
            field_name,
            f"{variable} must be a JSON object of strings, e.g. "
            f'{variable}=\'{{"security.protocol": "SSL"}}\'',
        )


_UNPARSED: Final = object()
_DICT_SETTINGS: Final = frozenset({"kafka", "consumer", "producer"})


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, allow_inf_nan=False
    )

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers.")
    levels: str = Field(DEFAULT_LEVELS, description="Delay levels, smallest first, e.g. 5s,1m,2h.")
    topic_prefix: str = Field(DEFAULT_TOPIC_PREFIX, description="Level N lives in PREFIX + N.")
    dead_letter_topic: str = Field("delay_dead_letter", description="Where bad records go.")
    markers_topic: str = Field(
        "delay_markers",
        description="Where cancel and reschedule markers of level messages go; the daemon "
        "answers each on MARKERS_TOPIC_outcomes.",
    )
    cancel_lead: str = Field(
        "1s",
        description="A cancel or reschedule the broker acknowledged at least this long before "
        "its message's due time is always honoured; closer, if the daemon read it before it "
        "forwarded the message. 0s honours every one acknowledged before the due time, at the "
        "cost of a marker read on each level record's path (docs/cancel-and-reschedule.md).",
    )
    group_id: str = Field(
        "delayservice",
        description="Consumer group prefix: {group_id}-levels for the levels' shared worker "
        "({group_id}-{level topic} per level), {group_id}-precise-... for precise mode.",
    )
    partitions: int = Field(
        3,
        ge=1,
        le=2**31 - 1,
        description="Partitions per level topic, and of the level markers topic (topics create).",
    )
    replication_factor: int = Field(
        1, ge=1, le=2**15 - 1, description="Replication of created topics."
    )
    retention_hours: float = Field(
        168.0, gt=0, le=876_600, description="Retention of created topics (at most 100 years)."
    )
    scheduler: Literal["heap", "wheel"] = Field(
        "heap",
        description="Deprecated and ignored: both modes keep one queue per partition and a "
        "heap of their heads. Setting it logs a warning.",
    )
    pause_high_water: int = Field(
        10_000, ge=1, description="Pause a partition at this many buffered messages."
    )
    pause_low_water: int = Field(5_000, ge=0, description="Resume it at or below this many.")
    max_buffered_bytes: int = Field(
        768 * MiB,
        ge=1024 * 1024,
        description="Memory cap for held records, shared by all levels of the process; "
        "counts keys, values, headers and a fixed per-record overhead.",
    )
    instance_name: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=200,
        description="Stable name of this instance (static group membership); "
        "defaults to the host name.",
    )
    processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Worker processes (one core each); above 1, `run` supervises them "
        "behind one metrics endpoint.",
    )
    session_timeout_s: float = Field(
        10.0,
        ge=1.0,
        le=300.0,
        description="How soon a vanished instance's partitions move to the others.",
    )
    retry_give_up_s: float = Field(
        300.0,
        gt=0,
        le=MAX_WAIT_S,
        description="A record that keeps failing while its target accepts others is "
        "dead-lettered (retries_exhausted) after this long.",
    )
    level_workers: Literal["shared", "per-level"] = Field(
        "shared",
        description="How a process's levels are served: 'shared', one worker (one "
        "consumer, one forwarder thread, one producer and transaction) for all of them; "
        "'per-level', one worker per level, with the ids of earlier versions.",
    )
    guarantee: Literal["at-least-once", "exactly-once"] = Field(
        "at-least-once",
        description="The delivery promise, of levels and precise mode alike: at-least-once "
        "(flush, then commit) or exactly-once (forwards in Kafka transactions with what says "
        "they were delivered, for read_committed consumers of the target).",
    )
    commit_interval_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="How often what was sent is made durable and committed; default 0.1 s "
        "exactly-once, else 1 s.",
    )
    retry_backoff_s: float = Field(
        1.0, gt=0, le=MAX_WAIT_S, description="First retry delay of a failed forward."
    )
    retry_backoff_max_s: float = Field(
        30.0, gt=0, le=MAX_WAIT_S, description="Longest retry delay (at least retry_backoff_s)."
    )
    shutdown_timeout_s: float = Field(
        30.0, gt=0, le=MAX_WAIT_S, description="Longest graceful stop."
    )
    metrics_host: str = Field("0.0.0.0", description="Address of /metrics, /healthz, /readyz.")  # noqa: S104
    metrics_port: int = Field(
        9480, ge=0, le=65535, description="Port of the HTTP endpoint; 0 picks a free one."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log verbosity."
    )
    kafka: dict[str, str] = Field(
        default_factory=dict, description="librdkafka keys for every client (security etc.)."
    )
    consumer: dict[str, str] = Field(
        default_factory=dict, description="librdkafka keys for consumers only."
    )
    producer: dict[str, str] = Field(
        default_factory=dict, description="librdkafka keys for producers only."
    )
    precise: bool = Field(
        False, description="Run the precise-mode wheel in the daemon (and create its topics)."
    )
    precise_topic: str = Field(
        "delay_precise",
        description="The topic for precise delays up to precise_far_after; longer ones go to "
        "PRECISE_TOPIC_far. Owners report progress on PRECISE_TOPIC_done (and _far_done).",
    )
    precise_far_after: str = Field(
        "1h",
        description="Exact delays longer than this go to the far topic, read by an intake of "
        "its own, so a flood of far-future messages never delays one due soon.",
    )
    data_dir: Path = Field(
        Path("/var/lib/delayservice"), description="Where the precise wheel's slot files live."
    )
    replicas: int = Field(
        1, ge=1, le=2, description="Copies of each precise message, on different instances."
    )
    max_delay: str = Field(
        "366d", description="Longest precise delay, to the millisecond (any length on disk)."
    )
    precise_members: int = Field(
        1,
        ge=1,
        le=64,
        description="Instances sharing the precise topic: partition p is owned by member "
        "p % precise_members; with replicas = 2 also held by member (p + 1) % precise_members.",
    )
    precise_member: int = Field(
        0, ge=0, description="This instance's index among the precise members, from 0."
    )
    takeover_delay_s: float = Field(
        30.0,
        gt=0,
        le=MAX_WAIT_S,
        description="How long after a due time a replica forwards what the owner has not "
        "reported done.",
    )
    precise_horizon_s: int = Field(
        3600,
        ge=1,
        le=86400,
        description="Precise records due within this long are kept in 1 s slot files; "
        "further out in span files 1, 24 and 768 horizons wide, split as they come near.",
    )
    precise_lookahead_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Wheel slots this far ahead of now are loaded into memory.",
    )

    @field_validator("levels")
    @classmethod
    def _levels_parse(cls, value: str) -> str:
        LevelSet.parse(value)  # raises ConfigError with the reason
        return value

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_listed(cls, value: str) -> str:
        """librdkafka takes an empty list and then never connects: the daemon would
        report not-ready forever instead of saying what is wrong."""
        servers = value.split(",")
        if not value or not all(_PRINTABLE_WORD.fullmatch(s) for s in servers):
            raise ConfigError(
                "bootstrap_servers",
                f"{value!r} is not a comma-separated list of host:port with no spaces",
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level_any_case(cls, value: object) -> object:
        """Enums are read in any case: `log_level = "info"` is INFO."""
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("scheduler", "level_workers", "guarantee", mode="before")
    @classmethod
    def _choice_any_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("group_id")
    @classmethod
    def _group_id_printable(cls, value: str) -> str:
        if _PRINTABLE_WORD.fullmatch(value) is None:
            raise ConfigError("group_id", f"{value!r} must be non-empty, with no spaces")
        return value

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host_printable(cls, value: str) -> str:
        if value and _PRINTABLE_WORD.fullmatch(value) is None:
            raise ConfigError("metrics_host", f"{value!r} is not an address")
        return value

    @field_validator("dead_letter_topic")
    @classmethod
    def _dead_letter_topic_legal(cls, value: str) -> str:
        reason = invalid_reason(value)
        if reason is not None:
            raise ConfigError("dead_letter_topic", f"{value!r}: {reason}")
        return value

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_named(cls, value: Any) -> Any:
        """`Path("")` is the working directory: an empty setting would put the wheel's
        files wherever the daemon happens to start."""
        text = str(value) if isinstance(value, str | os.PathLike) else None
        if text is not None and (not text.strip() or "\x00" in text):
            raise ConfigError("data_dir", f"{text!r} is not a directory name")
        return value

    @field_validator("kafka", "consumer", "producer", mode="before")
    @classmethod
    def _client_keys_not_owned(cls, value: Any, info: ValidationInfo) -> Any:
        """A key the daemon owns (`client_keys`), in any spelling librdkafka takes, is
        refused before its type is checked, so a nested `default.topic.config` is named
        for what it would set."""
        reason = refusal_in(value)
        if reason is not None:
            raise ConfigError(str(info.field_name), reason)
        return value

    @field_validator("kafka", "consumer", "producer")
    @classmethod
    def _client_keys_named(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        bad = [key for key in value if _PRINTABLE_WORD.fullmatch(key) is None]
        if bad:
            raise ConfigError(str(info.field_name), f"{bad[0]!r} is not a librdkafka key")
        return value

    @field_validator("max_delay", "precise_far_after")
    @classmethod
    def _duration_parses(cls, value: str, info: ValidationInfo) -> str:
        name = info.field_name or "duration"
        try:
            delay_ms = parse_duration_ms(value)
        except ValueError as exc:
            raise ConfigError(name, str(exc)) from None
        if delay_ms <= 0:
            raise ConfigError(name, "must be longer than 0")
        return value

    @field_validator("cancel_lead", mode="before")
    @classmethod
    def _lead_in_seconds(cls, value: object) -> object:
        """A bare number is seconds, as the SDK reads delays (`cancel_lead = 0`)."""
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError("cancel_lead", f"{value!r} is not a duration like 1s or 250ms")
        if isinstance(value, int | float) or _NUMBER.fullmatch(value):
            seconds = float(value)
            if seconds < 0:
                raise ConfigError("cancel_lead", "must not be negative")
            return format_duration_ms(round(seconds * 1000))
        return value

    @field_validator("cancel_lead")
    @classmethod
    def _lead_parses(cls, value: str) -> str:
        try:
            lead_ms = parse_duration_ms(value)
        except ValueError as exc:
            raise ConfigError("cancel_lead", str(exc)) from None
        if lead_ms > MAX_CANCEL_LEAD_MS:
            raise ConfigError(
                "cancel_lead", f"{value} is longer than {format_duration_ms(MAX_CANCEL_LEAD_MS)}"
            )
        return value

    @model_validator(mode="after")
    def _scheduler_deprecated(self) -> Settings:
        """Accepted so that old configuration still starts, but said out loud: an operator
        who picks `wheel` expecting a different buffer should learn it changes nothing."""
        if "scheduler" in self.model_fields_set:
            log.warning(
                "the setting scheduler (%s) is deprecated and ignored: every level keeps one "
                "queue per partition and a heap of their heads; remove it from the configuration",
                self.scheduler,
            )
        return self

    @model_validator(mode="after")
    def _water_marks(self) -> Settings:
        if self.pause_low_water >= self.pause_high_water:
            raise ConfigError("pause_low_water", "must be below pause_high_water")
        return self

    @model_validator(mode="after")
    def _backoffs_in_order(self) -> Settings:
        if self.retry_backoff_max_s < self.retry_backoff_s:
            raise ConfigError(
                "retry_backoff_max_s",
                f"is {self.retry_backoff_max_s:g}, below retry_backoff_s "
                f"({self.retry_backoff_s:g}); the longest retry delay comes after the first",
            )
        return self

    @model_validator(mode="after")
    def _level_topics(self) -> Settings:
        """Every level topic is a name Kafka takes, and none is the dead-letter topic: a
        dead letter written to a level topic would be read back as a delayed record."""
        for level in self.level_set():
            reason = invalid_reason(level.topic)
            if reason is not None:
                raise ConfigError("topic_prefix", f"level topic {level.topic!r}: {reason}")
            if level.topic == self.dead_letter_topic:
                raise ConfigError(
                    "dead_letter_topic", f"{level.topic} is also level {level.name}'s topic"
                )
        return self

    @model_validator(mode="after")
    def _instance_ids(self) -> Settings:
        """Each level worker joins as `{instance_name}-levels` (`{instance_name}-{level
        topic}` per level), which the broker takes only as a legal name of at most 249
        characters: refuse it here, at start-up."""
        if _LEGAL_ID.fullmatch(self.instance_name) is None:
            raise ConfigError("instance_name", "use only ASCII letters, digits, '.', '_' and '-'")
        worker = f"-p{self.processes - 1}" if self.processes > 1 else ""
        suffix = self.level_set().levels[-1].topic if self.level_workers == "per-level" else ""
        longest = f"{self.instance_name}{worker}-{max(suffix, 'levels', key=len)}"
        if len(longest) > MAX_INSTANCE_ID:
            raise ConfigError(
                "instance_name",
                f"with the level topics it makes ids of {len(longest)} characters; "
                f"Kafka allows {MAX_INSTANCE_ID}",
            )
        return self

    @model_validator(mode="after")
    def _precise_topics(self) -> Settings:
        """Checked even when `precise` is off, because producers send to the precise
        topic whatever this instance runs. A collision with a level or dead-letter topic
        would feed one kind of record to a reader that expects the other."""
        for name in self.precise_topics():
            reason = invalid_reason(name)
            if reason is not None:
                raise ConfigError("precise_topic", f"{name!r}: {reason}")
        own = {level.topic: f"level {level.name}'s topic" for level in self.level_set()}
        own[self.dead_letter_topic] = "the dead-letter topic"
        for name in self.precise_topics():
            if name in own:
                raise ConfigError("precise_topic", f"{name} is also {own[name]}")
        return self

    @model_validator(mode="after")
    def _marker_topics(self) -> Settings:
        """The level markers topic and its outcomes topic are names Kafka takes, and
        neither is a topic of another kind: a marker read as a delayed record (or one
        read as a marker) would be dead-lettered or ignored."""
        own = {level.topic: f"level {level.name}'s topic" for level in self.level_set()}
        own[self.dead_letter_topic] = "the dead-letter topic"
        own.update(dict.fromkeys(self.precise_topics(), "a precise-mode topic"))
        for name in self.marker_topics():
            reason = invalid_reason(name)
            if reason is not None:
                raise ConfigError("markers_topic", f"{name!r}: {reason}")
            if name in own:
                raise ConfigError("markers_topic", f"{name} is also {own[name]}")
        return self

    @model_validator(mode="after")
    def _precise_membership(self) -> Settings:
        """A member index outside the group would own no partition, and a second copy
        on the owner itself would not survive the loss of its disk."""
        if self.precise_member >= self.precise_members:
            raise ConfigError(
                "precise_member",
                f"is {self.precise_member}, must be below precise_members ({self.precise_members})",
            )
        if self.replicas == 2 and self.precise_members < 2:
            raise ConfigError(
                "replicas", "2 copies need at least 2 instances: set precise_members >= 2"
            )
        if self.precise and self.processes > 1:
            # Every worker process would be the same member over the same data directory.
            raise ConfigError(
                "processes", "precise mode runs in one process: set processes = 1 with precise"
            )
        return self

    @property
    def max_delay_ms(self) -> int:
        return parse_duration_ms(self.max_delay)

    @property
    def cancel_lead_ms(self) -> int:
        return parse_duration_ms(self.cancel_lead)

    @property
    def precise_done_topic(self) -> str:
        """The compacted topic where owners report which precise messages are forwarded,
        so replicas know what to clean and what to take over."""
        return f"{self.precise_topic}_done"

    @property
    def precise_far_after_ms(self) -> int:
        return parse_duration_ms(self.precise_far_after)

    @property
    def precise_far_topic(self) -> str:
        """Where exact messages due further out than `precise_far_after` go."""
        return f"{self.precise_topic}_far"

    @property
    def precise_far_done_topic(self) -> str:
        """The far topic's progress reports (replicas), kept apart from the near ones:
        each topic has its own partitions and offsets."""
        return f"{self.precise_far_topic}_done"

    @property
    def precise_outcomes_topic(self) -> str:
        """Where each holder replies to cancel and reschedule markers with what it did
        (`markers.replies`)."""
        return f"{self.precise_topic}_outcomes"

    def precise_topics(self) -> tuple[str, ...]:
        """Every topic precise mode owns."""
        return (
            self.precise_topic,
            self.precise_done_topic,
            self.precise_far_topic,
            self.precise_far_done_topic,
            self.precise_outcomes_topic,
        )

    @property
    def markers_outcomes_topic(self) -> str:
        """Where the daemon answers each level marker with what it did
        (`level.marker_answers`)."""
        return f"{self.markers_topic}_outcomes"

    def marker_topics(self) -> tuple[str, str]:
        """The level markers topic and its outcomes topic."""
        return self.markers_topic, self.markers_outcomes_topic

    def commit_interval(self) -> float:
        """The commit interval in force: exactly-once readers wait for it, so it is short."""
        if self.commit_interval_s is not None:
            return self.commit_interval_s
        return 0.1 if self.guarantee == "exactly-once" else 1.0

    def level_set(self) -> LevelSet:
        return LevelSet.parse(self.levels, self.topic_prefix)

    def internal_topics(self) -> frozenset[str]:
        """Topics this service owns, which no delayed message may name as its target:
        forwarding into one would loop or corrupt it."""
        return frozenset(
            {level.topic for level in self.level_set()}
            | {self.dead_letter_topic, *self.precise_topics(), *self.marker_topics()}
        )

    def __repr_args__(self) -> Any:
        """repr() and str() show librdkafka secrets as `<redacted>`."""
        for name, value in super().__repr_args__():
            if name in ("kafka", "consumer", "producer") and isinstance(value, dict):
                yield name, redacted(value)
            else:
                yield name, value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvSource(settings_cls))
