"""The process executor keeps items apart and always ends an attempt (issue 35
section 3; core review findings 2, 5 and 12).

* Each item run in a worker process has a context of its own: a thread the item
  leaves behind, calling its context after the item ended, is refused (``False``,
  ``is_valid()`` false) and never reaches the next item run in that child (it used
  to write the next item's checkpoint under that item's fence, or take the next
  item's ``run`` message off the pipe so the item never started).
* Whatever goes wrong between the instance and its child ends the attempt: an
  exception that cannot be rebuilt in the instance, a context answer or an item
  that cannot be pickled (they used to escape the pool: the batch never completed,
  the item's mark was held for good).
* An idle child that died is not handed the next item (the attempt used to fail
  with a broken pipe, and the dead child stayed in the pool's books).

Real child processes (forkserver); the runtime on the MemoryStore.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import LocalItemState, ShardingContext
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.execute.procpool import ProcessPool, job_ref
from shardkeeper.testing.faults import wait_until
from tests.runtime._procitems import (
    LeavesAThread,
    Pid,
    RaisesProcessLocal,
    ReadsItsState,
    WaitsForTheLeftover,
    running,
)

pytestmark = pytest.mark.timeout(120)


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _ctx(tmp_path: Path, job: str, item: int = 0, **private: Any) -> ShardingContext:
    return ShardingContext(
        job_name=job,
        item=item,
        item_parameter="",
        sharding_total_count=2,
        job_parameter=str(tmp_path),
        fire_time=datetime.now(UTC),
        instance_id="test",
        execution_id=f"{job}@0#{item}",
        **private,
    )


def _no() -> None:
    pass


@pytest.fixture(params=["forkserver", "spawn"])
def pool(request: pytest.FixtureRequest) -> Iterator[ProcessPool]:
    """A pool of one child, started each way."""
    made = ProcessPool(1, start_method=request.param)
    yield made
    made.shutdown()


def test_a_leftover_thread_is_refused_while_the_next_item_runs(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """Item 0 leaves a thread that calls its context while item 1 (another job) runs
    in the same child: the calls are refused, item 1's state gets only its own
    checkpoint, and item 1 ends ok."""
    s0, s1 = LocalItemState(), LocalItemState()
    first = pool.run(job_ref("a", LeavesAThread), _ctx(tmp_path, "a", 0, _item_state=s0), 30, _no)
    assert first.outcome == "ok"
    done = threading.Event()
    result: list[Any] = []

    def second() -> None:
        ctx = _ctx(tmp_path, "b", 1, _item_state=s1)
        result.append(pool.run(job_ref("b", WaitsForTheLeftover), ctx, 30, _no))
        done.set()

    runner = threading.Thread(target=second, daemon=True)
    runner.start()
    wait_until(lambda: _json(tmp_path / "running"), 30, message="item 1 never started")
    (tmp_path / "go").write_text("")
    assert done.wait(60), "item 1 never ended"
    assert result[0].outcome == "ok", result[0].error
    leftover = _json(tmp_path / "leftover")
    assert leftover == {"checkpoint": False, "valid": False, "stop_reason": "fenced"}
    assert s1.checkpoints == [{"written_by": "the item itself"}]
    assert s0.checkpoints == [] and s0.reports == [] and s1.reports == []


def test_a_leftover_thread_calling_between_items_is_refused_at_once(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """Item 0's leftover thread calls its context while the child is idle: it is
    answered (refused; with the job's checkpoint_strict, CheckpointFencedError) at
    once, and the next item starts and ends ok in that child."""
    s0 = LocalItemState()
    ctx = _ctx(tmp_path, "a", 0, _item_state=s0)
    first = pool.run(job_ref("a", LeavesAThread), ctx, 30, _no, checkpoint_strict=True)
    assert first.outcome == "ok"
    (tmp_path / "go").write_text("")
    leftover = wait_until(
        lambda: _json(tmp_path / "leftover"), 10, message="the leftover call was not answered"
    )
    assert str(leftover["checkpoint"]).startswith("CheckpointFencedError: job 'a' item 0")
    assert "the run has ended" in str(leftover["checkpoint"])
    assert leftover["valid"] is False
    before = pool.stats.started
    second = pool.run(job_ref("p", Pid), _ctx(tmp_path, "p", 1), 10, _no)
    assert second.outcome == "ok", second.error
    assert pool.stats.started == before  # the same child ran it
    assert s0.checkpoints == []


def test_an_exception_that_cannot_be_rebuilt_fails_the_attempt(
    pool: ProcessPool, tmp_path: Path
) -> None:
    attempt = pool.run(job_ref("x", RaisesProcessLocal), _ctx(tmp_path, "x", 0), 30, _no)
    assert attempt.outcome == "failed"
    # named: the item's exception, and why it could not be rebuilt in the instance
    assert "ProcessLocal: a handle of process" in str(attempt.error)
    assert "this handle belongs to another process" in str(attempt.error)
    again = pool.run(job_ref("x", RaisesProcessLocal), _ctx(tmp_path, "x", 1), 30, _no)
    assert again.outcome == "ok"
    assert pool.stats.started == 1  # the child was fine: kept


def test_a_context_answer_that_cannot_be_pickled_fails_the_call_in_the_child(
    pool: ProcessPool, tmp_path: Path
) -> None:
    state = LocalItemState(resume_state=threading.Lock())
    attempt = pool.run(
        job_ref("r", ReadsItsState), _ctx(tmp_path, "r", 0, _item_state=state), 30, _no
    )
    assert attempt.outcome == "failed"
    seen = _json(tmp_path / "state")
    assert seen is not None and "_item_state.resume" in str(seen["error"]), seen
    assert "pickle" in str(seen["error"])
    assert pool.run(job_ref("p", Pid), _ctx(tmp_path, "p", 1), 30, _no).outcome == "ok"


def test_an_item_that_cannot_be_pickled_fails_the_attempt(
    pool: ProcessPool, tmp_path: Path
) -> None:
    ctx = _ctx(tmp_path, "p", 0, props={"lock": threading.Lock()})
    attempt = pool.run(job_ref("p", Pid), ctx, 30, _no)
    assert attempt.outcome == "failed"
    assert "pickle" in str(attempt.error)
    assert pool.run(job_ref("p", Pid), _ctx(tmp_path, "p", 1), 30, _no).outcome == "ok"


class Records:
    """An observer keeping every execution record."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[ExecutionRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.records.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        pass

    def where(self, **match: object) -> list[ExecutionRecord]:
        with self.lock:
            return [r for r in self.records if all(getattr(r, k) == v for k, v in match.items())]


def test_a_batch_with_an_unrebuildable_exception_completes_and_the_next_fire_runs(
    memory_server: MemoryServer, runtimes: list[Runtime], tmp_path: Path
) -> None:
    """Finding 5 in the runtime: the item is recorded failed with the error named,
    and the item's later fires run (its mark was held for good)."""
    seen = Records()
    rt = Runtime(memory_server.store("ns"), shutdown_grace=2, observers=[seen], executor="process")
    rt.add_job(
        RaisesProcessLocal,
        JobConfig(
            name="stuck",
            interval=0.5,
            sharding_total_count=1,
            failover=True,
            job_parameter=str(tmp_path),
        ),
    )
    rt.start()
    runtimes.append(rt)
    failed = wait_until(
        lambda: (
            len(seen.where(item=0, outcome=Outcome.FAILED)) >= 3
            and seen.where(item=0, outcome=Outcome.FAILED)
        ),
        30,
        message=lambda: f"records: {seen.records}",
    )
    assert "this handle belongs to another process" in failed[0].error_message
    assert len({r.fire_time for r in failed}) >= 3


def test_an_idle_child_that_died_is_replaced(pool: ProcessPool, tmp_path: Path) -> None:
    """Finding 12: the next item ends ok in a new child; the dead one is forgotten."""
    assert pool.run(job_ref("p", Pid), _ctx(tmp_path, "p", 0), 30, _no).outcome == "ok"
    (dead,) = pool.pids()
    os.kill(dead, signal.SIGKILL)
    wait_until(lambda: not running(dead), 10, message=f"child {dead} still runs")
    attempt = pool.run(job_ref("p", Pid), _ctx(tmp_path, "p", 1), 30, _no)
    assert attempt.outcome == "ok", attempt.error
    assert dead not in pool.pids() and pool.busy_pids() == []
    assert len(pool.pids()) == 1
