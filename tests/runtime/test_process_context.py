"""What an item in a worker process (``executor="process"``) shares with its parent:

* its checkpoints and progress: ``ctx.checkpoint``, ``ctx.progress``,
  ``ctx.resumed``/``resume_state`` and ``ctx.state`` called in the child are the
  parent's fenced writes and reads (issue 28 sections 1-3), in the store at once;
* its log records: forwarded to the parent's logging, they carry the item's fields
  (logcontext.ItemContextFilter's), and the item span's trace context is current in
  the child (its ``traceparent`` is sent along and attached there).

Real child processes (forkserver); the runtime on the MemoryStore.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import CheckpointDoc, CheckpointReader
from shardkeeper.coordination.model import FailoverEntry
from shardkeeper.coordination.paths import JobPaths, checkpoint_path
from shardkeeper.job import ShardingContext
from shardkeeper.logcontext import FIELDS, ItemContextFilter
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.execute.procpool import ProcessPool, job_ref
from shardkeeper.testing.faults import wait_until
from tests.runtime._childjobs import LOGGER, Logs, Steps

pytestmark = pytest.mark.timeout(120)


def _file(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / name
    return json.loads(path.read_text()) if path.exists() else None


def test_checkpoints_and_progress_from_a_child_reach_the_parent_and_the_store(
    memory_server: MemoryServer, runtimes: list[Runtime], tmp_path: Path
) -> None:
    """A failover re-run in a child resumes from the stored checkpoint of its fire,
    checkpoints and reports progress step by step (each in the store while it runs,
    and in the parent's state), and completes with its last state written."""
    job, fire = "steps", float(int(time.time()) - 30)
    eid = f"{job}@{round(fire * 1000)}#0"
    seed = memory_server.store("ns")
    seed.start()
    try:
        # the predecessor of this fire's run checkpointed step 2, then its instance died
        before = CheckpointDoc(eid, fire, "host@9@gone", '{"step":2}', fire, seq=2)
        seed.put(checkpoint_path(job, 0, fire), before.to_bytes())
        seed.put(JobPaths(job).failover_item(0), FailoverEntry(fire, eid, "host@9@gone").to_bytes())
        rt = Runtime(memory_server.store("ns"), shutdown_grace=2, executor="process")
        rt.add_job(
            Steps,
            JobConfig(
                name=job,
                cron="0 0 0 1 1 ?",
                sharding_total_count=1,
                failover=True,
                checkpoint_interval=0,
                job_parameter=str(tmp_path),
            ),
        )
        rt.start()
        runtimes.append(rt)

        at3 = wait_until(lambda: _file(tmp_path, "at3"), 60, message="the child never got to 3")
        start = _file(tmp_path, "start")
        assert start is not None and start["pid"] != os.getpid()
        assert start["resumed"] is True
        assert start["resume_state"] == {"step": 2} and start["state"] == {"step": 2}
        assert at3["answers"] == [True]  # step 3, accepted
        # mid-run: the child's calls are the parent's fenced writes, in the store now
        reader = CheckpointReader(seed, JobPaths(job))
        doc = reader.read(0, fire)
        assert doc is not None and doc.state == {"step": 3}
        assert doc.execution_id == eid and doc.ended == ""
        progress = reader.read_progress(0)
        assert progress is not None and progress.execution_id == eid
        assert (progress.done, progress.total, progress.note) == (3, 5, "step 3")
        assert [p.done for p in rt.runners[job].item_states.running_progress()] == [3]
        [item] = Operations(seed).job(job).items
        assert item.progress is not None and item.progress["percent"] == 60.0

        (tmp_path / "release").touch()
        done = wait_until(lambda: _file(tmp_path, "done"), 30, message="the child never ended")
        assert done["answers"] == [True, True, True] and done["state"] == {"step": 5}

        def ended() -> CheckpointDoc | None:
            last = reader.read(0, fire)
            return last if last is not None and last.ended else None

        last = wait_until(ended, 30, message="the completion never wrote the last state")
        assert (last.state, last.ended, last.seq) == ({"step": 5}, "ok", 3)
        assert reader.read_progress(0) is None  # deleted with the running mark
        assert rt.runners[job].item_states.running_progress() == []
    finally:
        seed.close()


class Kept(logging.Handler):
    """Keeps the records it handles (after its filters)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_records_from_a_child_carry_the_items_fields_and_its_span(tmp_path: Path) -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    fire = datetime(2026, 12, 5, 8, 0, 0, 250000, tzinfo=UTC)
    ctx = ShardingContext(
        job_name="logs",
        item=1,
        item_parameter="",
        sharding_total_count=2,
        job_parameter=str(tmp_path),
        fire_time=fire,
        instance_id="test",
        execution_id="logs@1764921600250#1",
        fencing_token=7,
    )
    trace_id, span_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    span = NonRecordingSpan(
        SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))
    )
    # the parent's handler has the filter an application adds: it must keep the
    # child's fields, not put its own thread's (no item) over them
    kept = Kept()
    kept.addFilter(ItemContextFilter())
    logger = logging.getLogger(LOGGER)
    logger.addHandler(kept)
    pool = ProcessPool(1)
    try:
        run = pool.runner(job_ref("logs", Logs))
        assert run(Logs(), ctx, 30.0, lambda: None, span).outcome == "ok"
        traced = [r for r in kept.records if r.getMessage().startswith("hello from pid")]
        untraced_ctx = dataclasses.replace(ctx, fencing_token=8)
        assert run(Logs(), untraced_ctx, 30.0, lambda: None, None).outcome == "ok"
    finally:
        logger.removeHandler(kept)
        pool.shutdown()
    [record] = traced
    assert record.process != os.getpid()  # written in the child
    assert {name: getattr(record, name) for name in FIELDS} == {
        "sk_job": "logs",
        "sk_item": 1,
        "sk_fire_time": "2026-12-05T08:00:00.250+00:00",
        "sk_execution_id": "logs@1764921600250#1",
        "sk_fencing_token": 7,
    }
    assert record.sk_trace_id == format(trace_id, "032x")  # type: ignore[attr-defined]
    assert record.sk_span_id == format(span_id, "016x")  # type: ignore[attr-defined]
    # the item span is the current span in the child: the job's own spans and
    # outgoing requests are under it
    assert _file(tmp_path, "span-7") == {
        "valid": True,
        "trace_id": format(trace_id, "032x"),
        "span_id": format(span_id, "016x"),
    }
    # without a span: the item's fields all the same, no trace
    [plain] = [r for r in kept.records if getattr(r, "sk_fencing_token", None) == 8]
    assert plain.sk_item == 1 and plain.sk_trace_id is None  # type: ignore[attr-defined]
    assert _file(tmp_path, "span-8") == {"valid": False, "trace_id": "0" * 32, "span_id": "0" * 16}
