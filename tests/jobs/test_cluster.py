"""Elastic sharding across real OS processes on real stores (both backends)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.jobs.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

JOB = "job"
P = JobPaths(JOB)


@pytest.fixture
def cluster(registry_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(url=registry_url, workdir=tmp_path, defaults={"job": JOB, "interval": 1})
    try:
        yield c
    finally:
        c.stop()


def settled(c: Cluster, after: float, age: float = 3.0) -> dict[float, list[dict[str, Any]]]:
    """Fire times later than ``after`` whose executions have had time to finish (on a
    loaded machine a run may end well after its 1 s interval: then the next fire of
    its items is a misfire, re-run for that fire time, and counts for it)."""
    now = time.time()
    return {ft: recs for ft, recs in c.by_fire(misfire=True).items() if after < ft < now - age}


def coverage(recs: list[dict[str, Any]]) -> tuple[list[int], set[str]]:
    return sorted(r["item"] for r in recs), {r["instance"] for r in recs}


def wait_for_exact_cover(
    c: Cluster, after: float, count: int, instances: set[str], timeout: float = 30
) -> float:
    """Wait for a fire time after ``after`` covered exactly once by exactly ``instances``;
    return it."""
    found: list[float] = []

    def check() -> bool:
        for ft, recs in sorted(settled(c, after).items()):
            items, who = coverage(recs)
            if items == list(range(count)) and who == instances:
                found.append(ft)
                return True
        return False

    wait_until(
        check, timeout, message=f"no trigger covered 0..{count - 1} by {instances}\n" + c.logs()
    )
    return found[0]


def assert_exactly_once_since(
    c: Cluster, since: float, count: int, allowed: set[str] | None = None
) -> int:
    """Every settled fire time from ``since`` on ran each item exactly once."""
    n = 0
    for ft, recs in sorted(settled(c, since - 0.001).items()):
        items, who = coverage(recs)
        assert items == list(range(count)), f"fire {ft}: items {items}\n{c.logs()}"
        if allowed is not None:
            assert who <= allowed, f"fire {ft}: ran on {who}, expected within {allowed}"
        n += 1
    return n


def test_elastic_story(cluster: Cluster, store: CoordinationStore) -> None:
    """3 instances share 10 items exactly once; a 4th joins, one leaves gracefully,
    the leader is killed -9, the count changes: each next trigger covers every item
    exactly once across the live instances."""
    ids = {cluster.start(count=10).instance_id for _ in range(3)}
    first = wait_for_exact_cover(cluster, 0, 10, ids)
    wait_until(lambda: len(settled(cluster, first - 0.001)) >= 3, 15, message="triggers stall")
    assert assert_exactly_once_since(cluster, first, 10, ids) >= 3

    # scale up: the new instance gets items from the next trigger on
    fourth = cluster.start(count=10)
    joined = time.time()
    ids4 = ids | {fourth.instance_id}
    t4 = wait_for_exact_cover(cluster, joined, 10, ids4)
    wait_until(lambda: len(settled(cluster, t4 - 0.001)) >= 2, 15, message="triggers stall")
    # every trigger after the join covered all items, and the new one takes part
    assert_exactly_once_since(cluster, joined, 10, ids4)

    # graceful leave
    leaving = cluster.instances[0]
    assert leaving.term() == 0
    left = time.time()
    ids3 = ids4 - {leaving.instance_id}
    t3 = wait_for_exact_cover(cluster, left, 10, ids3)
    wait_until(lambda: len(settled(cluster, t3 - 0.001)) >= 2, 15, message="triggers stall")
    assert_exactly_once_since(cluster, left, 10, ids3)

    # kill -9 the leader: a new one is elected and reshards
    node = store.get(P.leader)
    assert node is not None
    leader_id = node.value.decode()
    victim = next(i for i in cluster.instances if i.instance_id == leader_id)
    victim.kill()
    ids2 = ids3 - {leader_id}

    def new_leader() -> bool:
        n = store.get(P.leader)
        return n is not None and n.value.decode() in ids2

    wait_until(new_leader, 15, message="no new leader after kill -9\n" + cluster.logs())
    t2 = wait_for_exact_cover(cluster, time.time(), 10, ids2)
    assert_exactly_once_since(cluster, t2, 10, ids2)

    # count 10 -> 6 while running (as the operations API does it)
    configs = ConfigService(store, P)
    cfg = configs.load()
    assert cfg is not None and cfg.sharding_total_count == 10
    configs.save(cfg.model_copy(update={"sharding_total_count": 6}))
    store.put(P.necessary, b"count changed")
    t6 = wait_for_exact_cover(cluster, time.time(), 6, ids2)
    wait_until(lambda: len(settled(cluster, t6 - 0.001)) >= 2, 15, message="triggers stall")
    assert_exactly_once_since(cluster, t6, 6, ids2)


def test_disabled_item_and_instance(cluster: Cluster, store: CoordinationStore) -> None:
    """A disabled item is skipped by its owner; a disabled instance gets no items
    and the others cover all of them."""
    a = cluster.start(count=6).instance_id
    b = cluster.start(count=6).instance_id
    wait_for_exact_cover(cluster, 0, 6, {a, b})
    store.put(P.disabled_item(3), b"")
    t = time.time() + 0.2

    def skipped_3() -> bool:
        s = settled(cluster, t)
        return len(s) >= 2 and all(coverage(r)[0] == [0, 1, 2, 4, 5] for r in s.values())

    wait_until(skipped_3, 20, message="item 3 not skipped\n" + cluster.logs())
    store.delete(P.disabled_item(3))
    store.put(P.disabled_instance(b), b"")
    store.put(P.necessary, b"instance switched")
    wait_for_exact_cover(cluster, time.time(), 6, {a})


def test_misfire_reruns_items_once(cluster: Cluster) -> None:
    """Items that take longer than the interval are marked misfired and run once more
    right after, flagged as misfire runs."""
    cluster.start(count=2, work=1.5)

    def misfired() -> bool:
        return any(r["misfire"] for r in cluster.records())

    wait_until(misfired, 30, message="no misfire re-run\n" + cluster.logs())
    recs = cluster.records()
    # never two executions of one item at once on the instance
    by_item: dict[int, list[tuple[float, float]]] = {}
    for r in recs:
        by_item.setdefault(r["item"], []).append((r["start"], r["end"]))
    for spans in by_item.values():
        spans.sort()
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            assert s2 >= e1 - 1e-3


def test_config_conflict_is_refused(cluster: Cluster, store: CoordinationStore) -> None:
    """A job name registered by one job class is refused to another class."""
    cluster.start(count=2)
    with pytest.raises(RuntimeError, match=r"JobConflictError.*already registered"):
        cluster.start(count=2, class_name="other.module:OtherJob")


def test_stored_config_wins_without_overwrite(cluster: Cluster, store: CoordinationStore) -> None:
    """A restarted instance with overwrite off uses the stored config; with overwrite
    on its own config replaces it."""
    cluster.start(count=4)
    cluster.start(count=7)  # overwrite off: stored count 4 stays
    stored = ConfigService(store, P).load()
    assert stored is not None and stored.sharding_total_count == 4
    cluster.start(count=5, overwrite=True)
    stored = ConfigService(store, P).load()
    assert stored is not None and stored.sharding_total_count == 5
    assert isinstance(stored, JobConfig)
