"""Insert, cancel half, expire the rest: every timer design next to heapq and asyncio.

    python benchmarks/timers.py                       # 10k, 100k, 1M (a few minutes)
    python benchmarks/timers.py --sizes 10000,100000  # quick

Dues are whole milliseconds spread uniformly over (0, 60] s (like the daemon's due_ms/1000).
Time is simulated: expiry means moving the clock past the last due time and letting
each design hand out everything, so it measures the data structure, not sleeping.
The garbage collector is off while a phase is timed (as `timeit` does) unless --gc is
given: with a million live objects its full passes would be charged to whichever
design happened to trigger one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from delayservice.timers.delay_queue import DelayQueue
from delayservice.timers.factory import make_scheduler
from delayservice.timers.hashed_wheel import HashedWheelTimer
from delayservice.timers.purgatory import DelayedOperation, DelayedOperationPurgatory
from delayservice.timers.system_timer import SystemTimer, TimerTask

SPAN_MS = 60_000
START = 1_700_000_000.0  # epoch seconds, as the daemon's clock reads


class SimClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class SimClockMs:
    def __init__(self) -> None:
        self.now = int(START * 1000)

    def __call__(self) -> int:
        return self.now


class InlineExecutor(Executor):
    """Runs expired tasks at once; one shared Future so the executor costs next to nothing."""

    _done: Future[Any] = Future()
    _done.set_result(None)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fn(*args, **kwargs)
        return self._done


@dataclass
class Result:
    design: str
    n: int
    insert: float  # seconds, whole phase
    cancel: float
    expire: float

    @property
    def total(self) -> float:
        return self.insert + self.cancel + self.expire

    @property
    def per_insert(self) -> float:
        return self.insert / self.n * 1e9

    @property
    def per_cancel(self) -> float:
        return self.cancel / (self.n // 2) * 1e9

    @property
    def per_expire(self) -> float:
        return self.expire / (self.n - self.n // 2) * 1e9

    @property
    def insert_expire(self) -> float:
        """ns per task for insert + expire, the cost a task pays when it is not cancelled."""
        return (self.insert + self.expire) / self.n * 1e9


class Phases:
    """Times the three phases; the design supplies insert(i, due_ms), cancel(h), expire()."""

    def __init__(self, keep_gc: bool) -> None:
        self.keep_gc = keep_gc

    def timed(self, phase: Callable[[], Any]) -> tuple[float, Any]:
        gc.collect()
        if not self.keep_gc:
            gc.disable()
        try:
            started = time.perf_counter()
            out = phase()
            return time.perf_counter() - started, out
        finally:
            gc.enable()

    def run(self, design: str, n: int, dues_ms: list[int], make: Callable[[], Any]) -> Result:
        insert, cancel, expire = make()
        t_insert, handles = self.timed(lambda: [insert(i, d) for i, d in enumerate(dues_ms)])
        t_cancel, _ = self.timed(lambda: [cancel(h) for h in handles[::2]])
        t_expire, fired = self.timed(expire)
        if fired != n - n // 2:
            raise AssertionError(f"{design}: {fired} fired, expected {n - n // 2}")
        return Result(design, n, t_insert, t_cancel, t_expire)


# -- the designs: each returns (insert, cancel, expire -> number fired) -------------
def plain_heapq() -> tuple[Any, Any, Any]:
    heap: list[list[Any]] = []
    push, pop = heapq.heappush, heapq.heappop

    def insert(i: int, due_ms: int) -> list[Any]:
        entry = [due_ms / 1000, i, i, True]  # the heapq docs' lazy-delete entry
        push(heap, entry)
        return entry

    def cancel(entry: list[Any]) -> None:
        entry[3] = False

    def expire() -> int:
        now = START + SPAN_MS / 1000
        fired = []
        while heap and heap[0][0] <= now:
            entry = pop(heap)
            if entry[3]:
                fired.append(entry[2])
        return len(fired)

    return insert, cancel, expire


def asyncio_call_at() -> tuple[Any, Any, Any]:
    class SimLoop(asyncio.SelectorEventLoop):
        now = START

        def time(self) -> float:
            return self.now

    loop = SimLoop()
    fired: list[int] = []
    callback = fired.append

    def expire() -> int:
        # asyncio runs a timer only when `when < time() + resolution`; at epoch scale the
        # 1 ns resolution rounds away, so a timer due exactly now would wait a turn.
        loop.now = START + SPAN_MS / 1000 + 0.001
        loop.call_soon(loop.stop)
        loop.run_forever()  # one iteration runs every timer due by now
        loop.close()
        return len(fired)

    return (lambda i, d: loop.call_at(d / 1000, callback, i)), (lambda h: h.cancel()), expire


def scheduler(kind: str) -> Callable[[], tuple[Any, Any, Any]]:
    def make() -> tuple[Any, Any, Any]:
        clock = SimClock()
        sched: Any = DelayQueue(clock) if kind == "heap" else make_scheduler("wheel", clock)
        schedule = sched.schedule

        def expire() -> int:
            clock.now = START + SPAN_MS / 1000
            return len(sched.take_expired(0))

        return (lambda i, d: schedule(i, d / 1000)), sched.cancel, expire

    return make


def hashed_wheel() -> tuple[Any, Any, Any]:
    clock = SimClock()
    timer = HashedWheelTimer(0.001, 512, clock=clock, start_worker=False)
    fired: list[Any] = []
    task = fired.append
    new_timeout_at = timer.new_timeout_at

    def expire() -> int:
        clock.now = START + SPAN_MS / 1000 + 0.002  # Netty fires on the tick boundary after
        timer.advance()
        return len(fired)

    return (lambda i, d: new_timeout_at(task, d / 1000)), (lambda t: t.cancel()), expire


FIRED = [0]  # expired tasks and operations, counted by the tasks themselves


class CountingTask(TimerTask):
    def run(self) -> None:
        FIRED[0] += 1


class NeverReady(DelayedOperation):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        FIRED[0] += 1


def ms_timer_design(kind: str) -> Callable[[], tuple[Any, Any, Any]]:
    """Kafka's SystemTimer on simulated ms, alone or under a purgatory, tasks run inline."""

    def make() -> tuple[Any, Any, Any]:
        clock = SimClockMs()
        start = clock.now
        timer = SystemTimer(
            "bench", tick_ms=1, wheel_size=512, clock_ms=clock, executor=InlineExecutor()
        )
        FIRED[0] = 0
        if kind == "purgatory":
            purg: DelayedOperationPurgatory[NeverReady] = DelayedOperationPurgatory(
                "bench", timer, reaper_enabled=False
            )
            advance: Callable[[int], Any] = purg.advance_clock

            def insert(i: int, due_ms: int) -> Any:
                op = NeverReady(due_ms - start)
                purg.try_complete_else_watch(op, (i % 1024,))
                return op

            # Cancel in a purgatory is completing before the deadline: force_complete
            # takes the operation out of the timer through its back-pointer.
            cancel: Callable[[Any], Any] = NeverReady.force_complete
        else:
            advance = timer.advance_clock

            def insert(i: int, due_ms: int) -> Any:
                task = CountingTask(due_ms - start)
                timer.add(task)
                return task

            cancel = CountingTask.cancel

        def expire() -> int:
            clock.now = start + SPAN_MS
            advance(0)
            return FIRED[0]

        return insert, cancel, expire

    return make


