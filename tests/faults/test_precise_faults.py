"""Scenarios 7 and 8: precise mode under kill -9, and a replica taking over from an
owner that vanished together with its disk.

Precise mode's promise rests on its disk: an offset of the precise topic is committed
only after the slot write is synced, so a kill at any moment leaves each record either
on disk or uncommitted. With two replicas, the second copy forwards whatever its owner
did not report done, so losing an owner and its data directory loses nothing.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
import urllib.request

import pytest
from confluent_kafka import KafkaException, Producer

from delayservice.producer import DelayProducer
from tests.faults.harness import DaemonProcess, wait_until
from tests.faults.hostile import FuzzTopics, HostileFactory

pytestmark = pytest.mark.kafka

SEED = 4_242
KILLS = 8
TAKEOVER_S = 3


def _metric(daemon: DaemonProcess, name: str) -> float:
    """One unlabelled sample from the daemon's /metrics (0 when absent)."""
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:  # loopback
        for line in reply.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    return 0.0


def _verdict(run, report, fault_summary) -> None:
    fault_summary(report)
    run.assert_alive()
    assert not report.lost, report.problems()
    assert not report.early, report.problems()
    assert not report.wrong, report.problems()


def test_precise_kill_9_during_intake_and_forwarding_loses_nothing(
    fault_run, kafka_bootstrap, fault_summary, tmp_path, testbed
):
    rng = random.Random(SEED)
    run = fault_run(
        kafka_bootstrap,
        levels="1s,6s",
        precise=True,
        precise_topic=f"dp-kill-{testbed.tag}",
        data_dir=tmp_path / "wheel",
        precise_lookahead_s=2.0,
    )
    target = run.target("pkill")
    name = f"pkill-{run.testbed.tag}"
    daemon = run.fleet.spawn(name)
    run.wait_ready(daemon)
    run.traffic([target], rate=120, seed=SEED, precision="exact")
    time.sleep(2)
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.3, 3.0))  # lands during intake, loading or forwarding
        daemon.kill()
        daemon = run.fleet.spawn(name)
        run.assert_alive()
    time.sleep(4)
    report = run.drain("7. precise: kill -9 x8 + restart", timeout=90)
    report.notes.append("delays 1 ms to 6 s in precise mode, same data directory")
    _verdict(run, report, fault_summary)
    run.wait_ready(daemon)
    assert wait_until(lambda: not list((tmp_path / "wheel").rglob("*.slot")), 30), (
        "slot files left behind after everything was forwarded"
    )


def test_precise_replica_takes_over_an_owner_lost_with_its_disk(
    fault_run, kafka_bootstrap, fault_summary, tmp_path, testbed
):
    rng = random.Random(SEED + 1)
    run = fault_run(
        kafka_bootstrap,
        levels="1s,8s",
        precise=True,
        precise_topic=f"dp-repl-{testbed.tag}",
        data_dir=tmp_path / "unused",
        replicas=2,
        precise_members=2,
        takeover_delay_s=TAKEOVER_S,
    )
    target = run.target("prepl")
    dirs = [tmp_path / "member-0", tmp_path / "member-1"]

    def spawn(member: int) -> DaemonProcess:
        return run.fleet.spawn(
            f"prepl{member}-{run.testbed.tag}",
            {
                "DELAYSERVICE_PRECISE_MEMBER": str(member),
                "DELAYSERVICE_DATA_DIR": str(dirs[member]),
            },
        )

    owner, replica = spawn(0), spawn(1)
    run.wait_ready(owner, replica)
    run.traffic([target], rate=100, seed=SEED, precision="exact")
    time.sleep(rng.uniform(4, 7))
    owner.kill()
    shutil.rmtree(dirs[0])  # the owner's disk is gone with it
    time.sleep(TAKEOVER_S + 6)  # the replica alone now, while traffic goes on
    owner = spawn(0)  # back, on an empty disk
    run.wait_ready(owner)
    time.sleep(4)
    report = run.drain("8. precise: owner + its disk lost, replicas=2", timeout=90)
    takeovers = _metric(replica, "delayservice_precise_takeovers_total")
    cleaned = _metric(replica, "delayservice_precise_replica_cleaned_total")
    report.notes.append(f"replica took over {takeovers:.0f}, cleaned {cleaned:.0f} copies")
    _verdict(run, report, fault_summary)
    assert takeovers > 0, "the replica never forwarded for the lost owner"
    assert cleaned > 0, "the replica never dropped a copy the owner reported done"


