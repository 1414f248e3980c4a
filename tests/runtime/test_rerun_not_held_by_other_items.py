"""An owed misfire re-run waits only for the marks of its own items.

A failed completion commit leaves its items' marks until housekeeping clears them
(retry_unfinished). The plain misfire re-run was held while ANY completion of the
job was unsettled, whatever its items: in a 600 s chaos run on ZooKeeper, vm@5301's
re-run of its own 2,500 bulk items (idle, their marks cleared) waited 15 s for the
settling of some 330 items it had failed over for another owner, past the final stop,
and the fire it stood for was never run nor recorded. The re-run now waits only
when the unsettled marks are those of the items whose runs held its fires.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "rerun-own"
NEVER = "0 0 1 1 *"
PARAMS = {"op": "held"}
#: a held execution returns by itself after this long (no test can hang on it)
HOLD_LIMIT = 30.0


class Gated(ShardedJob):
    """Records each execution (item, misfire, params); a run-now part waits for
    ``param_gate``, a plain first run for ``plain_gate``; misfire re-runs return."""

    def __init__(self) -> None:
        self.param_gate = threading.Event()
        self.plain_gate = threading.Event()
        self._lock = threading.Lock()
        self._runs: list[tuple[int, bool, dict[str, str]]] = []

    def execute(self, ctx: ShardingContext) -> None:
        """Record, then wait at the run's gate (bounded)."""
        with self._lock:
            self._runs.append((ctx.item, ctx.is_misfire, dict(ctx.params)))
        if ctx.params:
            self.param_gate.wait(HOLD_LIMIT)
        elif not ctx.is_misfire:
            self.plain_gate.wait(HOLD_LIMIT)

    @property
    def runs(self) -> list[tuple[int, bool, dict[str, str]]]:
        """Every execution so far (a copy)."""
        with self._lock:
            return list(self._runs)


def test_the_re_run_of_idle_items_does_not_wait_for_another_items_failed_completion(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Item 1's run ends and its completion commit keeps failing (its mark stays);
    item 1 is then switched off, so fires run item 0 only. A fire comes while item
    0's run goes on and is owed as a misfire re-run. Once item 0's run ends (its
    completion written), the re-run of item 0 starts at once; before, it waited for
    item 1's marks to be cleared, here never."""
    admin = memory_server.store()
    admin.start()
    job = Gated()
    store = memory_server.store(session_timeout=30.0)
    rt = Runtime(store, shutdown_grace=1, worker_threads=4)
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, misfire=True)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    try:
        rt.start()
        runner = rt.runners[JOB]
        wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
        ops = Operations(admin)

        # item 1 runs (an operator's run-now part); its completion commit fails, and
        # so does every retry of it
        ops.trigger(JOB, params=PARAMS, items=[1])
        wait_until(lambda: (1, False, PARAMS) in job.runs, 10, message="item 1 never ran")
        store.fail_next("commit", path=JobPaths(JOB).running(1), count=100_000)
        job.param_gate.set()
        wait_until(
            lambda: runner.batches.unfinished_items() == {1},
            10,
            message="item 1's completion did not fail",
        )

        ops.disable_item(JOB, 1)
        wait_until(
            lambda: runner.state.item_disabled(1, time.time()),
            10,
            message="the item switch was not seen",
        )
        # item 0 runs (held); a fire meanwhile is owed as a misfire re-run of item 0
        runner.on_trigger(datetime.now(UTC))
        wait_until(lambda: (0, False, {}) in job.runs, 10, message="item 0 never ran")
        misfires = runner.stats["misfires"]
        runner.on_trigger(datetime.fromtimestamp(time.time() + 0.001, UTC))
        wait_until(
            lambda: runner.stats["misfires"] > misfires, 10, message="the fire was not deferred"
        )
        assert not [r for r in job.runs if r[1]], job.runs

        job.plain_gate.set()
        wait_until(
            lambda: (0, True, {}) in job.runs,
            10,
            message=lambda: (
                f"item 0's re-run never started (unsettled: "
                f"{sorted(runner.batches.unfinished_items())}): {job.runs}"
            ),
        )
        # item 1's marks are still there: the re-run did not wait for them
        assert runner.batches.unfinished_items() == {1}
        assert not [r for r in job.runs if r[0] == 1 and r[1]], job.runs
    finally:
        job.param_gate.set()
        job.plain_gate.set()
