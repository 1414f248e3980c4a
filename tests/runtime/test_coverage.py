"""Which earlier fires a run stands for (runtime/job/coverage.py), on the MemoryStore."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime.job.coverage import MAX_COVERS, Coverage, Covered, FireSchedule
from shardkeeper.scheduling.triggers import build_trigger

P = JobPaths("cov")


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
        build_trigger(JobConfig(name="cov", interval=seconds, sharding_total_count=1))
    )


def _result(store: MemoryStore, item: int, fire_time: float) -> None:
    doc = ItemResult("ok", fire_time, fire_time, fire_time + 0.1, "host@9@other")
    store.put(P.result(item), doc.to_bytes())


def test_an_interval_schedule_lists_the_fires_strictly_between() -> None:
    every = _every(8)
    assert every.between(800.0, 832.0) == [808.0, 816.0, 824.0]
    assert every.between(801.0, 809.0) == [808.0]
    assert every.between(808.0, 816.0) == []
    assert every.previous(816.0) == 808.0
    assert every.previous(817.5) == 816.0
    newest = every.between(0.0, 8.0 * 10_000, limit=MAX_COVERS)
    assert len(newest) == MAX_COVERS and newest[-1] == 8.0 * 9_999


def test_a_cron_schedule_is_walked() -> None:
    minutely = FireSchedule(
        build_trigger(JobConfig(name="cov", cron="0 * * * * ?", sharding_total_count=1))
    )
    t0 = 1_800_000_000.0  # a whole minute (1800000000 = 30000000 x 60)
    assert minutely.between(t0, t0 + 180) == [t0 + 60, t0 + 120]
    assert minutely.previous(t0 + 90) == t0 + 60


def test_an_item_decided_here_at_its_previous_fire_costs_no_read(store: MemoryStore) -> None:
    cov = Coverage(store, P)
    every = _every(8)
    cov.decided([0, 1], 808.0)
    before = store.round_trips
    assert cov.gaps([0, 1], 816.0, every, monitored=True) == {}
    assert store.round_trips == before


def test_an_item_whose_owner_died_before_its_fire_covers_that_fire(store: MemoryStore) -> None:
    """Item 3's owner ran it for 800 and died before 808; the leader gave it here
    from 816 on: that run covers 808."""
    cov = Coverage(store, P)
    _result(store, 3, 800.0)
    _result(store, 4, 808.0)  # ran at its previous fire elsewhere: no gap
    assert cov.gaps([3, 4, 5], 816.0, _every(8), monitored=True) == {3: Covered((808.0,))}
    # decided now: the next fire has no gap and reads nothing
    before = store.round_trips
    assert cov.gaps([3, 4, 5], 824.0, _every(8), monitored=True) == {}
    assert store.round_trips == before


def test_fires_this_instance_skipped_are_covered_by_its_next_run(store: MemoryStore) -> None:
    cov = Coverage(store, P)
    cov.decided([0], 800.0)
    _result(store, 0, 800.0)
    # 808 and 816 were skipped here (say the store did not answer)
    assert cov.gaps([0], 824.0, _every(8), monitored=True) == {0: Covered((808.0, 816.0))}


def test_without_monitoring_nothing_is_read_or_covered(store: MemoryStore) -> None:
    cov = Coverage(store, P)
    _result(store, 0, 800.0)
    before = store.round_trips
    assert cov.gaps([0], 824.0, _every(8), monitored=False) == {}
    assert store.round_trips == before


def test_an_item_that_never_completed_is_counted_from_when_it_was_first_due(
    store: MemoryStore,
) -> None:
    """Items 2 and 3 were born at 800 (the assignment says so) and never completed
    anywhere; item 1 was born then too and completed at 808. Item 2's first run at 824
    covers 800, 808 and 816; item 3, born from the fire after 808 (a reshard that
    applied from the next fire: 808.001), covers 816; item 1 counts from its result."""
    cov = Coverage(store, P)
    _result(store, 1, 808.0)
    births = {1: 800.0, 2: 800.0, 3: 808.001}
    gaps = cov.gaps([1, 2, 3], 824.0, _every(8), monitored=True, born=births.get)
    assert gaps == {
        1: Covered((816.0,)),
        2: Covered((800.0, 808.0, 816.0)),
        3: Covered((816.0,)),
    }
    # unknown birth (an assignment written by an older version): nothing to count from
    assert Coverage(store, P).gaps([5], 824.0, _every(8), monitored=True, born=births.get) == {}
    # born at this very fire: nothing earlier was due
    assert (
        Coverage(store, P).gaps([6], 824.0, _every(8), monitored=True, born=lambda _i: 824.0) == {}
    )
