"""Scheduled fires are decided ahead of their due time (FIRE_LEAD) and their items
start at it, never before; an early decision does not turn a fire into a misfire."""

from __future__ import annotations

import threading
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.execute.batch import FIRE_LEAD
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)


class Starts(ShardedJob):
    """Records, per execution, when it started against its fire time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[tuple[float, float]] = []  # (fire time, start - fire time)

    def execute(self, ctx: ShardingContext) -> None:
        now = time.time()
        with self.lock:
            self.starts.append((ctx.fire_time.timestamp(), now - ctx.fire_time.timestamp()))

    def snapshot(self) -> list[tuple[float, float]]:
        with self.lock:
            return list(self.starts)


def test_items_start_at_their_fire_time_never_before(
    registry_url: str, runtimes: list[Runtime]
) -> None:
    """An interval job's items start at or after their fire time, although the decision
    and the start commit happen up to FIRE_LEAD earlier."""
    job = Starts()
    cfg = JobConfig.parse(name="lead", interval=0.3, sharding_total_count=2)
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(job, cfg)
    rt.start()
    runtimes.append(rt)
    wait_until(lambda: len({ft for ft, _ in job.snapshot()}) >= 6, timeout=30)
    starts = job.snapshot()
    # never before the fire time (to the clocks' precision: the start waits on the
    # monotonic clock for a wall-clock fire time)
    assert min(late for _, late in starts) >= -0.001, starts
    # decided and committed ahead of the due time, the items start right at it
    assert any(late < FIRE_LEAD for _, late in starts), starts


class EndsJustBeforeTheNextFire(ShardedJob):
    """Runs until FIRE_LEAD / 2 before the next fire of an every-0.5-s job (at module
    level: a job class defined in a function is refused, no other instance could
    import it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[float, bool]] = []

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs.append((ctx.fire_time.timestamp(), ctx.is_misfire))
        # run until FIRE_LEAD / 2 before the next fire: past the early decision
        end = ctx.fire_time.timestamp() + 0.5 - FIRE_LEAD / 2
        while time.time() < end and not ctx.should_stop():
            time.sleep(0.002)  # the item's own work, not synchronisation


def test_a_fire_decided_early_waits_for_the_earlier_batch_instead_of_a_misfire(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Items of the previous fire that end within the lead, before the next fire is
    due, do not turn that fire into a misfire (it waits until it is due to decide).
    On the in-memory reference store: its commits take microseconds, so an item's end
    and its completion commit fall where the test puts them."""

    job = EndsJustBeforeTheNextFire()
    cfg = JobConfig.parse(name="edge", interval=0.5, sharding_total_count=1, misfire=True)
    rt = Runtime(memory_server.store(), shutdown_grace=2)
    rt.add_job(job, cfg)
    rt.start()
    runtimes.append(rt)

    def fires() -> int:
        with job.lock:
            return len(job.runs)

    wait_until(lambda: fires() >= 6, timeout=30)
    with job.lock:
        runs = list(job.runs)
    # each fire ran once, as a regular fire (a misfire re-run would repeat a fire time)
    times = [ft for ft, _ in runs]
    assert len(times) == len(set(times)), runs
    # deciding at the early delivery made every fire a misfire; a loaded machine may
    # still end an item late now and then
    assert sum(1 for _, misfire in runs if misfire) <= len(runs) // 3, runs


def test_a_hard_stop_ends_items_still_waiting_for_their_due_time(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """Items committed ahead of their fire's due time and waiting for it are handed
    over by a hard stop, which ends them as fenced (they never run), instead of being
    left on a timer that the stop drops."""
    job = Starts()
    cfg = JobConfig.parse(name="halt", interval=0.5, sharding_total_count=2)
    rt = Runtime(memory_server.store(), shutdown_grace=2)
    rt.add_job(job, cfg)
    rt.start()
    runtimes.append(rt)
    runner = rt.runners["halt"]
    waiting = runner.batches.waiting_for_due_time
    fires = wait_until(waiting, timeout=10, interval=0.001, message="no batch waited")
    rt.stop_now()
    assert waiting() == []  # handed over at the stop, not left on a dropped timer
    # the waiting batch's items never ran: they ended as fenced, before their time
    assert not [ft for ft, _ in job.snapshot() if ft in fires], (fires, job.snapshot())
