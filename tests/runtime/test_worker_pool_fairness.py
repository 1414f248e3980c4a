"""The worker pool gives each job its turn: a job of many items does not starve the
others (600 s ZooKeeper chaos, seed 20261253: a 10,000-item job's 3,300 items per
instance queued ahead of a small job's items, which started 5-6 s after their fire,
and a run-now part behind them came after its bound)."""

from __future__ import annotations

import functools
import threading

import pytest

from shardkeeper.runtime.execute.pool import WorkerPool
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(30)


def _hold(gate: threading.Event) -> None:
    """Occupy the pool's thread until ``gate`` is set (bounded)."""
    gate.wait(10)


def test_a_small_job_does_not_wait_behind_a_large_one() -> None:
    pool = WorkerPool(1, "test-fair")
    gate = threading.Event()
    order: list[str] = []
    lock = threading.Lock()

    def task(name: str) -> None:
        with lock:
            order.append(name)

    try:
        assert pool.submit(lambda: _hold(gate), "blocker")
        wait_until(lambda: pool.busy == 1, 5, message="the blocker never started")
        for n in range(100):
            assert pool.submit(functools.partial(task, f"bulk-{n}"), "bulk")
        assert pool.submit(lambda: task("chaos-0"), "chaos")
        assert pool.submit(lambda: task("chaos-1"), "chaos")
        assert pool.free() == 1 - 1 - 102
        gate.set()
        wait_until(lambda: len(order) == 102, 10, message=lambda: f"ran {len(order)}")
    finally:
        pool.shutdown()
    # each key's own order is kept; the keys take turns
    assert [x for x in order if x.startswith("bulk")] == [f"bulk-{n}" for n in range(100)]
    assert order.index("chaos-0") <= 1 and order.index("chaos-1") <= 3, order[:6]


def test_shutdown_drops_what_is_queued_and_refuses_more() -> None:
    pool = WorkerPool(1, "test-fair-stop")
    gate = threading.Event()
    ran: list[int] = []
    assert pool.submit(lambda: _hold(gate), "a")
    wait_until(lambda: pool.busy == 1, 5, message="the blocker never started")
    assert pool.submit(lambda: ran.append(1), "b")
    pool.shutdown()
    gate.set()
    wait_until(lambda: pool.busy == 0, 5, message="the running task never ended")
    assert not pool.submit(lambda: ran.append(2), "b")
    assert ran == [] and pool.free() == 1
