"""A failover re-run of a run-now execution runs with the request's params (over the
MemoryStore; the kill -9 on real stores is in tests/jobs/test_run_now.py).

The run-now request's params and id are written in the running mark by the start
commit (the commit that creates the item's record of the request), carried into the
failover queue entry by whoever queues the mark (the leader for a dead owner, the
owner itself for a fenced or interrupted run) and into the claimed run's mark. Before,
neither the mark nor the entry had them: the re-run's ``ctx.params`` was empty, and
as the item had its record of the request nothing ever ran it with them (the
operator's request was lost for that item, also when the owner died between the
start commit and the item's code starting).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import DocumentError, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.runnow import RunNowService, request_value
from shardkeeper.job import ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob, Run

pytestmark = pytest.mark.timeout(60)

JOB = "rnf"
P = JobPaths(JOB)
PARAMS = {"batch": "7", "region": "eu-west"}
NEVER = "0 0 1 1 *"
DEAD = "host@9@dead"


@pytest.fixture
def store(memory_server: MemoryServer) -> Iterator[CoordinationStore]:
    s = memory_server.store()
    s.start()
    try:
        yield s
    finally:
        s.close()


# -- the documents ------------------------------------------------------------------------


def test_marks_and_entries_carry_the_params_and_old_documents_read_without_them() -> None:
    mark = RunningMark("a", 10.0, "x@10#0", params=PARAMS, request="r1")
    assert RunningMark.from_bytes(mark.to_bytes()) == mark
    entry = FailoverEntry(10.0, "x@10#0", "a", 11.0, params=PARAMS, request="r1")
    assert FailoverEntry.from_bytes(entry.to_bytes()) == entry
    # a scheduled fire's documents stay as they were; older ones read with no params
    plain = RunningMark("a", 10.0, "x@10#0", started_at=1.0)
    assert b"params" not in plain.to_bytes() and b"request" not in plain.to_bytes()
    old = b'{"execution_id":"x@10#0","fire_time":10.0,"instance_id":"a","started_at":1.0}'
    assert RunningMark.from_bytes(old) == plain
    old_entry = b'{"execution_id":"x@10#0","fire_time":10.0,"from_instance":"a"}'
    assert FailoverEntry.from_bytes(old_entry).params == {}
    assert FailoverEntry.from_bytes(old_entry).request == ""
    with pytest.raises(DocumentError, match="params"):
        RunningMark.from_bytes(old[:-1] + b',"params":["batch"]}', "/m")
    with pytest.raises(DocumentError, match="params"):
        FailoverEntry.from_bytes(old_entry[:-1] + b',"params":"batch=7"}', "/q")


def test_a_fold_never_drops_a_requests_params() -> None:
    """Two fires of one item queued: the later is run, with the params of a request
    that either entry is a part of (the later one's first)."""
    asked = FailoverEntry(100.0, "x@100#0", "a", params=PARAMS, request="r1")
    plain = FailoverEntry(200.0, "x@200#0", "b")
    for folded in (plain.fold(asked), asked.fold(plain)):
        assert (folded.fire_time, folded.folds) == (200.0, (100.0,))
        assert (folded.params, folded.request) == (PARAMS, "r1")
    later = FailoverEntry(300.0, "x@300#0", "c", params={"batch": "8"}, request="r2")
    assert (later.fold(asked).params, later.fold(asked).request) == ({"batch": "8"}, "r2")
    assert plain.fold(FailoverEntry(50.0, "x@50#0", "d")).params == {}


# -- the queue: from the start commit's mark to the claimed run's mark --------------------


def test_a_run_now_mark_is_queued_and_claimed_with_its_params(store: CoordinationStore) -> None:
    """The owner's start commit (the item's record of the request with its mark),
    then it dies before the item's code starts: the leader's requeue makes an entry
    with the params, the taker's claim writes them in its mark, and a second death
    queues them again."""
    store.put(P.sharding, b"{}")
    store.put(P.runnow("r1"), request_value(by="op", at=time.time(), params=PARAMS, total=2))
    node = store.get(P.sharding)
    assert node is not None
    ids = {i: f"{JOB}@1000#{i}" for i in (0, 1)}
    result = ExecutionService(store, P, DEAD).start(
        [0, 1],
        fire_time=1.0,
        execution_ids=ids,
        assignment_version=node.version,
        persistent=True,
        monitor=True,
        claims={i: RunNowService(store, P, DEAD).claim_ops("r1", i, ids[i]) for i in ids},
        params=PARAMS,
        request="r1",
    )
    assert result.marked == (0, 1)
    assert RunNowService(store, P, "x").recorded("r1") == frozenset({0, 1})

    assert FailoverService(store, P, "host@1@leader").requeue_orphans(live=set()) == [0, 1]
    for item in (0, 1):
        queued = store.get(P.failover_item(item))
        assert queued is not None
        entry = FailoverEntry.from_bytes(queued.value)
        assert (entry.params, entry.request, entry.execution_id) == (PARAMS, "r1", ids[item])

    taker = "host@2@taker"
    claims = FailoverService(store, P, taker).claim_many(limit=5)
    assert [(c.item, c.entry.params, c.entry.request) for c in claims] == [
        (0, PARAMS, "r1"),
        (1, PARAMS, "r1"),
    ]
    running = store.get(P.running(0))
    assert running is not None
    mark = RunningMark.from_bytes(running.value)
    assert (mark.instance_id, mark.failover, mark.params, mark.request) == (
        taker,
        True,
        PARAMS,
        "r1",
    )
    # the taker dies too: the item is queued again with the params
    assert FailoverService(store, P, "host@1@leader").requeue_orphans(live=set()) == [0, 1]
    again = store.get(P.failover_item(0))
    assert again is not None
    assert FailoverEntry.from_bytes(again.value).params == PARAMS


# -- the runtime: the re-run's ctx ---------------------------------------------------------


class Holding(RecordingJob):
    """Records every run; a first run of a run-now part (params, not a failover run)
    holds its item until ``release`` is set or it is told it is not valid any more or
    must stop (its instance lost its session, or stops at once)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        super().execute(ctx)
        if not ctx.params or ctx.is_failover:
            return
        while not self.release.wait(0.05):  # the item's own wait for its work
            if not ctx.is_valid() or ctx.should_stop():
                return


def _start(
    memory_server: MemoryServer, runtimes: list[Runtime], job: RecordingJob, count: int
) -> Runtime:
    rt = Runtime(memory_server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(name=JOB, cron=NEVER, sharding_total_count=count, failover=True))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10, message="the instance did not register")
    return rt


def _reruns(job: RecordingJob, item: int) -> list[Run]:
    return [r for r in job.runs if r.item == item and r.is_failover]


def _asked_item_running(
    store: CoordinationStore, job: RecordingJob, runtimes: list[Runtime]
) -> Run:
    """A run-now with PARAMS after a first round (the assignment): its run, held."""
    ops = Operations(store)
    wait_until(lambda: any(rt.runners[JOB].leader.is_leader for rt in runtimes), 10)
    ops.trigger(JOB)
    job.wait_for(lambda runs: len(runs) >= 1, 10, "the first request ran nothing")
    wait_until(lambda: all(rt.runners[JOB].idle for rt in runtimes), 10)
    ops.trigger(JOB, params=PARAMS)
    return job.wait_for(
        lambda runs: next((r for r in runs if r.params == PARAMS), None),
        10,
        "the run-now item did not start",
    )


@pytest.mark.parametrize("death", ["session", "hard_stop"])
def test_a_run_now_item_whose_owner_goes_is_re_run_with_the_params(
    memory_server: MemoryServer,
    store: CoordinationStore,
    runtimes: list[Runtime],
    death: str,
) -> None:
    """The owner of the item (one item, two instances) runs it for the request and
    then loses its session (the leader queues the mark, or the owner hands it off
    when it finds its run fenced) or stops at once (it hands it off): the failover
    re-run has ctx.params equal to the request's, and ctx.is_failover."""
    job = Holding()
    try:
        for _ in range(2):
            _start(memory_server, runtimes, job, count=1)
        held = _asked_item_running(store, job, runtimes)
        victim = next(rt for rt in runtimes if rt.instance_id == held.instance)
        if death == "session":
            victim_store = victim.store
            assert isinstance(victim_store, MemoryStore)
            victim_store.expire()
        else:
            victim.stop_now()
        rerun = job.wait_for(
            lambda runs: next((r for r in runs if r.item == 0 and r.is_failover), None),
            20,
            "the item was never re-run by failover",
        )
        assert rerun.params == PARAMS
        assert rerun.execution_id == held.execution_id
        wait_until(lambda: not store.children(P.runnow_root), 10, message="request pending")
    finally:
        job.release.set()
    assert [r.params for r in _reruns(job, 0)] == [PARAMS]


def test_an_owner_gone_between_the_start_commit_and_the_items_code_has_it_run_with_the_params(
    memory_server: MemoryServer, store: CoordinationStore, runtimes: list[Runtime]
) -> None:
    """The owner's start commit is applied (the item's record of the request: it
    counts as started) and its session ends before the commit returns, so the item's
    code never runs there: the survivor's failover run is the request's run of it,
    with the params."""
    job = RecordingJob()
    for _ in range(2):
        _start(memory_server, runtimes, job, count=1)
    ops = Operations(store)
    wait_until(lambda: any(rt.runners[JOB].leader.is_leader for rt in runtimes), 10)
    ops.trigger(JOB)  # the assignment
    first = job.wait_for(lambda runs: next(iter(runs), None), 10, "the first request did not run")
    wait_until(lambda: all(rt.runners[JOB].idle for rt in runtimes), 10)
    owner = next(rt for rt in runtimes if rt.instance_id == first.instance)
    owner_store = owner.store
    assert isinstance(owner_store, MemoryStore)
    # the owner's start commit of the request's part: applied, then held
    with memory_server.pause(
        "commit", when="after", path=P.runnow_root, store=owner_store
    ) as started:
        ops.trigger(JOB, params=PARAMS)
        assert started.wait_reached(10), "the owner did not commit the request's part"
        owner_store.expire()
        rerun = job.wait_for(
            lambda runs: next((r for r in runs if r.is_failover), None),
            20,
            "the owner's item was never re-run",
        )
    assert (rerun.params, rerun.item) == (PARAMS, 0)
    assert rerun.instance != owner.instance_id
    wait_until(lambda: not store.children(P.runnow_root), 10, message="request pending")
