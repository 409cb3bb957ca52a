"""Every metric the daemon exports, created on a registry the caller passes in.

Names are the contract with the dashboards and alert rules in `deploy/`; tests check
that every name used there is exported here. Units are seconds and bytes, never ms.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from delayservice.metrics.batch_histogram import BatchHistogram
from delayservice.metrics.dropped_lines import DroppedLines

LATENESS_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

COMMIT_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMMIT_STEPS = ("flush", "send_offsets", "commit_transaction")
"""A commit point's steps: waiting for the interval's forwards to be acknowledged, then
(exactly-once) the offsets into the transaction and its commit."""

ABOVE_LEVEL: Final = "delay_above_level"
BELOW_LEVEL: Final = "delay_below_level"
MISMATCH_KINDS: Final = (ABOVE_LEVEL, BELOW_LEVEL)
"""What a forwarder counts of envelopes against its level (`level_mismatches`); every
forwarder's topics have both series from the start."""

DONE_DROP_REASONS: Final = ("malformed", "key_mismatch", "unknown_member", "not_holder", "bad_slot")
"""Why a reader of a precise done topic drops a record (`precise_done_dropped`)."""


class ServiceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        registry.register(DroppedLines())
        self.consumed = Counter(
            "delayservice_consumed",
            "Records read from a delay topic.",
            ["level"],
            registry=registry,
        )
        self.forwarded = Counter(
            "delayservice_forwarded",
            "Records forwarded to their real topic and acknowledged by the broker.",
            ["level"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "delayservice_dead_lettered",
            "Records sent to the dead-letter topic, by reason.",
            ["level", "reason"],
            registry=registry,
        )
        self.forward_errors = Counter(
            "delayservice_forward_errors",
            "Failed forward attempts that will be retried, by Kafka error name.",
            ["level", "error"],
            registry=registry,
        )
        self.queue_full = Counter(
            "delayservice_producer_queue_full",
            "Forwards that found the producer's local queue full and waited for room: "
            "forwarding outran the broker's acknowledgements.",
            ["level"],
            registry=registry,
        )
        self.buffered_messages = Gauge(
            "delayservice_buffered_messages",
            "Records held in memory: waiting for their due time or for the broker's ack.",
            ["level"],
            registry=registry,
        )
        self.buffered_bytes = Gauge(
            "delayservice_buffered_bytes",
            "Bytes of key, value and headers held in memory.",
            ["level"],
            registry=registry,
        )
        self.paused_partitions = Gauge(
            "delayservice_paused_partitions",
            "Delay-topic partitions paused because the buffer is full.",
            ["level"],
            registry=registry,
        )
        self.longest_pause = Gauge(
            "delayservice_longest_pause_seconds",
            "How long the longest-paused partition of the level has been paused.",
            ["level"],
            registry=registry,
        )
        self.consumer_lag = Gauge(
            "delayservice_consumer_lag_messages",
            "Records on the delay topic not yet read by this instance (assigned partitions).",
            ["level"],
            registry=registry,
        )
        self.lateness = BatchHistogram(
            "delayservice_lateness_seconds",
            "Seconds past the due time at which a record was forwarded.",
            "level",
            LATENESS_BUCKETS,
            registry,
        )
        self.commits = Counter(
            "delayservice_commits",
            "Offset commits of safe positions, by worker (commit points: the forwarder's; "
            "at-least-once also the consumer's confirmed commits).",
            ["worker"],
            registry=registry,
        )
        self.commit_step_seconds = Histogram(
            "delayservice_commit_step_seconds",
            "Seconds a worker's commit point spent in each step (flush, send_offsets, "
            "commit_transaction). Nothing of the worker's levels is sent meanwhile, and "
            "a read_committed reader waits for all of it.",
            ["worker", "step"],
            buckets=COMMIT_STEP_BUCKETS,
            registry=registry,
        )
        self.assigned_partitions = Gauge(
            "delayservice_assigned_partitions",
            "Delay-topic partitions assigned to this instance.",
            ["level"],
            registry=registry,
        )
        self.ready = Gauge(
            "delayservice_ready",
            "1 when every level reaches the broker and runs.",
            registry=registry,
        )
        self.commit_failures = Counter(
            "delayservice_commit_failures",
            "Offset commits the broker did not confirm; the same offsets are committed again.",
            ["worker"],
            registry=registry,
        )
        self.level_mismatches = Counter(
            "delayservice_level_mismatches",
            "Records whose envelope or timestamp disagrees with this daemon's level: "
            "delay_above_level (held to the envelope's delay), delay_below_level "
            "(delivered late), not_append_time (due time taken from the time of reading).",
            ["level", "kind"],
            registry=registry,
        )
        self.clock_offset = Gauge(
            "delayservice_clock_offset_seconds",
            "Smallest (local time - broker append time) among records read lately: an upper "
            "bound on how far this host's clock runs ahead of the broker's, plus read latency.",
            ["worker"],
            registry=registry,
        )
        self.clock_hold_back = Gauge(
            "delayservice_clock_hold_back_seconds",
            "How far level due times are held back from this host's clock: the clock "
            "offset's bound, capped (never early while this host runs no further ahead).",
            registry=registry,
        )
        self.loop_errors = Counter(
            "delayservice_loop_errors",
            "Unexpected exceptions a worker thread caught and survived.",
            ["worker", "thread"],
            registry=registry,
        )
        self.consumer_rebuilds = Counter(
            "delayservice_consumer_rebuilds",
            "Consumers replaced after a fatal error (e.g. fenced after a coordinator "
            "failover); what they held is re-read.",
            ["worker"],
            registry=registry,
        )
        self.dead_letter_stubs = Counter(
            "delayservice_dead_letter_stubs",
            "Dead letters sent without key and value because the full copy did not fit.",
            ["level"],
            registry=registry,
        )
        self.memory_used = Gauge(
            "delayservice_memory_budget_used_bytes",
            "Held records' bytes plus per-record overhead, all levels together.",
            registry=registry,
        )
        self.memory_limit = Gauge(
            "delayservice_memory_budget_limit_bytes",
            "The process-wide cap on held records (max_buffered_bytes).",
            registry=registry,
        )
        self.level_delay = Gauge(
            "delayservice_level_delay_seconds",
            "The delay of each level, for dashboards to join on; for precise mode (level "
            "exact), the look-ahead: how long a record waits in memory before it is due.",
            ["level", "topic"],
            registry=registry,
        )
        self.precise_cancels = Counter(
            "delayservice_precise_cancels",
            "Cancel markers by outcome: cancelled (the message will not be delivered), "
            "too_late (it was already sent), unmatched (expired without finding it), "
            "refused (no id, or the cancel log is full).",
            ["outcome"],
            registry=registry,
        )
        self.precise_reschedules = Counter(
            "delayservice_precise_reschedules",
            "Reschedule markers by outcome: moved (the message is due at the new time), "
            "too_late (it was already sent), unmatched (no pending message has the id), "
            "cancelled (a cancel came first; cancels win), refused (a bad marker, a time "
            "beyond max_delay, or the reschedule log is full).",
            ["outcome"],
            registry=registry,
        )
        self.level_markers = Counter(
            "delayservice_level_markers",
            "Cancel and reschedule markers of level messages answered, by the level their "
            "id names (- for none) and outcome: cancelled (the message will not be "
            "delivered), moved (it is due at the new time), too_late (it was due before "
            "the marker), unmatched (no message with the id was there), refused (a marker "
            "that cannot be read, an unknown level or partition, a time beyond the top "
            "level).",
            ["level", "kind", "outcome"],
            registry=registry,
        )
        self.level_markers_kept = Gauge(
            "delayservice_level_markers_kept",
            "Level markers in memory, by kind: those a record still waiting may need, "
            "bounded by the markers sent within twice the top level's delay.",
            ["kind"],
            registry=registry,
        )
        self.level_markers_book_bytes = Gauge(
            "delayservice_level_markers_book_bytes",
            "What the level markers kept take, as the memory budget counts them (part of "
            "delayservice_memory_budget_used_bytes).",
            registry=registry,
        )
        self.level_markers_book_full = Gauge(
            "delayservice_level_markers_book_full",
            "1 while the level markers kept fill their share of the memory budget: no more "
            "markers are read, so level records due since wait (late, no cancel forgotten).",
            registry=registry,
        )
        self.level_markers_misplaced = Counter(
            "delayservice_level_markers_misplaced_total",
            "Level markers found on a markers partition other than their level "
            "partition's: an older SDK, or a topic grown; those records then wait for "
            "that partition's reading too.",
            registry=registry,
        )
        self.level_markers_lag = Gauge(
            "delayservice_level_markers_lag_seconds",
            "How far behind now the level markers are read through: a level record due "
            "later than that waits for them (late, never early).",
            registry=registry,
        )
        self.level_markers_answers_lag = Gauge(
            "delayservice_level_markers_answers_lag_seconds",
            "How far behind now the answers on the outcomes topic are read through, every "
            "transaction in them ended: a level partition newly assigned answers and moves "
            "nothing until they are read past its assignment.",
            registry=registry,
        )
        self.precise_takeovers = Counter(
            "delayservice_precise_takeovers",
            "Replica copies forwarded because the owner had not reported them done after "
            "the takeover delay (possible duplicates).",
            registry=registry,
        )
        self.precise_cleaned = Counter(
            "delayservice_precise_replica_cleaned",
            "Copies dropped because the partition's other holder reported them settled: "
            "a replica's once the owner forwarded them, an owner's overdue ones once the "
            "replica took them over.",
            registry=registry,
        )
        self.precise_done_dropped = Counter(
            "delayservice_precise_done_records_dropped",
            "Records a reader of a precise done topic did not take, by level and reason: "
            "malformed, key_mismatch (the body names another member than its key), "
            "unknown_member, not_holder (a member that does not hold the partition), "
            "bad_slot. Only daemons write these topics (docs/security.md): any is "
            "another writer's, or a bug.",
            ["level", "reason"],
            registry=registry,
        )
        self.precise_slot_files = Gauge(
            "delayservice_precise_slot_files",
            "Slot and span files of a precise wheel (level exact: the precise topic's, "
            "exact-far: the far topic's), by state: on_disk (not yet read) or loaded.",
            ["level", "state"],
            registry=registry,
        )
        self.precise_read_through_lag = Gauge(
            "delayservice_precise_read_through_lag_seconds",
            "How far behind now a precise wheel's intake is known to have read every "
            "partition it reads (+Inf before its first round): a message due more than "
            "a second later than that waits for it (late, never early).",
            ["level"],
            registry=registry,
        )
        self.precise_disk_bytes = Gauge(
            "delayservice_precise_disk_bytes",
            "Bytes of slot and span files in a precise wheel's data directory.",
            ["level"],
            registry=registry,
        )
        self.next_due = Gauge(
            "delayservice_next_due_timestamp_seconds",
            "Due time (epoch s) of the earliest message the instance holds: levels, in "
            "memory; exact, on disk (owner copies). 0 when it holds none.",
            ["level"],
            registry=registry,
        )
        self.oldest_overdue = Gauge(
            "delayservice_oldest_overdue_seconds",
            "How far past its due time the earliest held message is, one being retried "
            "included; 0 when none is due.",
            ["level"],
            registry=registry,
        )
        self.precise_pending = Gauge(
            "delayservice_precise_pending_messages",
            "Precise-mode messages on this instance's disk, per wheel (level exact or "
            "exact-far), by due class (overdue, within "
            "1m, 1h, 1d, 30d, later) and copy (owner, or replica: sent only on takeover), "
            "cancelled ones left out; from a census of the data directory (see "
            "delayservice_precise_census_age_seconds).",
            ["level", "copy", "due"],
            registry=registry,
        )
        self.precise_census_age = Gauge(
            "delayservice_precise_census_age_seconds",
            "Seconds since the census behind delayservice_precise_pending_messages was "
            "taken (retaken every 30 s, or 20 times as long as the last one took: it reads "
            "the whole data directory).",
            ["level"],
            registry=registry,
        )
