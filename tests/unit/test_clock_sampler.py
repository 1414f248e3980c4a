"""registry/clock.py's choice of sampler and the :class:`ServerClock` sampler, on a
MemoryStore that serves the protocol (no server): the store sends the request that
carries its server's time (ZooKeeper: the clock node's write, through its transport),
the sampler times it, creates the clock node on the first sample and maps any failure
to a StoreError."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

from shardkeeper.errors import OperationTimeoutError, StoreError
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.clock import ServerClock, ServerTime, clock_sampler
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.registry.zookeeper import ZooKeeperStore

PATH = "/control/clock/i-1"


class StampingStore(MemoryStore):
    """A MemoryStore whose "server" runs ``ahead`` seconds ahead of this host and
    stamps each write of the clock node (as ZooKeeper's leader stamps its mtime)."""

    def __init__(self, server: MemoryServer, ahead: float = 0.0) -> None:
        super().__init__(server, "clock")
        self.ahead = ahead
        self.asked = 0
        self.fail_with: BaseException | None = None
        self.vanish = False

    def server_time(self, path: str, value: bytes) -> ServerTime | None:
        self.asked += 1
        if self.fail_with is not None:
            raise self.fail_with
        if self.vanish or not self.exists(path):
            return None
        self.put(path, value, ephemeral=True)
        return ServerTime(int((time.time() + self.ahead) * 1000) / 1000, 0.001, "test stamp")


class Forwarding:
    """A store wrapper that forwards what it does not define (as the runtime's commit
    watch does): isinstance against a protocol does not see through it on 3.12+."""

    def __init__(self, inner: CoordinationStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture
def stamping(memory_server: MemoryServer) -> Iterator[StampingStore]:
    store = StampingStore(memory_server, ahead=30.0)
    store.start()
    try:
        yield store
    finally:
        store.close()


def test_a_server_clock_store_is_sampled_and_its_clock_node_made_on_the_first_sample(
    stamping: StampingStore,
) -> None:
    sampler = clock_sampler(stamping)
    assert sampler is not None
    sample = sampler(PATH, b"{}")
    # no node at first: created (ephemeral), then asked again
    assert stamping.asked == 2
    node = stamping.get(PATH)
    assert node is not None and node.ephemeral
    assert sample.source == "test stamp"
    assert sample.offset == pytest.approx(30.0, abs=sample.error + 0.01)
    assert sample.error >= 0.0005  # half the millisecond of resolution at least
    sampler(PATH, b"{}")
    assert stamping.asked == 3  # the node exists now: one request a sample


def test_the_local_clock_given_shows_up_in_the_offset(stamping: StampingStore) -> None:
    sampler = clock_sampler(stamping, wall=lambda: time.time() + 30.0)
    assert sampler is not None
    sample = sampler(PATH, b"{}")
    assert sample.offset == pytest.approx(0.0, abs=sample.error + 0.01)


def test_a_forwarding_wrapper_answers_for_its_store(stamping: StampingStore) -> None:
    sampler = clock_sampler(cast(CoordinationStore, Forwarding(stamping)))
    assert sampler is not None and sampler(PATH, b"{}").source == "test stamp"


def test_failures_are_store_errors(stamping: StampingStore) -> None:
    sampler = clock_sampler(stamping)
    assert sampler is not None
    timeout = OperationTimeoutError("clock sample (set /x): no answer")
    stamping.fail_with = timeout
    with pytest.raises(OperationTimeoutError) as caught:
        sampler(PATH, b"{}")
    assert caught.value is timeout  # a StoreError passes as the store raised it
    stamping.fail_with = RuntimeError("boom")
    with pytest.raises(StoreError, match=r"clock sample \(set /control/clock/i-1\): RuntimeError"):
        sampler(PATH, b"{}")
    stamping.fail_with = None
    stamping.vanish = True
    with pytest.raises(StoreError, match="vanished twice"):
        sampler(PATH, b"{}")


def test_the_memory_store_keeps_its_host_clock_and_a_bare_store_has_none(
    memory_server: MemoryServer,
) -> None:
    store = MemoryStore(memory_server, "plain")
    sampler = clock_sampler(store)
    assert sampler is not None and sampler(PATH, b"{}").source == "memory server"
    assert clock_sampler(cast(CoordinationStore, object())) is None


def _zookeeper_serves_the_clock(store: ZooKeeperStore) -> ServerClock:
    return store  # mypy checks the ZooKeeper store against the protocol


class _Reply:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.timeouts: list[float] = []

    def get(self, timeout: float) -> Any:
        self.timeouts.append(timeout)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _SetOnlyClient:
    """What the transport's ``stamp`` asks of the kazoo client: ``set_async``."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.sets: list[tuple[str, bytes]] = []

    def set_async(self, path: str, value: bytes) -> _Reply:
        self.sets.append((path, value))
        return _Reply(self.outcomes.pop(0))


def test_the_zookeeper_store_stamps_the_clock_node_through_its_transport() -> None:
    """``ZooKeeperStore.server_time`` writes the node through the transport (the one
    part that touches the kazoo client; nothing is counted), reads the leader's mtime
    in milliseconds, says None for a missing node and translates kazoo's errors."""
    from kazoo.exceptions import NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError
    from kazoo.protocol.states import ZnodeStat

    from shardkeeper.registry.url import RegistrySettings

    store = ZooKeeperStore(RegistrySettings.from_url("zk://127.0.0.1:1/ns?operation_timeout=3"))
    stat = ZnodeStat(1, 2, 0, 1_700_000_000_123, 1, 0, 0, 0, 2, 0, 2)
    client = _SetOnlyClient(stat, NoNodeError(), KazooTimeoutError())
    store._transport._client = client  # type: ignore[assignment]
    assert store.server_time(PATH, b"{}") == ServerTime(1_700_000_000.123, 0.001, "zookeeper mtime")
    assert store.server_time(PATH, b"{}") is None
    with pytest.raises(OperationTimeoutError, match="clock sample"):
        store.server_time(PATH, b"{}")
    assert client.sets == [(PATH, b"{}")] * 3
    assert store.round_trips == 0
