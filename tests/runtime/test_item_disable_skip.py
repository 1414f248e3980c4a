"""An operator's item disable is recorded as a skip of that item (reason DISABLED),
as a whole job's disable and a count cut's removal are: a fire the item misses is
accounted for in the skip records (the chaos checker and chaos-judge.py require a
``disabled`` skip line for each pair an item disable kept from running)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.counters import SkipReason
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "skipitem"


class Noop(ShardedJob):
    """Every item returns at once."""

    def execute(self, ctx: ShardingContext) -> None:
        """Nothing to do."""


class Skips:
    """An observer that keeps the skip records and the items that ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.skips: list[SkipRecord] = []
        self.ran: list[tuple[int, float]] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.ran.append((record.item, record.fire_time))

    def on_skip(self, record: SkipRecord) -> None:
        with self.lock:
            self.skips.append(record)

    def disabled_items(self) -> set[int]:
        with self.lock:
            return {i for s in self.skips if s.reason == SkipReason.DISABLED.value for i in s.items}


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def test_a_disabled_item_is_recorded_as_a_skip_of_that_item(server: MemoryServer) -> None:
    """Item 1 switched off: the fires it misses are skip records naming item 1 with
    reason DISABLED (before, the trigger left it out without a record), while item 0
    goes on running."""
    seen = Skips()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[seen])
    rt.add_job(Noop(), JobConfig(name=JOB, interval=0.2, sharding_total_count=2))
    rt.start()
    try:
        wait_until(lambda: len(seen.ran) >= 2, 10, message="the job never ran")
        rt.store.put(JobPaths(JOB).disabled_item(1), b"{}")
        wait_until(lambda: 1 in seen.disabled_items(), 10, message="no skip of item 1")
        with seen.lock:
            skip = next(s for s in seen.skips if s.reason == SkipReason.DISABLED.value)
            started = len(seen.ran)
        wait_until(lambda: len(seen.ran) >= started + 2, 10, message="item 0 stopped")
    finally:
        rt.stop()
    assert skip.items == (1,) and skip.job == JOB and skip.instance == rt.instance_id
    # the words name the item (the reason's value is the job's "job disabled")
    assert skip.message == "item disabled by an operator"
    with seen.lock:
        ran = list(seen.ran)
    assert not any(item == 1 and fire >= skip.fire_time for item, fire in ran)
    assert seen.disabled_items() == {1}
