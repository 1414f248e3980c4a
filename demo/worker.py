"""One demo instance: the example job on a :class:`~shardkeeper.runtime.Runtime`.

The story starts several of these as separate OS processes::

    python -m demo.worker --registry URL --name w1 --journal w1.jsonl

Each execution prints one line (instance, item, parameter) and appends ``start`` and
``end`` events to the journal; the process also records ``ready`` once its runtime
has started and ``stopped`` after a graceful stop. SIGTERM/SIGINT stop it
gracefully (the runtime's own handling). It exits by itself when the process that
started it goes away, so a killed demo never leaves workers behind.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from demo import ITEM_PARAMETERS, JOB_NAME
from demo.journal import JournalWriter
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime.runtime import Runtime

__all__ = ["DemoJob", "demo_config", "main"]


def demo_config(cron: str) -> JobConfig:
    """The demo job's configuration: 8 items, failover on, fired by ``cron``."""
    return JobConfig.parse(
        name=JOB_NAME,
        cron=cron,
        sharding_total_count=len(ITEM_PARAMETERS),
        sharding_item_parameters=ITEM_PARAMETERS,
        failover=True,
        monitor_execution=True,
        description="shardkeeper demo: orders of one city per item",
    )


class DemoJob(ShardedJob):
    """Pretends to process the orders of one city for ``work_seconds``.

    The work takes long enough that an instance killed at a random moment is
    usually in the middle of an item, which is what failover is about.
    """

    def __init__(self, journal: JournalWriter, work_seconds: float) -> None:
        self.journal = journal
        self.work_seconds = work_seconds

    def execute(self, ctx: ShardingContext) -> None:
        """Record the start, work (stopping early if fenced off), record the end."""
        fields = {
            "item": ctx.item,
            "param": ctx.item_parameter,
            "fire": ctx.fire_time.timestamp(),
            "execution_id": ctx.execution_id,
            "failover": ctx.is_failover,
            "misfire": ctx.is_misfire,
        }
        self.journal.write("start", **fields)
        tag = " (failover)" if ctx.is_failover else " (misfire)" if ctx.is_misfire else ""
        print(
            f"{self.journal.worker} {ctx.instance_id}: item {ctx.item} {ctx.item_parameter!r} "
            f"fired {ctx.fire_time:%H:%M:%S}{tag}",
            flush=True,
        )
        deadline = time.monotonic() + self.work_seconds
        # Work in small steps so that an execution fenced off (session lost) stops
        # writing at once, as real jobs should.
        while time.monotonic() < deadline and ctx.is_valid():
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        self.journal.write("end", ok=ctx.is_valid(), **fields)


def _watch_parent(parent_pid: int) -> None:
    # Re-parenting (our parent died, even by SIGKILL) changes getppid(); a worker
    # must not outlive the demo that owns it.
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one demo instance until SIGTERM/SIGINT; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m demo.worker")
    parser.add_argument("--registry", required=True, help="registry URL")
    parser.add_argument("--name", required=True, help="short name shown by the demo (w1...)")
    parser.add_argument("--journal", required=True, type=Path, help="JSON-lines event file")
    parser.add_argument("--cron", default="*/2 * * * * *", help="trigger (seconds first)")
    parser.add_argument("--work", type=float, default=1.0, help="seconds per item")
    parser.add_argument("--grace", type=float, default=5.0, help="shutdown grace, seconds")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when it is gone")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
    )
    if args.parent_pid:
        threading.Thread(
            target=_watch_parent, args=(args.parent_pid,), name="parent-watch", daemon=True
        ).start()
    journal = JournalWriter(args.journal, args.name)
    runtime = Runtime(
        args.registry,
        worker_threads=len(ITEM_PARAMETERS),
        shutdown_grace=args.grace,
        labels={"demo-name": args.name},
    )
    journal.instance_id = runtime.instance_id
    runtime.add_job(DemoJob(journal, args.work), demo_config(args.cron))
    runtime.start()
    journal.write("ready", pid=os.getpid())
    print(f"{args.name} {runtime.instance_id}: started", flush=True)
    try:
        runtime.run_forever()
    finally:
        runtime.stop()
    journal.write("stopped", pid=os.getpid())
    journal.close()
    print(f"{args.name} {runtime.instance_id}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
