"""``CoordinationStore.relinquish_session`` on every store: the session ends now, its
ephemeral nodes vanish for everyone, and the store goes on with a new session.

The runtime gives its session up this way when its commits go unanswered while the
session lives (runtime/health/graylink.py): others may take over only once its ephemeral
nodes are gone. Each test measures how long the others waited.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shardkeeper.registry.base import ConnectionState, CoordinationStore, Put
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)

StoreFactory = Callable[..., CoordinationStore]


@pytest.fixture(params=["zookeeper", "etcd", "memory"], ids=["zk", "etcd", "mem"])
def backend(request: pytest.FixtureRequest) -> str:
    """Both real backends and the in-memory reference store."""
    return str(request.param)


def test_relinquish_removes_the_ephemerals_at_once_and_a_new_session_follows(
    server: Any, namespace: str, store_factory: StoreFactory
) -> None:
    """The owner's ephemeral node is gone for another client well within one session
    timeout (the server heard the close); the owner gets LOST, then CONNECTED with a new
    session id, and its ephemeral writes belong to the new session."""
    url = server.url(namespace, session_timeout=2, operation_timeout=1.5, connection_timeout=5)
    owner = store_factory(url)
    other = store_factory(url)
    states: list[ConnectionState] = []
    seen = threading.Event()

    def on_state(state: ConnectionState) -> None:
        states.append(state)
        if state is ConnectionState.CONNECTED:
            seen.set()

    owner.add_state_listener(on_state)
    owner.put("/members/me", b"1", ephemeral=True)
    owner.put("/kept", b"persistent")
    old = owner.session_id
    wait_until(lambda: other.exists("/members/me"), 5)

    began = time.monotonic()
    owner.relinquish_session()
    wait_until(lambda: not other.exists("/members/me"), 10, interval=0.01)
    gone_after = time.monotonic() - began
    print(f"ephemeral gone for the others {gone_after:.3f}s after relinquish_session")
    # ended by the close, not by the session timeout running out
    assert gone_after < owner.session_timeout, gone_after

    assert seen.wait(15), f"no new session: states {states}"
    # (ZooKeeper reports SUSPENDED first: its connection is cut to leave the session)
    shown = [s for s in states if s is not ConnectionState.SUSPENDED]
    assert shown[:2] == [ConnectionState.LOST, ConnectionState.CONNECTED], states
    wait_until(lambda: owner.session_id not in ("", old), 5)
    assert other.get("/kept").value == b"persistent"  # type: ignore[union-attr]
    # the store works on the new session; the old ephemeral does not come back
    assert owner.commit([Put("/members/me", b"2", ephemeral=True)]).succeeded
    node = wait_until(lambda: other.get("/members/me"), 5)
    assert node.value == b"2" and node.ephemeral
    owner.close()
    wait_until(lambda: not other.exists("/members/me"), 10)
