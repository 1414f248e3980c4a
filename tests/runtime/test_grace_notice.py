"""A graceful stop keeps its word (issue 35 section 3, newcomer review N8 and N9).

The docs say that on SIGTERM running items finish within the grace period. They did
only when they never asked: ``ctx.should_stop()`` was true the moment the stop began
(reason ``shutdown``), so an item written as the docs teach (poll it between pieces
of work) returned at once, was recorded ``interrupted`` and was handed to failover on
every deploy, and the log called it "a fenced execution".

Now ``should_stop()`` turns true only when the grace period is about to run out
(``shutdown_notice`` seconds before its end: time to checkpoint and return), or when
the execution must end for another reason (fenced, timed out); and the hand-off log
line names the reason the item ended for.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import ConfigError
from shardkeeper.job import ShardedJob, ShardingContext, StopReason
from shardkeeper.observe import Outcome
from shardkeeper.registry import CoordinationStore
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.runtime import shutdown_notice_for
from shardkeeper.testing.faults import wait_until
from tests.runtime._holding import Records

pytestmark = pytest.mark.timeout(90)

JOB = "graceful-notice"
P = JobPaths(JOB)
#: how often an item polls should_stop() (the docs' pattern)
POLL = 0.02
#: an item returns by itself after this long: no test can hang on it
HOLD_LIMIT = 30.0


@dataclass
class Run:
    """One execution and what it saw."""

    item: int
    execution_id: str
    polls: int = 0
    #: ctx.stop_reason() once should_stop() answered true
    stopped: str | None = None
    #: monotonic time should_stop() first answered true
    stopped_at: float | None = None
    returned: bool = False


class Polling(ShardedJob):
    """Works until ``release`` (or the limit), polling ``ctx.should_stop()`` between
    pieces of work and returning when it says so, as concepts.md teaches."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._runs: list[Run] = []

    def execute(self, ctx: ShardingContext) -> None:
        """Poll until released or told to stop."""
        run = Run(ctx.item, ctx.execution_id)
        with self._lock:
            self._runs.append(run)
        deadline = time.monotonic() + HOLD_LIMIT
        try:
            while not self.release.is_set() and time.monotonic() < deadline:
                if ctx.should_stop():
                    run.stopped_at = time.monotonic()
                    run.stopped = str(ctx.stop_reason())
                    return
                run.polls += 1
                self.release.wait(POLL)
        finally:
            run.returned = True

    @property
    def runs(self) -> list[Run]:
        """Every execution so far (a copy)."""
        with self._lock:
            return list(self._runs)


def _config() -> JobConfig:
    # fired by the test only (a cron of once a year): one batch, no later fire
    return JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2, failover=True)


def _started(
    url: str, runtimes: list[Runtime], job: Polling, grace: float
) -> tuple[Runtime, Records]:
    """A runtime running both items of one fire of ``job``, each polling."""
    records = Records()
    rt = Runtime(url, shutdown_grace=grace, worker_threads=4, observers=[records])
    rt.add_job(job, _config())
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 15, message="the job never registered")
    runner.on_trigger(datetime.now(UTC))
    wait_until(
        lambda: len(job.runs) == 2 and all(r.polls > 0 for r in job.runs),
        15,
        message=lambda: f"the two items did not start: {job.runs}",
    )
    return rt, records


def _marks_of(store: CoordinationStore, instance: str) -> list[int]:
    items = []
    for name in store.children(P.running_root):
        node = store.get(P.running(int(name)))
        if node is not None and RunningMark.from_bytes(node.value).instance_id == instance:
            items.append(int(name))
    return items


def test_an_item_that_polls_should_stop_finishes_within_the_grace(
    registry_url: str, store: CoordinationStore, runtimes: list[Runtime]
) -> None:
    """SIGTERM (``stop()``) with a grace of 20 s while two items poll should_stop():
    they are not told to stop, go on working, end by themselves, and are recorded
    ok; nothing is handed to failover and no mark is left. On the old code they were
    told "shutdown" at once, recorded interrupted and queued for failover."""
    job = Polling()
    rt, records = _started(registry_url, runtimes, job, grace=20.0)
    runs = job.runs
    stopper = threading.Thread(target=rt.stop, name="test-graceful-stop")
    stopper.start()
    try:
        wait_until(lambda: rt.stopping, 10, message="the stop never began")
        before = [r.polls for r in runs]
        # working on through the stop: 25 more polls each (half a second), or told
        wait_until(
            lambda: (
                any(r.stopped for r in runs)
                or all(r.polls >= b + 25 for r, b in zip(runs, before, strict=True))
            ),
            10,
            message=lambda: f"the items neither went on nor were told to stop: {runs}",
        )
        assert [r.stopped for r in runs] == [None, None], "told to stop at once"
        job.release.set()  # their work is done: they return by themselves
        stopper.join(20)
        assert not stopper.is_alive(), "the graceful stop did not finish"
    finally:
        job.release.set()
        stopper.join(20)
    assert [r.stopped for r in runs] == [None, None]
    assert [records.outcome_of(r.execution_id) for r in runs] == [Outcome.OK, Outcome.OK]
    assert not store.children(P.failover_queue), "a finished item was queued for failover"
    assert not _marks_of(store, rt.instance_id), "a mark of the stopped instance was left"


