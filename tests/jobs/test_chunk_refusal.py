"""A fire packed into several start commits loses no item when one commit is refused.

Reliability review of 3005b15, finding 3, on the real stores: a fire of 300 items at
128 operations a commit is marked in five chunks. One item of the fifth chunk was
still running elsewhere for the previous fire (a failover taker), so that chunk was
refused (all or nothing), and its items and every later chunk's never ran for that
fire, with nothing recorded (issue 25: 1,083 of 6,000 items after a session expiry).
Now the free items start at once and the busy one after the other run ends, within
the fire's deadline.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry import open_store
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.etcd import EtcdStore
from shardkeeper.registry.zookeeper import ZooKeeperStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(120)

COUNT = 300
BUSY = 250  # in the fifth chunk of 62 items (two operations each, four fixed)
TAKER = "host@9@taker"


def test_a_later_start_commit_refused_by_one_busy_item_loses_no_item(
    registry_url: str, store: CoordinationStore
) -> None:
    name = "chunkrefused"
    paths = JobPaths(name)
    # a live member that gets no items (disabled) and runs item BUSY for an earlier
    # fire: its mark is not an orphan, so only its end frees the item
    store.put(paths.disabled_instance(TAKER), b"")
    store.put(paths.instance(TAKER), b"{}", ephemeral=True)
    capped = open_store(registry_url)
    assert isinstance(capped, ZooKeeperStore | EtcdStore), "the limits set are the real stores'"
    capped.max_ops_per_commit = 128
    capped.max_groups_per_commit = None  # plain all-or-nothing commits (ZooKeeper's way)
    job = RecordingJob()
    rt = Runtime(capped, shutdown_grace=5)
    config = JobConfig(
        name=name,
        interval=2,
        sharding_total_count=COUNT,
        failover=True,
        misfire=True,
        sharding_wait_timeout=10,
    )
    rt.add_job(job, config)
    with rt:
        wait_until(
            lambda: COUNT in Counter(r.fire_time for r in job.runs).values(),
            30,
            message="no whole fire ran",
        )
        # once the last run's own mark is gone (a put would overwrite it, and that
        # run's completion would delete the taker's mark with its own)
        wait_until(
            lambda: (
                store.create(
                    paths.running(BUSY), RunningMark(TAKER, time.time() - 0.5, "x").to_bytes()
                )
                is not None
            ),
            10,
            message="item BUSY's own mark never cleared",
        )
        taken = time.time()

        def next_fire() -> float | None:
            return min((r.fire_time for r in job.runs if r.fire_time > taken), default=None)

        def ran_for_next() -> set[int]:
            return {r.item for r in job.runs if r.fire_time == next_fire()}

        wait_until(
            lambda: len(ran_for_next()) == COUNT - 1,
            20,
            message=lambda: (
                f"{COUNT - 1 - len(ran_for_next())} free items never ran "
                f"(fire {next_fire()}, marked at {taken}, "
                f"per fire: {Counter(r.fire_time for r in job.runs)})"
            ),
        )
        assert BUSY not in ran_for_next(), "the busy item ran beside the other run"
        store.delete(paths.running(BUSY))  # the taker's run ended
        wait_until(
            lambda: BUSY in ran_for_next(),
            15,
            message="the busy item never ran for its fire after the other run ended",
        )
        first = next_fire()
        assert first is not None, "the busy item ran for a next fire, so there is one"
    per_fire = Counter(r.fire_time for r in job.runs)
    assert per_fire[first] == COUNT
    assert max(Counter((r.fire_time, r.item) for r in job.runs).values()) == 1
