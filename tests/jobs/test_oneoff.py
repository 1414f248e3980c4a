"""One-off jobs (``at``) in clusters of real processes, on ZooKeeper and etcd: each item
runs once cluster-wide, the job is then done for good (also for an instance started
later), a kill -9 of an owner mid-item fails the item over and it still completes
once, and a time already past at start runs once (misfire on) or is skipped (off)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.coordination.oneoff import DoneRecord
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.ops import Operations
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.jobs.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

JOB = "oneoff"
P = JobPaths(JOB)
#: once every instance is up, the fire is moved this far ahead (config set): time
#: for each of them to reschedule it (a start-up under load takes longer than that)
LEAD = 5.0


@pytest.fixture
def cluster(registry_url: str, tmp_path: Path) -> Iterator[Cluster]:
    # sharding_wait: the least the fixture's 2 s operation timeout allows (two start
    # attempts, config/timing.py)
    c = Cluster(url=registry_url, workdir=tmp_path, defaults={"job": JOB, "sharding_wait": 4.0})
    try:
        yield c
    finally:
        c.stop()


def iso(at: float) -> str:
    """``at`` as the ISO 8601 text a job file would hold."""
    return datetime.fromtimestamp(at, UTC).isoformat()


def done_record(store: CoordinationStore) -> DoneRecord | None:
    """The job's done marker, or None."""
    node = store.get(P.done)
    return DoneRecord.from_bytes(node.value, node.path) if node is not None else None


def wait_done(store: CoordinationStore, c: Cluster, timeout: float = 40) -> DoneRecord:
    """Wait for the done marker."""
    done = wait_until(
        lambda: done_record(store), timeout, message=lambda: "never done\n" + c.logs()
    )
    assert done is not None
    return done


def start_then_arm(c: Cluster, store: CoordinationStore, n: int, **options: Any) -> float:
    """Start ``n`` instances of a one-off job due in an hour, then move its time to
    LEAD seconds from now in the stored config (as ``shardkeeper config set`` does):
    every instance is then up at the time, however slowly they started. Returns the
    new time once every instance has taken the change."""
    for _ in range(n):
        c.start(at=iso(time.time() + 3600), **options)
    at = round(time.time() + LEAD, 3)
    Operations(store).update_config(JOB, at=iso(at))
    wait_until(
        lambda: all(
            "configuration changed in the registry" in i.errlog.read_text() for i in c.instances
        ),
        LEAD - 1,
        message=lambda: "the new time did not reach every instance in time\n" + c.logs(),
    )
    return at


def test_date_job_runs_each_item_once_then_is_done(
    cluster: Cluster, store: CoordinationStore
) -> None:
    """Three instances up at ``at`` (moved there by a config edit): every item runs
    exactly once across them, at that fire time; then the job is done, and an
    instance started after that runs nothing."""
    at = start_then_arm(cluster, store, 3, count=6, work=0.5)
    ids = [i.instance_id for i in cluster.instances]
    done = wait_done(store, cluster)
    assert done.is_for(at) and done.skipped == ()
    ends = cluster.records("end")
    assert Counter(r["item"] for r in ends) == dict.fromkeys(range(6), 1), ends
    assert all(abs(r["fire"] - at) < 1e-3 for r in ends)
    assert {r["instance"] for r in ends} <= set(ids)
    assert len({r["instance"] for r in ends}) == 3  # spread over the cluster
    late = cluster.start(at=iso(at), count=6, work=0.5)
    wait_until(
        lambda: "one-off job is done" in late.errlog.read_text(),
        20,
        message=lambda: "the late instance never saw the job done\n" + cluster.logs(),
    )
    assert cluster.records("start") == cluster.records("start")[: len(ends)]
    assert not [r for r in cluster.records("start") if r["instance"] == late.instance_id]


def test_killed_owner_mid_item_fails_over_and_completes_once(
    cluster: Cluster, store: CoordinationStore
) -> None:
    """kill -9 of an owner while its items run: they fail over to a survivor and
    complete there, once each; every other item completes once; the job is done."""
    at = start_then_arm(cluster, store, 3, count=6, work=3.0, failover=True)
    victim = cluster.instances[1]

    def victim_running() -> list[int]:
        started = {
            r["item"] for r in cluster.records("start") if r["instance"] == victim.instance_id
        }
        ended = {r["item"] for r in cluster.records("end") if r["instance"] == victim.instance_id}
        return sorted(started - ended)

    orphans = wait_until(
        victim_running, LEAD + 20, message=lambda: "victim ran nothing\n" + cluster.logs()
    )
    victim.kill()
    done = wait_done(store, cluster, 60)
    assert done.is_for(at) and done.skipped == ()
    ends = cluster.records("end")
    assert Counter(r["item"] for r in ends) == dict.fromkeys(range(6), 1), ends
    by_item = {r["item"]: r for r in ends}
    for item in orphans:
        run = by_item[item]
        assert run["instance"] != victim.instance_id
        assert run["failover"], run
        assert abs(run["fire"] - at) < 1e-3  # the original fire, not a new one
    assert all(r["valid"] for r in ends)


def test_past_date_at_start_runs_once(cluster: Cluster, store: CoordinationStore) -> None:
    """``at`` an hour ago and nobody was up: the instances started now run every item
    once (a missed one-off fire is a misfire, run late), then the job is done."""
    at = time.time() - 3600
    for _ in range(2):
        cluster.start(at=iso(at), count=4, work=0.2)
    done = wait_done(store, cluster)
    assert done.is_for(at) and done.skipped == ()
    ends = cluster.records("end")
    assert Counter(r["item"] for r in ends) == dict.fromkeys(range(4), 1), ends
    assert all(r["fire"] > at + 3000 for r in ends)  # a catch-up fire, late


def test_past_date_with_misfire_off_is_skipped_then_done(
    cluster: Cluster, store: CoordinationStore
) -> None:
    """misfire off: the missed one-off fire is not run; the job is recorded done with
    every item skipped."""
    at = time.time() - 3600
    for _ in range(2):
        cluster.start(at=iso(at), count=4, no_misfire=True)
    done = wait_done(store, cluster)
    assert done.skipped == (0, 1, 2, 3)
    assert cluster.records("start") == []
