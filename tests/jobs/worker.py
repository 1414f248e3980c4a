"""A test instance: runs one recording job in its own OS process.

Every execution appends one JSON line (instance, item, fire time, token, start,
end, outcome, failover, misfire) to ``--log`` and fsyncs it, so a test (or the
chaos checker) can read what happened even after a kill -9. While it works, an
execution checks ``ctx.is_valid()`` every 50 ms and records the time just before its
last check that said true (``valid_through``) and of its first one that said false
(``invalid_at``): the chaos checker uses them to tell a fenced zombie from two
executions that both believed they were valid. The log also gets a ``state`` line for
every connection-state change of the runtime's store and an ``exit`` line when the
runtime stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry import ConnectionState
from shardkeeper.runtime import Runtime


class RecordingJob(ShardedJob):
    """Sleeps ``work`` seconds per item and records each execution."""

    def __init__(self, log_path: str, work: float, fail_items: set[int]) -> None:
        self.log_path = log_path
        self.work = work
        self.fail_items = fail_items

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (and fsync it)."""
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def execute(self, ctx: ShardingContext) -> None:
        start = time.time()
        base = {
            "instance": ctx.instance_id,
            "item": ctx.item,
            "param": ctx.item_parameter,
            "fire": ctx.fire_time.timestamp(),
            "token": ctx.fencing_token,
            "execution_id": ctx.execution_id,
            "failover": ctx.is_failover,
            "misfire": ctx.is_misfire,
            "start": start,
        }
        covers = getattr(ctx, "covers", None)  # the fires a misfire fold stands for
        if covers:  # (the chaos checker's strict rules require them)
            base["covers"] = [
                float(x.timestamp()) if hasattr(x, "timestamp") else float(x) for x in covers
            ]
        if ctx.params:  # an operator's run-now params
            base["params"] = dict(ctx.params)
        self._write({**base, "phase": "start"})
        deadline = start + self.work
        valid_through: float | None = None
        invalid_at: float | None = None
        while True:
            before = time.time()
            if ctx.is_valid():
                valid_through = before
            elif invalid_at is None:
                invalid_at = before
            if before >= deadline:
                break
            time.sleep(min(0.05, max(0.0, deadline - time.time())))
        self._write(
            {
                **base,
                "phase": "end",
                "end": time.time(),
                "valid": invalid_at is None,
                "valid_through": valid_through,
                "invalid_at": invalid_at,
            }
        )
        if ctx.item in self.fail_items:
            raise RuntimeError(f"item {ctx.item} fails on purpose")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--job", default="job")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--cron", default=None)
    p.add_argument("--at", default=None, help="a one-off job's time (ISO 8601 with a zone)")
    p.add_argument("--sharding-wait", type=float, default=5.0)
    p.add_argument("--log", required=True)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--failover", action="store_true")
    p.add_argument("--no-misfire", action="store_true")
    p.add_argument("--no-monitor", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--fail-items", default="")
    p.add_argument("--params", default="")
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument("--class-name", default=None, help="pretend to be another job class")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    cfg = JobConfig.parse(
        name=args.job,
        interval=None if args.cron or args.at else args.interval,
        cron=args.cron,
        at=args.at,
        sharding_wait_timeout=args.sharding_wait,
        sharding_total_count=args.count,
        sharding_item_parameters=args.params,
        failover=args.failover,
        misfire=not args.no_misfire,
        monitor_execution=not args.no_monitor,
        overwrite=args.overwrite,
        job_class=args.class_name,
    )
    fail = {int(x) for x in args.fail_items.split(",") if x}
    rt = Runtime(args.url, shutdown_grace=args.grace)
    job = RecordingJob(args.log, args.work, fail)
    rt.add_job(job, cfg)

    def on_state(state: ConnectionState) -> None:
        job.write(
            {"phase": "state", "instance": rt.instance_id, "state": state.value, "t": time.time()}
        )

    rt.store.add_state_listener(on_state)
    try:
        rt.start()
    except Exception as exc:  # report the refusal on one line for the test to read
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 3
    print(f"READY {rt.instance_id}", flush=True)
    rt.run_forever(install_signal_handlers=True)
    job.write({"phase": "exit", "instance": rt.instance_id, "t": time.time()})
    print("STOPPED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