def test_an_item_longer_than_the_grace_is_told_to_stop_as_the_grace_runs_out(
    registry_url: str,
    store: CoordinationStore,
    runtimes: list[Runtime],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Items that would outlast a 5 s grace are told to stop ``shutdown_notice``
    before its end (by default a fifth of it: 1 s), with the reason that names it;
    they return in time, are recorded interrupted and handed to failover, and the
    log line of the hand-off says why (not "a fenced execution": nothing was
    fenced). On the old code they were told at once."""
    caplog.set_level(logging.INFO, logger="shardkeeper")
    job = Polling()
    rt, records = _started(registry_url, runtimes, job, grace=5.0)
    runs = job.runs
    began = time.monotonic()
    stopper = threading.Thread(target=rt.stop, name="test-graceful-stop")
    stopper.start()
    try:
        wait_until(
            lambda: all(r.returned for r in runs),
            10,
            message=lambda: f"the items were never told to stop: {runs}",
        )
        stopper.join(20)
        assert not stopper.is_alive(), "the graceful stop did not finish"
    finally:
        job.release.set()
        stopper.join(20)
    told = [r.stopped_at - began for r in runs if r.stopped_at is not None]
    # 4 s after the stop began (not at once), and before the grace was over
    assert len(told) == 2 and all(3.9 <= t < 5.0 for t in told), told
    assert [r.stopped for r in runs] == [StopReason.SHUTDOWN.value] * 2
    assert StopReason.SHUTDOWN.value == "shutdown grace ending"
    assert [records.outcome_of(r.execution_id) for r in runs] == [Outcome.INTERRUPTED] * 2
    # handed to failover (nobody else runs the job here: the entries wait)
    assert sorted(store.children(P.failover_queue)) == ["0", "1"]
    handed = [
        r.getMessage() for r in caplog.records if r.name == "shardkeeper.coordination.failover"
    ]
    assert any("handed to failover" in m and "shutdown grace ending" in m for m in handed), handed
    assert not any("fenced" in m for m in handed), handed
    told_lines = [r.getMessage() for r in caplog.records if r.name == "shardkeeper.runtime.runtime"]
    assert any("told to stop" in m for m in told_lines), told_lines


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_a_bad_shutdown_notice_is_refused(bad: float) -> None:
    """A clear error naming the bad value and what is valid."""
    with pytest.raises(ConfigError, match=r"shutdown_notice=.*>= 0"):
        Runtime("memory://notice-bad/ns", shutdown_notice=bad)


def test_shutdown_notice_says_when_items_are_told(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """``shutdown_notice`` sets how long before the end of the grace items are told:
    3 s of grace and 2.5 s of notice tell them half a second into the stop. Without
    it, a fifth of the grace, at most 5 s."""
    assert shutdown_notice_for(30.0, None) == 5.0
    assert shutdown_notice_for(5.0, None) == 1.0
    assert shutdown_notice_for(1.0, 3.0) == 1.0  # never more than the grace
    assert shutdown_notice_for(0.0, None) == 0.0
    job = Polling()
    records = Records()
    rt = Runtime(
        memory_server.store(),
        shutdown_grace=3.0,
        shutdown_notice=2.5,
        worker_threads=4,
        observers=[records],
    )
    rt.add_job(job, _config())
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len(job.runs) == 2 and all(r.polls > 0 for r in job.runs), 10)
    runs = job.runs
    began = time.monotonic()
    stopper = threading.Thread(target=rt.stop, name="test-graceful-stop")
    stopper.start()
    try:
        wait_until(lambda: all(r.returned for r in runs), 10, message=lambda: f"{runs}")
        stopper.join(20)
    finally:
        job.release.set()
        stopper.join(20)
    told = [r.stopped_at - began for r in runs if r.stopped_at is not None]
    assert len(told) == 2 and all(0.4 <= t < 1.5 for t in told), told
    assert [records.outcome_of(r.execution_id) for r in runs] == [Outcome.INTERRUPTED] * 2
