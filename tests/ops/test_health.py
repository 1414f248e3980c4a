"""Health in the operators' view: last results per item, ``failing`` and ``stale``,
on real stores with real runtimes (both backends), and the schedule arithmetic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.coordination.snapshot import JobSnapshot
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.ops.health import assess
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "health"
P = JobPaths(JOB)
INTERVAL = 0.5


class ItemOneRaises(ShardedJob):
    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise KeyError("order 42 is gone")


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


@pytest.fixture
def runtime(registry_url: str) -> Iterator[Runtime]:
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(ItemOneRaises(), JobConfig(name=JOB, interval=INTERVAL, sharding_total_count=3))
    rt.start()
    try:
        yield rt
    finally:
        rt.stop_now()


def test_a_failing_item_shows_within_one_trigger(ops: Operations, runtime: Runtime) -> None:
    started = time.time()
    status = wait_until(
        lambda: s if (s := ops.status().jobs[0]).health == "failing" else None,
        10,
        0.05,
        "status never said failing",
    )
    # the first fire after the start (plus the reshard it waits for) is enough
    assert time.time() - started < 2 * INTERVAL + 5.0
    assert status.failing_items == [1] and status.stale_items == []
    detail = ops.job(JOB)
    assert detail.health == "failing"
    ok0, bad1 = detail.items[0], detail.items[1]
    assert bad1.last_outcome == "failed" and bad1.health == "failing"
    assert bad1.last_error is not None and bad1.last_error.startswith("KeyError: ")
    assert "order 42 is gone" in bad1.last_error
    assert bad1.last_run is not None and bad1.last_ok is None and bad1.failures >= 1
    assert bad1.last_instance == runtime.instance_id
    assert ok0.last_outcome == "ok" and ok0.last_error is None and ok0.health == "ok"
    assert ok0.last_ok is not None and ok0.last_duration is not None
    data = detail.to_dict()["items"][1]
    assert data["last_error"] == bad1.last_error and data["last_run"].endswith("+00:00")


def test_a_job_without_a_live_instance_is_no_instance(ops: Operations, runtime: Runtime) -> None:
    """Not "stale": that is the word of an item that has not run for too long
    (newcomer review N17); a job nobody runs has a name of its own."""
    wait_until(lambda: ops.job(JOB).items[0].last_run, 10, 0.05, "no result")
    runtime.stop()
    status = ops.status().jobs[0]
    assert status.health == "no-instance"
    assert status.stale_items == []
    assert status.summary.next_fire is None
    assert status.summary.next_fire_reason == "no instance"
    detail = ops.job(JOB)
    assert detail.next_fire is None and detail.next_fire_reason == "no instance"


NEVER = "0 0 1 1 *"  # fires once a year, 1 January


def test_an_item_that_missed_two_fires_is_stale(
    ops: Operations, registry_url: str, store: CoordinationStore
) -> None:
    """A yearly job whose item 0 last ran three years ago missed two fires: stale;
    item 1 last ran at the latest 1 January: ok (the cron's own gaps are the bar)."""
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(ItemOneRaises(), JobConfig(name=JOB, cron=NEVER, sharding_total_count=2))
    with rt:
        # the leader assigns the items at the first fire (a year away): run it now
        ops.trigger(JOB)
        wait_until(lambda: ops.job(JOB).items[1].last_run, 10, 0.05, "no trigger")
        this_year = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC).timestamp()
        long_ago = datetime(datetime.now(UTC).year - 3, 1, 1, tzinfo=UTC).timestamp()
        store.put(P.result(0), ItemResult("ok", long_ago, long_ago, long_ago + 1, "x").to_bytes())
        store.put(
            P.result(1), ItemResult("ok", this_year, this_year, this_year + 1, "x").to_bytes()
        )
        status = ops.status().jobs[0]
        assert status.health == "stale" and status.stale_items == [0]
        items = ops.job(JOB).items
        assert [i.health for i in items] == ["stale", "ok"]
        # an operator who disables the item clears it from the job's health
        ops.disable_item(JOB, 0)
        assert ops.status().jobs[0].health == "ok"


def _state(config: JobConfig, results: dict[int, ItemResult], at: float) -> JobSnapshot:
    state = JobSnapshot(JOB, config=config, has_config=True, instances=["i"])
    state.assignment = Assignment(
        total=config.sharding_total_count,
        owners=dict.fromkeys(range(config.sharding_total_count), "i"),
        generation=1,
        leader="i",
        at=at,
    )
    state.results.update(results)
    return state


def test_interval_staleness_is_two_intervals_plus_grace() -> None:
    cfg = JobConfig(name=JOB, interval=10, sharding_total_count=3)
    now = 1_000_000.0  # a multiple of 10: interval fires are anchored at the epoch
    ran = {
        0: ItemResult("ok", now - 30, now - 30, now - 29, "i"),  # fires at -20, -10: missed
        1: ItemResult("ok", now - 10, now - 10, now - 9, "i"),  # next fires at 0, +10
        2: ItemResult("failed", now - 10, now - 10, now - 9, "i", error="x"),
    }
    health = assess(_state(cfg, ran, now - 100), now=now, grace=3.0)
    assert health.items == {0: "stale", 1: "ok", 2: "failing"}
    # within the grace a late fire is not yet stale
    assert assess(_state(cfg, ran, now - 100), now=now - 8.0, grace=3.0).items[0] == "ok"
    # an item with no result yet counts from its assignment
    fresh = assess(_state(cfg, {}, now - 5), now=now, grace=3.0)
    assert fresh.stale == []
    old = assess(_state(cfg, {}, now - 60), now=now, grace=3.0)
    assert old.stale == [0, 1, 2]
