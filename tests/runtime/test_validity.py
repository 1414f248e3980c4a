"""Validity of executions against the session's real life (review 2026-12-reliability,
findings 1 and 10), on the MemoryStore: what the freshness clock may count as contact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.registry.base import ConnectionState, WatchEvent
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.liveness import FRESH_FRACTION
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

T = 2.0


@pytest.fixture
def runtime(memory_server: MemoryServer) -> Iterator[tuple[Runtime, MemoryStore]]:
    """A started runtime of one idle job on its own MemoryStore (session timeout T)."""
    store = memory_server.store("validity", session_timeout=T)
    rt = Runtime(store)
    rt.add_job(RecordingJob(), JobConfig(name="idle", cron="0 0 1 1 *", sharding_total_count=1))
    rt.start()
    try:
        yield rt, store
    finally:
        if store.state is ConnectionState.SUSPENDED:
            store.resume()
        rt.stop()


def test_a_reconnect_delivered_late_does_not_stretch_validity(
    runtime: tuple[Runtime, MemoryStore], memory_server: MemoryServer
) -> None:
    """Review finding 10: the store reconnects at t_r and drops again at once, while
    its event thread is busy; RECONNECTED is delivered at t_r + 0.5 T. The session may
    end at t_r + T, so executions must be invalid from t_r + 0.9 T on. 3005b15 counted
    the delivery as contact and stayed fresh until t_r + 1.4 T."""
    rt, store = runtime
    seen: list[ConnectionState] = []
    store.add_state_listener(seen.append)  # after the runtime's: it runs after it
    gate, busy = threading.Event(), threading.Event()

    def slow_listener(event: WatchEvent) -> None:
        if event.value is not None:
            busy.set()
            gate.wait(20)  # the event thread is held here (a slow drain)

    store.watch("/slow", slow_listener)
    admin = memory_server.store("validity")
    admin.start()
    try:
        admin.put("/slow", b"x")
        wait_until(busy.is_set, 5, message="the event thread was never held")
        assert rt.liveness.fresh()
        store.suspend()
        store.resume()
        reconnected = time.monotonic()
        store.suspend()
        wait_until(lambda: time.monotonic() >= reconnected + 0.5 * T, 5)
    finally:
        gate.set()
    wait_until(
        lambda: (
            seen[-3:]
            == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED, ConnectionState.SUSPENDED]
        ),
        5,
        message=f"the state changes were not delivered: {seen}",
    )
    check_at = reconnected + (FRESH_FRACTION + 0.05) * T
    wait_until(lambda: time.monotonic() >= check_at, 5)
    age = rt.liveness.age()
    assert not rt.liveness.fresh(), (
        f"still fresh {time.monotonic() - reconnected:.2f} s after the last reconnection "
        f"(T = {T} s; freshness age {age:.2f} s)"
    )
    admin.close()
