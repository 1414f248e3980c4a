"""Fires folded behind a run that lasts longer than the interval are named by the
misfire re-run that stands for them (``ctx.covers``): with misfire on, every fire of
the schedule is either run or covered, never dropped in silence (issue 25, section 4).
Before, the re-run was of the earliest missed fire and the later ones it folded were
forgotten: with 2.3 s items every second, about one fire in three ran nowhere and no
run said so.
"""

from __future__ import annotations

import threading
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)

JOB = "folds"


class Slow(ShardedJob):
    """Each run takes ``work`` seconds; records (fire time, misfire, covered fires)."""

    def __init__(self, work: float) -> None:
        self.work = work
        self.lock = threading.Lock()
        self.runs: list[tuple[float, bool, tuple[float, ...]]] = []

    def execute(self, ctx: ShardingContext) -> None:
        time.sleep(self.work)  # the item's work: longer than the interval on purpose
        with self.lock:
            self.runs.append(
                (
                    ctx.fire_time.timestamp(),
                    ctx.is_misfire,
                    tuple(t.timestamp() for t in ctx.covers),
                )
            )

    def snapshot(self) -> list[tuple[float, bool, tuple[float, ...]]]:
        with self.lock:
            return list(self.runs)


def stands_for_every_fire(
    runs: list[tuple[float, bool, tuple[float, ...]]], why: str
) -> set[float]:
    """Every fire of the 1 s schedule from the first run to the last is run or named
    in a run's covers (``why`` says what the test did); the fire times that ran."""
    ran = {round(ft, 3) for ft, _m, _c in runs}
    covered = {round(c, 3) for _ft, _m, cov in runs for c in cov}
    first, last = min(ran), max(ran)
    due = {round(first + k, 3) for k in range(round(last - first) + 1)}
    assert due <= ran | covered, (
        f"fires {sorted(due - ran - covered)} neither ran nor were covered{why}: {runs}"
    )
    return ran


def test_fires_folded_behind_a_long_run_are_covered_by_the_rerun(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    job = Slow(work=2.3)
    rt = Runtime(memory_server.store(session_timeout=4.0), shutdown_grace=5)
    rt.add_job(
        job,
        JobConfig(name=JOB, interval=1, sharding_total_count=1, misfire=True, failover=True),
    )
    rt.start()
    runtimes.append(rt)
    wait_until(
        lambda: sum(1 for _ft, misfire, _c in job.snapshot() if misfire) >= 4,
        40,
        message=lambda: f"fewer than 4 misfire re-runs: {job.snapshot()}",
    )
    runs = job.snapshot()
    ran = stands_for_every_fire(runs, "")
    # the re-runs are what folds them: each names the fires after its own
    reruns = [(ft, cov) for ft, misfire, cov in runs if misfire]
    assert any(cov and min(cov) > ft for ft, cov in reruns), reruns
    # nothing claimed twice as a run of its own fire
    assert len(ran) == len(runs), runs


def test_fires_folded_into_a_rerun_that_never_came_are_covered_by_the_next_run(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A re-run owed for fires folded behind a running item can be lost (its run was
    fenced and the item handed over, the owed re-run dropped with it): those fires
    were never run, so the next start of the item here must find them as a gap and
    cover them, not take them for decided because they were once deferred."""
    job = Slow(work=2.3)
    rt = Runtime(memory_server.store(session_timeout=4.0), shutdown_grace=5)
    rt.add_job(
        job,
        JobConfig(name=JOB, interval=1, sharding_total_count=1, misfire=True, failover=True),
    )
    rt.start()
    runtimes.append(rt)
    st = rt.runners[JOB].state

    def owed() -> bool:
        with st.lock:
            return st.misfire_at is not None

    wait_until(lambda: job.snapshot() and owed(), 30, message="no fire was folded behind a run")
    with st.lock:  # the owed re-run is lost
        lost_from = st.misfire_at
        st.misfire_at = st.misfire_last = None
    assert lost_from is not None
    wait_until(
        lambda: sum(1 for ft, _m, _c in job.snapshot() if ft > lost_from + 2) >= 2,
        30,
        message=lambda: f"no runs after the lost re-run: {job.snapshot()}",
    )
    stands_for_every_fire(job.snapshot(), f" (re-run of {lost_from} lost)")
