"""A stop closes the store only after the housekeeping tick in flight returned.

CI found it in the README tour: Ctrl-C while housekeeping's liveness probe was on
the wire closed the etcd channel under it, and the probe failed with the client's
own ``ValueError: Cannot invoke RPC on closed channel!``, printing a traceback on a
clean exit. Here the probe is held on the wire while the stop runs: the store must
not be closed before the probe is answered, and no tick may fail."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import instance_path
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)


class Idle(ShardedJob):
    """Does nothing: the test is about the stop."""

    def execute(self, ctx: ShardingContext) -> None:
        return None


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def test_a_probe_on_the_wire_returns_before_the_store_closes(
    server: MemoryServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = server.store(session_timeout=3.0)
    rt = Runtime(store, shutdown_grace=0.2)
    rt.add_job(Idle(), JobConfig(name="idle", interval=60, sharding_total_count=1))
    probing = threading.Event()  # a probe is on the wire, held
    release = threading.Event()
    closed = threading.Event()
    hold = threading.Event()  # set once the stop began: hold the next probe
    real_exists, real_close = store.exists, store.close
    probe_path = instance_path(rt.instance_id)

    def exists(path: str) -> bool:
        if path == probe_path and hold.is_set() and not probing.is_set():
            probing.set()
            assert release.wait(20), "the test never released the probe"
            if closed.is_set():  # what etcd's client does on a closed channel
                raise ValueError("Cannot invoke RPC on closed channel!")
        return real_exists(path)

    def close() -> None:
        closed.set()
        real_close()

    store.exists = exists  # type: ignore[method-assign]
    store.close = close  # type: ignore[method-assign]
    rt.start()
    hold.set()
    wait_until(probing.is_set, 15, message="no liveness probe after start")
    stopper = threading.Thread(target=rt.stop, name="test-stop")
    with caplog.at_level(logging.ERROR, logger="shardkeeper.runtime.housekeeping"):
        stopper.start()
        # the stop reaches its teardown and waits there for the probe
        wait_until(lambda: rt.stopping, 10, message="stop never began")
        stopper.join(1.0)  # would have closed the store by now without the wait
        assert not closed.is_set(), "the store was closed under a probe on the wire"
        release.set()
        stopper.join(20)
    assert not stopper.is_alive()
    assert closed.is_set()
    assert not [r for r in caplog.records if "tick failed" in r.getMessage()]
