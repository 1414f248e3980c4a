"""A test instance whose item writes to a database through a fence (test_fencing_e2e.py).

One job with one item and failover on, in its own OS process. Each run appends a
``start`` line (its instance, token, execution id, whether it is a failover re-run) to
``--runs``, then:

* the first run of the item, on whichever instance (the one that creates the file
  ``--release`` + ``.held``), waits for the file ``--release`` to exist, so that the
  test can freeze its instance mid-item (SIGSTOP) and thaw it after the take-over: its
  write then comes late, as a zombie's would, without asking ``ctx.is_valid()`` first
  (the window a fence exists for);
* every later run (the survivor's failover re-run, or its run of a later fire, which
  may come first) writes at once.

The write is one transaction: claim the item's fence (:func:`shardkeeper.fencing.fenced`)
and upsert the item's row of ``report`` with the writer's token. Its outcome is a
``write`` line: accepted, or refused with the error.
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
from typing import Any

import sqlalchemy as sa

from shardkeeper.config import JobConfig
from shardkeeper.fencing import FencedWriteError, fenced
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime

METADATA = sa.MetaData()
#: the table the job writes: one row per item, with who wrote it last
REPORT = sa.Table(
    "report",
    METADATA,
    sa.Column("item", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("instance_id", sa.String(255), nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
)
#: the longest the first run waits for the release file (the test's own timeout is shorter)
RELEASE_WAIT = 150.0


def append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, written and fsynced at once (the test reads while we run)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class FencedReport(ShardedJob):
    """Writes the item's report row through the item's fence (see module docstring)."""

    def __init__(self, engine: sa.Engine, runs: Path, release: Path) -> None:
        self.engine = engine
        self.runs = runs
        self.release = release

    def execute(self, ctx: ShardingContext) -> None:
        run = {
            "instance": ctx.instance_id,
            "item": ctx.item,
            "token": ctx.fencing_token,
            "execution_id": ctx.execution_id,
            "failover": ctx.is_failover,
        }
        append(self.runs, {"event": "start", **run})
        if self._first_run():
            waiting = threading.Event()
            deadline = time.monotonic() + RELEASE_WAIT
            # a bounded poll inside the item, the test's signal to go on
            while not self.release.exists() and time.monotonic() < deadline:
                waiting.wait(0.05)
        valid = ctx.is_valid()
        try:
            with fenced(self.engine, ctx) as guard:
                guard.db.execute(sa.delete(REPORT).where(REPORT.c.item == ctx.item))
                guard.db.execute(
                    sa.insert(REPORT).values(
                        item=ctx.item, instance_id=ctx.instance_id, token=ctx.fencing_token
                    )
                )
        except FencedWriteError as exc:
            append(
                self.runs,
                {"event": "write", **run, "valid": valid, "accepted": False, "error": str(exc)},
            )
            return
        append(self.runs, {"event": "write", **run, "valid": valid, "accepted": True})

    def _first_run(self) -> bool:
        """True for the one run, of all instances, that creates the hold file."""
        try:
            os.close(os.open(f"{self.release}.held", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="the registry URL")
    p.add_argument("--db", required=True, help="the SQLAlchemy URL of the database")
    p.add_argument("--runs", required=True)
    p.add_argument("--release", required=True)
    p.add_argument("--job", default="fenced-report")
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    engine = sa.create_engine(args.db)
    cfg = JobConfig.parse(
        name=args.job, interval=args.interval, sharding_total_count=1, failover=True
    )
    rt = Runtime(args.url, shutdown_grace=2)
    rt.add_job(FencedReport(engine, Path(args.runs), Path(args.release)), cfg)
    rt.start()
    print(f"READY {rt.instance_id}", flush=True)
    rt.run_forever(install_signal_handlers=True)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
