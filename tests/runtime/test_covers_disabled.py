"""Fires an operator switched off are never listed in ``ctx.covers`` (core review
2026-12, finding 13): a fire skipped because the job (or the item) was disabled is
recorded as that skip, and the next run does not also stand for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.counters import SkipReason
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.job import coverage
from shardkeeper.runtime.job.coverage import Coverage, FireSchedule
from shardkeeper.scheduling.triggers import build_trigger
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

P = JobPaths("dis")


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
        build_trigger(JobConfig(name="dis", interval=seconds, sharding_total_count=1))
    )


def _result(store: MemoryStore, item: int, fire_time: float) -> None:
    doc = ItemResult("ok", fire_time, fire_time, fire_time + 0.1, "host@9@other")
    store.put(P.result(item), doc.to_bytes())


def _held(cov: Coverage, every: FireSchedule, fires: list[float], items: list[int] | None) -> None:
    for ft in fires:
        cov.held(ft, every, items)


def test_fires_held_by_a_job_disable_are_not_covered(store: MemoryStore) -> None:
    """Items 0 and 1 ran at 800 (item 1 elsewhere); the job was disabled for the fires
    808..832; the run at 840 covers nothing, for either item."""
    cov = Coverage(store, P)
    every = _every(8)
    cov.decided([0], 800.0)
    _result(store, 0, 800.0)
    _result(store, 1, 800.0)
    _held(cov, every, [808.0, 816.0, 824.0, 832.0], None)
    assert cov.gaps([0, 1], 840.0, every, monitored=True) == {}


def test_fires_lost_before_the_disable_are_still_covered(store: MemoryStore) -> None:
    """Item 0's owner died after 800; the job was disabled at 824 and 832; enabled
    again, this instance (the item's new owner) runs it at 840: it covers 808 and 816,
    which the owner's death lost, and not the operator's 824 and 832."""
    cov = Coverage(store, P)
    every = _every(8)
    _result(store, 0, 800.0)
    _held(cov, every, [824.0, 832.0], None)
    assert cov.gaps([0], 840.0, every, monitored=True) == {0: coverage.Covered((808.0, 816.0))}


def test_an_item_disable_holds_that_item_only(store: MemoryStore) -> None:
    cov = Coverage(store, P)
    every = _every(8)
    cov.decided([0, 1], 800.0)
    _result(store, 0, 800.0)
    _result(store, 1, 800.0)
    _held(cov, every, [808.0, 816.0], [1])
    # item 0 was not disabled: its fires 808 and 816 were skipped for another reason
    assert cov.gaps([0, 1], 824.0, every, monitored=True) == {0: coverage.Covered((808.0, 816.0))}


def test_stretches_of_held_fires_are_merged_and_bounded() -> None:
    every = _every(8)
    stretches: list[tuple[float, float]] = []
    for ft in (808.0, 816.0, 816.0, 824.0, 848.0):
        coverage._hold(stretches, ft, every.previous(ft))
    assert stretches == [(808.0, 824.0), (848.0, 848.0)]
    for k in range(200):
        coverage._hold(stretches, 10_000.0 + 16 * k, 10_000.0 + 16 * k - 8)
    assert len(stretches) == coverage.MAX_HELD


class _Seen:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.contexts: list[ShardingContext] = []
        self.skips: list[SkipRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        pass

    def on_skip(self, record: SkipRecord) -> None:
        with self.lock:
            self.skips.append(record)

    def disabled_skips(self) -> int:
        with self.lock:
            return sum(s.reason == SkipReason.DISABLED.value for s in self.skips)

    def after(self, t: float) -> list[ShardingContext]:
        with self.lock:
            return [c for c in self.contexts if c.fire_time.timestamp() > t]


class _Keep(ShardedJob):
    def __init__(self, seen: _Seen) -> None:
        self.seen = seen

    def execute(self, ctx: ShardingContext) -> None:
        with self.seen.lock:
            self.seen.contexts.append(ctx)


def test_the_first_run_after_an_operator_enables_the_job_covers_nothing() -> None:
    """The review's covers_disabled.py: interval 0.2 s, the job disabled for a while
    (its fires recorded as ``disabled`` skips), then enabled: the first run after
    covers nothing. Before the fix it listed every fire of the disabled stretch."""
    server = MemoryServer()
    seen = _Seen()
    rt = Runtime(server.store(), shutdown_grace=0, observers=[seen])
    rt.add_job(_Keep(seen), JobConfig(name="dis", interval=0.2, sharding_total_count=2))
    try:
        rt.start()
        wait_until(lambda: len(seen.after(0)) >= 4, 20, message="the job never ran")
        rt.store.put(P.disabled_job, b"")
        wait_until(lambda: seen.disabled_skips() >= 8, 20, message="no disabled skips")
        rt.store.delete(P.disabled_job)
        enabled = time.time()

        def firsts() -> dict[int, ShardingContext] | None:
            # each item's first run of a fire after the enable
            out: dict[int, ShardingContext] = {}
            for c in sorted(seen.after(enabled), key=lambda c: c.fire_time):
                out.setdefault(c.item, c)
            return out if len(out) == 2 else None

        first = wait_until(firsts, 20, message="the items never ran again")
        assert {i: (c.covers, getattr(c, "covered_before", 0)) for i, c in first.items()} == {
            0: ((), 0),
            1: ((), 0),
        }
    finally:
        rt.stop()
        server.shutdown()


def test_the_first_run_after_an_operator_enables_an_item_covers_nothing() -> None:
    """The same for one item switched off (``disabled/items/1``) while item 0 runs on."""
    server = MemoryServer()
    seen = _Seen()
    rt = Runtime(server.store(), shutdown_grace=0, observers=[seen])
    rt.add_job(_Keep(seen), JobConfig(name="dis", interval=0.2, sharding_total_count=2))
    try:
        rt.start()
        wait_until(lambda: len(seen.after(0)) >= 4, 20, message="the job never ran")
        rt.store.put(P.disabled_item(1), b"")
        off = time.time()
        wait_until(
            lambda: sum(c.item == 0 for c in seen.after(off)) >= 8, 20, message="item 0 stopped"
        )
        rt.store.delete(P.disabled_item(1))
        enabled = time.time()
        first = wait_until(
            lambda: [c for c in seen.after(enabled) if c.item == 1], 20, message="item 1 never ran"
        )
        assert all(
            c.item != 1 for c in seen.after(off + 0.4) if c.fire_time.timestamp() < enabled - 0.4
        )
        assert (first[0].covers, getattr(first[0], "covered_before", 0)) == ((), 0)
    finally:
        rt.stop()
        server.shutdown()
