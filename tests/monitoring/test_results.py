"""The last result of each item, written by the completion commit, on the real stores."""

from __future__ import annotations

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ERROR_LIMIT, ItemResult
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "results"
P = JobPaths(JOB)


def _result(store: CoordinationStore, item: int) -> ItemResult | None:
    node = store.get(P.result(item))
    return ItemResult.from_bytes(node.value, node.path) if node is not None else None


def _doc(outcome: str, *, last_ok: float = 0.0) -> bytes:
    return ItemResult(outcome, 1.0, 2.0, 3.0, "host@1@me", last_ok=last_ok).to_bytes()


def _start(
    store: CoordinationStore, me: str, persistent: bool
) -> tuple[ExecutionService, int, dict[int, str]]:
    version = store.put(P.sharding, b'{"total": 2}').version
    svc = ExecutionService(store, P, me)
    started = svc.start(
        [0, 1],
        fire_time=1.0,
        execution_ids={0: "results@1000#0", 1: "results@1000#1"},
        assignment_version=version,
        persistent=persistent,
        monitor=True,
    )
    assert started.marked == (0, 1)
    return svc, started.tokens[0], started.fences


@pytest.mark.parametrize("persistent", [False, True], ids=["ephemeral", "persistent"])
def test_the_completion_commit_writes_the_results(
    store: CoordinationStore, persistent: bool
) -> None:
    svc, token, fences = _start(store, "host@1@me", persistent)
    assert svc.finish([0, 1], token, fences, {0: _doc("ok"), 1: _doc("failed")}) == []
    assert not store.exists(P.running(0)) and not store.exists(P.running(1))
    r0, r1 = _result(store, 0), _result(store, 1)
    assert r0 is not None and r0.outcome == "ok" and r0.duration == 1.0
    assert r1 is not None and r1.failed
    # the next completion overwrites (the node exists now: a set, not a create)
    svc, token, fences = _start(store, "host@1@me", persistent)
    assert svc.finish([0, 1], token, fences, {1: _doc("ok", last_ok=9.0)}) == []
    r1 = _result(store, 1)
    assert r1 is not None and r1.outcome == "ok" and r1.last_ok == 9.0
    r0 = _result(store, 0)
    assert r0 is not None and r0.outcome == "ok"  # no result given: left as it was


def test_a_fenced_completion_writes_no_result(store: CoordinationStore) -> None:
    zombie, token, fences = _start(store, "host@1@zombie", True)
    leader = FailoverService(store, P, "host@3@leader")
    assert sorted(leader.requeue_orphans(live=set())) == [0, 1]
    claim = FailoverService(store, P, "host@2@taker").claim()
    assert claim is not None
    fenced = zombie.finish([0, 1], token, fences, {0: _doc("failed"), 1: _doc("failed")})
    # both marks were taken away from it (one claimed, one queued): nothing written
    assert fenced == [0, 1]
    assert _result(store, 0) is None and _result(store, 1) is None
    assert store.exists(P.running(claim.item))


def test_results_are_bounded() -> None:
    big = ItemResult("failed", 1, 2, 3, "i", error_type="E" * 500, error="x" * 10_000)
    raw = big.to_bytes()
    assert len(raw) < 600
    back = ItemResult.from_bytes(raw)
    assert len(back.error) == ERROR_LIMIT and back.error.endswith("...")


class Broken(ShardedJob):
    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise KeyError("order 42 " + "y" * 400)


@pytest.mark.parametrize("failover", [False, True], ids=["plain", "failover"])
def test_a_runtime_records_the_last_result_of_every_item(
    registry_url: str, store: CoordinationStore, failover: bool
) -> None:
    # item 1 succeeded once before, on another instance: its last ok is carried over
    store.put(P.result(1), _doc("ok", last_ok=1234.0))
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(
        Broken(), JobConfig(name=JOB, interval=0.3, sharding_total_count=2, failover=failover)
    )
    with rt:
        r1 = wait_until(
            lambda: r if (r := _result(store, 1)) is not None and r.failures >= 2 else None,
            20,
            0.05,
            "no failed result for item 1",
        )
        r0 = wait_until(lambda: _result(store, 0), 10, 0.05, "no result for item 0")
    assert r1.failed and r1.error_type == "KeyError" and "order 42" in r1.error
    assert len(r1.error) <= ERROR_LIMIT
    assert r1.last_ok == 1234.0 and r1.instance == rt.instance_id
    assert r0.outcome == "ok" and r0.last_ok == pytest.approx(r0.ended)
    assert r0.failures == 0 and r0.ended >= r0.started > 0


def test_a_put_of_an_existing_node_is_written_whether_or_not_the_hint_holds(
    store: CoordinationStore,
) -> None:
    """``Put(existing=True)`` lets ZooKeeper skip the pre-read; a wrong hint (the node
    is missing, its parent too) still creates it, in the same single commit."""
    from shardkeeper.registry.base import Check, Put

    path = P.result(7)
    assert store.commit([Put(path, b"one", existing=True)])
    node = store.get(path)
    assert node is not None and node.value == b"one" and not node.ephemeral
    assert store.commit([Check(P.results_root, exists=True), Put(path, b"two", existing=True)])
    node = store.get(path)
    assert node is not None and node.value == b"two"
    store.delete(path)
    assert store.commit([Put(path, b"three", existing=True)])
    node = store.get(path)
    assert node is not None and node.value == b"three"
