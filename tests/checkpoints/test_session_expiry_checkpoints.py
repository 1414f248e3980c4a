"""An execution begun under a session is never valid under the next one (issue 35 §2).

Two instances on a real store; one item of 40 steps of 0.25 s that checkpoints
``{"step": n}`` after each and resumes from ``ctx.resume_state``. Once step 6 was
reported accepted, its owner's session is expired on the server (``expire_session``)
as step 7 is called (its commit meets the connection the expiry drops), and the
owner's client gets a new session at once. The old execution goes on stepping (a
zombie that never asks ``ctx.is_valid()``). Then:

* the successor (the failover re-run of the same fire) resumes from the newest step
  the old execution was told was accepted, or a newer one (before the fix, on
  ZooKeeper: step 7's commit met the dropped connection, the call said True, the
  write never landed, and the successor resumed from step 6);
* no checkpoint of the old execution is accepted once the successor started, nor once
  the owner's client had its new session (a write of an execution begun under
  session S is refused after S ended, though the client reconnected and registered
  again: before the fix the persistent mark's fence child, which outlives the
  session, let it through).

Then the same rules step by step on the MemoryStore, and the ZooKeeper planner's part:
a commit planned on an expired session is never sent on the next one.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import CheckpointReader
from shardkeeper.coordination.execution import new_fence
from shardkeeper.coordination.model import FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import CheckpointFencedError, StoreUnavailableError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import Check, CoordinationStore, Create, Put
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire.checkpoints import ItemCheckpoints, ItemStates
from shardkeeper.testing.faults import expire_session, wait_until

pytestmark = pytest.mark.timeout(180)

JOB = "stepping40"
STEPS = 40
STEP = 0.25
#: the owner's session is expired once this step was reported accepted
EXPIRE_AFTER = 6


@dataclass(frozen=True)
class Start:
    instance: str
    execution_id: str
    token: int
    failover: bool
    resumed: bool
    state: Any
    at: float


@dataclass(frozen=True)
class Answer:
    instance: str
    token: int
    step: int
    ok: bool
    #: monotonic times of the call and of its answer
    called: float
    answered: float


class Forty(ShardedJob):
    """40 steps from the resume state, one checkpoint after each; never asks
    ``ctx.is_valid()`` (a zombie goes on). The first run holds after step 6 until the
    test has begun expiring its owner's session, then calls step 7 at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[Start] = []
        self.answers: list[Answer] = []
        #: the fencing tokens of the runs that returned
        self.ended: set[int] = set()
        self.at_expiry = threading.Event()
        self.go_on = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        state = ctx.resume_state
        with self.lock:
            first = not self.starts
            self.starts.append(
                Start(
                    ctx.instance_id,
                    ctx.execution_id,
                    ctx.fencing_token,
                    ctx.is_failover,
                    ctx.resumed,
                    state,
                    time.monotonic(),
                )
            )
        begin = int(state["step"]) if isinstance(state, dict) else 0
        pause = threading.Event()
        for step in range(begin + 1, STEPS + 1):
            if not (first and step == EXPIRE_AFTER + 1):
                pause.wait(STEP)  # the work of one step (a bounded wait, not a sync)
            called = time.monotonic()
            ok = ctx.checkpoint({"step": step})
            with self.lock:
                self.answers.append(
                    Answer(ctx.instance_id, ctx.fencing_token, step, ok, called, time.monotonic())
                )
            if first and step == EXPIRE_AFTER:
                self.at_expiry.set()
                # step 7 is called as soon as the session is being expired: its
                # commit meets the connection the expiry drops
                assert self.go_on.wait(60)
        with self.lock:
            self.ended.add(ctx.fencing_token)


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_an_expired_sessions_execution_writes_nothing_after_its_successor_starts(
    registry_url: str, store: CoordinationStore
) -> None:
    job = Forty()
    cfg = JobConfig(
        name=JOB,
        cron="0 0 0 1 1 ?",  # never fires by itself: the run is the queued fire below
        sharding_total_count=1,
        failover=True,
        checkpoint_interval=0,  # every call is one commit: "accepted" is exact
    )
    # one fire of the item waits in the failover queue; the first instance claims it
    fire = float(int(time.time()) - 30)
    eid = f"{JOB}@{round(fire * 1000)}#0"
    store.put(JobPaths(JOB).failover_item(0), FailoverEntry(fire, eid, "host@9@gone").to_bytes())
    runtimes = [Runtime(registry_url, shutdown_grace=1) for _ in range(2)]
    try:
        for rt in runtimes:
            rt.add_job(job, cfg)
        # the owner starts alone (it leads the job and claims the fire), the other
        # instance joins while the item runs
        runtimes[0].start()
        wait_until(lambda: job.starts, 60, message="the item never ran")
        runtimes[1].start()
        wait_until(
            lambda: len(store.children(JobPaths(JOB).instances)) == 2,
            30,
            message="the second instance never joined",
        )
        assert job.at_expiry.wait(60), "the first run never reached step 6"
        with job.lock:
            owner_id, old_token = job.starts[0].instance, job.starts[0].token
            accepted = [a.step for a in job.answers if a.instance == owner_id and a.ok]
        assert accepted == list(range(1, EXPIRE_AFTER + 1)), job.answers
        owner = next(rt for rt in runtimes if rt.instance_id == owner_id)
        # the session ends on the server while the owner's next commit is sent
        old_session = expire_session(owner.store, wait=False)
        job.go_on.set()
        wait_until(
            lambda: owner.store.session_id not in (None, old_session),
            30,
            message="the owner's client never got a new session",
        )
        renewed = time.monotonic()

        def successor() -> Start | None:
            with job.lock:
                return next(
                    (s for s in job.starts if s.execution_id == eid and s.token != old_token),
                    None,
                )

        nxt = wait_until(successor, 60, message=lambda: f"no successor ran: {job.starts}")

        # let the zombie try a few more steps after the successor's start (unless it
        # had ended before: then its own hand-off started the successor)
        def tried_after() -> bool:
            with job.lock:
                late = [a for a in job.answers if a.token == old_token and a.called > nxt.at]
                return len(late) >= 2 or old_token in job.ended

        wait_until(
            tried_after,
            30,
            message=lambda: (
                "the old execution stopped trying: "
                + repr([(a.token, a.step, a.ok, round(a.called - nxt.at, 2)) for a in job.answers])
            ),
        )
        with job.lock:
            old = [a for a in job.answers if a.token == old_token]
        assert nxt.failover and nxt.resumed, nxt
        assert isinstance(nxt.state, dict), nxt
        # what the old execution was told was accepted is what its successor resumes
        # from, or newer
        best = max(a.step for a in old if a.ok)
        assert best >= EXPIRE_AFTER and nxt.state["step"] >= best, (nxt, old)
        late = [a for a in old if a.ok and a.called > nxt.at]
        assert not late, (
            f"the old execution's checkpoints accepted after its successor started: {late}"
        )
        # and none of the calls made once the owner's client had its new session
        renewed_ok = [a for a in old if a.ok and a.called > renewed]
        assert not renewed_ok, (
            f"the expired session's execution accepted under the next: {renewed_ok}"
        )
    finally:
        job.go_on.set()
        for rt in runtimes:
            rt.stop()


