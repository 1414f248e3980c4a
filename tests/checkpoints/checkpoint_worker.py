"""A test instance whose long item checkpoints every step (test_checkpoint_failover_e2e.py).

One job with one item and failover on, in its own OS process, on the thread or the
process executor. Each run appends JSON lines to ``--runs`` (written and fsynced at
once: the test reads them while the instance runs, and after a kill -9):

* ``start``: its instance, execution id, fire, fencing token, whether it is a
  failover re-run, ``resumed`` and ``resume_state``;
* the one run, of all instances, that creates the file ``--hold`` (the first run of
  the item) is the long item: from its state on, step after step until it is killed,
  a ``try`` line before ``ctx.checkpoint(step)`` and an ``ok`` (or ``refused``) line
  after its answer. So the test knows the last accepted checkpoint, up to the one
  step whose commit the store may have accepted just before the kill came (its
  ``try`` is written, its ``ok`` is not);
* every other run (the survivor's re-run of that fire, or its runs of later fires)
  takes :data:`STEPS` more steps from its state and ends with a ``done`` line.

The job lives in this module and is given to the runtime as a class (a worker
process imports it: the test runs this file with the repository on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime

#: steps a run that is not the long one takes
STEPS = 5
#: seconds between two steps of the long run (a bounded wait in the item)
STEP = 0.02
#: the long run stops by itself after this many steps (the test kills it long before)
MAX_STEPS = 100_000


def append(path: Path, record: dict[str, Any]) -> None:
    """One JSON line, written and fsynced at once."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Stepping(ShardedJob):
    """See the module docstring. The files come from the environment (a class is
    called with no argument in a worker process, and inherits the environment)."""

    def __init__(self) -> None:
        self.runs = Path(os.environ["SK_TEST_RUNS"])
        self.hold = Path(os.environ["SK_TEST_HOLD"])

    def execute(self, ctx: ShardingContext) -> None:
        run = {
            "instance": ctx.instance_id,
            "execution_id": ctx.execution_id,
            "fire_ms": round(ctx.fire_time.timestamp() * 1000),
            "token": ctx.fencing_token,
            "failover": ctx.is_failover,
            "pid": os.getpid(),
        }
        resumed, resume_state = ctx.resumed, ctx.resume_state
        append(self.runs, {"event": "start", **run, "resumed": resumed, "state": resume_state})
        start = int(resume_state or 0)
        if not self._long_run():
            for step in range(start + 1, start + STEPS + 1):
                ok = ctx.checkpoint(step)
                append(self.runs, {"event": "ok" if ok else "refused", **run, "step": step})
            append(self.runs, {"event": "done", **run, "state": ctx.state})
            return
        pause = threading.Event()
        for step in range(start + 1, MAX_STEPS):
            append(self.runs, {"event": "try", **run, "step": step})
            ok = ctx.checkpoint(step)
            append(self.runs, {"event": "ok" if ok else "refused", **run, "step": step})
            if not ok or ctx.should_stop():
                return
            pause.wait(STEP)

    def _long_run(self) -> bool:
        """True for the one run, of all instances, that creates the hold file."""
        try:
            os.close(os.open(self.hold, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="the registry URL")
    p.add_argument("--job", default="stepping")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--executor", choices=("thread", "process"), default="thread")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    cfg = JobConfig.parse(
        name=args.job,
        interval=args.interval,
        sharding_total_count=1,
        failover=True,
        checkpoint_interval=0,  # every step written at once: "last accepted" is exact
    )
    rt = Runtime(args.url, shutdown_grace=2, executor=args.executor)
    # by its import path, not this script's __main__: a worker process imports it
    from tests.checkpoints.checkpoint_worker import Stepping as job

    rt.add_job(job, cfg)
    rt.start()
    print(f"READY {rt.instance_id}", flush=True)
    rt.run_forever(install_signal_handlers=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
