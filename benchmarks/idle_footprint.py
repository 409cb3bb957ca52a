"""Idle footprint: OS threads and RSS of a daemon running 12 levels with nothing to do.

The daemon runs as `python -m delayservice run` in its own process, as deployed, on a
real broker. Once /readyz answers ready the process is sampled a few times over
`--settle` seconds from outside (/proc), and the largest figures are printed, with the
threads grouped by name so it shows who holds them (librdkafka names its threads
rdk:main, rdk:broker..., Python threads show the interpreter's name).

    python benchmarks/idle_footprint.py [--levels 12] [--settle 5] [--level-workers per-level]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka.admin import AdminClient

from delayservice.kafka import topics
from delayservice.settings_loading import load_settings

sys.path.insert(0, str(Path(__file__).parent))
from daemon_process import running_daemon
from forwarding import add_layout_option, broker

LEVELS = ["1s", "2s", "5s", "10s", "30s", "1m", "2m", "5m", "10m", "30m", "1h", "2h"]


def sample(pid: int) -> tuple[int, int, collections.Counter[str]]:
    """(threads, RSS bytes, thread names) of a live process, read from /proc."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {k: v.split() for k, _, v in (line.partition(":") for line in status)}
    names: collections.Counter[str] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended while we looked
        names[name.split("#")[0].rstrip("0123456789/") or name] += 1
    return int(fields["Threads"][0]), int(fields["VmRSS"][0]) * 1024, names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, default=12, choices=range(1, len(LEVELS) + 1))
    parser.add_argument("--settle", type=float, default=5.0, help="seconds sampled once ready")
    parser.add_argument("--bootstrap", help="an existing broker instead of a local one")
    add_layout_option(parser)
    args = parser.parse_args()

    with broker(args.bootstrap) as bootstrap:
        tag = uuid.uuid4().hex[:6]
        settings = load_settings(
            bootstrap_servers=bootstrap,
            levels=",".join(LEVELS[: args.levels]),
            topic_prefix=f"idle-{tag}-",
            group_id=f"idle-{tag}",
            dead_letter_topic=f"idle-{tag}-dlq",
            level_workers=args.level_workers,
        )
        topics.create(AdminClient({"bootstrap.servers": bootstrap}), settings)
        with running_daemon(settings, f"idle-{tag}", ready_within=120) as process:
            threads, rss, names = 0, 0, collections.Counter[str]()
            end = time.monotonic() + args.settle
            while time.monotonic() < end:
                t, r, n = sample(process.pid)
                if t >= threads:
                    threads, names = t, n
                rss = max(rss, r)
                time.sleep(0.5)

    print(
        f"idle daemon, {args.levels} levels ({args.level_workers} level workers), "
        f"sampled {args.settle:.0f} s after ready"
    )
    print(f"OS threads : {threads}  (target <= 40 at 12 levels)")
    print(f"RSS        : {rss / 2**20:.0f} MiB")
    print("by name    : " + ", ".join(f"{name} {count}" for name, count in names.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
