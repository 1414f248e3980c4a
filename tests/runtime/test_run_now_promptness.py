"""A run-now request's part runs as soon as the item's current run ends.

Items of a long job outlast the interval: while one runs, the fires of the schedule
are missed here and owed as one misfire re-run, which starts when the run ends. A
run-now request that finds the item running is held for that moment too. Both were
queued in fire-time order, and the re-run's fire (the first one missed) was nearly
always older than the request's (the owner's clock when it queued the part): the
part waited a whole run more behind it, and behind the next re-run's busy waits
(600 s chaos on ZooKeeper: params reached the item 23 to 67 s after the request,
past the deadline of wait + 2 work + 2 intervals). The request goes first now.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.runtime._holding import Holding

pytestmark = pytest.mark.timeout(60)

JOB = "prompt"
PARAMS = {"op": "5-386125"}
NEVER = "0 0 1 1 *"


def test_a_request_part_starts_when_the_long_run_ends_before_the_owed_misfire_re_run(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Both items run (held: a long item); a fire of the schedule comes meanwhile
    and is owed as a misfire re-run; then an operator's run-now request (durable,
    as the CLI makes it) finds the items running. Once the runs end, each item's
    next run is the request's part, with its params; the owed re-run comes after
    it (its fires are not dropped). Before, the re-run (the older fire) went
    first and the part waited one more run."""
    admin = memory_server.store()
    admin.start()
    job = Holding(hold=lambda ctx: not ctx.params and not ctx.is_misfire)
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, misfire=True)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len([r for r in job.runs if r.held]) == 2, 10, message="no long run")
    # a fire of the schedule while the items run: owed as a misfire re-run
    runner.on_trigger(datetime.fromtimestamp(time.time(), UTC))
    wait_until(lambda: runner.stats["misfires"] >= 1, 10, message="the fire was not deferred")
    Operations(admin).trigger(JOB, params=PARAMS)
    wait_until(
        lambda: runner.stats["misfires"] >= 2,
        10,
        message="the request's part did not find its items running",
    )
    assert not [r for r in job.runs if r.params], job.runs
    job.release.set()

    def both_ran() -> bool:
        after = [r for r in job.runs if not r.held]
        return all(
            any(r.item == i and r.params for r in after)
            and any(r.item == i and r.misfire and not r.params for r in after)
            for i in (0, 1)
        )

    wait_until(
        both_ran, 15, message=lambda: f"the part and the re-run did not both run: {job.runs}"
    )
    after = [r for r in job.runs if not r.held]
    for item in (0, 1):
        runs = [r for r in after if r.item == item]
        # the item's first run once the long one ended is the request's part
        assert runs[0].params == PARAMS, (item, runs)
        assert any(r.misfire and not r.params for r in runs[1:]), (item, runs)


def test_a_request_part_held_behind_a_failed_completion_commit_runs_once_it_is_retried(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The long run's completion commit fails (a timeout: the store was slow), so its
    marks stay and the part held for its items cannot start. The commit is retried
    within a second or so when a part (or a misfire re-run) waits for it, not only at
    the next housekeeping pass (every T/3: here 10 s; 14 s late in 600 s chaos on
    ZooKeeper, the bulk job's repairs ahead of it)."""
    admin = memory_server.store()
    admin.start()
    job = Holding(hold=lambda ctx: not ctx.params and not ctx.is_misfire)
    store = memory_server.store(session_timeout=30.0)
    rt = Runtime(store, shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, misfire=True)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len([r for r in job.runs if r.held]) == 2, 10, message="no long run")
    Operations(admin).trigger(JOB, params=PARAMS)
    wait_until(
        lambda: runner.stats["misfires"] >= 1,
        10,
        message="the request's part did not find its items running",
    )
    # the next commit under running/ is the long run's completion
    store.fail_next("commit", path=JobPaths(JOB).running_root)
    job.release.set()
    wait_until(lambda: runner.batches.unfinished(), 10, message="the completion did not fail")
    failed = time.monotonic()
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        10,
        message=lambda: f"the part never ran: {job.runs}",
    )
    assert time.monotonic() - failed < 5.0, "the part waited for a housekeeping pass"


