"""Failover, session loss, fencing and graceful shutdown on real stores."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths, instance_path
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import expire_session, wait_until
from shardkeeper.testing.jobs import RecordingJob
from tests.jobs.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

JOB = "job"
P = JobPaths(JOB)


@pytest.fixture
def cluster(registry_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(
        url=registry_url, workdir=tmp_path, defaults={"job": JOB, "interval": 6, "failover": True}
    )
    try:
        yield c
    finally:
        c.stop()


def unfinished(c: Cluster, instance_id: str) -> list[dict[str, Any]]:
    """Executions of ``instance_id`` that started and did not end."""
    ended = {(r["item"], r["fire"]) for r in c.records("end") if r["instance"] == instance_id}
    return [
        r
        for r in c.records("start")
        if r["instance"] == instance_id and (r["item"], r["fire"]) not in ended
    ]


def test_killed_instance_items_fail_over_at_once(cluster: Cluster) -> None:
    """kill -9 of an instance in the middle of its items: the survivors run exactly
    those items at once (not at the next trigger), as failover runs carrying the
    original fire time and execution id."""
    workers = [cluster.start(count=6, work=3.0) for _ in range(3)]
    victim = workers[1]
    wait_until(
        lambda: len(unfinished(cluster, victim.instance_id)) >= 2,
        20,
        message=lambda: "victim never ran items\n" + cluster.logs(),
    )
    orphans = unfinished(cluster, victim.instance_id)
    killed_at = time.time()
    victim.kill()
    want = {(r["item"], r["fire"]) for r in orphans}

    def taken_over() -> bool:
        got = {(r["item"], r["fire"]) for r in cluster.records("start") if r["failover"]}
        return want <= got

    wait_until(taken_over, 20, message=lambda: "orphans not taken over\n" + cluster.logs())
    fo = [r for r in cluster.records("start") if r["failover"]]
    by_key = {(r["item"], r["fire"]): r for r in fo}
    for orphan in orphans:
        run = by_key[(orphan["item"], orphan["fire"])]
        assert run["instance"] != victim.instance_id
        assert run["execution_id"] == orphan["execution_id"]
        assert run["token"] > orphan["token"]  # fencing tokens only grow
        # at once: long before the next trigger of the job (6 s period)
        assert run["start"] < orphan["fire"] + 6
    latency = min(r["start"] for r in fo) - killed_at
    print(f"failover latency after kill -9: {latency:.2f}s")


def test_zombie_is_fenced_and_writes_nothing(cluster: Cluster, store: CoordinationStore) -> None:
    """An instance frozen (SIGSTOP) past its session timeout is taken over; when it
    wakes, its execution learns it is fenced off (ctx.is_valid() is false) and its
    completion does not remove the taker's running mark."""
    workers = [cluster.start(count=2, work=4.0) for _ in range(2)]
    zombie = workers[0]
    wait_until(
        lambda: len(unfinished(cluster, zombie.instance_id)) >= 1,
        20,
        message=lambda: "zombie never ran\n" + cluster.logs(),
    )
    item = unfinished(cluster, zombie.instance_id)[0]["item"]
    zombie.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: any(r["failover"] and r["item"] == item for r in cluster.records("start")),
            20,
            message=lambda: "frozen instance's item not taken over\n" + cluster.logs(),
        )
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
    taker = next(r for r in cluster.records("start") if r["failover"] and r["item"] == item)

    def zombie_done() -> bool:
        return any(
            r["instance"] == zombie.instance_id and r["item"] == item and r["fire"] == taker["fire"]
            for r in cluster.records("end")
        )

    wait_until(zombie_done, 20, message=lambda: "zombie never finished\n" + cluster.logs())
    end = next(
        r
        for r in cluster.records("end")
        if r["instance"] == zombie.instance_id and r["item"] == item and r["fire"] == taker["fire"]
    )
    assert end["valid"] is False, f"{end}\n{taker}\n{cluster.logs()}"
    # the taker's mark survived the zombie's completion unless the taker finished
    taker_done = any(
        r["instance"] == taker["instance"] and r["failover"] and r["item"] == item
        for r in cluster.records("end")
    )
    if not taker_done:
        node = store.get(P.running(item))
        assert node is not None and node.created_revision == taker["token"]


def test_graceful_stop_finishes_items_without_failover(cluster: Cluster) -> None:
    """SIGTERM lets running items finish, deregisters, and leaves nothing to fail over."""
    workers = [cluster.start(count=4, work=2.0) for _ in range(2)]
    leaving = workers[0]
    wait_until(
        lambda: len(unfinished(cluster, leaving.instance_id)) >= 1,
        20,
        message=lambda: "never ran\n" + cluster.logs(),
    )
    running = unfinished(cluster, leaving.instance_id)
    assert leaving.term() == 0
    ended = {
        (r["item"], r["fire"])
        for r in cluster.records("end")
        if r["instance"] == leaving.instance_id
    }
    assert {(r["item"], r["fire"]) for r in running} <= ended
    # the survivor takes all items at its next trigger; none as a failover run
    survivor = workers[1].instance_id
    t = time.time()

    def all_on_survivor() -> bool:
        recs = [r for r in cluster.records("end") if r["fire"] > t]
        return sorted(r["item"] for r in recs if r["instance"] == survivor) == [0, 1, 2, 3]

    wait_until(all_on_survivor, 25, message=lambda: "survivor did not take all\n" + cluster.logs())
    assert not any(r["failover"] for r in cluster.records("start"))


def test_session_expiry_reregisters_without_restart(
    registry_url: str, store: CoordinationStore
) -> None:
    """After a real server-side session expiry the instance re-registers (membership,
    leadership) and keeps running its items, in the same process."""
    job = RecordingJob()
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(job, JobConfig(name=JOB, interval=1, sharding_total_count=2))
    with rt:
        job.wait_for(lambda runs: len(runs) >= 2, 15, message="job never ran")
        old = rt.store.session_id
        expire_session(rt.store)
        expired_at = time.time()
        wait_until(lambda: rt.store.session_id != old, 15, message="no new session")
        wait_until(
            lambda: store.exists(P.instance(rt.instance_id)),
            15,
            message="membership not re-registered",
        )
        wait_until(
            lambda: store.exists(instance_path(rt.instance_id)),
            15,
            message="instance node not re-registered",
        )
        job.wait_for(
            lambda runs: any(r.at > expired_at + 0.5 for r in runs),
            20,
            message="job did not resume after the session expiry",
        )
        node = store.get(P.leader)
        assert node is not None and node.value.decode() == rt.instance_id
    assert not rt.running


def test_thread_budget_is_fixed_for_500_jobs(registry_url: str) -> None:
    """500 jobs in one process run on a fixed number of threads."""
    before = threading.active_count()
    rt = Runtime(registry_url, shutdown_grace=1)
    for n in range(500):
        rt.add_job(
            RecordingJob(), JobConfig(name=f"job-{n}", interval=3600, sharding_total_count=2)
        )
    t0 = time.time()
    with rt:
        started = time.time() - t0
        wait_until(lambda: threading.active_count() - before >= 5, 5, message="no threads?")
        added = threading.active_count() - before
        print(f"500 jobs: started in {started:.1f}s, threads added {added}")
        # store (<= 6) + scheduler (3) + coordinator pool (4) + workers (8) + housekeeping
        assert added <= 24
