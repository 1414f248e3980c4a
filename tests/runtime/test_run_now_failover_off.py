"""With failover off nobody takes over a run cut short: a run-now part whose run
was fenced (or interrupted, or whose instance died) ended without a completion, and
its record said "started" for good; the leader deleted the request as soon as every
part had a record, so the operator's request looked done while that part never
completed. Now the leader waits for the started parts' runs to end, and reopens
a part whose run ended without a completion: its owner runs it again, with the
params, at its next look (as a plain item cut short runs at its next fire)."""

from __future__ import annotations

import threading

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.runtime._holding import Holding

pytestmark = pytest.mark.timeout(60)

JOB = "rnoff"
P = JobPaths(JOB)
PARAMS = {"op": "fenced-once"}
NEVER = "0 0 1 1 *"


def test_a_fenced_part_is_run_again_by_its_owner_and_the_request_retired_after(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    admin = memory_server.store()
    admin.start()
    fenced = threading.Event()
    # the part of item 0 runs long the first time (until fenced), then briefly
    job = Holding(hold=lambda ctx: ctx.params == PARAMS and ctx.item == 0 and not fenced.is_set())
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, failover=False)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    ops = Operations(admin)
    ops.trigger(JOB)  # the assignment: both items are ours
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)

    ops.trigger(JOB, params=PARAMS)
    wait_until(
        lambda: [r.item for r in job.runs if r.params == PARAMS and r.held] == [0],
        10,
        message=lambda: f"item 0's part did not start: {job.runs}",
    )
    wait_until(
        lambda: [r.item for r in job.runs if r.params == PARAMS and not r.held] == [1],
        10,
        message=lambda: f"item 1's part did not run: {job.runs}",
    )
    # the run of item 0's part is fenced (as by a session that may be lost)
    fenced.set()
    assert 0 in runner.batches.fence_all("the test")
    wait_until(
        lambda: (
            [r.stopped is not None for r in job.runs if r.params == PARAMS and r.item == 0]
            == [True]
        ),
        10,
        message="the fenced run did not stop",
    )
    wait_until(
        lambda: len([r for r in job.runs if r.params == PARAMS and r.item == 0]) == 2,
        15,
        message=lambda: f"item 0's fenced part was not run again: {job.runs}",
    )
    wait_until(lambda: not admin.children(P.runnow_root), 10, message="the request stayed")
    again = [r for r in job.runs if r.params == PARAMS and r.item == 0][1]
    assert again.instance == rt.instance_id and not again.held and again.returned
    # each part ran to its end once, item 1's was not run again
    assert len([r for r in job.runs if r.params == PARAMS and r.item == 1]) == 1


def test_a_reopened_part_is_looked_at_by_its_owner_at_once(
    memory_server: MemoryServer, runtimes: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fenced part's owner is not the leader. The leader's reopen writes the
    request again, and its event makes the owner look now: here the owner's
    housekeeping passes are held off, so only that event can bring it to look.
    Before, a deleted record was no event at all, and the owner ran the part only
    at its next housekeeping pass."""
    admin = memory_server.store()
    admin.start()
    fenced = threading.Event()
    held: set[str] = set()  # the owner's part runs long the first time
    job = Holding(
        hold=lambda ctx: ctx.params == PARAMS and ctx.instance_id in held and not fenced.is_set()
    )
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, failover=False)
    lead = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    lead.add_job(job, cfg)
    runtimes.append(lead)
    lead.start()
    wait_until(lambda: lead.runners[JOB].leader.is_leader, 10)
    other = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    other.add_job(job, cfg)
    runtimes.append(other)
    other.start()
    owner = other.runners[JOB]
    held.add(other.instance_id)
    wait_until(lambda: owner.state.registered, 10)
    admin.put(P.necessary, b"the test")
    ops = Operations(admin)
    ops.trigger(JOB)

    def theirs() -> list[int]:
        assignment, _ = owner.services.sharding.read()
        return [] if assignment is None else assignment.items_of(other.instance_id)

    (item,) = wait_until(theirs, 10, message="the other instance got no item")
    wait_until(lambda: lead.runners[JOB].idle and owner.idle, 10)
    ops.trigger(JOB, params=PARAMS)
    wait_until(
        lambda: (
            [(r.instance, r.item) for r in job.runs if r.params == PARAMS and r.held]
            == [(other.instance_id, item)]
        ),
        10,
        message=lambda: f"the owner's part did not start: {job.runs}",
    )
    # from now on the owner looks at the requests only when an event asks it to
    monkeypatch.setattr(owner, "repair", lambda: [])
    fenced.set()
    assert item in owner.batches.fence_all("the test")
    wait_until(
        lambda: len([r for r in job.runs if r.params == PARAMS and r.item == item]) == 2,
        10,
        message=lambda: f"the owner did not run its reopened part: {job.runs}",
    )
    again = [r for r in job.runs if r.params == PARAMS and r.item == item][1]
    assert again.instance == other.instance_id
    wait_until(lambda: not admin.children(P.runnow_root), 10, message="the request stayed")