# -- the same rules, step by step on the MemoryStore (deterministic) --------------------

P = JobPaths("ck")
ME = "host@1@me"
FIRE = 1_700_000_000.0
EID = f"ck@{round(FIRE * 1000)}#0"


def _session(
    store: MemoryStore, *, valid: Callable[[], bool] = lambda: True, member: bool = True
) -> tuple[ItemCheckpoints, Counter[str]]:
    """A checkpoint session of a persistent mark of item 0, opened while this
    instance's membership node is the one registered (its incarnation checked)."""
    member_node = store.put(P.instance(ME), b"{}", ephemeral=True)
    fence = new_fence()
    done = store.commit(
        [
            Create(P.running(0), RunningMark(ME, FIRE, EID).to_bytes()),
            Create(f"{P.running(0)}/{fence}"),
        ]
    )
    assert done
    cfg = JobConfig.parse(
        name="ck", cron="0 0 0 1 1 ?", sharding_total_count=1, failover=True, checkpoint_interval=0
    )
    counts: Counter[str] = Counter()
    states = ItemStates(
        reader=CheckpointReader(store, P),
        instance_id=ME,
        config=lambda: cfg,
        count=lambda key, n: counts.update({key: n}),
    )
    check = Check(P.instance(ME), created_revision=member_node.created_revision)
    session = states.open(
        item=0,
        fire_time=FIRE,
        execution_id=EID,
        token=done.revision,
        fence=fence,
        rerun=False,
        member=check if member else None,
        valid=valid,
    )
    return session, counts


