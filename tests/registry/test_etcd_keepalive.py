"""etcd validity comes from the lease's own keep-alives (review 2026-12-reliability,
finding 1), with no server: the store's gRPC stubs are replaced by scripted ones and
time by a controlled clock, so the interleaving of keep-alives and probes is exact.

The shape of the fault is the review's: every keep-alive attempt times out while reads
are answered (a slow link against asymmetric deadlines, a stalled lease stream, GIL
starvation), and the housekeeping probes go on meanwhile.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import etcd3
import grpc
import pytest

from shardkeeper.registry.base import ConnectionState
from shardkeeper.registry.etcd import EtcdStore
from shardkeeper.registry.etcd import session as etcd_session
from shardkeeper.registry.etcd import transport as etcd_transport
from shardkeeper.registry.etcd.watch import Watch
from shardkeeper.registry.url import parse_registry_url
from shardkeeper.runtime import housekeeping
from shardkeeper.runtime.fire.skiplog import SkipLog
from shardkeeper.runtime.health.liveness import FRESH_FRACTION, Liveness
from shardkeeper.runtime.housekeeping import Housekeeper
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

TTL = 4
START = 1000.0


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class DeadlineExceeded(grpc.RpcError):  # type: ignore[misc]  # grpc has no type stubs here
    """What gRPC raises when a call's deadline passes."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "Deadline Exceeded"


class LeaseStub:
    """LeaseKeepAlive answers ``ttl`` after ``delay`` seconds of the clock, or, when
    ``delay`` exceeds the attempt's deadline, waits the deadline and times out.
    ``meanwhile`` runs halfway through every attempt (what other threads do while the
    session thread waits)."""

    def __init__(self, clock: Clock | None) -> None:
        self.clock = clock
        self.delay = 0.0
        self.ttl = TTL
        self.timeouts: list[float] = []
        self.meanwhile: Callable[[], None] = lambda: None

    def LeaseKeepAlive(self, requests: Any, timeout: float, metadata: Any = None) -> Any:
        self.timeouts.append(timeout)
        waited = min(self.delay, timeout)
        if self.clock is not None:
            self.clock.advance(waited / 2)
            self.meanwhile()
            self.clock.advance(waited / 2)
        if self.delay > timeout:
            raise DeadlineExceeded()
        return iter([types.SimpleNamespace(TTL=self.ttl)])


