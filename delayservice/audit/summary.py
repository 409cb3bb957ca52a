"""Summary: the per-message verdicts counted per level, per target, both, and in total.

Reconciling (`transform`) gives every accepted message its flags; this turns the written
rows into what the report says: counts and lateness percentiles for every scope, the
pass/fail verdict on them, and the lateness histogram the plot draws. It is apart
because it reads only the reconciled rows (the job counts from the Parquet it wrote),
never Kafka's records, and `load` and the CLI need its counts, not the reconciling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayservice.audit.transform import spark_functions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

COUNTS = (
    "accepted",
    "delivered",
    "missing",
    "duplicated",
    "early",
    "superseded",
    "cancelled",
    "pending",
    "leaked",
)
BROKEN = ("missing", "early", "superseded", "leaked")
"""The counts that are broken promises: any one of them fails the audit."""
PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
LATENESS = ("p50_ms", "p95_ms", "p99_ms", "max_ms")
SCOPES = {0: "level+target", 1: "level", 2: "target", 3: "total"}
"""Spark's grouping_id for cube(level, target), named."""


def promises_kept(counts: Mapping[str, int]) -> bool:
    """The audit's verdict on one row of counts (the total decides the exit status)."""
    return all(counts[name] == 0 for name in BROKEN)


def summarize(messages: DataFrame) -> DataFrame:
    """Counts and lateness percentiles per level, per target, per both, and in total."""
    F = spark_functions()  # noqa: N806
    quantiles = F.percentile("lateness_ms", [q for _, q in PERCENTILES])
    grouped = messages.withColumn("lv", F.struct("level_index", "level", "level_delay_ms"))
    return (
        grouped.cube("lv", "target")
        .agg(
            F.grouping_id().alias("gid"),
            F.count("*").alias("accepted"),
            *[F.count_if(name).alias(name) for name in COUNTS[1:]],
            quantiles.alias("q"),
            F.max("lateness_ms").alias("max_ms"),
        )
        .select(
            "*",
            "lv.*",
            *[F.col("q")[i].alias(f"{name}_ms") for i, (name, _) in enumerate(PERCENTILES)],
        )
        .drop("lv", "q")
    )


@dataclass(frozen=True)
class SummaryRow:
    scope: str
    level_index: int | None
    level: str | None
    level_delay_ms: int | None
    target: str | None
    counts: dict[str, int]
    lateness_ms: dict[str, float | None]

    @property
    def label(self) -> str:
        parts = [p for p in (self.level, self.target) if p]
        return " / ".join(parts) or "total"

    def as_dict(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "level": self.level,
            "level_index": self.level_index,
            "level_delay_ms": self.level_delay_ms,
            "target": self.target,
            **self.counts,
            "lateness_ms": self.lateness_ms,
        }


def collect_summary(summary: DataFrame) -> list[SummaryRow]:
    """Plain rows, totals last, levels in level order, targets by name."""
    rows = []
    for r in summary.collect():
        lateness = {k: (None if r[k] is None else float(r[k])) for k in LATENESS}
        rows.append(
            SummaryRow(
                scope=SCOPES[int(r["gid"])],
                level_index=r["level_index"],
                level=r["level"],
                level_delay_ms=r["level_delay_ms"],
                target=r["target"],
                counts={k: int(r[k]) for k in COUNTS},
                lateness_ms={k.removesuffix("_ms"): v for k, v in lateness.items()},
            )
        )
    if not any(r.scope == "total" for r in rows):  # cube() yields no rows at all for no input
        rows.append(
            SummaryRow(
                "total",
                None,
                None,
                None,
                None,
                dict.fromkeys(COUNTS, 0),
                {k.removesuffix("_ms"): None for k in LATENESS},
            )
        )
    order = {"level": 0, "target": 1, "level+target": 2, "total": 3}
    return sorted(rows, key=lambda s: (order[s.scope], s.level_index or 0, s.target or ""))


def bin_width(lo: float, hi: float, bins: int) -> int:
    """A round bin width (1, 2 or 5 times a power of ten, in ms) giving at most `bins` bins."""
    raw = max(1.0, (hi - lo) / max(1, bins))
    exponent = 10 ** math.floor(math.log10(raw))
    for step in (1, 2, 5, 10):
        if step * exponent >= raw:
            return int(step * exponent)
    return int(10 * exponent)  # pragma: no cover  # the loop always returns


def lateness_histogram(
    messages: DataFrame, bins: int = 40
) -> tuple[int, list[tuple[int, str, int, int]]]:
    """(bin width, [(level_index, level, bin start ms, count)]) over delivered messages."""
    F = spark_functions()  # noqa: N806
    delivered = messages.where(F.col("lateness_ms").isNotNull())
    bounds = delivered.agg(
        F.min("lateness_ms").alias("lo"), F.max("lateness_ms").alias("hi")
    ).first()
    if bounds is None or bounds["lo"] is None:
        return 1, []
    width = bin_width(float(bounds["lo"]), float(bounds["hi"]), bins)
    start = F.floor(F.col("lateness_ms") / width) * width
    rows = (
        delivered.groupBy("level_index", "level", start.cast("bigint").alias("bin_ms"))
        .count()
        .orderBy("level_index", "bin_ms")
        .collect()
    )
    return width, [
        (int(r["level_index"]), str(r["level"]), int(r["bin_ms"]), int(r["count"])) for r in rows
    ]