def _stored_step(store: MemoryStore) -> Any:
    doc = CheckpointReader(store, P).read(0, FIRE)
    return None if doc is None else doc.state


def test_a_write_of_the_previous_sessions_execution_is_refused_by_the_store(
    memory_server: MemoryServer,
) -> None:
    """The membership node the execution began under is gone and registered again
    (a new session): the mark and its fence child are intact, yet the store refuses."""
    store = memory_server.store("ns")
    store.start()
    try:
        session, counts = _session(store)
        assert session.checkpoint({"step": 1}, None) is True
        store.delete(P.instance(ME))  # the session's ephemeral node went with it
        store.put(P.instance(ME), b"{}", ephemeral=True)  # and came back, another one
        assert session.checkpoint({"step": 2}, None) is False
        assert _stored_step(store) == {"step": 1}
        assert counts["checkpoints_refused"] == 1
    finally:
        store.close()


def test_a_call_whose_commit_met_a_store_error_answers_what_the_store_did(
    memory_server: MemoryServer,
) -> None:
    """The commit's reply is lost (applied or not): the call sends it again and says
    True only once the store took it."""
    store = memory_server.store("ns")
    store.start()
    try:
        session, counts = _session(store)
        store.fail_next("commit", path=P.running(0), count=2)  # not applied, twice
        assert session.checkpoint({"step": 1}, None) is True
        assert _stored_step(store) == {"step": 1}
        store.fail_next("commit", path=P.running(0), applied=True)  # applied, reply lost
        assert session.checkpoint({"step": 2}, None) is True
        assert _stored_step(store) == {"step": 2}
        assert counts["checkpoint_errors"] == 3 and counts["checkpoints"] == 2
    finally:
        store.close()


def test_a_call_whose_store_stays_silent_until_the_execution_is_fenced_is_refused(
    memory_server: MemoryServer,
) -> None:
    """The store gives no answer and the runtime fences the execution meanwhile (its
    session may have ended): False, not a True for a state the store never took; and
    every later call is refused without a store call."""
    store = memory_server.store("ns")
    store.start()
    try:
        valid = threading.Event()
        valid.set()
        session, counts = _session(store, valid=valid.is_set)
        assert session.checkpoint({"step": 1}, None) is True

        class Fencing(StoreUnavailableError):
            """The store's error; the runtime fences the execution as it is raised."""

            def __init__(self, *args: object) -> None:
                valid.clear()
                super().__init__(*args)

        store.fail_next("commit", path=P.running(0), error=Fencing, count=1000)
        assert session.checkpoint({"step": 2}, None) is False
        assert _stored_step(store) == {"step": 1}
        with pytest.raises(CheckpointFencedError, match="fenced off"):
            session.checkpoint({"step": 3}, True)
        assert counts["checkpoints_refused"] == 2 and counts["checkpoint_errors"] == 1
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["zookeeper"], ids=["zk"])
def test_a_zookeeper_commit_planned_on_an_expired_session_is_not_sent_on_the_next(
    store_factory: Callable[..., CoordinationStore],
) -> None:
    """The session ends between a commit's plan and its multi, and the node its check
    names is re-created under the new session with the same data version (an
    instance registering again): the multi planned on the old session must not be sent
    on the new one, where the version check would pass; planned again, it is refused."""
    store = store_factory()
    member = store.put("/member", b"m", ephemeral=True)
    commits: Any = store._commits  # type: ignore[attr-defined]  # the planner under test
    plan = commits.plan
    expired: list[str] = []

    def plan_then_expire(*args: Any, **kwargs: Any) -> Any:
        planned = plan(*args, **kwargs)
        if not expired:
            expired.append(expire_session(store))  # returns with the next session
            again = store.put("/member", b"m", ephemeral=True)
            assert again.created_revision != member.created_revision
            assert again.version == member.version  # the same version, another node
        return planned

    commits.plan = plan_then_expire
    done = store.commit(
        [Check("/member", created_revision=member.created_revision), Put("/data", b"zombie")]
    )
    assert expired, "the commit was never planned"
    assert not done and done.failed_path == "/member", done
    assert store.get("/data") is None
