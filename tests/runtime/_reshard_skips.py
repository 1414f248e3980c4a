"""How many fires a reshard costs a job whose items outlast its interval (issue 35
section 4), measured on a real store.

Three instances run one job of 6 items every 2 s, each item working 5 s (and
polling ``ctx.should_stop()``), misfire on, the default timeouts
(``sharding_wait_timeout`` and ``execution_wait_timeout``, 5 s each). A fourth
instance joins, and once the reshard that gives it items is committed and a few
fires have gone by, it leaves gracefully: two reshards a cycle. Counted, over every
instance: the fires skipped because "resharding did not finish in time", per
reshard committed.

Used by tests/runtime/test_reshard_fires.py, and as a script for the figures::

    python -m tests.runtime._reshard_skips --backend zookeeper --cycles 5
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.counters import SkipReason
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

JOB = "reshard-long"
ITEMS = 6
INTERVAL = 2.0
#: each item's work: 2.5 intervals (the 600 s chaos runs' `long` job)
WORK = 5.0
#: fires left to go by after each reshard before the next membership change
SETTLE = 8.0


class LongItems(ShardedJob):
    """Works ``WORK`` seconds, polling should_stop() as the docs teach."""

    def execute(self, ctx: ShardingContext) -> None:
        """The item's work: a bounded wait standing for it."""
        end = time.monotonic() + WORK
        pause = threading.Event()
        while time.monotonic() < end and not ctx.should_stop():
            pause.wait(0.02)


@dataclass
class Seen:
    """Every skip and execution record of every instance (thread-safe)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    skips: list[SkipRecord] = field(default_factory=list)
    executions: list[ExecutionRecord] = field(default_factory=list)

    def on_execution(self, record: ExecutionRecord) -> None:
        """Keep it."""
        with self.lock:
            self.executions.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        """Keep it."""
        with self.lock:
            self.skips.append(record)

    def reshard_timeouts(self, since: float = 0.0) -> list[SkipRecord]:
        """Skips "resharding did not finish in time" of fires from ``since`` on."""
        with self.lock:
            return [
                s
                for s in self.skips
                if s.reason == SkipReason.RESHARD_TIMEOUT.value and s.fire_time >= since
            ]


def config(**overrides: Any) -> JobConfig:
    """The job: 6 items every second, misfire on, the default timeouts."""
    return JobConfig(
        name=JOB, interval=INTERVAL, sharding_total_count=ITEMS, misfire=True, **overrides
    )


@dataclass
class Result:
    """What one run measured."""

    reshards: int
    skipped: int
    #: seconds from each membership change to the reshard that follows it
    latencies: list[float]
    #: every skip record counted, by reason
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def per_reshard(self) -> float:
        """Fires skipped ("resharding did not finish") per reshard."""
        return self.skipped / self.reshards if self.reshards else 0.0

    def __str__(self) -> str:
        lat = (
            f"{statistics.median(self.latencies):.2f} s median, {max(self.latencies):.2f} s max"
            if self.latencies
            else "-"
        )
        return (
            f"{self.reshards} reshards, {self.skipped} fires skipped as 'resharding did not "
            f"finish in time' ({self.per_reshard:.2f} per reshard); membership change to "
            f"reshard: {lat}; all skips: {self.reasons}"
        )


def measure(url: str, cycles: int, runtimes: list[Runtime], **overrides: Any) -> Result:
    """Run ``cycles`` join/leave cycles of a fourth instance beside three (their
    runtimes are appended to ``runtimes``: the caller stops them)."""
    seen = Seen()
    job = LongItems()

    def start() -> Runtime:
        rt = Runtime(url, shutdown_grace=10, worker_threads=8, observers=[seen])
        rt.add_job(job, config(**overrides))
        runtimes.append(rt)
        rt.start()
        return rt

    base = [start() for _ in range(3)]

    def owners() -> set[str]:
        for rt in base:
            try:
                assignment = rt.runners[JOB].assignment()
            except Exception:  # a store hiccup: look again
                continue
            if assignment is not None:
                return set(assignment.owners.values())
        return set()

    def reshards() -> int:
        return sum(rt.runners[JOB].state.stats.get("reshards", 0) for rt in runtimes)

    ids = {rt.instance_id for rt in base}
    wait_until(lambda: owners() == ids, 60, message="the three never shared the items")
    # not a synchronisation: the measured load, several fires of long items, goes by
    time.sleep(SETTLE)
    counted_from = time.time()
    before = reshards()
    latencies: list[float] = []
    for _ in range(cycles):
        joined = time.monotonic()
        extra = start()

        def has_items(joiner: str = extra.instance_id) -> bool:
            return joiner in owners()

        wait_until(has_items, 60, message="the joiner never got items")
        latencies.append(time.monotonic() - joined)
        time.sleep(SETTLE)  # fires under the new assignment go by
        left = time.monotonic()
        extra.stop()
        wait_until(lambda: owners() == ids, 60, message="the leaver kept its items")
        latencies.append(time.monotonic() - left)
        time.sleep(SETTLE)
    done = reshards() - before
    with seen.lock:
        reasons = Counter(s.reason for s in seen.skips if s.fire_time >= counted_from)
    return Result(done, len(seen.reshard_timeouts(counted_from)), latencies, dict(reasons))


def main() -> None:
    """Start a single-node server of the backend, measure, print the figures."""
    from shardkeeper.testing.servers import EtcdCluster, ZooKeeperCluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["zookeeper", "etcd"], default="zookeeper")
    p.add_argument("--cycles", type=int, default=5)
    args = p.parse_args()
    server = ZooKeeperCluster(1) if args.backend == "zookeeper" else EtcdCluster(1)
    server.start()
    runtimes: list[Runtime] = []
    try:
        url = server.url("reshard-skips", session_timeout=2.0, operation_timeout=2.0)
        print(f"{args.backend}: {measure(url, args.cycles, runtimes)}", flush=True)
    finally:
        for rt in runtimes:
            rt.stop_now()
        server.stop()


if __name__ == "__main__":
    main()
