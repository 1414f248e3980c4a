"""A bench instance: one Runtime in its own OS process, running one measured job.

``--records FILE``: every execution appends one JSON line when it starts (instance,
item, fire time, start time, failover flag). The line is written with one
``os.write`` on an ``O_APPEND`` descriptor, so it survives a kill -9 of this process
(the page cache keeps it) without paying an fsync per execution.

``--stats FILE``: every 0.2 s the runner's counters are written (atomically, by
rename) with a wall-clock stamp, for the throughput benchmark, with the fires
queued on the coordinator (``JobRunner.pending_fires()``) and the largest age of a
fire at the start of one of its items (start minus fire time) since the last
sample. ``--stats-log FILE`` appends every such sample as one JSON line (the
overload benchmark's time series).

``--drive SECONDS``: the job is registered on a yearly cron (it never fires by
itself) and a bench thread fires it every ``SECONDS`` instead, on epoch-anchored
fire times (the same times on every instance, as the interval trigger gives) by
calling ``JobRunner.on_trigger``, the method a scheduler fire ends in. This drives
a job faster than the shortest interval a configuration accepts (0.1 s), for the
throughput and overload benchmarks.

``--no-poll``: an item sleeps its whole ``work`` without looking at
``ctx.should_stop()``, like a job that never checks it.

Prints ``READY <instance id> <wall time>`` once the runtime has started.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.counting import request_count
from shardkeeper.runtime import Runtime


class BenchJob(ShardedJob):
    """Sleeps ``work`` seconds per item; records the start of each execution."""

    def __init__(self, records: str | None, work: float, *, poll: bool = True) -> None:
        self.records = records
        self.work = work
        self.poll = poll
        self._fd = (
            os.open(records, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if records else None
        )
        self._age_lock = threading.Lock()
        #: largest (start - fire time) since the last :meth:`take_age`: all starts,
        #: and those of normal fires (not misfire re-runs, not failover runs)
        self._age_max = 0.0
        self._age_max_normal = 0.0

    def take_age(self) -> tuple[float, float]:
        """The largest fire ages since the last call (all, normal fires), then reset."""
        with self._age_lock:
            out = (self._age_max, self._age_max_normal)
            self._age_max = self._age_max_normal = 0.0
        return out

    def execute(self, ctx: ShardingContext) -> None:
        """Record the start, then pretend to work."""
        start = time.time()
        age = start - ctx.fire_time.timestamp()
        with self._age_lock:
            self._age_max = max(self._age_max, age)
            if not ctx.is_misfire and not ctx.is_failover:
                self._age_max_normal = max(self._age_max_normal, age)
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
        if self.work > 0 and not self.poll:
            time.sleep(self.work)  # a job that never asks whether it should stop
        elif self.work > 0:
            # sleep in slices so that a fenced or stopping execution ends early
            deadline = start + self.work
            while time.time() < deadline and not ctx.should_stop():
                time.sleep(min(0.05, max(0.0, deadline - time.time())))


def _write_stats(
    rt: Runtime, job: BenchJob, path: Path, log_path: Path | None, stop: threading.Event
) -> None:
    tmp = path.with_suffix(".tmp")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log_path else None
    while not stop.wait(0.2):
        runners = rt.runners
        age, age_normal = job.take_age()
        stats: dict[str, float] = {
            "time": time.time(),
            "round_trips": request_count(rt.store),
            "pending_fires": sum(r.pending_fires() for r in runners.values()),
            "age_max": age,
            "age_max_normal": age_normal,
        }
        for runner in runners.values():
            for key, value in runner.stats.items():
                stats[key] = stats.get(key, 0) + value
        line = json.dumps(stats)
        tmp.write_text(line)
        os.replace(tmp, path)
        if log_fd is not None:
            os.write(log_fd, (line + "\n").encode())


#: a cron that never fires during a benchmark (the driver fires the job instead)
YEARLY = "0 0 1 1 *"


def _drive(rt: Runtime, job: str, every: float, stop: threading.Event) -> None:
    """Fire ``job`` at every multiple of ``every`` seconds since the epoch."""
    runner = rt.runners[job]
    tick = math.floor(time.time() / every) + 1
    while not stop.is_set():
        due = tick * every
        delay = due - time.time()
        if delay > 0:
            stop.wait(delay)
            continue
        runner.on_trigger(datetime.fromtimestamp(due, UTC))
        # a driver that fell behind skips the ticks it missed, like a scheduler
        # whose misfire grace is over
        tick = max(tick + 1, math.floor(time.time() / every))


def main(argv: list[str] | None = None) -> int:
    """Run one bench instance until SIGTERM."""
    p = argparse.ArgumentParser(prog="python -m bench.worker")
    p.add_argument("--url", required=True)
    p.add_argument("--job", default="bench")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--records", default=None)
    p.add_argument("--stats", default=None)
    p.add_argument("--stats-log", default=None)
    p.add_argument("--no-poll", action="store_true")
    p.add_argument("--drive", type=float, default=None)
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
    schedule: dict[str, str | float] = (
        {"cron": YEARLY} if args.drive is not None else {"interval": args.interval}
    )
    cfg = JobConfig.parse(
        name=args.job,
        **schedule,
        sharding_total_count=args.count,
        failover=args.failover,
        monitor_execution=not args.no_monitor,
        misfire=not args.no_misfire,
    )
    rt = Runtime(args.url, worker_threads=args.worker_threads, shutdown_grace=args.grace)
    job = BenchJob(args.records, args.work, poll=not args.no_poll)
    rt.add_job(job, cfg)
    try:
        rt.start()
    except Exception as exc:  # one line for the harness to read
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 3
    stop = threading.Event()
    if args.stats:
        threading.Thread(
            target=_write_stats,
            args=(
                rt,
                job,
                Path(args.stats),
                Path(args.stats_log) if args.stats_log else None,
                stop,
            ),
            daemon=True,
        ).start()
    if args.drive is not None:
        threading.Thread(target=_drive, args=(rt, args.job, args.drive, stop), daemon=True).start()
    # the wall time at which the instance had registered (start() returned)
    print(f"READY {rt.instance_id} {time.time():.6f}", flush=True)
    try:
        rt.run_forever(install_signal_handlers=True)
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
