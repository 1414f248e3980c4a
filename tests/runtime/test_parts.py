"""The runner's parts, driven one by one over the MemoryStore (no runtime, no threads
beyond the store's): typed events, the trigger's steps and skip reasons, the
leader's reshard steps, lanes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.paths import InstanceNode, JobNode, ShutdownNode, Unknown, parse
from shardkeeper.coordination.sharding import necessary_parts, necessary_value
from shardkeeper.registry.base import ConnectionState, EventKind, WatchEvent
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime.execute.pool import Lanes, WorkerPool
from shardkeeper.runtime.fire.batches import Batch
from shardkeeper.runtime.fire.trigger import Deferred, Fire, Launched, Skipped, TriggerFlow, Wait
from shardkeeper.runtime.job import events as ev
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.leader import LeaderDuties, ReshardStep
from shardkeeper.runtime.job.phase import JobPhase
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(30)

JOB = "parts"
ME = "host@1@me"


@pytest.fixture(params=[False, True], ids=["together", "apart"])
def store(request: pytest.FixtureRequest) -> Iterator[MemoryStore]:
    """A store whose commit_groups is one plain commit (ZooKeeper's way), or checks
    each item apart (etcd's nested transactions): the trigger's steps hold for both."""
    server = MemoryServer(groups_apart=request.param)
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        server.shutdown()


def _register(state: JobState) -> None:
    """As a registration that succeeded."""
    state.phase.transition(JobPhase.REGISTERING, "the test")
    state.phase.transition(JobPhase.REGISTERED, "the test")


def _flow(
    store: MemoryStore, held: set[int] | None = None, **cfg: object
) -> tuple[TriggerFlow, JobState, JobServices, list[Batch]]:
    services = JobServices.build(store, JOB, ME)
    state = JobState(
        JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True, **cfg)  # type: ignore[arg-type]
    )
    node = store.put(services.paths.instance(ME), b"{}", ephemeral=True)
    state.member_revision = node.created_revision
    _register(state)
    launched: list[Batch] = []
    flow = TriggerFlow(
        services,
        state,
        LeaderDuties(services, state),
        local_items=lambda: set(held or ()),
        launch=launched.append,
        session=lambda: store.session_id,
        # as the runner's batches do: a launched batch owns its items' executions
        owns=lambda item, ex: any(b.execution_ids.get(item) == ex for b in launched),
    )
    return flow, state, services, launched


def _assign(store: MemoryStore, services: JobServices, owners: dict[int, str]) -> None:
    store.put(services.paths.sharding, Assignment(total=2, owners=owners).to_bytes())


# ---- paths.parse and typed events -------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "node"),
    [
        ("/instances/a@1@x", InstanceNode("a@1@x")),
        ("/control/shutdown/a@1@x", ShutdownNode("a@1@x")),
        ("/jobs/j/running/3", JobNode("j", "running", item=3)),
        ("/jobs/j/failover/queue/4", JobNode("j", "failover", item=4)),
        ("/jobs/j/instances/i", JobNode("j", "member", instance="i")),
        ("/jobs/j/disabled/items/2", JobNode("j", "disabled_item", item=2)),
        ("/jobs/j/running/x", Unknown("/jobs/j/running/x")),
        ("/jobs/j/strange/node/deep/er", Unknown("/jobs/j/strange/node/deep/er")),
        ("/", Unknown("/")),
    ],
)
def test_parse_names_every_node_and_never_raises(path: str, node: object) -> None:
    """Known nodes come out typed; a stray name is Unknown, never an exception."""
    assert parse(path) == node


def test_classify_turns_changes_into_hints() -> None:
    """A member's deletion is MemberLeft (but not our own), a queue entry is
    FailoverQueued, a stray node is Ignored."""
    gone = WatchEvent(EventKind.DELETED, f"/jobs/{JOB}/instances/other")
    assert ev.classify(gone, ME) == ev.MemberLeft("other")
    mine = WatchEvent(EventKind.DELETED, f"/jobs/{JOB}/instances/{ME}")
    assert ev.classify(mine, ME) == ev.Ignored()
    queued = WatchEvent(EventKind.CREATED, f"/jobs/{JOB}/failover/queue/1", b"{}")
    assert ev.classify(queued, ME) == ev.FailoverQueued(1)
    stray = WatchEvent(EventKind.CREATED, f"/jobs/{JOB}/failover/queue/x", b"{}")
    assert ev.classify(stray, ME) == ev.Ignored()
    assert ev.classify(WatchEvent(EventKind.RESYNC, "/"), ME) == ev.Resync()


# ---- the trigger's steps ----------------------------------------------------------------


def test_a_fire_launches_the_items_assigned_here(store: MemoryStore) -> None:
    """Items assigned to this instance are marked in one commit and launched, each
    with its token and, as persistent marks, a fence child."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: "other"})
    result = flow.step(Fire(time.time()))
    assert result == Launched((0,))
    [batch] = launched
    assert batch.items == [0] and batch.tokens[0] > 0 and batch.fences[0]
    assert store.exists(f"{services.paths.running(0)}/{batch.fences[0]}")


def test_skip_reasons_are_typed(store: MemoryStore) -> None:
    """Not registered, disabled, no items: each is a SkipReason, not a string."""
    flow, state, services, _ = _flow(store)
    _assign(store, services, {0: "other", 1: "other"})
    assert flow.step(Fire(time.time())) == Skipped(SkipReason.NO_ITEMS)
    state.disabled_job = True
    assert flow.step(Fire(time.time())) == Skipped(SkipReason.DISABLED)
    state.disabled_job = False
    state.phase.lose_membership("the test")
    assert flow.step(Fire(time.time())) == Skipped(SkipReason.NOT_REGISTERED)


def test_a_fire_before_the_join_is_not_run_here(store: MemoryStore) -> None:
    """A fire older than this membership (queued across a freeze and a new session)
    is not run here: the leader gives its items to the members that fire it."""
    flow, state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    state.joined_at = time.time()
    assert flow.step(Fire(state.joined_at - 2)) == Skipped(SkipReason.BEFORE_JOIN)
    assert not launched and not store.children(services.paths.running_root)


def test_a_pending_reshard_makes_a_follower_wait_then_skip_at_the_deadline(
    store: MemoryStore,
) -> None:
    """The step never blocks: it says Wait until the fire's deadline, then skips."""
    flow, _state, services, _ = _flow(store, sharding_wait_timeout=0.2)
    _assign(store, services, {0: ME, 1: ME})
    store.put(services.paths.necessary, b"joined")
    fire = Fire(time.time())
    first = flow.step(fire)
    assert isinstance(first, Wait)
    wait_until(lambda: time.monotonic() >= fire.deadline, 2)
    assert flow.step(fire) == Skipped(SkipReason.RESHARD_TIMEOUT)


def test_items_held_by_an_earlier_batch_here_are_deferred(store: MemoryStore) -> None:
    """A fire that finds some items still running here is a misfire for them
    (Deferred); its free items start at once (each item ends on its own, issue 36
    §2); with every item held, nothing starts."""
    flow, _state, services, launched = _flow(store, held={1})
    _assign(store, services, {0: ME, 1: ME})
    assert flow.step(Fire(time.time())) == Deferred((1,))
    assert [b.items for b in launched] == [[0]]
    flow, _state, services, launched = _flow(store, held={0, 1})
    assert flow.step(Fire(time.time())) == Deferred((0, 1))
    assert not launched


def test_a_lost_start_reply_is_adopted(store: MemoryStore) -> None:
    """The start commit applied but its reply lost: the marks are read back and the
    batch launched with their real tokens."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    store.fail_next("commit", path=services.paths.running_root, applied=True)
    assert flow.step(Fire(time.time())) == Launched((0, 1))
    node = store.get(services.paths.running(0))
    assert node is not None and launched[0].tokens[0] == node.created_revision


# ---- the leader -------------------------------------------------------------------------


def test_the_leader_waits_for_live_running_items_but_not_for_orphans(store: MemoryStore) -> None:
    """Marks of dead owners are requeued first, so they never hold a reshard; a live
    owner's running item does (until execution_wait_timeout; then the reshard applies
    from the next fire)."""
    services = JobServices.build(store, JOB, ME)
    state = JobState(JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True))
    _register(state)
    store.put(services.paths.instance(ME), b"{}", ephemeral=True)
    leader = LeaderDuties(services, state)
    assert leader.elect()
    store.put(services.paths.necessary, b"x")
    ghost = RunningMark("ghost@1@x", 1.0, f"{JOB}@1#0")
    store.put(services.paths.running(0), ghost.to_bytes())
    assert leader.serve_reshard(time.time(), time.monotonic()) is ReshardStep.DONE
    assert store.children(services.paths.failover_queue) == ["0"]
    # now a live member's item runs: the reshard waits
    store.put(services.paths.instance("other"), b"{}", ephemeral=True)
    store.put(services.paths.necessary, b"y")
    store.put(services.paths.running(1), RunningMark("other", 2.0, "x").to_bytes())
    fire = time.time()
    assert leader.serve_reshard(fire, time.monotonic()) is ReshardStep.WAIT
    # past execution_wait_timeout: committed anyway, from the next fire; the item goes on
    assert leader.serve_reshard(fire, time.monotonic() - 999) is ReshardStep.DONE
    assert not store.exists(services.paths.necessary)
    assignment = services.sharding.read()[0]
    assert assignment is not None and assignment.effective_fire > fire
    assert store.exists(services.paths.running(1))


@pytest.mark.parametrize(("flag_delay", "applies_now"), [(-0.5, True), (0.5, False)])
def test_a_reshard_asked_for_after_the_fire_applies_from_the_next_fire(
    store: MemoryStore, flag_delay: float, applies_now: bool
) -> None:
    """A member left (or the reconcile check fired) while the fire was being decided:
    an instance without items in the previous assignment may have skipped the fire
    already, so the new assignment must not give it items of that fire (they would
    run nowhere: chaos checker). A flag from before the fire applies to it."""
    services = JobServices.build(store, JOB, ME)
    state = JobState(JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True))
    _register(state)
    store.put(services.paths.instance(ME), b"{}", ephemeral=True)
    store.put(services.paths.instance("other"), b"{}", ephemeral=True)
    leader = LeaderDuties(services, state)
    assert leader.elect()
    _assign(store, services, {0: ME, 1: "gone@1@x"})
    ft = time.time()
    store.put(services.paths.necessary, necessary_value("instance left: gone@1@x", ft + flag_delay))
    assert leader.serve_reshard(ft, time.monotonic()) is ReshardStep.DONE
    assignment, _ = services.sharding.read()
    assert assignment is not None
    assert not services.sharding.is_necessary()
    gets_now = assignment.items_of("other", ft)
    assert bool(gets_now) is applies_now, (gets_now, assignment)
    assert assignment.items_of("other", ft + 1), "the next fire does not include the member"


def test_the_reshard_flag_carries_its_reason_and_time() -> None:
    """The operators' view shows the reason; the leader reads the time."""
    assert necessary_parts(necessary_value("count changed: 2 -> 4", 12.5)) == (
        "count changed: 2 -> 4",
        12.5,
    )
    assert necessary_parts(b"written by an older version") == ("written by an older version", None)


# ---- lanes ------------------------------------------------------------------------------


def test_lanes_run_one_task_per_job_in_order_and_merge_by_key() -> None:
    """Tasks of one lane never overlap and run in order; a queued key is merged; other
    lanes are not held up by a busy one."""
    pool = WorkerPool(2, "test-lanes")
    lanes = Lanes(pool)
    try:
        gate = threading.Event()
        order: list[str] = []
        active = {"a": 0}
        overlap: list[bool] = []

        def task(name: str, hold: bool = False) -> None:
            active["a"] += 1
            overlap.append(active["a"] > 1)
            if hold:
                gate.wait(5)
            order.append(name)
            active["a"] -= 1

        lanes.submit("a", None, lambda: task("first", hold=True))
        lanes.submit("a", "k", lambda: task("merged-away"))
        lanes.submit("a", "k", lambda: task("k"))
        lanes.submit("a", None, lambda: task("last"))
        other: list[str] = []
        lanes.submit("b", None, lambda: other.append("b"))
        wait_until(lambda: other == ["b"], 5, message="lane b was held up by lane a")
        gate.set()
        wait_until(lambda: len(order) == 3, 5)
        assert order == ["first", "k", "last"] and not any(overlap)
        ran: list[float] = []
        lanes.submit_after("a", None, lambda: ran.append(time.monotonic()), 0.1)
        t0 = time.monotonic()
        wait_until(lambda: ran, 5)
        assert ran[0] - t0 >= 0.09
    finally:
        lanes.close()
        pool.shutdown()


def test_a_lane_stuck_on_one_task_is_reported_once_with_its_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A lane task that runs on (a 600 s etcd run: one job's registration waited 58 s
    behind something that logged nothing) is reported once, naming the task, what
    waits behind it and where its thread is; a quick task is never reported."""
    pool = WorkerPool(2, "test-stalls")
    lanes = Lanes(pool)
    gate, entered = threading.Event(), threading.Event()

    def stuck_in_here() -> None:
        entered.set()
        gate.wait(10)

    try:
        lanes.submit("quick", None, lambda: None)
        lanes.submit("held", "repair", stuck_in_here)
        lanes.submit("held", "fire", lambda: None)
        wait_until(entered.is_set, 5)
        assert lanes.report_stalls(after=60) == []
        with caplog.at_level("WARNING", logger="shardkeeper.runtime.execute.pool"):
            assert lanes.report_stalls(after=0) == ["held"]
            assert lanes.report_stalls(after=0) == []  # once per task
        (line,) = [r.getMessage() for r in caplog.records if "has run for" in r.getMessage()]
        assert "held: coordination task repair" in line and "1 queued behind it" in line
        assert "stuck_in_here" in line and "gate.wait" in line
        gate.set()
        wait_until(lambda: any("ended after" in r.getMessage() for r in caplog.records), 5)
    finally:
        gate.set()
        lanes.close()
        pool.shutdown()


def test_a_fire_delivered_twice_runs_once() -> None:
    """Fires of a job are decided in order: a second delivery of a fire already
    decided is ignored instead of running its items a second time (a duplicate the
    chaos checker saw once under a slow link)."""
    from datetime import UTC, datetime

    from shardkeeper.registry.memory import MemoryServer
    from shardkeeper.runtime import Runtime

    server = MemoryServer()
    job = RecordingJob()
    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2))
    rt.start()
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
        at = datetime.now(UTC)
        runner.on_trigger(at)
        wait_until(lambda: job.count() == 2 and runner.idle and not runner.pending_fires(), 10)
        runner.on_trigger(at)
        wait_until(lambda: not runner.pending_fires(), 10)
        assert job.count() == 2 and runner.stats["skipped"] == 1
    finally:
        rt.stop_now()
        server.shutdown()


def test_an_item_that_returned_before_a_fence_is_done_not_run_again() -> None:
    """The fence came between the item's return and its bookkeeping (600 s etcd run:
    it returned valid 8 ms before a starved session's fence): the run counted as
    fenced and was handed to failover, so the item ran twice, both runs valid. An
    item that had returned before the fence is done (its completion is conditional on
    its mark all the same); one still running at the fence is not (other tests)."""
    from datetime import UTC, datetime

    from shardkeeper.coordination.paths import JobPaths
    from shardkeeper.registry.memory import MemoryServer
    from shardkeeper.runtime import Runtime

    server = MemoryServer()
    job = RecordingJob()
    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=1, failover=True))
    rt.start()
    paths = JobPaths(JOB)
    admin = server.store()
    admin.start()
    try:
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
        count = runner.state.count

        def fence_after_the_return(key: str, n: int = 1) -> None:
            if key == "executed":  # the item has returned; its outcome is not settled
                runner.fence_all()
            count(key, n)

        runner.state.count = fence_after_the_return  # type: ignore[method-assign]
        runner.on_trigger(datetime.now(UTC))
        wait_until(lambda: job.count() == 1 and runner.idle and not runner.pending_fires(), 10)
        wait_until(lambda: not admin.exists(paths.running(0)), 10)
        assert admin.exists(paths.result(0)), "the run was not recorded as done"
        assert admin.children(paths.failover_queue) == []
        assert job.count() == 1
    finally:
        admin.close()
        rt.stop_now()
        server.shutdown()


def test_own_stray_marks_are_handed_over_and_the_fire_proceeds(store: MemoryStore) -> None:
    """A mark naming this instance for an earlier fire, with no execution here (its
    start commit's reply was lost and could not be read back), used to make every
    later fire skip the item as "running elsewhere" until a repair pass. The fire
    hands it to failover and runs its own items."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    stray = RunningMark(ME, 1.0, f"{JOB}@1000#0")
    store.put(services.paths.running(0), stray.to_bytes())
    fire = Fire(time.time())
    first = flow.step(fire)
    assert isinstance(first, Wait)
    assert store.children(services.paths.failover_queue) == ["0"]
    last = flow.step(fire)
    # checked apart, item 1 started with the first step already
    assert isinstance(last, Launched) and 0 in last.items
    assert sorted(i for b in launched for i in b.items) == [0, 1]


def test_an_item_busy_with_a_later_fire_runs_this_fire_after_it(store: MemoryStore) -> None:
    """A reshard moved item 1 away and back around this fire: another instance runs
    it for the NEXT fire when this one gets to it. This fire of item 1 is still due
    here: the free item starts now, item 1 once the later run ended (it used to be
    skipped as running elsewhere: found by the chaos checker, etcd seed 3003)."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    ft = time.time()
    later = RunningMark("host@2@other", ft + 1, f"{JOB}@later#1")
    store.put(services.paths.running(1), later.to_bytes())
    fire = Fire(ft)
    result = flow.step(fire)
    assert isinstance(result, Wait)
    assert [b.items for b in launched] == [[0]]
    store.delete(services.paths.running(1))
    assert flow.step(fire) == Launched((1,))
    assert [b.items for b in launched] == [[0], [1]]


def test_an_item_a_failover_taker_runs_for_an_earlier_fire_runs_this_fire_after_it(
    store: MemoryStore,
) -> None:
    """Item 1's previous fire was fenced here and a failover taker runs it now: with
    misfire on, this fire of item 1 runs after the taker's run, as it would after a
    run here (it used to be skipped as running elsewhere: chaos checker, ZooKeeper
    seed 2002, a slow link)."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    ft = time.time()
    taker = RunningMark("host@2@taker", ft - 1, f"{JOB}@earlier#1")
    store.put(services.paths.running(1), taker.to_bytes())
    fire = Fire(ft)
    assert isinstance(flow.step(fire), Wait)
    assert [b.items for b in launched] == [[0]]
    assert isinstance(flow.step(fire), Wait), "item 1 started while the taker still ran it"
    store.delete(services.paths.running(1))
    assert flow.step(fire) == Launched((1,))
    assert [b.items for b in launched] == [[0], [1]]


def test_with_misfire_off_an_item_running_elsewhere_for_an_earlier_fire_is_skipped(
    store: MemoryStore,
) -> None:
    """misfire=false keeps ElasticJob's rule: a fire that finds its item running is
    skipped for that item, wherever it runs."""
    flow, _state, services, launched = _flow(store, misfire=False)
    _assign(store, services, {0: ME, 1: ME})
    ft = time.time()
    store.put(services.paths.running(1), RunningMark("host@2@taker", ft - 1, "x").to_bytes())
    fire = Fire(ft)
    # item 1's skip is recorded with the launch of item 0
    assert flow.step(fire) == Launched((0,), Skipped(SkipReason.RUNNING_ELSEWHERE, (1,)))
    assert [b.items for b in launched] == [[0]]


def test_a_fire_waits_through_a_suspended_connection_within_its_deadline(
    store: MemoryStore,
) -> None:
    """A fire that came while the connection was suspended (a slow link) used to be
    skipped at once, although the session came back a moment later intact (chaos
    checker, etcd seed 4004). It waits, bounded by its deadline, and runs."""
    flow, state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    state.connection = ConnectionState.SUSPENDED
    fire = Fire(time.time())
    assert isinstance(flow.step(fire), Wait)
    assert not launched
    state.connection = ConnectionState.RECONNECTED
    assert flow.step(fire) == Launched((0, 1))
    late = Fire(time.time())
    state.connection = ConnectionState.SUSPENDED
    late.deadline = time.monotonic() - 0.001
    assert flow.step(late) == Skipped(SkipReason.SUSPENDED)


# ---- the assignment cache --------------------------------------------------------------


def test_a_fire_with_items_commits_against_the_cached_assignment(store: MemoryStore) -> None:
    """The second fire reads nothing before its start commit: the commit checks the
    version it decided on."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    ft = float(int(time.time()))  # fire times of the schedule (every second)
    assert flow.step(Fire(ft)) == Launched((0, 1))
    for item in (0, 1):
        store.delete(services.paths.running(item), recursive=True)
    before = store.round_trips
    # nothing read either for the fires this run stands for: the items were decided
    # here at the previous fire
    assert flow.step(Fire(ft + 1)) == Launched((0, 1))
    assert store.round_trips - before == 1, "the second fire read before committing"
    assert len(launched) == 2


def test_a_stale_cached_assignment_fails_the_commit_and_the_fire_reads_again(
    store: MemoryStore,
) -> None:
    """A reshard the watch has not reported yet: the start commit's version check
    refuses the stale copy and the fire runs what the new assignment says."""
    flow, _state, services, launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    assert flow.step(Fire(time.time())) == Launched((0, 1))
    for item in (0, 1):
        store.delete(services.paths.running(item), recursive=True)
    _assign(store, services, {0: ME, 1: "host@2@other"})  # no event delivered
    assert _decide(flow, Fire(time.time() + 1)) == Launched((0,))
    assert launched[-1].items == [0]


def test_no_items_is_never_decided_from_the_cached_assignment(store: MemoryStore) -> None:
    """A copy saying "nothing for this instance" is checked against the store before
    the fire is skipped (a skip commits nothing that could refuse a stale copy)."""
    flow, _state, services, _launched = _flow(store)
    _assign(store, services, {0: ME, 1: ME})
    assert flow.step(Fire(time.time())) == Launched((0, 1))
    for item in (0, 1):
        store.delete(services.paths.running(item), recursive=True)
    _assign(store, services, {0: "host@2@other", 1: "host@2@other"})
    assert _decide(flow, Fire(time.time() + 1)) == Skipped(SkipReason.NO_ITEMS)
    _assign(store, services, {0: ME, 1: ME})  # the copy now says "none": stale
    assert flow.step(Fire(time.time() + 2)) == Launched((0, 1))


def _decide(flow: TriggerFlow, fire: Fire) -> object:
    result = flow.step(fire)
    for _ in range(20):
        if not isinstance(result, Wait):
            break
        result = flow.step(fire)
    return result


def test_the_leader_takes_the_flags_absence_from_the_watch_and_a_stale_hint_is_caught(
    store: MemoryStore,
) -> None:
    """A leader reads the reshard flag only when the watch has not told it the flag is
    absent: a steady fire is one request (the start commit). A flag set elsewhere whose
    event has not arrived yet refuses the start commit (it checks the flag), the hint is
    forgotten, and the same fire is resharded and run."""
    flow, state, services, launched = _flow(store)
    leader = LeaderDuties(services, state)
    flow._leader = leader  # the flow's leader part is this elected one
    assert leader.elect()
    _assign(store, services, {0: ME, 1: ME})
    ft = float(int(time.time()))  # fire times of the schedule (every second)
    assert _decide(flow, Fire(ft)) == Launched((0, 1))
    for item in (0, 1):
        store.delete(services.paths.running(item), recursive=True)
    services.sharding.note_flag_event(deleted=True)  # what the watch reports
    before = store.round_trips
    assert flow.step(Fire(ft + 1)) == Launched((0, 1))
    assert store.round_trips - before == 1, "the leader read before committing"
    for item in (0, 1):
        store.delete(services.paths.running(item), recursive=True)
    generation = services.sharding.read()[0]
    store.put(services.paths.instance("host@2@other"), b"{}", ephemeral=True)
    store.put(services.paths.necessary, necessary_value("instance joined", time.time() - 1))
    # no event delivered: the hint still says "absent"
    result = _decide(flow, Fire(ft + 2))
    assert isinstance(result, Launched) and result.items
    assert not store.exists(services.paths.necessary), "the flag was never served"
    after = services.sharding.read()[0]
    assert after is not None and generation is not None
    assert after.generation > generation.generation
    assert set(after.owners.values()) == {ME, "host@2@other"}
    assert launched[-1].items == list(result.items)


def test_a_fire_a_just_disabled_instance_started_keeps_its_owners(store: MemoryStore) -> None:
    """An operator disabled "other", which started fire ``ft`` under the assignment in
    effect before the switch reached it. The reshard that removes "other" must take
    effect after ``ft``: it used to skip (and delete) the start marker of a disabled
    instance, dated the new owners at ``ft``, and another instance ran the same item
    for the same fire (600 s etcd run, cpu job, an unexplained duplicate)."""
    services = JobServices.build(store, JOB, ME)
    state = JobState(JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True))
    _register(state)
    for inst in (ME, "other"):
        store.put(services.paths.instance(inst), b"{}", ephemeral=True)
    leader = LeaderDuties(services, state)
    assert leader.elect()
    ft = time.time()
    before = {0: "other", 1: ME}
    store.put(
        services.paths.sharding,
        Assignment(total=2, owners=before, effective_fire=ft - 10).to_bytes(),
    )
    store.put(services.paths.fired("other"), repr(ft).encode())
    store.put(services.paths.disabled_instance("other"), b"")
    store.put(services.paths.necessary, necessary_value("instance disabled: other", ft - 1))
    assert leader.serve_reshard(ft, time.monotonic()) is ReshardStep.DONE
    assignment, _ = services.sharding.read()
    assert assignment is not None and assignment.effective_fire > ft
    assert assignment.owners_for(ft) == before
    assert assignment.owners_for(ft + 1) == {0: ME, 1: ME}
    assert store.exists(services.paths.fired("other"))  # live: its marker is kept


@pytest.mark.parametrize("started_since", [True, False], ids=["started", "not-started"])
def test_a_reshard_at_an_old_fire_never_applies_to_a_fire_started_since(
    store: MemoryStore, started_since: bool
) -> None:
    """The leader decides a fire late (a run-now behind its lane's backlog) while
    another instance already started a later fire under the assignment in effect: the
    new assignment takes effect after that later fire, never under it, and never
    before the assignment it replaces (whose first fire may be under way)."""
    services = JobServices.build(store, JOB, ME)
    state = JobState(JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True))
    _register(state)
    for inst in (ME, "other", "third"):
        store.put(services.paths.instance(inst), b"{}", ephemeral=True)
    leader = LeaderDuties(services, state)
    assert leader.elect()
    ft = time.time()
    before = {0: "other", 1: ME}  # the new assignment gives them the other way
    store.put(
        services.paths.sharding,
        Assignment(total=2, owners=before, effective_fire=ft + 1.7).to_bytes(),
    )
    if started_since:
        store.put(services.paths.fired("other"), repr(ft + 4.0).encode())
    store.put(services.paths.necessary, necessary_value("instance joined: third", ft - 1))
    assert leader.serve_reshard(ft, time.monotonic()) is ReshardStep.DONE
    assignment, _ = services.sharding.read()
    assert assignment is not None and not services.sharding.is_necessary()
    last_old = ft + 4.0 if started_since else ft + 1.7
    assert assignment.effective_fire > last_old, assignment.effective_fire
    for fire in (ft + 1.7, last_old):
        assert assignment.owners_for(fire) == before, fire