def test_a_request_part_of_a_free_item_starts_while_another_item_of_it_still_runs(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Item 0 runs long here (an earlier request of that item alone); a request of
    both items comes. Item 1 is free: its part starts now, with the params; only
    item 0's part waits for item 0's run to end. Before, the whole request waited
    for its busiest item (600 s chaos: a part of an idle item ran behind a busy
    one's run and re-runs)."""
    admin = memory_server.store()
    admin.start()
    job = Holding(hold=lambda ctx: ctx.params.get("hold") == "1")
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, misfire=True)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    runner.on_trigger(datetime.now(UTC))  # the assignment: both items are ours
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    ops = Operations(admin)
    ops.trigger(JOB, params={"hold": "1"}, items=[0])
    wait_until(lambda: [r.item for r in job.runs if r.held] == [0], 10, message="no long run")
    ops.trigger(JOB, params=PARAMS)
    wait_until(
        lambda: [r.item for r in job.runs if r.params == PARAMS] == [1],
        10,
        message=lambda: f"item 1's part did not start while item 0 ran: {job.runs}",
    )
    assert not [r for r in job.runs if r.params == PARAMS and r.item == 0]
    job.release.set()
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        10,
        message=lambda: f"item 0's part never ran: {job.runs}",
    )
    wait_until(lambda: not admin.children(JobPaths(JOB).runnow_root), 10, message="not retired")


def test_a_part_that_becomes_ours_runs_while_a_part_of_the_same_request_waits_here(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Our item runs long (an earlier request of it alone) when a request of both
    items comes: our part waits here for that run. The other item's owner (a
    member that runs nothing) then leaves, so its part is ours to run: it starts
    now, with the params, while our first part still waits. Before, a request with
    a part in hand here was not looked at again until that part ended (600 s chaos
    on ZooKeeper: the new owner queued the part 48 s after the request)."""
    admin = memory_server.store()
    admin.start()
    paths = JobPaths(JOB)
    job = Holding(hold=lambda ctx: ctx.params.get("hold") == "1")
    rt = Runtime(memory_server.store(), shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, misfire=True)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    # a member that runs nothing takes one item at the next fire's reshard
    admin.put(paths.instance("other"), b"{}", ephemeral=True)
    admin.put(paths.necessary, b"test")
    runner.on_trigger(datetime.now(UTC))

    def split() -> tuple[int, int] | None:
        assignment, _ = runner.services.sharding.read()
        if assignment is None:
            return None
        owners = assignment.owners_for(None)
        ours = [i for i, o in owners.items() if o == rt.instance_id]
        theirs = [i for i, o in owners.items() if o == "other"]
        return (ours[0], theirs[0]) if ours and theirs else None

    ours, theirs = wait_until(split, 10, message="the other member got no item")
    wait_until(lambda: runner.idle, 10)
    ops = Operations(admin)
    ops.trigger(JOB, params={"hold": "1"}, items=[ours])
    wait_until(lambda: [r.item for r in job.runs if r.held] == [ours], 10, message="no long run")
    before = runner.stats["misfires"]
    ops.trigger(JOB, params=PARAMS)
    wait_until(
        lambda: runner.stats["misfires"] > before,
        10,
        message="our part did not wait for the long run",
    )
    admin.delete(paths.instance("other"))
    wait_until(
        lambda: [r.item for r in job.runs if r.params == PARAMS] == [theirs],
        10,
        message=lambda: f"the part that became ours did not start: {job.runs}",
    )
    assert not [r for r in job.runs if r.params == PARAMS and r.item == ours]
    job.release.set()
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        10,
        message=lambda: f"our waiting part never ran: {job.runs}",
    )
