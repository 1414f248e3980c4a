"""An owed misfire re-run that a later start stands for is not decided; a fire whose
decision is past its deadline makes no further store round.

600 s chaos on ZooKeeper (instance vm@28116, job ``chaos``): fire 368 waited on a
reshard, fires 369-370 were folded behind it (a re-run owed for them), then fire 371
ran covering 368-370. The lane still went on to decide the re-run of 369, redundant;
it met store timeouts (2 s each), ran one operation past its 5 s deadline and held
the lane 6.5 s while fires 372-377 waited behind it.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.counters import SkipReason
from shardkeeper.errors import StoreError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire.trigger import Fire, StepResult
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "owed"
HOUR = 3600.0


class Covers(ShardedJob):
    """Records (fire time, misfire, covered fires) of each run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[float, bool, tuple[float, ...]]] = []

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs.append(
                (
                    ctx.fire_time.timestamp(),
                    ctx.is_misfire,
                    tuple(t.timestamp() for t in ctx.covers),
                )
            )

    def snapshot(self) -> list[tuple[float, bool, tuple[float, ...]]]:
        with self.lock:
            return list(self.runs)


def _at(ft: float) -> datetime:
    return datetime.fromtimestamp(ft, UTC)


def test_an_owed_rerun_a_later_run_covers_is_not_started(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Hourly fires: F0 runs; F1 and F2 are folded (a re-run of F1 owed, folding F2);
    F3 then runs and covers F1 and F2. No re-run of F1 starts afterwards."""
    job = Covers()
    rt = Runtime(memory_server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(name=JOB, interval=int(HOUR), sharding_total_count=2, misfire=True))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    runner.state.joined_at = 0.0  # the fires of the test come from the past hours
    f0 = (time.time() // HOUR) * HOUR - 4 * HOUR
    f1, f2, f3 = f0 + HOUR, f0 + 2 * HOUR, f0 + 3 * HOUR
    runner.on_trigger(_at(f0))
    wait_until(lambda: len(job.snapshot()) == 2 and runner.idle, 10)
    # folded behind a fire that waited (the chaos run's reshard wait): a re-run owed
    runner.fires._fold(Fire(f1))
    runner.fires._fold(Fire(f2))
    with runner.state.lock:
        assert (runner.state.misfire_at, runner.state.misfire_last) == (f1, f2)
    runner.on_trigger(_at(f3))

    def settled() -> bool:
        with runner.state.lock:
            owed = runner.state.misfire_at is not None
        ran = sum(1 for ft, _m, _c in job.snapshot() if ft == f3)
        return ran == 2 and not owed and runner.pending_fires() == 0 and runner.idle

    wait_until(settled, 15, message=lambda: f"not settled: {job.snapshot()}")
    runs = job.snapshot()
    assert all(cov == (f1, f2) for ft, _m, cov in runs if ft == f3), runs
    assert [r for r in runs if r[0] == f1] == [], f"a redundant re-run of F1 started: {runs}"


def test_a_decision_past_its_deadline_makes_no_further_store_round(
    memory_server: MemoryServer, runtimes: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step meets a store error shortly before the fire's deadline: the fire is
    skipped (reason store) without another step once the deadline passed."""
    rt = Runtime(memory_server.store(), shutdown_grace=1)
    rt.add_job(Covers(), JobConfig(name=JOB, cron="0 0 1 1 *", sharding_total_count=2))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    late_steps: list[float] = []
    skips: list[SkipReason] = []
    lock = threading.Lock()

    def failing_step(fire: Fire) -> StepResult:
        now = time.monotonic()
        with lock:
            if fire.deadline and now >= fire.deadline:
                late_steps.append(now - fire.deadline)
        if not fire.deadline:
            fire.deadline = now + 0.05  # the error comes just before the deadline
        raise StoreError("the store did not answer within 2s; the outcome is unknown")

    monkeypatch.setattr(runner.fires.trigger, "step", failing_step)
    on_skip = runner.fires._on_skip

    def seen(job: str, reason: SkipReason, ft: float, detail: str) -> None:
        with lock:
            skips.append(reason)
        on_skip(job, reason, ft, detail)

    monkeypatch.setattr(runner.fires, "_on_skip", seen)
    runner.on_trigger(datetime.now(UTC))
    wait_until(lambda: runner.pending_fires() == 0, 10, message="the fire was never decided")
    with lock:
        assert skips == [SkipReason.STORE]
        assert late_steps == [], f"steps after the deadline: {late_steps}"
