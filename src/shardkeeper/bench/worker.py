"""A bench instance: one Runtime in its own OS process, running one measured job.

``--records FILE``: every execution appends one JSON line when it starts (instance,
item, fire time, start time, failover flag). The line is written with one
``os.write`` on an ``O_APPEND`` descriptor, so it survives a kill -9 of this process
(the page cache keeps it) without paying an fsync per execution.

``--stats FILE``: every 0.2 s the runner's counters are written (atomically, by
rename) with a wall-clock stamp, for the throughput benchmark.

Prints ``READY <instance id> <wall time>`` once the runtime has started.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime


class BenchJob(ShardedJob):
    """Sleeps ``work`` seconds per item; records the start of each execution."""

    def __init__(self, records: str | None, work: float) -> None:
        self.records = records
        self.work = work
        self._fd = (
            os.open(records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if records else None
        )

    def execute(self, ctx: ShardingContext) -> None:
        """Record the start, then pretend to work."""
        start = time.time()
        if self._fd is not None:
            rec = {
                "instance": ctx.instance_id,
                "item": ctx.item,
                "fire": ctx.fire_time.timestamp(),
                "start": start,
                "failover": ctx.is_failover,
                "misfire": ctx.is_misfire,
            }
            os.write(self._fd, (json.dumps(rec) + "\n").encode())
        if self.work > 0:
            # sleep in slices so that a fenced or stopping execution ends early
            deadline = start + self.work
            while time.time() < deadline and not ctx.should_stop():
                time.sleep(min(0.05, max(0.0, deadline - time.time())))


def _write_stats(rt: Runtime, path: Path, stop: threading.Event) -> None:
    tmp = path.with_suffix(".tmp")
    while not stop.wait(0.2):
        runners = rt.runners
        stats: dict[str, float] = {"time": time.time(), "round_trips": rt.store.round_trips}
        for runner in runners.values():
            for key, value in runner.stats.items():
                stats[key] = stats.get(key, 0) + value
        tmp.write_text(json.dumps(stats))
        os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run one bench instance until SIGTERM."""
    p = argparse.ArgumentParser(prog="python -m shardkeeper.bench.worker")
    p.add_argument("--url", required=True)
    p.add_argument("--job", default="bench")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--records", default=None)
    p.add_argument("--stats", default=None)
    p.add_argument("--failover", action="store_true")
    p.add_argument("--no-monitor", action="store_true")
    p.add_argument("--no-misfire", action="store_true")
    p.add_argument("--worker-threads", type=int, default=8)
    p.add_argument("--grace", type=float, default=5.0)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s: %(message)s",
    )
    cfg = JobConfig.parse(
        name=args.job,
        interval=args.interval,
        sharding_total_count=args.count,
        failover=args.failover,
        monitor_execution=not args.no_monitor,
        misfire=not args.no_misfire,
    )
    rt = Runtime(args.url, worker_threads=args.worker_threads, shutdown_grace=args.grace)
    rt.add_job(BenchJob(args.records, args.work), cfg)
    try:
        rt.start()
    except Exception as exc:  # one line for the harness to read
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 3
    stop = threading.Event()
    if args.stats:
        threading.Thread(
            target=_write_stats, args=(rt, Path(args.stats), stop), daemon=True
        ).start()
    # the wall time at which the instance had registered (start() returned)
    print(f"READY {rt.instance_id} {time.time():.6f}", flush=True)
    try:
        rt.run_forever(install_signal_handlers=True)
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