HOSTILE = 1500
GOOD = 600
HOSTILE_CANCELS = 200


def test_precise_hostile_records_and_cancels_never_stop_the_wheel(
    fault_run, kafka_bootstrap, fault_summary, tmp_path, testbed
):
    """Invariant 7 for precise mode: the same hostile envelopes as scenario 1, plus
    hostile cancel markers, all through the real daemon and its slot files."""
    rng = random.Random(SEED + 2)
    run = fault_run(
        kafka_bootstrap,
        levels="1s",
        precise=True,
        precise_topic=f"dp-fuzz-{testbed.tag}",
        data_dir=tmp_path / "wheel",
        max_delay="1m",
    )
    targets = [run.target("pfuzz-a"), run.target("pfuzz-b")]
    run.fleet.extra_env["DELAYSERVICE_RETRY_GIVE_UP_S"] = "15"
    daemon = run.fleet.spawn(f"pfuzz-{run.testbed.tag}")
    run.wait_ready(daemon)
    precise = run.settings.precise_topic
    factory = HostileFactory(
        rng,
        FuzzTopics(
            [(precise, 6000)],
            run.settings.partitions,
            targets,
            3,
            run.settings.dead_letter_topic,
            f"missing-{run.testbed.tag}",
        ),
    )
    hostile = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
    good = DelayProducer(
        {"bootstrap.servers": kafka_bootstrap, "linger.ms": 5},
        settings=run.settings,
        precision="exact",
    )
    cancel_values = [None, b"", b"\xff\xfe", "x" * 100_000, "no-such-id", "ü✓"]
    for i in range(HOSTILE + GOOD + HOSTILE_CANCELS):
        roll = rng.random()
        if roll < GOOD / (HOSTILE + GOOD + HOSTILE_CANCELS):
            good.produce(
                rng.choice(targets),
                rng.randbytes(rng.randint(1, 300)),
                f"good-{rng.randrange(100)}".encode(),
                delay=rng.randint(1, 6000) / 1000,
                on_delivery=run.sent.callback(good=True),
            )
        elif roll < (GOOD + HOSTILE_CANCELS) / (HOSTILE + GOOD + HOSTILE_CANCELS):
            value = rng.choice(cancel_values)
            headers = [("delay-cancel", value)] + (
                [("delay-v", b"1")] if rng.random() < 0.5 else []
            )
            hostile.produce(precise, rng.randbytes(10), None, headers=headers)
        else:
            partition, key, value, headers = factory.record(0)
            # Too big for any broker: never sent.
            with contextlib.suppress(KafkaException, BufferError, ValueError, TypeError):
                hostile.produce(
                    precise,
                    value,
                    key,
                    partition=partition,
                    headers=headers,
                    on_delivery=run.sent.callback(good=False),
                )
        if i % 100 == 0:
            hostile.poll(0)
            good.poll(0)
            time.sleep(0.2)  # pacing: about 25 s of traffic
    assert hostile.flush(60) == 0
    assert good.flush(60) == 0
    del hostile, good

    report = run.drain("9. precise: hostile fuzz + cancels", timeout=60)
    good_missing = [s.where() for s in report.ours if s.good and not s.deliveries]
    reasons = ", ".join(f"{r or '(empty)'} {n}" for r, n in report.dead_reasons.most_common())
    report.notes += [
        f"{sum(1 for s in report.ours if not s.good)} hostile, {HOSTILE_CANCELS} hostile cancels",
        f"dead letters: {reasons}",
    ]
    _verdict(run, report, fault_summary)
    assert not good_missing, f"{len(good_missing)} good records not forwarded: {good_missing[:5]}"
    assert wait_until(lambda: not list((tmp_path / "wheel").rglob("*.slot")), 30), (
        "slot files left behind after everything was forwarded or dead-lettered"
    )
