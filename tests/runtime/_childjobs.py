"""Jobs run in worker processes by tests/runtime/test_process_context.py.

Importable by a worker process (a module of their own); they report what they saw
in the child through JSON files in the directory named by ``job_parameter``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from shardkeeper.job import ShardedJob, ShardingContext

#: the logger the child's record is written to
LOGGER = "tests.childjobs"
#: the longest a run waits for the test's release file
RELEASE_WAIT = 60.0


def write(ctx: ShardingContext, name: str, data: dict[str, Any]) -> None:
    """``data`` as the file ``name`` of the job's directory, whole or not at all."""
    path = Path(ctx.job_parameter) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class Steps(ShardedJob):
    """Goes on from ``ctx.state`` to step 5, one ``ctx.checkpoint`` and one
    ``ctx.progress`` per step; after step 3 it waits for the file ``release`` (so the
    test can look at the store mid-run). Files: ``start`` (what it resumed from),
    ``at3`` and ``done`` (the checkpoint calls' answers)."""

    def execute(self, ctx: ShardingContext) -> None:
        write(
            ctx,
            "start",
            {
                "pid": os.getpid(),
                "resumed": ctx.resumed,
                "resume_state": ctx.resume_state,
                "state": ctx.state,
            },
        )
        start = int((ctx.state or {}).get("step", 0))
        answers = []
        for step in range(start + 1, 6):
            answers.append(ctx.checkpoint({"step": step}))
            ctx.progress(step, 5, f"step {step}")
            if step == 3:
                write(ctx, "at3", {"answers": answers})
                release = Path(ctx.job_parameter) / "release"
                deadline = time.monotonic() + RELEASE_WAIT
                pause = threading.Event()
                while not release.exists() and time.monotonic() < deadline:
                    pause.wait(0.02)  # a bounded poll inside the item: the test's signal
        write(ctx, "done", {"answers": answers, "state": ctx.state})


class Logs(ShardedJob):
    """Logs one record and writes the span current in the child (file ``span``)."""

    def execute(self, ctx: ShardingContext) -> None:
        from opentelemetry import trace

        span = trace.get_current_span().get_span_context()
        write(
            ctx,
            f"span-{ctx.fencing_token}",
            {
                "valid": span.is_valid,
                "trace_id": format(span.trace_id, "032x"),
                "span_id": format(span.span_id, "016x"),
            },
        )
        logging.getLogger(LOGGER).warning("hello from pid %d", os.getpid())
