"""A clock-skew mark whose commit failed is committed again by the next pass (core
review 2026-12, finding 4): until it is in the store the leader does not know the
instance is skewed and keeps giving it items, which it skips."""

from __future__ import annotations

import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.clockskew import CLOCK_EVERY
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)


def test_a_failed_skew_mark_is_committed_again_and_the_items_run_elsewhere() -> None:
    """B runs the job; A joins with its clock 30 s ahead (limit 5 s) and the commit of
    its skew mark fails once. The mark is in the store well within one measurement
    period (CLOCK_EVERY), and every item then runs on B. Before the fix the mark was
    never retried: items 0 and 1 stayed A's and ran nowhere."""
    server = MemoryServer()
    paths = JobPaths("j")
    cfg = JobConfig(name="j", interval=0.5, sharding_total_count=4, max_time_diff_seconds=5)
    b_job, a_job = RecordingJob(), RecordingJob()
    b = Runtime(server.store("ns", session_timeout=2), instance_id="B", shutdown_grace=0)
    b.add_job(b_job, cfg)
    store_a = server.store("ns", session_timeout=2)
    store_a.fail_next("commit", path=paths.skewed("A"))
    a = Runtime(store_a, instance_id="A", shutdown_grace=0, wall_clock=lambda: time.time() + 30)
    a.add_job(a_job, cfg)
    admin = server.store("ns")
    admin.start()
    try:
        b.start()
        b_job.wait_for(lambda runs: len(runs) >= 1, 20)
        a.start()
        assert a.clock is not None and "j" in a.clock.skewed
        began = time.monotonic()
        wait_until(
            lambda: admin.children(paths.skewed_root) == ["A"],
            CLOCK_EVERY - 2,
            message=lambda: f"no skew mark: {admin.children(paths.skewed_root)}",
        )
        assert time.monotonic() - began < CLOCK_EVERY
        after = time.time() + 1.0
        b_job.wait_for(
            lambda runs: {r.item for r in runs if r.fire_time >= after} == {0, 1, 2, 3}, 20
        )
        assert a_job.runs == []
    finally:
        a.stop()
        b.stop()
        admin.close()
        server.shutdown()
