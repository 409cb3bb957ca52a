"""Precise mode lateness: exact delays on an idle daemon, then steady load against level mode.

The daemon runs as `python -m delayservice run` in its own process; afterwards this
process reads the delay topics and the targets (all LogAppendTime) and joins them by
`delay-id`, so every figure comes from the broker's clocks:

    due      = append time on the delay topic + max(floor, delay-ms), or delay-due-ms
               when later (floor: 0 in precise mode, the level's delay in level mode)
    lateness = append time on the target - due      (negative = early)

Part `exact`: `--per-delay` messages of each of `--delays` (default 1.3 s, 7.9 s and
61.25 s) sent in rounds to an otherwise idle precise daemon; min / max lateness and
the early count per delay (target: 0 early, max <= 50 ms).

Part `quiet`: `--pending` exact messages (default 1,500) sent at once to an otherwise
idle precise daemon, with delays drawn uniformly from [`--quiet-min`, `--quiet-max`]
(0.35-12.7 s, seeded); lateness p50 / p99 / max, early, lost and duplicates (issue 46's
quiet phase; the goal: p99 <= 100 ms), and the same of those due `--quiet-after` (3 s)
or more after the flush, once the intake has written them all: only the wheel and the
forwarder then stand between a due time and its forward.

Part `steady`: `--rate` messages per second for `--seconds`, each with a delay drawn
uniformly from [`--min-delay`, `--max-delay`] (seeded), from a load generator in its
own process; run twice in a row on the same broker, once through precise mode and
once through level mode (`--levels`), each with a fresh daemon that runs only the
mode under test. Level mode delivers a delay at the next level up, so its lateness
against the requested delay is large by design; it is also reported against the
level's own due time. A reader in this process tails the target while the load runs
(read_committed under exactly-once) and takes the time each record reaches it: what a
consumer of the target sees, commit interval included.

    python benchmarks/precise_lateness.py [--parts exact,steady] [--rate 2000] [--seconds 60]
    python benchmarks/precise_lateness.py --parts quiet [--pending 1500]
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).parent))
from forwarding import broker
from precise_common import (
    Joined,
    Seen,
    cpu_seconds,
    create_topics,
    data_dir,
    due_ms,
    join,
    load,
    log_problems,
    logged_daemon,
    pct,
    precise_settings,
    read_topic,
    report_log,
    stderr,
    tag_for,
    wait_for_count,
    wait_for_ids,
)
from steady_lateness import LiveReader

from delayservice.producer import DelayProducer
from delayservice.settings import Settings
from delayservice.settings_loading import load_settings, settings_env

TARGET_PARTITIONS = 6


# -- an idle daemon ---------------------------------------------------------------------
def on_idle_daemon(
    bootstrap: str,
    args: argparse.Namespace,
    kind: str,
    log_path: Path,
    send: Callable[[DelayProducer, str], tuple[int, float]],
    *,
    linger_ms: int,
    wait: Callable[[str, str, int, float], int] = wait_for_count,
    **overrides: Any,
) -> tuple[Settings, list[Seen], list[Seen]]:
    """A fresh precise daemon with nothing else running: `send(producer, target)` sends
    (and returns how many messages, and the longest delay); once all have arrived, the
    settings, the precise topic and the target, read back."""
    tag = tag_for(kind)
    with data_dir(kind) as root:
        settings = precise_settings(
            bootstrap, tag, root, max_delay=args.max_delay_setting, **overrides
        )
        target = f"{tag}-target"
        create_topics(settings, [target], TARGET_PARTITIONS)
        with logged_daemon(settings, tag, log_path):
            producer = DelayProducer(
                {"bootstrap.servers": bootstrap, "linger.ms": linger_ms},
                settings=settings,
                precision="exact",
            )
            count, longest = send(producer, target)
            if producer.flush(30) != 0:
                raise SystemExit(f"{kind}: the producer could not deliver every message")
            stderr(f"{kind}: {count:,} messages sent; the longest is due in {longest:g} s")
            wait(bootstrap, target, count, time.monotonic() + longest + 60)
        sources = read_topic(bootstrap, settings.precise_topic)
        arrivals = read_topic(bootstrap, target)
    return settings, sources, arrivals


# -- part exact --------------------------------------------------------------------------
def run_exact(bootstrap: str, args: argparse.Namespace, log_path: Path) -> list[str]:
    delays = [float(d) for d in args.delays.split(",")]
    asked: dict[bytes, float] = {}

    def send(producer: DelayProducer, target: str) -> tuple[int, float]:
        for round_no in range(args.per_delay):
            for delay in delays:
                mid = producer.produce(target, f"r{round_no}".encode(), delay=delay)
                asked[mid.encode()] = delay
            producer.flush(10)
            time.sleep(args.spacing)
        return len(asked), max(delays)

    settings, sources, arrivals = on_idle_daemon(
        bootstrap, args, "exact", log_path, send, linger_ms=0
    )
    dues = {s.message_id: due_ms(s) for s in sources if s.message_id in asked}
    print(
        f"\n(a) exactness: {args.per_delay} messages per delay, idle daemon, "
        f"lookahead {settings.precise_lookahead_s:g} s"
    )
    print(f"{'delay':>8} {'sent':>5} {'arrived':>8} {'early':>6} {'min ms':>7} {'max ms':>7}")
    rows = []
    worst = -math.inf
    early_total = lost_total = 0
    for delay in delays:
        mine = {mid: due for mid, due in dues.items() if asked[mid] == delay}
        joined = join(mine, arrivals)
        late = joined.lateness
        lo, hi = (min(late), max(late)) if late else (math.nan, math.nan)
        worst = max(worst, hi) if late else worst
        early_total += joined.early
        lost_total += joined.lost
        print(f"{delay:>7g}s {len(mine):>5} {len(late):>8} {joined.early:>6} {lo:>7.0f} {hi:>7.0f}")
        rows.append(f"{delay:g} s: {lo:.0f}-{hi:.0f} ms")
    print(
        f"early {early_total}, lost {lost_total}, max {worst:.0f} ms "
        f"(target: 0 early, max <= 50 ms)"
    )
    summary = (
        f"exact delays, idle daemon: lateness min-max {'; '.join(rows)}; "
        f"early {early_total}, lost {lost_total}"
    )
    print(f"summary: {summary}")
    return [summary]


# -- part quiet --------------------------------------------------------------------------
def run_quiet(bootstrap: str, args: argparse.Namespace, log_path: Path) -> list[str]:
    flushed_ms = 0

    def send(producer: DelayProducer, target: str) -> tuple[int, float]:
        nonlocal flushed_ms
        rng = random.Random(args.seed)
        for i in range(args.pending):
            delay = rng.uniform(args.quiet_min, args.quiet_max)
            producer.produce(target, b"v" * 100, str(i).encode(), delay=delay)
        producer.flush(30)
        flushed_ms = int(time.time() * 1000)
        return args.pending, args.quiet_max

    _, sources, arrivals = on_idle_daemon(
        bootstrap, args, "quiet", log_path, send, linger_ms=5, wait=wait_for_ids,
        guarantee=args.guarantee,
    )  # fmt: skip
    joined = join({s.message_id: due_ms(s) for s in sources if s.message_id}, arrivals)
    late = joined.lateness
    # Due once the intake has long written them all: only the wheel and the forwarder
    # stand between the due time and the forward.
    settled_ms = flushed_ms + int(args.quiet_after * 1000)
    after = [ms for ms, at in zip(late, joined.arrivals, strict=True) if at - ms >= settled_ms]
    summary = (
        f"quiet: {args.pending:,} exact messages sent at once, delays U[{args.quiet_min:g}, "
        f"{args.quiet_max:g}] s, {args.guarantee}: lateness p50 / p99 / max {triple(late)} ms; "
        f"the {len(after):,} due >= {args.quiet_after:g} s after the flush "
        f"{triple(after)} ms; early {joined.early}, lost {joined.lost}, "
        f"duplicates {joined.duplicates}"
    )
    print(f"\nsummary: {summary}")
    return [summary]


# -- part steady -------------------------------------------------------------------------
def generate(settings: Settings, args: argparse.Namespace) -> int:
    """Child: `rate` messages per second for `seconds`, in 10 ms steps; returns the count."""
    precision: Literal["level", "exact"] = "exact" if args.mode == "precise" else "level"
    producer = DelayProducer(
        {"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5},
        settings=settings,
        precision=precision,
    )
    rng = random.Random(args.seed)
    value = b"v" * args.value_bytes
    sent = 0
    start = time.monotonic()
    next_line = start + 5
    while (elapsed := time.monotonic() - start) < args.seconds:
        for _ in range(int(elapsed * args.rate) - sent):
            delay = rng.uniform(args.min_delay, args.max_delay)
            while True:
                try:
                    producer.produce(args.generate, value, str(sent).encode(), delay=delay)
                    break
                except BufferError:
                    producer.poll(0.01)
            sent += 1
        producer.poll(0)
        if time.monotonic() >= next_line:
            next_line += 5
            stderr(f"  {args.mode}: {sent:,} sent in {elapsed:.0f} of {args.seconds:.0f} s")
        time.sleep(max(0.0, 0.01 - (time.monotonic() - start - elapsed)))
    producer.flush(60)
    return sent


class ModeResult:
    def __init__(
        self,
        sent: int,
        asked: Joined,
        due: Joined,
        cpu: float,
        seconds: float,
        log: int,
        reader: list[int],
    ) -> None:
        self.sent = sent
        self.asked = asked  # against the requested delay
        self.due = due  # against the mode's own due time
        self.reader = reader  # when a live reader of the target got it, against the request
        self.cpu = cpu
        self.seconds = seconds
        self.log = log


def run_mode(bootstrap: str, args: argparse.Namespace, mode: str, log_path: Path) -> ModeResult:
    tag = tag_for(f"steady-{mode}")
    with data_dir("steady") as root:
        settings = precise_settings(
            bootstrap,
            tag,
            root,
            levels=args.levels,
            precise=mode == "precise",
            max_delay=args.max_delay_setting,
            guarantee=args.guarantee,
        )
        target = f"{tag}-target"
        create_topics(settings, [target], TARGET_PARTITIONS)
        isolation = "read_committed" if args.guarantee == "exactly-once" else "read_uncommitted"
        live = LiveReader(bootstrap, target, isolation)
        with logged_daemon(settings, tag, log_path) as daemon:
            cpu_before, started = cpu_seconds(daemon.pid), time.monotonic()
            generator = subprocess.run(
                [sys.executable, __file__, "--generate", target, "--mode", mode,
                 "--rate", str(args.rate), "--seconds", str(args.seconds),
                 "--min-delay", str(args.min_delay), "--max-delay", str(args.max_delay),
                 "--value-bytes", str(args.value_bytes), "--seed", str(args.seed)],
                env=settings_env(settings), stdout=subprocess.PIPE, text=True, check=True,
            )  # fmt: skip
            sent = int(generator.stdout.split()[-1])
            stderr(f"  {mode}: {sent:,} sent; waiting for the last to fall due and arrive")
            deadline = time.monotonic() + args.max_delay + 120
            wait = wait_for_ids if args.guarantee == "exactly-once" else wait_for_count
            wait(bootstrap, target, sent, deadline)
            cpu = cpu_seconds(daemon.pid) - cpu_before
            seconds = time.monotonic() - started
            while len(live.seen) < sent and time.monotonic() < deadline:
                time.sleep(0.2)
        live.stop()
        stderr(f"  {mode}: reading both sides back")
        if mode == "precise":
            sources = [(s, 0) for s in read_topic(bootstrap, settings.precise_topic)]
        else:
            sources = [
                (s, level.delay_ms)
                for level in settings.level_set()
                for s in read_topic(bootstrap, level.topic)
            ]
        arrivals = read_topic(bootstrap, target)
    valid: list[tuple[Seen, int]] = [(s, floor) for s, floor in sources if s.message_id]
    asked = join({s.message_id: due_ms(s) for s, _ in valid if s.message_id}, arrivals)
    due = join({s.message_id: due_ms(s, floor) for s, floor in valid if s.message_id}, arrivals)
    count, _ = log_problems(log_path)
    requested = {s.message_id: due_ms(s) for s, _ in valid if s.message_id}
    reader = [at - requested[mid] for mid, at in live.seen.items() if mid in requested]
    return ModeResult(sent, asked, due, cpu, seconds, count, reader)


def triple(values: list[int]) -> str:
    if not values:
        return "-"
    return f"{pct(values, 0.5):.0f} / {pct(values, 0.99):.0f} / {max(values):.0f}"


def run_steady(bootstrap: str, args: argparse.Namespace, log_dir: Path) -> list[str]:
    modes = args.modes.split(",")
    results: dict[str, ModeResult] = {}
    for mode in modes:
        stderr(f"steady, {mode} mode: {args.rate:,} msg/s for {args.seconds:g} s; {load()}")
        results[mode] = run_mode(bootstrap, args, mode, log_dir / f"steady-{mode}.log")
        stderr(f"  {mode}: done; {load()}")
    print(
        f"\n(b) steady {args.rate:,} msg/s for {args.seconds:g} s, delays uniform in "
        f"[{args.min_delay:g} s, {args.max_delay:g} s] (seed {args.seed}), "
        f"{args.value_bytes} B values; one daemon per mode, run one after the other "
        f"on the same broker; level mode over {args.levels}; {args.guarantee}, targets "
        "read read_committed"
    )
    width = 26
    print(f"{'':<{width}}" + "".join(f"{mode:>22}" for mode in modes))

    def row(name: str, cell: Any) -> None:
        print(f"{name:<{width}}" + "".join(f"{cell(results[m], m):>22}" for m in modes))

    row("sent", lambda r, _: f"{r.sent:,}")
    row("lateness vs requested ms", lambda r, _: "")
    row("  p50 / p99 / max", lambda r, _: triple(r.asked.lateness))
    row("a live reader sees it ms", lambda r, _: "")
    row("  p50 / p99 / max", lambda r, _: triple(r.reader))
    row("lateness vs own due ms", lambda r, _: "")
    row("  p50 / p99 / max", lambda r, _: triple(r.due.lateness))
    row("over 50 ms (vs own due)", lambda r, _: f"{sum(1 for x in r.due.lateness if x > 50):,}")
    row("early (vs own due)", lambda r, _: f"{r.due.early:,}")
    row("early (vs requested)", lambda r, _: f"{r.asked.early:,}")
    row("lost", lambda r, _: f"{r.due.lost:,}")
    row("duplicates", lambda r, _: f"{r.due.duplicates:,}")
    row("daemon CPU (% of 1 core)", lambda r, _: f"{100 * r.cpu / r.seconds:.0f}%")
    row("daemon log warnings", lambda r, _: f"{r.log}")
    summary = []
    reader_kind = "read_committed" if args.guarantee == "exactly-once" else "read_uncommitted"
    for mode in modes:
        r = results[mode]
        own = "" if mode == "precise" else f" ({triple(r.due.lateness)} vs its level's due)"
        summary.append(
            f"{mode} {triple(r.asked.lateness)} ms{own}, as a {reader_kind} reader sees it "
            f"{triple(r.reader)} ms, early {r.due.early}, lost {r.due.lost}"
        )
    if len(modes) == 2 and "precise" in results and "level" in results:
        p, lv = results["precise"].asked.lateness, results["level"].asked.lateness
        if p and lv:
            print(
                f"ratio level / precise, lateness vs requested: p50 "
                f"{pct(lv, 0.5) / max(1.0, pct(p, 0.5)):.0f}x, p99 "
                f"{pct(lv, 0.99) / max(1.0, pct(p, 0.99)):.0f}x"
            )
    line = (
        f"steady {args.rate:,} msg/s x {args.seconds:g} s, delays U[{args.min_delay:g}, "
        f"{args.max_delay:g}] s, lateness vs requested p50/p99/max: " + "; ".join(summary)
    )
    print(f"summary: {line}")
    return [line]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--parts", default="exact,steady", help="exact, quiet, steady")
    parser.add_argument("--delays", default="1.3,7.9,61.25", help="exact: delays in seconds")
    parser.add_argument("--per-delay", type=int, default=5, help="exact: messages per delay")
    parser.add_argument(
        "--spacing", type=float, default=0.613, help="exact: seconds between rounds"
    )
    parser.add_argument("--pending", type=int, default=1_500, help="quiet: messages")
    parser.add_argument("--quiet-min", type=float, default=0.35, help="quiet: shortest delay")
    parser.add_argument("--quiet-max", type=float, default=12.7, help="quiet: longest delay")
    parser.add_argument(
        "--quiet-after",
        type=float,
        default=3.0,
        help="quiet: also report those due this long after the flush (the intake done)",
    )
    parser.add_argument("--rate", type=int, default=2000, help="steady: messages per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="steady: seconds of load")
    parser.add_argument("--min-delay", type=float, default=1.0, help="steady: shortest delay")
    parser.add_argument("--max-delay", type=float, default=30.0, help="steady: longest delay")
    parser.add_argument("--levels", default="1s,2s,5s,10s,30s", help="steady: level mode's")
    parser.add_argument("--modes", default="precise,level", help="steady: modes, in order")
    parser.add_argument("--value-bytes", type=int, default=200, help="steady: value size")
    parser.add_argument("--seed", type=int, default=7, help="steady: delays' random seed")
    parser.add_argument("--max-delay-setting", default="1d", help="the daemon's max_delay")
    parser.add_argument(
        "--guarantee",
        choices=["at-least-once", "exactly-once"],
        default="at-least-once",
        help="the daemon's guarantee (targets are read read_committed)",
    )
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    parser.add_argument("--generate", help=argparse.SUPPRESS)  # the load generator's role
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.generate:  # child: settings come in through the environment
        print(generate(load_settings(), args))
        return 0

    parts = args.parts.split(",")
    if unknown := set(parts) - {"exact", "quiet", "steady"}:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")
    if unknown := set(args.modes.split(",")) - {"precise", "level"}:
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    log_dir = Path(f"/tmp/precise-lateness-{int(time.time())}")
    log_dir.mkdir(parents=True, exist_ok=True)
    stderr(f"start: {load()}; daemon logs in {log_dir}")
    summaries = []
    with broker(args.bootstrap) as bootstrap:
        if "exact" in parts:
            summaries += run_exact(bootstrap, args, log_dir / "exact.log")
            report_log(log_dir / "exact.log")
        if "quiet" in parts:
            summaries += run_quiet(bootstrap, args, log_dir / "quiet.log")
            report_log(log_dir / "quiet.log")
        if "steady" in parts:
            summaries += run_steady(bootstrap, args, log_dir)
            for mode in args.modes.split(","):
                report_log(log_dir / f"steady-{mode}.log")
    stderr(f"end: {load()}")
    print("\n" + "\n".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
