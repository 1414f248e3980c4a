"""Fenced checkpoints on every store (issue 28 section 1): a zombie's write after the
take-over is refused and the successor's state is intact; the successor of the same
fire resumes from the last accepted checkpoint; held writes; the named errors.

The coordination-level tests drive the real services (execution marks, the failover
requeue and claim, the checkpoint sessions) over the MemoryStore and real ZooKeeper
and etcd servers, step by step: no thread, no sleep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import (
    KEEP_FIRES,
    CheckpointDoc,
    CheckpointReader,
    ProgressDoc,
)
from shardkeeper.coordination.execution import ExecutionService, new_fence
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths, checkpoint_path
from shardkeeper.errors import (
    CheckpointFencedError,
    CheckpointStateError,
    CheckpointUnavailableError,
)
from shardkeeper.registry.base import CoordinationStore, Create
from shardkeeper.runtime.fire.checkpoints import ItemCheckpoints, ItemStates

P = JobPaths("ck")
OLD = "host@1@zombie"
NEW = "host@2@successor"
FIRE = 1_700_000_000.0
EID = f"ck@{round(FIRE * 1000)}#0"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["memory", "zookeeper", "etcd"], ids=["memory", "zk", "etcd"])
def backend(request: pytest.FixtureRequest) -> str:
    """Every store: the in-process reference and the real servers."""
    return str(request.param)


def _config(**kw: object) -> JobConfig:
    base: dict[str, object] = {
        "name": "ck",
        "cron": "0 0 0 1 1 ?",
        "sharding_total_count": 2,
        "failover": True,
        "checkpoint_interval": 0.0,
    }
    base.update(kw)
    return JobConfig.parse(**base)


def _states(store: CoordinationStore, me: str, counts: Counter[str], **kw: object) -> ItemStates:
    cfg = _config(**kw)
    return ItemStates(
        reader=CheckpointReader(store, P),
        instance_id=me,
        config=lambda: cfg,
        count=lambda key, n: counts.update({key: n}),
    )


def _mark(store: CoordinationStore, item: int = 0) -> tuple[int, str]:
    """The zombie's persistent mark of ``item`` for FIRE: (token, fence)."""
    fence = new_fence()
    mark = RunningMark(OLD, FIRE, EID)
    done = store.commit(
        [Create(P.running(item), mark.to_bytes()), Create(f"{P.running(item)}/{fence}")]
    )
    assert done
    return done.revision, fence


def _stored(store: CoordinationStore, item: int = 0, fire: float = FIRE) -> CheckpointDoc | None:
    return CheckpointReader(store, P).read(item, fire)


@pytest.fixture
def two(store_factory: object) -> Iterator[tuple[CoordinationStore, CoordinationStore]]:
    """Two stores (two instances) on one namespace."""
    factory = store_factory
    assert callable(factory)
    yield factory(), factory()


def test_a_zombies_checkpoint_after_the_take_over_is_refused(
    two: tuple[CoordinationStore, CoordinationStore],
) -> None:
    old_store, new_store = two
    old_counts: Counter[str] = Counter()
    token, fence = _mark(old_store)
    zombie = _states(old_store, OLD, old_counts).open(
        item=0, fire_time=FIRE, execution_id=EID, token=token, fence=fence, rerun=False
    )
    assert zombie.checkpoint({"step": 1}, None) is True
    zombie.progress(1, 10, "one")
    assert _stored(old_store) is not None

    # the leader finds the zombie's instance gone: its mark goes to the queue, and
    # the successor claims it (the fence child is deleted by the requeue)
    assert FailoverService(new_store, P, NEW).requeue_orphans(live={NEW}) == [0]
    claim = FailoverService(new_store, P, NEW).claim()
    assert claim is not None and claim.entry.execution_id == EID
    new_counts: Counter[str] = Counter()
    successor = _states(new_store, NEW, new_counts).open(
        item=0, fire_time=FIRE, execution_id=EID, token=claim.token, fence=claim.fence, rerun=True
    )
    assert successor.resume() == ({"step": 1}, True, None)
    assert successor.checkpoint({"step": 2}, None) is True

    # the zombie wakes up and writes: refused by the store, counted, not written
    assert zombie.checkpoint({"step": 99}, None) is False
    with pytest.raises(CheckpointFencedError, match="no longer this execution's"):
        zombie.checkpoint({"step": 100}, True)
    assert old_counts["checkpoints_refused"] == 2
    zombie.progress(99, 10, "zombie")  # dropped, never raises
    doc = _stored(new_store)
    assert doc is not None and doc.state == {"step": 2} and doc.instance == NEW
    # its completion would write nothing: the session is refused for good
    assert zombie.final_ops("ok") == []

    # the successor completes: its last state is written with the outcome, fenced
    ops = successor.final_ops("ok")
    fenced = ExecutionService(new_store, P, NEW).finish(
        [0], claim.token, {0: claim.fence}, extra={0: ops}
    )
    assert fenced == []
    doc = _stored(new_store)
    assert doc is not None and doc.state == {"step": 2} and doc.ended == "ok"
    assert new_store.get(P.progress(0)) is None
    assert new_store.get(P.running(0)) is None


