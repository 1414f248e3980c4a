"""Misfire marks: one commit per missed run, cleared by the re-run's own start commit."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import EventKind, WatchEvent
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire import fires
from shardkeeper.runtime.fire.trigger import Fire
from shardkeeper.runtime.runner.runner import JobRunner
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "mis"
P = JobPaths(JOB)
ITEMS = (0, 1)


class Held(ShardedJob):
    """Items of the first run wait for ``release``; later runs end at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.runs: list[tuple[float, int, bool]] = []
        self._lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self._lock:
            self.runs.append((ctx.fire_time.timestamp(), ctx.item, ctx.is_misfire))
        if not ctx.is_misfire:
            self.release.wait(20)


@contextlib.contextmanager
def held_run(
    memory_server: MemoryServer,
) -> Iterator[tuple[JobRunner, Held, list[WatchEvent], MemoryStore, float]]:
    """A runtime whose job's first run (fired by the test) holds both items until
    ``job.release``; yields (runner, job, the job's registry events, an observer
    store, the first fire time). A cron that never fires in the test: the fires are
    handed to the job directly."""
    observer = memory_server.store()
    observer.start()
    events: list[WatchEvent] = []
    observer.watch(P.root, events.append)
    job = Held()
    rt = Runtime(memory_server.store(), shutdown_grace=5)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=len(ITEMS)))
    rt.start()
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.registered, 10)
        first = time.time()
        runner.fires._enqueue(Fire(first))
        wait_until(lambda: runner.running_count() == len(ITEMS), 10, message="no batch ran")
        yield runner, job, events, observer, first
        job.release.set()
        wait_until(lambda: sum(1 for r in job.runs if r[2]) == len(ITEMS), 10, message="no re-run")
        wait_until(lambda: all(observer.get(P.misfire(i)) is None for i in ITEMS), 10)
        wait_until(lambda: runner.idle, 10)
    finally:
        job.release.set()
        rt.stop()


def test_missed_fires_of_one_run_write_the_marks_once_and_the_rerun_start_clears_them(
    memory_server: MemoryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three fires missed while the items run write the misfire marks once (they keep
    the first missed fire's time, not a commit per miss); the re-run's start commit
    deletes them together with writing its running marks (one revision)."""
    # marked however briefly the run has gone on (the next test keeps the default)
    monkeypatch.setattr(fires, "MISFIRE_MARK_AFTER", 0.0)
    with held_run(memory_server) as (runner, job, events, observer, first):
        missed = [first + 1, first + 2, first + 3]
        for n, fire_time in enumerate(missed):
            runner.fires._enqueue(Fire(fire_time))
            wait_until(partial(_misfires_are, runner, n + 1), 10)
            wait_until(lambda: runner.pending_fires() == 0, 10)
            for item in ITEMS:
                node = observer.get(P.misfire(item))
                assert node is not None, f"no misfire mark of item {item}"
                # the first missed fire's time: later misses wrote nothing
                assert float(node.value) == missed[0], (n, node.value)
        assert len({e.revision for e in _mark_writes(events)}) == 1, events
    reruns = sorted((round(ft, 3), item) for ft, item, misfire in job.runs if misfire)
    assert reruns == [(round(missed[0], 3), item) for item in ITEMS], job.runs
    assert not runner.state.misfire_marked
    deleted = {
        e.revision
        for e in events
        if e.kind is EventKind.DELETED and e.path.startswith(P.misfire_root + "/")
    }
    started = {
        e.revision
        for e in events
        if e.kind is EventKind.CREATED
        and e.path in {P.running(i) for i in ITEMS}
        and e.revision in deleted
    }
    assert len(deleted) == 1 and deleted == started, (deleted, started)


def test_a_run_that_ends_in_moments_is_rerun_without_marks(
    memory_server: MemoryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fire missed by a run younger than MISFIRE_MARK_AFTER writes no misfire mark
    (the re-run follows at once); one missed once the run is older does, and the
    re-run's start deletes it. (The threshold is set per phase: a run's age is then
    on the right side of it whatever the machine's speed.)"""
    with held_run(memory_server) as (runner, job, events, observer, first):
        monkeypatch.setattr(fires, "MISFIRE_MARK_AFTER", 60.0)  # the run is younger
        soon = first + 1
        runner.fires._enqueue(Fire(soon))
        wait_until(lambda: runner.state.stats["misfires"] == 1, 10)
        wait_until(lambda: runner.pending_fires() == 0, 10)
        assert all(observer.get(P.misfire(i)) is None for i in ITEMS)
        assert not runner.state.misfire_marked
        monkeypatch.setattr(fires, "MISFIRE_MARK_AFTER", 0.0)  # the run is older
        late = first + 2
        runner.fires._enqueue(Fire(late))
        wait_until(lambda: all(observer.get(P.misfire(i)) is not None for i in ITEMS), 10)
    # the re-run is of the first missed fire, marked or not
    reruns = sorted((round(ft, 3), item) for ft, item, misfire in job.runs if misfire)
    assert reruns == [(round(soon, 3), item) for item in ITEMS], job.runs
    assert {float(e.value or b"0") for e in _mark_writes(events)} == {late}, events


def _mark_writes(events: list[WatchEvent]) -> list[WatchEvent]:
    return [e for e in events if e.path.startswith(P.misfire_root + "/") and e.value is not None]


def _misfires_are(runner: JobRunner, count: int) -> bool:
    return runner.state.stats["misfires"] == count
