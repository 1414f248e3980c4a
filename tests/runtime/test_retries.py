"""Retries with backoff, and the execution timeout, on both stores."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)


class Records:
    """An observer keeping every execution record."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[ExecutionRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.records.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        pass

    def of_fire(self, fire_time: float) -> list[ExecutionRecord]:
        with self.lock:
            return [r for r in self.records if r.fire_time == fire_time]

    def fires(self) -> list[float]:
        with self.lock:
            return sorted({r.fire_time for r in self.records})


class FailsFirst(ShardedJob):
    """Fails the first ``failures`` runs of each fire, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs: Counter[float] = Counter()
        self.lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs[ctx.fire_time.timestamp()] += 1
            n = self.runs[ctx.fire_time.timestamp()]
        if n <= self.failures:
            raise ConnectionError(f"flaky dependency (run {n})")


def _start(
    runtimes: list[Runtime], url: str, job: ShardedJob, cfg: JobConfig, workers: int = 8
) -> tuple[Runtime, Records]:
    seen = Records()
    rt = Runtime(url, shutdown_grace=2, observers=[seen], worker_threads=workers)
    rt.add_job(job, cfg)
    rt.start()
    runtimes.append(rt)
    return rt, seen


def _first_complete_fire(seen: Records, done: Outcome) -> list[ExecutionRecord]:
    for ft in seen.fires():
        records = seen.of_fire(ft)
        if any(r.outcome is done for r in records):
            return sorted(records, key=lambda r: r.attempt)
    return []


def test_a_failed_item_is_retried_with_backoff_until_it_succeeds(
    registry_url: str, runtimes: list[Runtime]
) -> None:
    cfg = JobConfig(name="retry", interval=2, sharding_total_count=1, retries=2, retry_backoff=0.1)
    rt, seen = _start(runtimes, registry_url, FailsFirst(2), cfg)
    wait_until(lambda: _first_complete_fire(seen, Outcome.OK), 20, message="no success")
    records = _first_complete_fire(seen, Outcome.OK)
    assert [(r.attempt, r.outcome) for r in records] == [
        (1, Outcome.FAILED),
        (2, Outcome.FAILED),
        (3, Outcome.OK),
    ]
    assert "flaky dependency (run 1)" in records[0].error_message
    # the backoff doubles: 0.1 s, then 0.2 s
    assert records[1].started - records[0].ended >= 0.09
    assert records[2].started - records[1].ended >= 0.19
    stats = rt.runners["retry"].stats
    assert stats["retries"] >= 2 and stats["failed"] == 0


def test_retries_that_run_out_report_one_failure(
    registry_url: str, runtimes: list[Runtime]
) -> None:
    cfg = JobConfig(name="giveup", interval=2, sharding_total_count=1, retries=1, retry_backoff=0)
    rt, seen = _start(runtimes, registry_url, FailsFirst(100), cfg)

    def two_failed() -> list[ExecutionRecord]:
        for ft in seen.fires():
            records = seen.of_fire(ft)
            if len(records) >= 2:
                return records
        return []

    wait_until(two_failed, 20, message="no fire with two attempts")
    records = sorted(two_failed(), key=lambda r: r.attempt)
    assert [(r.attempt, r.outcome) for r in records] == [(1, Outcome.FAILED), (2, Outcome.FAILED)]
    wait_until(lambda: rt.runners["giveup"].stats["failed"] >= 1, 10)


class Hangs(ShardedJob):
    """Item 0 runs until told to stop (or 20 s); item 1 returns at once."""

    def __init__(self) -> None:
        self.stopped_valid: list[bool] = []
        self.item1_while_item0_ran = threading.Event()
        self.item0_running = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            if self.item0_running.is_set():
                self.item1_while_item0_ran.set()
            return
        self.item0_running.set()
        deadline = time.monotonic() + 20
        try:
            while not ctx.should_stop() and time.monotonic() < deadline:
                time.sleep(0.01)  # the item's own work loop
            self.stopped_valid.append(ctx.is_valid())
            # slow to wind down: its slot is already free, so item 1 runs meanwhile
            self.item1_while_item0_ran.wait(5)
        finally:
            self.item0_running.clear()


def test_a_timed_out_item_is_reported_told_to_stop_and_frees_its_slot(
    registry_url: str, runtimes: list[Runtime]
) -> None:
    job = Hangs()
    cfg = JobConfig(name="slowpoke", interval=3, sharding_total_count=2, execution_timeout=0.5)
    rt, seen = _start(runtimes, registry_url, job, cfg, workers=1)

    def timed_out() -> list[ExecutionRecord]:
        with seen.lock:
            return [r for r in seen.records if r.outcome is Outcome.TIMED_OUT]

    wait_until(timed_out, 20, message="item 0 never timed out")
    record = timed_out()[0]
    assert record.item == 0
    assert 0.4 <= record.duration < 5
    assert record.error_type == "TimeoutError"
    wait_until(lambda: bool(job.stopped_valid), 10, message="the item was not told to stop")
    assert job.stopped_valid[0] is False  # no longer valid once timed out
    assert rt.runners["slowpoke"].stats["timed_out"] >= 1
    # one worker thread: item 1 could only run because the timeout freed the slot
    wait_until(job.item1_while_item0_ran.is_set, 10, message="the slot was not freed")
