"""The periodic mark checks take a bounded share of a job's lane.

Each periodic check reads every running mark of the job (the leader's orphan requeue
and the instance's own stray marks). A job of 10,000 items has up to 10,000 marks,
and 4 instances reading them every third pass on a loaded 2-core machine kept the
coordinating threads busy with reads while fires waited (the production-like chaos
run, issue 25). Now a periodic check waits MARKS_BUDGET⁻¹ times its own duration
(at most MARKS_MAX_WAIT); suspect marks are still checked at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.runner import repair
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)


class _Clock:
    """A monotonic clock the test moves: a mark check "costs" ``cost`` seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def _passes(server: MemoryServer, runtimes: list[Runtime], cost: float, suspect: bool) -> int:
    """Run 60 passes, one simulated second apart; how many checked the own marks."""
    # a session of 600 s: the housekeeping thread's first tick is 200 s away, so the
    # only passes are the test's own
    rt = Runtime(server.store(session_timeout=600), shutdown_grace=1)
    rt.add_job(RecordingJob(), JobConfig(name="j", cron="0 0 1 1 *", sharding_total_count=4))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners["j"]
    wait_until(lambda: runner.state.registered and runner.idle, 10)
    clock = _Clock()
    calls = 0
    failover = runner.repairs._s.failover
    real = failover.requeue_own

    def costly(*args: Any, **kwargs: Any) -> list[int]:
        nonlocal calls
        calls += 1
        clock.now += cost
        return real(*args, **kwargs)

    # undone on leaving the block, as a try/finally would
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repair, "time", clock)
        patch.setattr(failover, "requeue_own", costly)
        for _ in range(60):
            if suspect:
                runner.state.marks_suspect = True
            runner.repairs.run()
            clock.now += 1.0
    return calls


def test_cheap_mark_checks_run_every_third_pass(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    assert _passes(server, runtimes, cost=0.001, suspect=False) == 20


def test_costly_mark_checks_are_spaced_by_their_cost(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """A check of 0.5 s waits 0.5 / MARKS_BUDGET = 10 s: 60 passes 1 s apart (plus the
    cost) run a handful, not 20."""
    calls = _passes(server, runtimes, cost=0.5, suspect=False)
    spacing = 0.5 / repair.MARKS_BUDGET
    assert 60 / (spacing + 3) <= calls <= 60 / spacing + 1, calls


def test_a_check_past_the_longest_wait_still_comes(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Even a check that cost 10 s (200 s of budget) comes again after MARKS_MAX_WAIT."""
    calls = _passes(server, runtimes, cost=10.0, suspect=False)
    assert calls >= 2


def test_suspect_marks_are_checked_at_once_whatever_they_cost(
    server: MemoryServer, runtimes: list[Runtime]
) -> None:
    assert _passes(server, runtimes, cost=0.5, suspect=True) == 60