def test_held_checkpoints_are_coalesced_and_the_last_is_written_at_completion(
    store: CoordinationStore,
) -> None:
    counts: Counter[str] = Counter()
    token, fence = _mark(store)
    session = _states(store, OLD, counts, checkpoint_interval=3600).open(
        item=0, fire_time=FIRE, execution_id=EID, token=token, fence=fence, rerun=False
    )
    assert session.checkpoint({"n": 1}, None) is True  # the first is written at once
    for n in range(2, 6):
        assert session.checkpoint({"n": n}, None) is True  # within the interval: held
    doc = _stored(store)
    assert doc is not None and doc.state == {"n": 1}
    assert counts["checkpoints"] == 1
    assert session.current() == {"n": 5}
    ops = session.final_ops("failed")
    assert ExecutionService(store, P, OLD).finish([0], token, {0: fence}, extra={0: ops}) == []
    doc = _stored(store)
    assert doc is not None and doc.state == {"n": 5} and doc.ended == "failed"
    # after its end a late call (an abandoned thread) writes nothing
    assert session.checkpoint({"n": 6}, None) is False


def test_a_handed_off_run_takes_its_held_state_along(store: CoordinationStore) -> None:
    """A graceful stop interrupts the item: the hand-off commit writes what it held."""
    counts: Counter[str] = Counter()
    token, fence = _mark(store)
    session = _states(store, OLD, counts, checkpoint_interval=3600).open(
        item=0, fire_time=FIRE, execution_id=EID, token=token, fence=fence, rerun=False
    )
    session.checkpoint({"n": 1}, None)
    session.checkpoint({"n": 2}, None)
    session.progress(2, 4, None)
    from shardkeeper.coordination.model import FailoverEntry

    moved = FailoverService(store, P, OLD).hand_off(
        {0: (token, FailoverEntry(FIRE, EID, OLD), fence)},
        keep=True,
        extra={0: session.handoff_ops()},
    )
    assert moved == [0]
    doc = _stored(store)
    assert doc is not None and doc.state == {"n": 2} and doc.ended == ""
    node = store.get(P.progress(0))
    assert node is not None and ProgressDoc.from_bytes(node.value).done == 2


def test_bad_states_get_named_errors(store: CoordinationStore) -> None:
    counts: Counter[str] = Counter()
    token, fence = _mark(store)
    session = _states(store, OLD, counts, checkpoint_max_bytes=100).open(
        item=0, fire_time=FIRE, execution_id=EID, token=token, fence=fence, rerun=False
    )
    with pytest.raises(
        CheckpointStateError, match=r"is 1\d\d bytes of JSON, over the limit of 100"
    ):
        session.checkpoint("x" * 120, None)
    with pytest.raises(CheckpointStateError, match="not JSON-serialisable"):
        session.checkpoint({"when": object()}, None)
    with pytest.raises(CheckpointStateError, match="finite"):
        session.progress(float("nan"), None, None)
    with pytest.raises(CheckpointStateError, match="not a number"):
        session.progress("3", None, None)  # type: ignore[arg-type]
    assert _stored(store) is None
    unmonitored = _states(store, OLD, counts, monitor_execution=False, failover=False).open(
        item=1, fire_time=FIRE, execution_id="x", token=0, fence="", rerun=False
    )
    with pytest.raises(CheckpointUnavailableError, match="monitor_execution"):
        unmonitored.checkpoint(1, None)


def test_old_fires_are_pruned_and_last_state_is_the_previous_ended_run(
    store: CoordinationStore,
) -> None:
    counts: Counter[str] = Counter()
    states = _states(store, OLD, counts, checkpoint_carry=True)
    seen = []
    for k in range(KEEP_FIRES + 2):
        fire = FIRE + 60 * k
        eid = f"ck@{round(fire * 1000)}#0"
        fence = new_fence()
        done = store.commit(
            [
                Create(P.running(0), RunningMark(OLD, fire, eid).to_bytes()),
                Create(f"{P.running(0)}/{fence}"),
            ]
        )
        session: ItemCheckpoints = states.open(
            item=0, fire_time=fire, execution_id=eid, token=done.revision, fence=fence, rerun=False
        )
        seen.append(session.resume()[2])
        assert session.checkpoint({"cursor": k}, None)
        assert (
            ExecutionService(store, P, OLD).finish(
                [0], done.revision, {0: fence}, extra={0: session.final_ops("ok")}
            )
            == []
        )
    assert seen == [None, *({"cursor": k} for k in range(KEEP_FIRES + 1))]
    left = CheckpointReader(store, P).fires(0)
    assert len(left) == KEEP_FIRES
    assert store.get(checkpoint_path("ck", 0, FIRE)) is None


