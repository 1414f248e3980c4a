"""An instance process for the process executor's signal tests
(tests/runtime/test_process_executor_signals.py).

``python -m tests.runtime._procinstance URL DIR PARAM GRACE``: a Runtime on the
registry URL runs the job ``sleeps`` (tests/runtime/_procitems.Sleeps, one item with
the item parameter PARAM, ``executor="process"``) once, by a run-now request, with a
graceful stop of GRACE seconds, until SIGTERM/SIGINT (``run_forever``). Each execution
record is appended to DIR/records as a JSON line (outcome, error); DIR/instance holds
this process's pid once the run-now request is made; its log goes to stderr
(INFO).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

from shardkeeper.config import JobConfig
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.ops import Operations
from shardkeeper.registry import open_store
from shardkeeper.runtime import Runtime
from tests.runtime._procitems import Sleeps


class Appends:
    """An observer appending each execution record to a file (one JSON line each)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def on_execution(self, record: ExecutionRecord) -> None:
        line = {
            "item": record.item,
            "outcome": record.outcome.value,
            "error": record.error_message,
        }
        with self.lock, self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def on_skip(self, record: SkipRecord) -> None:
        pass


def main(url: str, directory: Path, param: str, grace: float) -> None:
    """Run the instance (module docstring)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    rt = Runtime(
        url,
        shutdown_grace=grace,
        executor="process",
        observers=[Appends(directory / "records")],
    )
    rt.add_job(
        Sleeps,
        JobConfig(
            name="sleeps",
            cron="0 0 0 1 1 ?",
            sharding_total_count=1,
            sharding_item_parameters={0: param} if param else {},
            job_parameter=str(directory),
        ),
    )
    rt.start()
    admin = open_store(url)
    admin.start()
    try:
        Operations(admin).trigger("sleeps")
    finally:
        admin.close()
    (directory / "instance").write_text(str(os.getpid()))
    rt.run_forever()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
