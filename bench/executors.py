"""The executors side by side (issue 28 section 3): ``python -m bench.executors``.

1. **Per-item overhead**, no-op items: one attempt as the worker thread makes it,
   ``attempts.run_once`` (the thread executor, with and without an
   ``execution_timeout``, which runs the item in a thread of its own) against
   ``ProcessPool.run`` (a warm worker process: the item's context pickled to it, the
   outcome back), and the same with one ``ctx.is_valid()`` inside the item (one round
   trip to the parent). The coordination around an attempt (start commit, marks,
   completion commit) is the same for both executors and is not in these numbers.
2. **CPU-bound items with ``session_timeout=2``** on a real store: one instance, 8
   worker threads, a job of 8 items that each burn ``--burn`` seconds of pure-Python
   CPU every fire, for ``--seconds`` per executor. Counted: sessions lost (the
   store's LOST state), executions fenced, executions ok, and the housekeeping
   thread's largest lateness (how starved the store client's side of the process was).

``--quick`` runs each part briefly (the figures in docs/benchmarks.md name the
settings they came from). Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import Servers, percentile
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.registry.base import ConnectionState
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.execute.attempts import run_once
from shardkeeper.runtime.execute.procpool import ProcessPool, job_ref


class Noop(ShardedJob):
    """Returns at once."""

    def execute(self, ctx: ShardingContext) -> None:
        return None


class AsksOnce(ShardedJob):
    """Asks ``ctx.is_valid()`` once and returns."""

    def execute(self, ctx: ShardingContext) -> None:
        ctx.is_valid()


class Burns(ShardedJob):
    """Burns the CPU seconds of its ``job_parameter`` in pure Python (holding the
    GIL in a thread executor), checking ``ctx.is_valid()`` every 10 ms."""

    def execute(self, ctx: ShardingContext) -> None:
        end = time.process_time() + float(ctx.job_parameter)
        n = 0
        while time.process_time() < end:
            for i in range(20_000):
                n += i * i
            if not ctx.is_valid():
                return


def _context(job: str = "bench") -> ShardingContext:
    return ShardingContext(
        job_name=job,
        item=0,
        item_parameter="",
        sharding_total_count=1,
        job_parameter="",
        fire_time=datetime.now(UTC),
        instance_id="bench",
        execution_id=f"{job}@0#0",
        fencing_token=1,
    )


def _times(fn: Callable[[], Any], n: int) -> dict[str, float]:
    for _ in range(min(50, n)):  # warm: the child imports the job, caches warm up
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return {
        "n": n,
        "p50_us": round(percentile(samples, 50), 1),
        "p99_us": round(percentile(samples, 99), 1),
    }


def overhead(n: int) -> dict[str, Any]:
    """Part 1 (module docstring)."""
    ctx = _context()
    pool = ProcessPool(1)
    noop, asks = job_ref("bench", Noop), job_ref("bench", AsksOnce)
    try:
        out: dict[str, Any] = {
            "thread": _times(lambda: run_once(Noop(), ctx, None, lambda: None), n),
            "thread_with_timeout": _times(lambda: run_once(Noop(), ctx, 60.0, lambda: None), n),
            "process": _times(lambda: pool.run(noop, ctx, None, lambda: None), n),
            "process_with_timeout": _times(lambda: pool.run(noop, ctx, 60.0, lambda: None), n),
            "thread_is_valid": _times(lambda: run_once(AsksOnce(), ctx, None, lambda: None), n),
            "process_is_valid": _times(lambda: pool.run(asks, ctx, None, lambda: None), n),
        }
        out["process_children_started"] = pool.stats.started
    finally:
        pool.shutdown()
    return out


class _Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[str, int] = {}

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            key = str(record.outcome)
            self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def on_skip(self, record: SkipRecord) -> None:
        pass


def cpu_bound(url: str, executor: str, seconds: float, burn: float) -> dict[str, Any]:
    """Part 2 for one executor (module docstring)."""
    seen = _Seen()
    lost = [0]

    rt = Runtime(url, worker_threads=8, shutdown_grace=burn + 5, observers=[seen])
    rt.add_job(
        Burns,
        JobConfig(
            name=f"burn-{executor}",
            interval=max(1.0, round(burn + 1)),
            sharding_total_count=8,
            job_parameter=str(burn),
            executor=executor,
        ),
    )

    def on_state(state: ConnectionState) -> None:
        if state is ConnectionState.LOST:
            lost[0] += 1

    rt.start()
    rt.store.add_state_listener(on_state)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rt.wait_stopped(min(0.5, max(0.0, deadline - time.monotonic())))
        lateness = rt.heartbeat_lateness() or (0.0, 0.0)
    finally:
        rt.stop()
    runner_stats = next(iter(rt.runners.values())).stats
    return {
        "executor": executor,
        "seconds": seconds,
        "burn_s_per_item": burn,
        "sessions_lost": lost[0],
        "outcomes": dict(seen.outcomes),
        "fenced": runner_stats.get("fenced", 0),
        "max_heartbeat_lateness_s": round(lateness[1], 3),
    }


def main() -> None:
    """Run both parts; print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--items", type=int, default=None, help="attempts per overhead case")
    parser.add_argument("--seconds", type=float, default=None, help="CPU part, per executor")
    parser.add_argument("--burn", type=float, default=3.0, help="CPU seconds per item")
    parser.add_argument("--backend", default="zookeeper", choices=("zookeeper", "etcd"))
    args = parser.parse_args()
    n = args.items or (300 if args.quick else 2000)
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    result: dict[str, Any] = {"cpus": os.cpu_count(), "overhead": overhead(n)}
    servers = Servers(Path(tempfile.mkdtemp(prefix="bench-executors-")))
    try:
        cluster = servers.get(args.backend)
        result["cpu_bound"] = [
            cpu_bound(
                cluster.url(f"bench-exec-{executor}-{os.getpid()}", session_timeout=2),
                executor,
                seconds,
                args.burn,
            )
            for executor in ("thread", "process")
        ]
        result["backend"] = args.backend
    finally:
        servers.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
