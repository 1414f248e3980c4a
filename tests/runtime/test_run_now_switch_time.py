"""An operator's switch has a time, for run-now requests as for the fires of the
schedule (JobState.job_disabled/item_disabled): a request made before a job or
item disable is not dropped by it (its parts run, decided at the request's time,
even while the switch is on), and a request made at or after it is recorded as a
``disabled`` skip of the parts it switches off. Before, the leader recorded every
pending part of a job or item switched off when it looked as ``disabled``,
whenever the switch was set."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.runnow import request_value
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.ops import Operations
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "rnswitch"
P = JobPaths(JOB)
EARLY = {"made": "before the switch"}
LATE = {"made": "after the switch"}
NEVER = "0 0 1 1 *"


class Skips:
    """Records the skip records of a runtime."""

    def __init__(self) -> None:
        self.skips: list[SkipRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        """Executions are not looked at here."""

    def on_skip(self, record: SkipRecord) -> None:
        """Keep the skip record."""
        self.skips.append(record)


@pytest.fixture
def admin(memory_server: MemoryServer) -> Iterator[CoordinationStore]:
    s = memory_server.store()
    s.start()
    try:
        yield s
    finally:
        s.close()


def _runtime(
    memory_server: MemoryServer, runtimes: list[Runtime], admin: CoordinationStore
) -> tuple[Runtime, RecordingJob, Skips]:
    """A leader of both items of the job, which ran them once (its assignment)."""
    job = RecordingJob()
    skips = Skips()
    rt = Runtime(memory_server.store(), shutdown_grace=1, observers=[skips])
    rt.add_job(job, JobConfig(name=JOB, cron=NEVER, sharding_total_count=2))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    Operations(admin).trigger(JOB)
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    return rt, job, skips


def _switch(admin: CoordinationStore, path: str, at: float) -> None:
    """An operator's switch set at ``at`` (the value ops/writes.py stores)."""
    admin.put(path, json.dumps({"at": at}).encode())


def _request(admin: CoordinationStore, name: str, at: float, params: dict[str, str]) -> None:
    admin.put(P.runnow(name), request_value(by="op", at=at, params=params, total=2))


def test_a_request_made_before_a_job_disable_runs_and_one_made_after_it_is_a_skip(
    memory_server: MemoryServer, runtimes: list[Runtime], admin: CoordinationStore
) -> None:
    """The leader looks at both requests only once the job is switched off (a
    request queued behind other work, or seen after a partition, say)."""
    rt, job, skips = _runtime(memory_server, runtimes, admin)
    runner = rt.runners[JOB]
    made = time.time()
    switched = made + 0.5
    _switch(admin, P.disabled_job, switched)
    wait_until(lambda: runner.state.disabled_job, 10, message="the disable was not seen")
    _request(admin, "1-early", made, EARLY)
    _request(admin, "2-late", switched + 0.5, LATE)
    wait_until(
        lambda: not admin.children(P.runnow_root),
        15,
        message=lambda: f"requests stayed: {admin.get_tree(P.runnow_root)}; runs {job.runs}",
    )
    assert sorted(r.item for r in job.runs if r.params == EARLY) == [0, 1]
    assert [r for r in job.runs if r.params == LATE] == []
    assert [(s.reason, s.items) for s in skips.skips] == [("job disabled", (0, 1))]
    assert runner.state.disabled_job  # ran while the switch was on


def test_a_request_made_before_an_item_disable_runs_that_item(
    memory_server: MemoryServer, runtimes: list[Runtime], admin: CoordinationStore
) -> None:
    rt, job, skips = _runtime(memory_server, runtimes, admin)
    runner = rt.runners[JOB]
    made = time.time()
    switched = made + 0.5
    _switch(admin, P.disabled_item(1), switched)
    wait_until(lambda: 1 in runner.state.disabled_items, 10, message="the disable was not seen")
    _request(admin, "1-early", made, EARLY)
    _request(admin, "2-late", switched + 0.5, LATE)
    wait_until(
        lambda: not admin.children(P.runnow_root),
        15,
        message=lambda: f"requests stayed: {admin.get_tree(P.runnow_root)}; runs {job.runs}",
    )
    assert sorted(r.item for r in job.runs if r.params == EARLY) == [0, 1]
    assert [r.item for r in job.runs if r.params == LATE] == [0]
    assert [s.items for s in skips.skips] == [(1,)]
    assert skips.skips[0].message == "item disabled by an operator"
