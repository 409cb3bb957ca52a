"""`delayservice audit`: the Spark job that proves nothing was lost and nothing was early.

Exit status is the verdict, so the command can gate a cron job or a CI stage: 0 when
no message is missing, early or superseded, 3 when one is, 1 when the audit could not
run, 2 for bad options or settings.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from delayservice.audit import AuditError
from delayservice.audit.isolation import DEFAULT as DEFAULT_ISOLATION
from delayservice.audit.isolation import Isolation
from delayservice.cli.common import (
    BootstrapOption,
    ConfigOption,
    JsonOption,
    echo_json,
    fail,
    friendly_errors,
    setup_logging,
)
from delayservice.levels import format_duration_ms, parse_duration_ms
from delayservice.settings_loading import load_settings

ENV = "DELAYSERVICE_AUDIT_"


def parse_instant(text: str, now_ms: int) -> int:
    """Epoch ms from ISO 8601 (naive means UTC), epoch ms digits, or a duration ago (`2h`)."""
    text = text.strip()
    if re.fullmatch(r"\d{12,}", text):
        return int(text)
    try:
        return now_ms - parse_duration_ms(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO 8601 time, epoch milliseconds, "
            "nor a duration ago such as 30m or 2h"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_pairs(items: list[str] | None, option: str) -> dict[str, str]:
    """key=value pairs; a malformed one is named in the error unless it may hold a secret
    (without `=` there is no telling the key from the value, so the whole text is judged)."""
    from delayservice.audit.kafka_options import is_sensitive  # keeps --help fast

    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            shown = "(not shown: it may hold a secret)" if is_sensitive(item) else repr(item)
            raise fail(f"{option} {shown} is not key=value", 2)
        pairs[key.strip()] = value
    return pairs


def _option(env: str, help_text: str, *names: str, show_default: bool = False) -> Any:
    """An option that `DELAYSERVICE_AUDIT_<env>` can also set, for cron jobs and CI stages."""
    return typer.Option(*names, envvar=f"{ENV}{env}", show_default=show_default, help=help_text)


TargetsOption = Annotated[
    list[str] | None,
    _option(
        "TARGETS",
        "Target topics to read (comma-separated or repeated); default: every topic the "
        "envelopes name.",
        "--targets",
    ),
]
SinceOption = Annotated[
    str | None,
    _option(
        "SINCE",
        "Audit messages accepted at or after this: ISO 8601 (naive is UTC), epoch ms, or "
        "a duration ago such as 2h.",
    ),
]
UntilOption = Annotated[
    str | None, _option("UNTIL", "...and accepted before this (same forms as --since).")
]
StartingOffsetsOption = Annotated[
    str | None,
    _option(
        "STARTING_OFFSETS",
        "Or an offset range on the delay topics, in Spark's notation: "
        'earliest, or JSON such as {"delay_topic_1":{"0":1200}} (-2 earliest).',
    ),
]
EndingOffsetsOption = Annotated[
    str | None,
    _option("ENDING_OFFSETS", "End of the offset range, exclusive: latest, or JSON (-1 latest)."),
]
GraceOption = Annotated[
    str,
    _option(
        "GRACE",
        "How long past its due time an undelivered message is still pending rather than missing.",
        show_default=True,
    ),
]
OutOption = Annotated[
    Path,
    _option(
        "OUT",
        "Folder for messages.parquet, summary.json and lateness.png.",
        "--out",
        "-o",
        show_default=True,
    ),
]
MasterOption = Annotated[
    str | None,
    _option("MASTER", "Spark master, e.g. yarn or spark://host:7077 (default: local[2])."),
]
ConfOption = Annotated[
    list[str] | None,
    typer.Option(
        "--conf",
        show_default=False,
        help="A Spark setting, key=value, repeatable (e.g. spark.driver.memory=4g).",
    ),
]
KafkaOption = Annotated[
    list[str] | None,
    typer.Option(
        "--kafka-option",
        show_default=False,
        help="A Java Kafka client setting for Spark's Kafka source, key=value, repeatable "
        "(e.g. sasl.jaas.config=...); wins over the translated settings file.",
    ),
]
KafkaSettingsOption = Annotated[
    bool,
    _option(
        "KAFKA_SETTINGS",
        "Translate the settings file's kafka and consumer keys (librdkafka) for Spark's "
        "Kafka source; --no-kafka-settings leaves only the --kafka-option pairs.",
        "--kafka-settings/--no-kafka-settings",
        show_default=True,
    ),
]
IsolationOption = Annotated[
    Isolation,
    _option(
        "ISOLATION",
        "How the target topics are read, as the consumer the audit speaks for reads them. "
        "read_committed (the default) sees a Kafka transaction's records only once it "
        "commits: it is what guarantee = exactly-once promises exactly once to, and "
        "without transactions it sees every record anyway, so it hides nothing then. "
        "read_uncommitted also sees the copies aborted transactions left behind, and "
        "counts them as duplicates. The delay topics are always read as the daemon "
        "reads them.",
        "--isolation",
        show_default=True,
    ),
]


@friendly_errors
def audit(
    *,
    config: ConfigOption = None,
    bootstrap_servers: BootstrapOption = None,
    targets: TargetsOption = None,
    since: SinceOption = None,
    until: UntilOption = None,
    starting_offsets: StartingOffsetsOption = None,
    ending_offsets: EndingOffsetsOption = None,
    grace: GraceOption = "1m",
    out: OutOption = Path("delayservice-audit"),
    master: MasterOption = None,
    conf: ConfOption = None,
    kafka_option: KafkaOption = None,
    kafka_settings: KafkaSettingsOption = True,
    isolation: IsolationOption = DEFAULT_ISOLATION,
    as_json: JsonOption = False,
) -> None:
    """Reconcile the delay topics with the target topics on Spark; exit 3 if any message is
    missing, early or superseded.

    With precise = true in the settings the precise topic is read too; its messages show
    as level exact, and a cancel marker counts for them only on their own partition. The
    daemon's replies on the outcomes topic ({precise_topic}_outcomes) say which
    reschedules moved a message: its last move sets the due time it is judged by, and a
    copy delivered at a time a later move replaced counts as superseded. Without that
    topic (an older deployment) the audit says so and judges each message by its own
    due time.

    Spark reads Kafka with the same settings as the daemon: the settings file's kafka and
    consumer keys are translated from librdkafka to the Java client. security.protocol
    passes through; sasl.mechanisms with sasl.username and sasl.password (PLAIN,
    SCRAM-SHA-256/512) become sasl.jaas.config; ssl.ca.location becomes a PEM trust store;
    ssl.certificate.location and ssl.key.location (PKCS#8; ssl.key.password if encrypted)
    become a PEM key store. librdkafka-only tuning keys are left out with a warning. A
    security key with no known translation stops the audit (exit 2) unless a
    --kafka-option with the Java setting replaces it. Passwords, keys and JAAS lines are
    shown as ***.
    """
    from delayservice.audit.extract import Window  # keeps --help fast
    from delayservice.audit.job import AuditOptions, run
    from delayservice.audit.load import console_table
    from delayservice.audit.session import stderr_is_terminal
    from delayservice.audit.summary import BROKEN

    settings = load_settings(config, bootstrap_servers=bootstrap_servers)
    setup_logging(settings.log_level)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    now_ms = int(time.time() * 1000)
    try:
        window = Window(
            since_ms=parse_instant(since, now_ms) if since else None,
            until_ms=parse_instant(until, now_ms) if until else None,
            starting_offsets=starting_offsets,
            ending_offsets=ending_offsets,
        )
        grace_ms = parse_duration_ms(grace)
    except (ValueError, AuditError) as exc:
        raise fail(str(exc), 2) from None
    topics = [t.strip() for item in targets or [] for t in item.split(",") if t.strip()]
    options = AuditOptions(
        window=window,
        grace_ms=grace_ms,
        targets=topics or None,
        out_dir=out,
        master=master,
        spark_conf=parse_pairs(conf, "--conf"),
        kafka_options=parse_pairs(kafka_option, "--kafka-option"),
        spark_progress_bar=stderr_is_terminal(),
        kafka_settings=kafka_settings,
        isolation=isolation,
    )

    started = time.monotonic()

    def progress(message: str) -> None:
        typer.echo(f"audit [{time.monotonic() - started:5.1f}s] {message}", err=True)

    report = run(settings, options, progress)
    if as_json:  # what summary.json holds, on stdout
        echo_json(report.document)
        raise typer.Exit(report.exit_code)
    typer.echo(report.header)
    typer.echo(console_table(report.rows))
    total = report.total.counts
    typer.echo(
        f"\nas of {report.document['as_of']}, grace {format_duration_ms(grace_ms)}; "
        f"{report.document['unmatched_deliveries']} deliveries outside the audited range"
    )
    if report.note is not None:
        typer.echo(f"note: {report.note}")
    for name, path in report.outputs.items():
        typer.echo(f"{name:9} {path}")
    if not report.ok:
        broken = ", ".join(f"{total[name]} {name}" for name in BROKEN)
        typer.echo(f"FAILED: {broken}", err=True)
    raise typer.Exit(report.exit_code)


def register(app: typer.Typer) -> None:
    app.command()(audit)