def _run_marked(
    store: CoordinationStore, states: ItemStates, me: str, fire: float, *, persistent: bool
) -> tuple[ItemCheckpoints, int, str]:
    """A run of item 0 for ``fire`` by ``me``: its mark (persistent with a fence
    child, or ephemeral) and its open checkpoint session."""
    eid = f"ck@{round(fire * 1000)}#0"
    fence = new_fence() if persistent else ""
    ops = [Create(P.running(0), RunningMark(me, fire, eid).to_bytes(), ephemeral=not persistent)]
    if persistent:
        ops.append(Create(f"{P.running(0)}/{fence}"))
    done = store.commit(ops)
    assert done
    session = states.open(
        item=0, fire_time=fire, execution_id=eid, token=done.revision, fence=fence, rerun=False
    )
    return session, done.revision, fence


def test_a_queued_fires_checkpoint_outlives_newer_fires_pruning(
    store_factory: object,
) -> None:
    """Review finding 9: F0's run is cut off and queued; the item's next owner runs
    four newer fires, each checkpointing (the fourth's first write prunes); a claim of
    F0 afterwards (a stale failover run) resumes from F0's last accepted checkpoint."""
    factory = store_factory
    assert callable(factory)
    store: CoordinationStore = factory()
    counts: Counter[str] = Counter()
    old = _states(store, OLD, counts)
    first, token, fence = _run_marked(store, old, OLD, FIRE, persistent=True)
    assert first.checkpoint({"cursor": 500}, None)
    from shardkeeper.coordination.model import FailoverEntry

    moved = FailoverService(store, P, OLD).hand_off(
        {0: (token, FailoverEntry(FIRE, EID, OLD), fence)},
        keep=True,
        extra={0: first.handoff_ops()},
    )
    assert moved == [0]
    owner = _states(store, NEW, counts)
    for k in range(1, KEEP_FIRES + 1):
        run, tok, fen = _run_marked(store, owner, NEW, FIRE + 60 * k, persistent=True)
        assert run.checkpoint({"cursor": 1000 + k}, None)
        extra = {0: run.final_ops("ok")}
        assert ExecutionService(store, P, NEW).finish([0], tok, {0: fen}, extra=extra) == []
    claims = FailoverService(store, P, "host@3@taker").claim_many((), limit=1)
    assert [c.entry.fire_time for c in claims] == [FIRE]
    claim = claims[0]
    rerun = _states(store, "host@3@taker", counts).open(
        item=0,
        fire_time=claim.entry.fire_time,
        execution_id=claim.entry.execution_id,
        token=claim.token,
        fence=claim.fence,
        rerun=True,
    )
    assert rerun.resume()[:2] == ({"cursor": 500}, True)
    # and the item's nodes stay bounded: the kept fires, and the queued one besides
    assert len(CheckpointReader(store, P).fires(0)) <= KEEP_FIRES + 1


def test_the_carried_state_outlives_cut_off_runs_with_failover_off(
    store: CoordinationStore,
) -> None:
    """Review finding 10: with checkpoint_carry and failover off, F0 ends ok (cursor
    100), F1..F4 are cut off (a hand-off that only clears the mark: no ``ended``); the
    prune of their writes keeps F0's node, so F5's ctx.last_state is F0's cursor."""
    counts: Counter[str] = Counter()
    states = _states(store, OLD, counts, failover=False, checkpoint_carry=True)
    run, token, _ = _run_marked(store, states, OLD, FIRE, persistent=False)
    assert run.checkpoint({"cursor": 100}, None)
    final = {0: run.final_ops("ok")}
    assert ExecutionService(store, P, OLD).finish([0], token, {}, extra=final) == []
    from shardkeeper.coordination.model import FailoverEntry

    seen = []
    for k in range(1, KEEP_FIRES + 1):
        fire = FIRE + 60 * k
        run, token, _ = _run_marked(store, states, OLD, fire, persistent=False)
        seen.append(run.resume()[2])
        assert run.checkpoint({"cursor": 100, "partial": k}, None)
        eid = f"ck@{round(fire * 1000)}#0"
        moved = FailoverService(store, P, OLD).hand_off(
            {0: (token, FailoverEntry(fire, eid, OLD), "")},
            keep=False,
            extra={0: run.handoff_ops()},
        )
        assert moved == [0]
    assert seen == [{"cursor": 100}] * KEEP_FIRES
    last, _token, _ = _run_marked(
        store, states, OLD, FIRE + 60 * (KEEP_FIRES + 1), persistent=False
    )
    assert last.resume()[2] == {"cursor": 100}
