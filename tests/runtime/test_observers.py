"""Execution observers see every execution and skip, also when added after start."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)


class FailsOnOne(ShardedJob):
    """Item 1 raises; the others return."""

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise ValueError("item one is broken")


class Collect:
    """An observer that keeps what it is given."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executions: list[ExecutionRecord] = []
        self.skips: list[SkipRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.executions.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        with self.lock:
            self.skips.append(record)

    def outcomes(self) -> set[tuple[int, Outcome]]:
        with self.lock:
            return {(r.item, r.outcome) for r in self.executions}


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def test_an_observer_added_after_start_sees_outcomes_and_errors(server: MemoryServer) -> None:
    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(FailsOnOne(), JobConfig(name="obs", interval=0.2, sharding_total_count=2))
    rt.start()
    try:
        seen = Collect()
        rt.observers.add(seen)
        wait_until(
            lambda: {(0, Outcome.OK), (1, Outcome.FAILED)} <= seen.outcomes(),
            10,
            message="no ok and failed records",
        )
    finally:
        rt.stop()
    failed = next(r for r in seen.executions if r.outcome is Outcome.FAILED)
    assert failed.job == "obs" and failed.instance == rt.instance_id
    assert failed.error_type == "ValueError"
    assert failed.error_message == "item one is broken"
    assert "raise ValueError" in failed.traceback
    assert failed.execution_id and failed.fencing_token > 0
    assert failed.ended >= failed.started


def test_a_broken_observer_does_not_stop_executions_or_other_observers(
    server: MemoryServer,
) -> None:
    class Broken:
        def on_execution(self, record: ExecutionRecord) -> None:
            raise RuntimeError("observer bug")

        def on_skip(self, record: SkipRecord) -> None:
            raise RuntimeError("observer bug")

    seen = Collect()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[Broken(), seen])
    rt.add_job(FailsOnOne(), JobConfig(name="obs2", interval=0.2, sharding_total_count=1))
    rt.start()
    try:
        wait_until(lambda: len(seen.outcomes()) >= 1 and len(seen.executions) >= 3, 10)
    finally:
        rt.stop()
    assert rt.runners["obs2"].stats["executed"] >= 3


def test_store_errors_are_counted_and_the_fire_still_runs(server: MemoryServer) -> None:
    """A registry failure while deciding a fire is counted (the store_errors metric)
    and the fire is decided again until it runs."""
    from datetime import UTC, datetime

    from shardkeeper.coordination.paths import JobPaths

    store = server.store()
    seen = Collect()
    rt = Runtime(store, shutdown_grace=1, observers=[seen])
    rt.add_job(FailsOnOne(), JobConfig(name="errs", cron="0 0 1 1 *", sharding_total_count=1))
    rt.start()
    try:
        runner = rt.runners["errs"]
        wait_until(lambda: runner.state.registered, 10)
        store.fail_next("get", path=JobPaths("errs").sharding, count=2)
        runner.on_trigger(datetime.now(UTC))
        wait_until(lambda: (0, Outcome.OK) in seen.outcomes(), 10, message="the fire never ran")
        assert runner.stats["store_errors"] >= 1
    finally:
        rt.stop()
