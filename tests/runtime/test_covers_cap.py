"""A gap longer than MAX_COVERS fires (core review 2026-12, finding 14): the run lists
the newest 100 in ``ctx.covers`` and counts the older ones in ``ctx.covered_before``
(and its execution record); before, they were neither listed nor counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.job import coverage
from shardkeeper.runtime.job.coverage import MAX_COVERS, Coverage, FireSchedule
from shardkeeper.scheduling.triggers import build_trigger
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

P = JobPaths("cap")


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    server = MemoryServer()
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        server.shutdown()


def _every(seconds: float) -> FireSchedule:
    return FireSchedule(
        build_trigger(JobConfig(name="cap", interval=seconds, sharding_total_count=1))
    )


def test_a_gap_of_150_fires_lists_the_newest_100_and_counts_the_other_50(
    store: MemoryStore,
) -> None:
    """The review's covers_cap.py: last result at 1000, this run at 1151 (interval 1):
    150 fires no run stood for."""
    store.put(P.result(0), ItemResult("ok", 1000.0, 1000.0, 1000.1, "h@1@x").to_bytes())
    gaps = Coverage(store, P).gaps([0], 1151.0, _every(1), monitored=True)
    assert gaps == {0: coverage.Covered(tuple(float(t) for t in range(1051, 1151)), 50)}
    assert len(gaps[0].fires) == MAX_COVERS


def test_the_window_counts_what_it_does_not_list() -> None:
    every = _every(8)
    assert every.window(800.0, 832.0) == ([808.0, 816.0, 824.0], 0)
    assert every.window(0.0, 8.0 * 1000, limit=10) == ([8.0 * k for k in range(990, 1000)], 989)
    assert every.window(0.0, 8.0 * 1000, limit=0) == ([], 999)
    cron = FireSchedule(
        build_trigger(JobConfig(name="cap", cron="0 * * * * ?", sharding_total_count=1))
    )
    t0 = 1_800_000_000.0  # a whole minute
    assert cron.window(t0, t0 + 60 * 10, limit=3) == ([t0 + 420, t0 + 480, t0 + 540], 6)


def test_merging_folds_into_a_full_listing_counts_what_falls_off() -> None:
    full = coverage.Covered(tuple(float(t) for t in range(100)), 7)
    more = full.plus([100.0, 101.0], 3)
    assert more.fires == tuple(float(t) for t in range(2, 102))
    assert more.before == 7 + 3 + 2
    with pytest.raises(ValueError, match="before=-1"):
        coverage.Covered((), -1)


class _Seen:
    """The contexts and execution records of the job."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contexts: list[ShardingContext] = []
        self.records: list[ExecutionRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.records.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        pass


class _Keep(ShardedJob):
    def __init__(self, seen: _Seen) -> None:
        self.seen = seen

    def execute(self, ctx: ShardingContext) -> None:
        with self.seen.lock:
            self.seen.contexts.append(ctx)


def test_the_first_run_after_a_long_gap_counts_the_unlisted_fires() -> None:
    """Item 0 last completed 150 intervals ago (its owner gone since): its first run
    here lists 100 fires in ctx.covers and counts every older one in
    ctx.covered_before and the execution record: all of them, none lost."""
    server = MemoryServer()
    seen = _Seen()
    interval = 0.2
    admin = server.store()
    admin.start()
    last = (int(time.time() / interval) - 150) * interval
    admin.put(P.result(0), ItemResult("ok", last, last, last + 0.01, "h@1@gone").to_bytes())
    rt = Runtime(server.store(), shutdown_grace=0, observers=[seen])
    rt.add_job(_Keep(seen), JobConfig(name="cap", interval=interval, sharding_total_count=1))
    try:
        rt.start()
        wait_until(lambda: seen.records, 20, message="item 0 never ran")
        with seen.lock:
            ctx, record = seen.contexts[0], seen.records[0]
        fire = ctx.fire_time.timestamp()
        missed = round((fire - last) / interval) - 1
        assert missed >= 150
        assert len(ctx.covers) == MAX_COVERS
        assert ctx.covers[-1].timestamp() == pytest.approx(fire - interval)
        assert getattr(ctx, "covered_before", 0) == missed - MAX_COVERS
        assert getattr(record, "covered_before", 0) == missed - MAX_COVERS
        assert ctx.to_dict().get("covered_before") == missed - MAX_COVERS
    finally:
        rt.stop()
        admin.close()
        server.shutdown()
