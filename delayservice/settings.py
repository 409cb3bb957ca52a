"""The settings shared by the daemon, the producer wrapper and the CLI: each field with
its default, range and `DELAYSERVICE_*` name, its validators (what they check is in
`settings_checks`), and what follows from the fields (the level set, the topic names,
the commit interval). `settings_loading` reads them from their sources; the environment
source is here, with the class that names it.
"""

from __future__ import annotations

import logging
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

from delayservice import settings_checks as checks
from delayservice.errors import ConfigError
from delayservice.levels import (
    DEFAULT_LEVELS,
    DEFAULT_TOPIC_PREFIX,
    LevelSet,
    parse_duration_ms,
)
from delayservice.redaction import redacted

log = logging.getLogger(__name__)

ENV_PREFIX = "DELAYSERVICE_"

MiB = 1024 * 1024
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
        return checks.servers_listed(value)

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
        return checks.group_id_printable(value)

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host_printable(cls, value: str) -> str:
        return checks.metrics_host_printable(value)

    @field_validator("dead_letter_topic")
    @classmethod
    def _dead_letter_topic_legal(cls, value: str) -> str:
        return checks.dead_letter_topic_legal(value)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_named(cls, value: Any) -> Any:
        return checks.data_dir_named(value)

    @field_validator("kafka", "consumer", "producer", mode="before")
    @classmethod
    def _client_keys_not_owned(cls, value: Any, info: ValidationInfo) -> Any:
        return checks.client_keys_not_owned(value, str(info.field_name))

    @field_validator("kafka", "consumer", "producer")
    @classmethod
    def _client_keys_named(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        return checks.client_keys_named(value, str(info.field_name))

    @field_validator("max_delay", "precise_far_after")
    @classmethod
    def _duration_parses(cls, value: str, info: ValidationInfo) -> str:
        return checks.duration_parses(value, info.field_name or "duration")

    @field_validator("cancel_lead", mode="before")
    @classmethod
    def _lead_in_seconds(cls, value: object) -> object:
        return checks.lead_in_seconds(value)

    @field_validator("cancel_lead")
    @classmethod
    def _lead_parses(cls, value: str) -> str:
        return checks.lead_parses(value)

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
        checks.water_marks_in_order(self)
        return self

    @model_validator(mode="after")
    def _backoffs_in_order(self) -> Settings:
        checks.backoffs_in_order(self)
        return self

    @model_validator(mode="after")
    def _level_topics(self) -> Settings:
        checks.level_topics_legal(self)
        return self

    @model_validator(mode="after")
    def _instance_ids(self) -> Settings:
        checks.instance_ids_legal(self)
        return self

    @model_validator(mode="after")
    def _precise_topics(self) -> Settings:
        checks.precise_topics_legal(self)
        return self

    @model_validator(mode="after")
    def _marker_topics(self) -> Settings:
        checks.marker_topics_legal(self)
        return self

    @model_validator(mode="after")
    def _precise_membership(self) -> Settings:
        checks.precise_membership_valid(self)
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
        (`level.markers.answers`)."""
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