DESIGNS: dict[str, Callable[[], tuple[Any, Any, Any]]] = {
    "heapq (plain)": plain_heapq,
    "asyncio call_at": asyncio_call_at,
    "DelayQueue": scheduler("heap"),
    "HashedWheelTimer": hashed_wheel,
    "SystemTimer (Kafka wheel)": ms_timer_design("system-timer"),
    "WheelScheduler (factory 'wheel')": scheduler("wheel"),
    "Purgatory (SystemTimer)": ms_timer_design("purgatory"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="best of N rounds below 1M tasks")
    parser.add_argument("--repeat-large", type=int, default=1, help="rounds at 1M tasks and up")
    parser.add_argument("--designs", default="", help="comma-separated name prefixes")
    parser.add_argument("--gc", action="store_true", help="keep the garbage collector on")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    chosen = [
        d for d in DESIGNS if not args.designs or d.startswith(tuple(args.designs.split(",")))
    ]
    phases = Phases(args.gc)
    results: dict[tuple[str, int], Result] = {}
    order = ["heapq (plain)", *[d for d in chosen if d != "heapq (plain)"]]
    for n in sizes:
        rnd = random.Random(n)
        dues = [int(START * 1000) + rnd.randrange(1, SPAN_MS + 1) for _ in range(n)]
        # Rounds interleave the designs, so a burst of load on a shared machine costs
        # all of them alike; each keeps its best round.
        for _ in range(args.repeat if n < 1_000_000 else args.repeat_large):
            for design in order:
                run = phases.run(design, n, dues, DESIGNS[design])
                best = results.get((design, n))
                if best is None or run.total < best.total:
                    results[design, n] = run
        print(f"  measured {n:,} tasks", file=sys.stderr, flush=True)
    print_tables(results, sizes, order)


def print_tables(
    results: dict[tuple[str, int], Result], sizes: list[int], designs: list[str]
) -> None:
    columns = [
        "design",
        "tasks",
        "insert ns",
        "cancel ns",
        "expire ns/fired",
        "insert+expire ns/task",
        "vs heapq (insert+expire)",
        "cancel vs heapq",
    ]
    print()
    print("| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for n in sizes:
        base = results["heapq (plain)", n]
        for design in designs:
            r = results[design, n]
            cells = [
                design,
                f"{n:,}",
                f"{r.per_insert:,.0f}",
                f"{r.per_cancel:,.0f}",
                f"{r.per_expire:,.0f}",
                f"{r.insert_expire:,.0f}",
                f"{r.insert_expire / base.insert_expire:.2f}x",
                f"{r.per_cancel / base.per_cancel:.1f}x",
            ]
            print("| " + " | ".join(cells) + " |")
    print()
    print("Flatness: insert+expire ns per task as the number of tasks grows")
    print()
    print("| design | " + " | ".join(f"{n:,}" for n in sizes) + " | largest / smallest |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for design in designs:
        costs = [results[design, n].insert_expire for n in sizes]
        row = " | ".join(f"{c:,.0f}" for c in costs)
        print(f"| {design} | {row} | {costs[-1] / costs[0]:.2f}x |")


if __name__ == "__main__":
    main()
