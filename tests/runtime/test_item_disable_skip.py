"""An operator's item disable is recorded as a skip of that item (reason DISABLED),
as a whole job's disable and a count cut's removal are: a fire the item misses is
accounted for in the skip records (the chaos checker and chaos-judge.py require a
``disabled`` skip line for each pair an item disable kept from running)."""

from __future__ import annotations

import json
import threading
import time
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
        self.records: list[ExecutionRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.ran.append((record.item, record.fire_time))
            self.records.append(record)

    def runs(self) -> list[tuple[int, float, bool, tuple[float, ...]]]:
        """(item, fire, misfire re-run, covers) of each run."""
        with self.lock:
            return [(r.item, r.fire_time, r.misfire, r.covers) for r in self.records]

    def disabled_skips(self) -> list[SkipRecord]:
        with self.lock:
            return [s for s in self.skips if s.reason == SkipReason.DISABLED.value]

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


class HoldsFirst(ShardedJob):
    """The first call waits for ``release``: later fires come while it runs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def execute(self, ctx: ShardingContext) -> None:
        self.calls += 1
        if self.calls == 1:
            assert self.release.wait(30), "never released"


def test_a_fire_in_a_disable_folded_into_a_re_run_is_a_disabled_skip(server: MemoryServer) -> None:
    """Item 0 busy, fires deferred into the misfire re-run; the item's disable, seen
    late, dates from between them (as a switch committed during a store leader's loss
    is seen once it is back). The re-run of the fire from before the disable runs and
    folds the later ones; those at or after the disable are ``disabled`` skips. Before,
    they were left out of the re-run's covers and recorded nowhere (600 s etcd chaos,
    seed 20261244: 2 pairs lost)."""
    seen = Skips()
    job = HoldsFirst()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[seen])
    period = 0.3
    rt.add_job(job, JobConfig(name=JOB, interval=period, sharding_total_count=1, misfire=True))
    rt.start()
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: job.calls >= 1, 10, message="the job never ran")
        wait_until(
            lambda: runner.state.stats.get("misfires", 0) >= 4, 10, message="no fire deferred"
        )
        with runner.state.lock:
            first, last = runner.state.misfire_at, runner.state.misfire_last
        assert first is not None and last is not None and last > first
        at = first + period / 2  # after the re-run's own fire, before the last it folds
        rt.store.put(JobPaths(JOB).disabled_item(0), json.dumps({"at": at}).encode())
        wait_until(lambda: runner.state.item_disabled(0, last), 10, message="switch unseen")
        job.release.set()
        wait_until(
            lambda: any(i == 0 and misfire for i, _f, misfire, _c in seen.runs()),
            10,
            message="no misfire re-run",
        )
        rerun = next(r for r in seen.runs() if r[2])
    finally:
        rt.stop()
    _item, own, _misfire, covers = rerun
    assert own < at, "the re-run is of the fire from before the disable"
    skipped = {round(s.fire_time, 3) for s in seen.disabled_skips()}
    folded_off = [f for f in _schedule(own, last, period) if f >= at]
    assert folded_off, "no folded fire inside the disable: the test checked nothing"
    for f in folded_off:
        assert f not in covers, f"fire {f} in the disable covered by the re-run"
        assert round(f, 3) in skipped, f"fire {f} in the disable recorded nowhere: {skipped}"


def _schedule(after: float, until: float, period: float) -> list[float]:
    """The interval trigger's fires after ``after`` up to ``until`` (both fires)."""
    n = round((until - after) / period)
    return [after + k * period for k in range(1, n + 1)]


def test_a_stale_disable_in_the_view_is_read_again_before_a_skip(server: MemoryServer) -> None:
    """The view says the job is disabled but the store says enabled (an instance frozen
    while an operator enabled it decides its first fire after the thaw before the
    enable's event arrives): the fire reads the switches before skipping, and runs.
    Before, it recorded a ``disabled`` skip with no disable in force (600 s etcd
    chaos, seed 20261244: 4 skips without a cause)."""
    seen = Skips()
    rt = Runtime(server.store(), shutdown_grace=1, observers=[seen])
    rt.add_job(Noop(), JobConfig(name=JOB, interval=0.2, sharding_total_count=2))
    rt.start()
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: len(seen.ran) >= 2, 10, message="the job never ran")
        with runner.state.lock:  # the stale view: no event will correct it
            runner.state.disabled_job = True
            runner.state.disabled_job_at = 0.0
            runner.state.disabled_items = {1}
            runner.state.disabled_items_at = {1: 0.0}
        poked = time.time()
        wait_until(
            lambda: {i for i, f in seen.ran if f > poked + 0.2} == {0, 1},
            10,
            message="the job did not run again",
        )
    finally:
        rt.stop()
    assert not seen.disabled_skips(), seen.disabled_skips()
