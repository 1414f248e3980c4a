"""Run-now is durable (issue 35 section 2): an operator's request lives with the job,
and every item runs with its params once, whatever happens to the item's owner
between the request and the run (kill -9, a freeze past its session, a reshard, the
item still running when the request comes). Real stores, workers as OS processes.

Before, a request was one node per live instance, consumed (deleted) by that
instance as it queued the fire: an owner frozen or dead at the request left its
items to nobody (the others ran only their own items), and one that consumed it
and died lost it with its memory.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.ops import Operations
from shardkeeper.testing.faults import wait_until
from tests.jobs.cluster import Cluster, Instance

pytestmark = pytest.mark.timeout(180)

JOB = "job"
P = JobPaths(JOB)
COUNT = 6
#: a schedule that never fires during a test: only the operator's requests run items
NEVER = "0 0 1 1 *"
PARAMS = {"batch": "7", "region": "eu-west"}


@pytest.fixture
def cluster(registry_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(
        url=registry_url,
        workdir=tmp_path,
        defaults={"job": JOB, "cron": NEVER, "count": COUNT, "failover": True},
    )
    try:
        yield c
    finally:
        for inst in c.instances:  # a frozen worker must be able to stop
            if inst.proc.poll() is None:
                os.kill(inst.proc.pid, signal.SIGCONT)
        c.stop()


@pytest.fixture
def ops(registry_url: str) -> Iterator[Operations]:
    with Operations.connect(registry_url) as o:
        yield o


def with_params(c: Cluster) -> Counter[int]:
    """How many runs of each item started with PARAMS."""
    return Counter(r["item"] for r in c.records("start") if r.get("params") == PARAMS)


def first_round(c: Cluster, ops: Operations) -> None:
    """A request without params: the assignment is made and every item ran once."""
    wait_until(lambda: ops.job(JOB).leader is not None, 20, message="no leader")
    ops.trigger(JOB)
    wait_until(
        lambda: {r["item"] for r in c.records("end")} == set(range(COUNT)),
        30,
        message=lambda: "the first request did not run every item\n" + c.logs(),
    )


def owner_of_items(ops: Operations, workers: list[Instance]) -> Instance:
    """A worker that owns items and does not lead the job."""
    detail = ops.job(JOB)
    owners = {i.owner for i in detail.items}
    return next(w for w in workers if w.instance_id in owners and w.instance_id != detail.leader)


def settled(c: Cluster, ops: Operations) -> None:
    """Every item ran with PARAMS, and the request is gone (every item has its
    record): nothing of it is left to run."""
    wait_until(
        lambda: set(with_params(c)) == set(range(COUNT)),
        60,
        message=lambda: f"items ran with the params: {dict(with_params(c))}\n" + c.logs(),
    )
    wait_until(
        lambda: not ops.store.children(P.runnow_root),
        30,
        message=lambda: f"the request is still pending: {ops.store.get_tree(P.runnow_root)}",
    )


def test_the_items_of_a_frozen_owner_that_dies_run_elsewhere_once(
    cluster: Cluster, ops: Operations
) -> None:
    """The owner is frozen when the request comes (it cannot see it), a new instance
    joins (a reshard), and the owner is killed: its items run with the params on the
    others, each once."""
    workers = [cluster.start(work=0.2) for _ in range(3)]
    first_round(cluster, ops)
    victim = owner_of_items(ops, workers)
    os.kill(victim.proc.pid, signal.SIGSTOP)
    ops.trigger(JOB, params=PARAMS)
    cluster.start(work=0.2)
    victim.kill()
    settled(cluster, ops)
    runs = with_params(cluster)
    assert all(n == 1 for n in runs.values()), dict(runs)
    ran_by = {r["instance"] for r in cluster.records("start") if r.get("params") == PARAMS}
    assert victim.instance_id not in ran_by


def test_an_owner_frozen_past_its_session_runs_nothing_twice_when_it_returns(
    cluster: Cluster, ops: Operations
) -> None:
    """A partition that heals: the owner is frozen through the request and past its
    session; the others run its items with the params; thawed, it rejoins and runs
    none of them again (a later request reaches it: it looked at the requests)."""
    workers = [cluster.start(work=0.2) for _ in range(3)]
    first_round(cluster, ops)
    victim = owner_of_items(ops, workers)
    os.kill(victim.proc.pid, signal.SIGSTOP)
    ops.trigger(JOB, params=PARAMS)
    settled(cluster, ops)
    os.kill(victim.proc.pid, signal.SIGCONT)
    wait_until(
        lambda: ops.store.exists(P.instance(victim.instance_id)),
        30,
        message=lambda: "the thawed owner did not rejoin\n" + cluster.logs(),
    )
    before = len(cluster.records("end"))
    ops.trigger(JOB)
    wait_until(
        lambda: len(cluster.records("end")) >= before + COUNT,
        40,
        message=lambda: "the later request did not run every item\n" + cluster.logs(),
    )
    wait_until(lambda: not ops.store.children(P.runnow_root), 30, message="request pending")
    runs = with_params(cluster)
    assert sorted(runs) == list(range(COUNT))
    assert all(n == 1 for n in runs.values()), dict(runs)


def test_a_request_that_comes_while_the_items_run_outlives_their_owner(
    cluster: Cluster, ops: Operations
) -> None:
    """Every item is running when the request comes; one owner is killed right after
    it (its items fail over). Each item runs with the params once, after the run it
    was in when the request came."""
    workers = [cluster.start(work=3.0) for _ in range(3)]
    first_round(cluster, ops)
    victim = owner_of_items(ops, workers)
    started = time.time()
    ops.trigger(JOB)
    wait_until(
        lambda: (
            {r["item"] for r in cluster.records("start") if r["start"] >= started}
            == set(range(COUNT))
        ),
        30,
        message=lambda: "the items did not start\n" + cluster.logs(),
    )
    asked = time.time()
    ops.trigger(JOB, params=PARAMS)
    victim.kill()
    settled(cluster, ops)
    runs = with_params(cluster)
    assert all(n == 1 for n in runs.values()), dict(runs)
    ends = {
        r["item"]: r["end"]
        for r in cluster.records("end")
        if started <= r["start"] < asked and not r.get("params")
    }
    for r in cluster.records("start"):
        if r.get("params") == PARAMS and r["item"] in ends:
            assert r["start"] >= ends[r["item"]] - 0.05, (r, ends)


def test_an_item_killed_mid_run_is_re_run_by_failover_with_the_params(
    cluster: Cluster, ops: Operations
) -> None:
    """The owner of some items is killed (kill -9) while it runs them for the
    request: the survivors' failover re-runs of them have exactly the request's
    params (ctx.params), and each ends. Before, the running mark and the failover
    entry carried no params: the re-runs ran with none, and as the items had their
    record of the request nothing ran them with the params again."""
    workers = [cluster.start(work=4.0) for _ in range(3)]
    first_round(cluster, ops)
    victim = owner_of_items(ops, workers)
    mine = {i.item for i in ops.job(JOB).items if i.owner == victim.instance_id}
    ops.trigger(JOB, params=PARAMS)

    def started_on_victim() -> dict[int, str]:
        return {
            r["item"]: r["execution_id"]
            for r in cluster.records("start")
            if r["instance"] == victim.instance_id and r.get("params") == PARAMS
        }

    wait_until(
        lambda: set(started_on_victim()) == mine,
        30,
        message=lambda: f"the victim's items {mine} did not start\n" + cluster.logs(),
    )
    asked = started_on_victim()
    victim.kill()

    def reruns(phase: str) -> list[dict[str, Any]]:
        return [r for r in cluster.records(phase) if r["failover"] and r["item"] in mine]

    wait_until(
        lambda: {r["item"] for r in reruns("end")} == mine,
        60,
        message=lambda: f"failover re-runs of {mine}: {reruns('end')}\n" + cluster.logs(),
    )
    for rec in reruns("start"):
        assert rec.get("params") == PARAMS, rec
        assert rec["execution_id"] == asked[rec["item"]], (rec, asked)
        assert rec["instance"] != victim.instance_id
    settled(cluster, ops)