class KVStub:
    """Every read is answered at once: the node exists."""

    def __init__(self) -> None:
        self.reads = 0

    def Txn(self, request: Any, timeout: float, metadata: Any = None) -> Any:
        self.reads += 1
        found = types.SimpleNamespace(response_range=types.SimpleNamespace(kvs=[object()]))
        return types.SimpleNamespace(responses=[found, found])


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The controlled clock, as the session's and the housekeeping's time."""
    c = Clock()
    fake_time = types.SimpleNamespace(monotonic=c, sleep=time.sleep)
    monkeypatch.setattr(etcd_session, "time", fake_time)
    # (3005b15's housekeeping read time.monotonic itself; today it asks the liveness)
    monkeypatch.setattr(housekeeping, "time", fake_time, raising=False)
    return c


def offline_store(
    monkeypatch: pytest.MonkeyPatch,
    lease: LeaseStub,
    kv: KVStub,
    *,
    members: int = 3,
    ttl: int = TTL,
) -> EtcdStore:
    """An EtcdStore whose requests go to the scripted stubs: started, CONNECTED, with a
    granted lease and ``members`` endpoints (none of them is ever dialled)."""
    ports = range(23791, 23791 + members)
    hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
    url = f"etcd://{hosts}/ka?session_timeout={ttl}&operation_timeout={min(ttl, 3)}"
    settings = parse_registry_url(url)
    store = EtcdStore(settings)
    store._transport.attach(
        etcd3.MultiEndpointEtcd3Client(
            endpoints=[etcd3.Endpoint("127.0.0.1", p, secure=False, time_retry=0.5) for p in ports],
            timeout=3,
            failover=True,
        )
    )
    monkeypatch.setitem(etcd_transport.STUB_CLASSES, "leasestub", lambda channel: lease)
    monkeypatch.setitem(etcd_transport.STUB_CLASSES, "kvstub", lambda channel: kv)
    store._session.adopt(0x51, ttl)
    store._started = True
    store._loop.post_state(ConnectionState.CONNECTED)  # (the loop's thread is not needed)
    return store


def housekeeper_of(store: EtcdStore, liveness: Liveness) -> Housekeeper:
    return Housekeeper(
        store,
        liveness,
        "i-1",
        runners=list,
        started=threading.Event(),
        stopped=threading.Event(),
        stopping=lambda: False,
        reput_instance=lambda: None,
        session_id=lambda: store.session_id,
        skips=SkipLog(),
    )


@pytest.fixture
def stubs(clock: Clock) -> Iterator[tuple[LeaseStub, KVStub]]:
    yield LeaseStub(clock), KVStub()


def test_validity_ends_one_ttl_after_the_last_answered_keepalive_though_probes_answer(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, stubs: tuple[LeaseStub, KVStub]
) -> None:
    """Review finding 1, sketch (b): the keep-alive answered at START is the last one;
    every later attempt times out while the housekeeping probes (reads) are answered.
    The lease may end at START + TTL, so ctx.is_valid() must be false from
    START + FRESH_FRACTION * TTL on, whatever the probes say (3005b15 counted the
    probes: still fresh at START + 1.5 TTL)."""
    lease, kv = stubs
    store = offline_store(monkeypatch, lease, kv)
    liveness = Liveness(store, clock=clock)
    keeper = housekeeper_of(store, liveness)
    samples: list[tuple[float, bool]] = []

    def tick() -> None:
        keeper.tick(1)
        samples.append((clock.now, liveness.fresh()))

    store._session.step()  # answered: the lease lives until START + TTL at least
    tick()
    lease.delay = 60.0  # from now on no keep-alive is answered in time
    lease.meanwhile = tick  # the probes go on while the session thread waits
    clock.advance(TTL / 3)
    while clock.now < START + 2 * TTL:
        store._session.step()
        tick()
        clock.advance(0.2)  # the session thread's retry delay

    # one probe answered after the good keep-alive, one during each failing attempt
    # (none once SUSPENDED: the housekeeping does not probe a suspended store)
    assert kv.reads >= 1 + 3, "the probes were not answered: the test proves nothing"
    deadline = START + FRESH_FRACTION * TTL
    late = [(round(t - START, 2), fresh) for t, fresh in samples if t >= deadline]
    assert late and not any(fresh for _, fresh in late), (
        f"still valid after the last answered keep-alive + {FRESH_FRACTION} TTL "
        f"(seconds after it, fresh): {late}"
    )
    early = [fresh for t, fresh in samples if t < deadline]
    assert early and all(early), "valid before the lease could have ended"


def test_every_member_is_tried_before_the_lease_may_have_run_out(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, stubs: tuple[LeaseStub, KVStub]
) -> None:
    """The attempts of one refresh share what is left of the lease: with 3 members
    and none answering, SUSPENDED is reported by START + TTL (3005b15 waited TTL/4
    on each: SUSPENDED at START + 1.08 TTL, after the lease could have ended)."""
    lease, kv = stubs
    store = offline_store(monkeypatch, lease, kv)
    store._session.step()
    lease.delay = 60.0
    clock.advance(TTL / 3)
    store._session.step()
    assert len(lease.timeouts) == 1 + 3, "each member once"
    assert store.state is ConnectionState.SUSPENDED
    assert clock.now <= START + TTL + 1e-9, (
        f"SUSPENDED only {clock.now - START:.2f} s after the last answered keep-alive "
        f"(the lease lives {TTL} s)"
    )


def test_a_slow_keepalive_that_fits_in_the_lease_renews_it(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, stubs: tuple[LeaseStub, KVStub]
) -> None:
    """With one member the refresh may wait for all that is left of the lease: an
    answer after 1.5 s renews a 4 s lease (3005b15 gave up after TTL/4 = 1 s, and the
    session went SUSPENDED on a link that still kept it alive)."""
    lease, kv = stubs
    store = offline_store(monkeypatch, lease, kv, members=1)
    store._session.step()
    clock.advance(TTL / 3)
    lease.delay = 1.5
    sent = clock.now
    store._session.step()
    assert store.state is ConnectionState.CONNECTED
    assert store.last_renewal() == sent


def test_lost_ends_the_validity_at_once(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, stubs: tuple[LeaseStub, KVStub]
) -> None:
    """A keep-alive that finds the lease gone: nothing the session owned is valid any
    more, and the new lease's validity counts from its grant's send time."""
    lease, kv = stubs
    store = offline_store(monkeypatch, lease, kv)
    liveness = Liveness(store, clock=clock)
    store._session.step()
    assert liveness.fresh()
    lease.ttl = -1
    clock.advance(TTL / 3)
    store._session.step()
    # a tuple: an `is` here would narrow store.state for mypy past the next step
    assert (store.state, liveness.fresh()) == (ConnectionState.LOST, False)

    def grant(request: Any, timeout: float, metadata: Any = None) -> Any:
        clock.advance(0.1)
        return types.SimpleNamespace(ID=0x52, TTL=TTL)

    lease.LeaseGrant = grant  # type: ignore[attr-defined]
    sent = clock.now
    store._session.step()
    assert store.state is ConnectionState.CONNECTED
    assert store.last_renewal() == sent and liveness.fresh()


def test_keepalives_go_on_while_a_watch_restore_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch whose re-creation hangs (etcd3's add_callback waits up to the operation
    timeout on a member that holds it) does not hold up the keep-alive: on 3005b15 the
    session thread restored watches itself, and no keep-alive went out meanwhile."""
    lease, kv = LeaseStub(None), KVStub()
    store = offline_store(monkeypatch, lease, kv, ttl=1)  # refreshes every 1/3 s
    hanging, release = threading.Event(), threading.Event()

    def establish(w: Watch, *, counted: bool = False) -> bool:
        hanging.set()
        release.wait(20)
        return True

    watches = store._watches
    monkeypatch.setattr(watches, "_establish", establish)
    w = Watch(prefix="/w", listener=lambda event: None, key=b"/ka/w", end=b"/ka/w0")
    watches._watches.add(w)
    watches._pending.add(w)
    # the watch part's recovery thread and the session thread, as start() runs them
    watches.start("test-etcd-watches")
    store._session.start("test-etcd-session")
    thread = store._session._thread
    assert thread is not None
    try:
        wait_until(hanging.is_set, 5, message="the pending watch was never restored")
        before = len(lease.timeouts)
        wait_until(
            lambda: len(lease.timeouts) >= before + 3,
            5,
            message="no keep-alive while a watch restore hangs",
        )
        assert hanging.is_set() and not release.is_set()
    finally:
        release.set()
        store._session.stop(10)
        watches.stop(10)
    assert not thread.is_alive()
