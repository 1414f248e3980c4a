"""The step hooks of the reference in-memory store (registry/memory/).

The contract itself is checked by test_contract.py (``[mem]`` ids); these tests check
the hooks deterministic tests are built on: pauses before and after a call, injected
failures (applied or not), lost and delayed events, suspension and session expiry,
and the ``memory://`` URLs. Every wait is on a condition or a thread with a deadline.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shardkeeper.errors import (
    ConfigError,
    InvalidRegistryURLError,
    OperationTimeoutError,
    StoreError,
    StoreUnavailableError,
)
from shardkeeper.registry import (
    Check,
    ConnectionState,
    EventKind,
    Put,
    WatchEvent,
    open_store,
    parse_registry_url,
)
from shardkeeper.registry.faults import SessionFaults
from shardkeeper.registry.memory import MemoryServer, MemoryStore, named_server
from shardkeeper.testing.faults import expire_session, wait_until

StoreMaker = Callable[..., MemoryStore]


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    """A fresh server for one test, shut down after it."""
    srv = MemoryServer("hooks")
    yield srv
    srv.shutdown()


@pytest.fixture
def make(server: MemoryServer) -> Iterator[StoreMaker]:
    """``make(namespace="ns", session_timeout=2.0)`` -> a started store, closed after."""
    stores: list[MemoryStore] = []

    def factory(namespace: str = "ns", session_timeout: float = 2.0) -> MemoryStore:
        store = MemoryStore(server, namespace, session_timeout=session_timeout)
        store.start()
        stores.append(store)
        return store

    yield factory
    for s in stores:
        s.close()


class Events:
    """Collects what a listener receives."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)

    def snapshot(self) -> list[Any]:
        with self.lock:
            return list(self.items)

    def paths(self) -> list[str]:
        return [e.path for e in self.snapshot()]


class Call:
    """A store call run on its own thread (named ``name``); result or error kept."""

    def __init__(self, fn: Callable[[], Any], name: str = "caller") -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 10) -> Call:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the call did not return"
        return self

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


# ---- pauses ---------------------------------------------------------------------------------


def test_pause_before_a_commit_hides_it_from_others(server: MemoryServer, make: StoreMaker) -> None:
    """Paused before: nothing is applied yet; release lets the commit through."""
    a, b = make(), make()
    pause = server.pause("commit", when="before", store=a)
    call = Call(lambda: a.commit([Put("/x", b"1")]))
    assert pause.wait_reached(5)
    assert pause.reached_by == "caller"
    assert b.get("/x") is None
    assert not call.done
    pause.release()
    call.join()
    assert call.error is None and call.result
    assert b.get("/x").value == b"1"  # type: ignore[union-attr]


def test_pause_after_a_commit_shows_it_before_the_caller_returns(
    server: MemoryServer, make: StoreMaker
) -> None:
    """Paused after: others see the change and its event; the caller has no reply yet."""
    a, b = make(), make()
    events = Events()
    b.watch("/x", events)
    pause = server.pause("commit", when="after", path="/x")
    call = Call(lambda: a.commit([Put("/x", b"1")]))
    assert pause.wait_reached(5)
    assert b.get("/x").value == b"1"  # type: ignore[union-attr]
    wait_until(lambda: events.paths() == ["/x"], 5, message="event of the paused commit")
    assert not call.done and call.result is None
    pause.release()
    call.join()
    assert call.result is not None and call.result.succeeded is True


def test_a_pause_replays_a_lost_update_race(server: MemoryServer, make: StoreMaker) -> None:
    """Two read-modify-write callers: the one paused before its commit loses to the
    other one, deterministically (its version check fails, nothing of it applied)."""
    a, b = make(), make()
    seen = a.put("/counter", b"0")
    pause = server.pause("commit", store=a)
    slow = Call(lambda: a.commit([Check("/counter", version=seen.version), Put("/counter", b"a")]))
    assert pause.wait_reached(5)
    assert b.commit([Check("/counter", version=seen.version), Put("/counter", b"b")])
    pause.release()
    slow.join()
    assert not slow.result
    assert slow.result.failed_path == "/counter"
    assert b.get("/counter").value == b"b"  # type: ignore[union-attr]


def test_pause_matches_op_path_segments_and_thread(server: MemoryServer, make: StoreMaker) -> None:
    """Only the call that matches op, path (segment-wise prefix) and thread blocks."""
    a = make()
    pause = server.pause("put", path="/jobs/a", thread="worker-")
    a.put("/jobs/ab", b"not /jobs/a")  # another segment
    a.get("/jobs/a")  # another operation
    a.put("/jobs/a/x", b"wrong thread")  # the main thread
    assert not pause.reached
    call = Call(lambda: a.put("/jobs/a/y", b"1"), name="worker-7")
    assert pause.wait_reached(5)
    assert pause.reached_by == "worker-7"
    pause.release()
    call.join()
    assert call.error is None
    assert a.children("/jobs/a") == ["x", "y"]


def test_a_commit_matches_a_pause_by_any_of_its_paths(
    server: MemoryServer, make: StoreMaker
) -> None:
    a = make()
    pause = server.pause("commit", path="/b")
    call = Call(lambda: a.commit([Put("/a", b"1"), Put("/b/c", b"2")]))
    assert pause.wait_reached(5)
    pause.release()
    assert call.join().result


def test_a_forgotten_pause_releases_itself(server: MemoryServer, make: StoreMaker) -> None:
    """A pause never released lets its call go after its limit: no test hangs on it."""
    a = make()
    pause = server.pause("get", limit=0.3)
    began = time.monotonic()
    assert a.get("/nothing") is None
    elapsed = time.monotonic() - began
    assert pause.reached and pause.released
    assert 0.3 <= elapsed < 5, f"blocked {elapsed:.2f} s with a 0.3 s limit"


def test_close_and_shutdown_release_pauses(server: MemoryServer, make: StoreMaker) -> None:
    """close() frees a call blocked on its store (which then fails as closed);
    shutdown() frees every pause."""
    a, b = make(), make()
    mine = server.pause("get", store=a)
    blocked = Call(lambda: a.get("/x"))
    assert mine.wait_reached(5)
    a.close()
    blocked.join()
    assert isinstance(blocked.error, StoreUnavailableError)
    other = server.pause("get", store=b)
    blocked = Call(lambda: b.get("/x"))
    assert other.wait_reached(5)
    server.shutdown()
    blocked.join()
    assert isinstance(blocked.error, StoreUnavailableError)


def test_a_pause_released_before_it_is_reached_is_disarmed(
    server: MemoryServer, make: StoreMaker
) -> None:
    a = make()
    pause = server.pause("get")
    pause.release()
    assert a.get("/x") is None
    assert not pause.reached


# ---- failures -------------------------------------------------------------------------------


def test_fail_next_not_applied(make: StoreMaker) -> None:
    """The default: an OperationTimeoutError and nothing applied; the next call works."""
    a = make()
    a.fail_next("put")
    with pytest.raises(OperationTimeoutError, match="injected"):
        a.put("/x", b"1")
    assert a.get("/x") is None
    assert a.put("/x", b"2").value == b"2"


def test_fail_next_applied_is_really_applied(make: StoreMaker) -> None:
    """applied=True: the commit is applied (others see it, the event goes out) and the
    caller still gets the error: a lost reply."""
    a, observer = make(), make()
    events = Events()
    observer.watch("/c", events)
    a.fail_next("commit", error=StoreUnavailableError, applied=True)
    with pytest.raises(StoreUnavailableError):
        a.commit([Put("/c/1", b"x")])
    assert observer.get("/c/1").value == b"x"  # type: ignore[union-attr]
    wait_until(lambda: events.paths() == ["/c/1"], 5, message="event of the applied commit")
    assert a.commit([Check("/c/1", value=b"x")])


def test_fail_next_by_path_count_and_instance(make: StoreMaker) -> None:
    """``path`` and ``count`` choose the calls; an error instance is raised as is."""
    a = make()
    boom = StoreError("boom")
    a.fail_next("create", path="/a", count=2, error=boom)
    assert a.create("/b", b"") is not None
    for _ in range(2):
        with pytest.raises(StoreError) as caught:
            a.create("/a/x", b"")
        assert caught.value is boom
    assert a.create("/a/x", b"") is not None


def test_fail_next_only_hits_calls_that_reach_the_server(make: StoreMaker) -> None:
    """A call refused as disconnected does not use the armed failure up."""
    a = make()
    a.fail_next("get")
    a.suspend()
    with pytest.raises(StoreUnavailableError, match="disconnected"):
        a.get("/x")
    a.resume()
    with pytest.raises(OperationTimeoutError):
        a.get("/x")
    assert a.get("/x") is None


# ---- events ---------------------------------------------------------------------------------


def test_drop_events_loses_exactly_one_event(server: MemoryServer, make: StoreMaker) -> None:
    a, writer = make(), make()
    events = Events()
    a.watch("/", events)
    server.drop_events("/d")
    writer.put("/d/1", b"1")
    writer.put("/d/2", b"2")
    writer.put("/other", b"o")
    writer.put("/d/3", b"3")
    wait_until(lambda: "/d/3" in events.paths(), 5, message="events after the lost one")
    assert events.paths() == ["/d/2", "/other", "/d/3"]
    assert a.get("/d/1").value == b"1"  # type: ignore[union-attr]


def test_delay_events_holds_them_in_order_until_released(
    server: MemoryServer, make: StoreMaker
) -> None:
    a, writer = make(), make()
    events = Events()
    a.watch("/", events)
    hold = server.delay_events("/h")
    writer.put("/h/1", b"1")
    writer.put("/h/1", b"2")
    writer.delete("/h/1")
    writer.put("/o", b"o")
    wait_until(lambda: "/o" in events.paths(), 5, message="an event outside the hold")
    assert hold.wait_held(3, 5)
    assert events.paths() == ["/o"]
    hold.release()
    wait_until(lambda: len(events.snapshot()) == 4, 5, message="held events after release")
    held = [(e.kind, e.value) for e in events.snapshot()[1:]]
    assert held == [
        (EventKind.CREATED, b"1"),
        (EventKind.CHANGED, b"2"),
        (EventKind.DELETED, None),
    ]
    writer.put("/h/2", b"after")
    wait_until(lambda: "/h/2" in events.paths(), 5, message="no more holding after release")


def test_events_come_after_the_watch_and_in_store_order(make: StoreMaker) -> None:
    """Every change, exactly, in global order; revisions strictly increase."""
    a, writer = make(), make()
    writer.put("/before", b"")
    events = Events()
    a.watch("/", events)
    for i in range(50):
        writer.put(f"/k{i % 7}", str(i).encode())
    writer.delete("/k0")
    wait_until(lambda: len(events.snapshot()) == 51, 5, message="51 events")
    got: list[WatchEvent] = events.snapshot()
    assert [e.path for e in got[:50]] == [f"/k{i % 7}" for i in range(50)]
    assert got[-1].kind is EventKind.DELETED
    assert all(x.revision < y.revision for x, y in itertools.pairwise(got))


# ---- sessions and connection ----------------------------------------------------------------


def test_suspend_beyond_the_session_timeout_expires_the_session(make: StoreMaker) -> None:
    """No contact for longer than the session timeout: the server deletes the
    ephemerals (others see it while the store is still cut off), the store gets LOST;
    on resume CONNECTED with a new session id."""
    owner, observer = make(session_timeout=0.5), make()
    states, events = Events(), Events()
    owner.add_state_listener(states)
    owner.put("/live/me", b"1", ephemeral=True)
    observer.watch("/live", events)
    old = owner.session_id
    suspended_at = time.monotonic()
    owner.suspend()
    with pytest.raises(StoreUnavailableError):
        owner.get("/live/me")
    wait_until(
        lambda: (EventKind.DELETED, "/live/me") in [(e.kind, e.path) for e in events.snapshot()],
        5,
        message="ephemeral deleted after the session timeout",
    )
    elapsed = time.monotonic() - suspended_at
    assert 0.5 <= elapsed <= 1.5, f"expired {elapsed:.2f} s after the drop (timeout 0.5 s)"
    wait_until(lambda: ConnectionState.LOST in states.snapshot(), 5, message="LOST")
    assert owner.state is ConnectionState.LOST
    owner.resume()
    wait_until(lambda: states.snapshot()[-1] is ConnectionState.CONNECTED, 5, message="CONNECTED")
    assert states.snapshot() == [
        ConnectionState.SUSPENDED,
        ConnectionState.LOST,
        ConnectionState.CONNECTED,
    ]
    assert owner.session_id != old
    assert owner.get("/live/me") is None


def test_a_short_suspension_keeps_the_session_and_delivers_events_after(
    make: StoreMaker,
) -> None:
    """Events of the suspension are delivered after RECONNECTED, none lost."""
    a, writer = make(session_timeout=5), make()
    states, events = Events(), Events()
    a.add_state_listener(states)
    a.put("/e", b"", ephemeral=True)
    a.watch("/w", events)
    session = a.session_id
    a.suspend()
    writer.put("/w/1", b"during")
    a.resume()
    wait_until(lambda: events.paths() == ["/w/1"], 5, message="the event of the suspension")
    assert states.snapshot() == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED]
    assert a.session_id == session
    assert writer.get("/e").ephemeral is True  # type: ignore[union-attr]


def test_expire_deletes_ephemerals_and_gives_a_new_session(make: StoreMaker) -> None:
    owner, observer = make(), make()
    states, events = Events(), Events()
    owner.add_state_listener(states)
    owner.put("/eph", b"1", ephemeral=True)
    owner.put("/keep", b"1")
    observer.watch("/", events)
    old = owner.session_id
    assert expire_session(owner) == old  # through the SessionFaults protocol
    assert owner.session_id != old
    assert observer.get("/eph") is None
    assert observer.get("/keep") is not None
    wait_until(lambda: events.paths() == ["/eph"], 5, message="DELETED seen by the watcher")
    wait_until(lambda: len(states.snapshot()) == 2, 5, message="LOST and CONNECTED")
    assert states.snapshot() == [ConnectionState.LOST, ConnectionState.CONNECTED]
    assert owner.state is ConnectionState.CONNECTED
    assert owner.put("/eph", b"2", ephemeral=True).ephemeral is True


def test_memory_store_implements_session_faults(make: StoreMaker) -> None:
    store = make()
    assert isinstance(store, SessionFaults)
    states = Events()
    store.add_state_listener(states)
    store.drop_connection()
    wait_until(lambda: len(states.snapshot()) == 2, 5, message="states of a drop")
    assert states.snapshot() == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED]


# ---- arguments and URLs ---------------------------------------------------------------------


def test_bad_hook_arguments_name_the_value(server: MemoryServer, make: StoreMaker) -> None:
    store = make()
    with pytest.raises(ConfigError, match="'watch'"):
        server.pause("watch")
    with pytest.raises(ConfigError, match="'during'"):
        server.pause("get", when="during")
    with pytest.raises(ConfigError, match="invalid node path"):
        server.drop_events("no-slash")
    with pytest.raises(ConfigError, match="StoreError"):
        store.fail_next("get", error=ValueError)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="namespace"):
        MemoryStore(server, "bad ns")


def test_memory_urls_share_the_named_server() -> None:
    """``memory://NAME/ns`` stores of one name see each other's data; shutdown
    forgets the name; credentials are refused."""
    name = f"url-test-{time.monotonic_ns()}"
    settings = parse_registry_url(f"memory://{name}/app?session_timeout=3")
    assert (settings.backend, settings.namespace, settings.session_timeout) == ("memory", "app", 3)
    try:
        with open_store(f"memory://{name}/app") as a, open_store(settings) as b:
            assert isinstance(a, MemoryStore) and a.server is named_server(name)
            a.put("/k", b"v")
            assert b.get("/k").value == b"v"  # type: ignore[union-attr]
            assert b.session_timeout == 3
        assert named_server(name).url("app", session_timeout=2) == (
            f"memory://{name}/app?session_timeout=2"
        )
    finally:
        named_server(name).shutdown()
    with open_store(f"memory://{name}/app") as fresh:
        assert fresh.get("/k") is None  # a new server after the shutdown
    named_server(name).shutdown()
    with pytest.raises(InvalidRegistryURLError, match="no credentials"):
        parse_registry_url(f"memory://user:pw@{name}/app")
    with pytest.raises(InvalidRegistryURLError, match="memory server name"):
        parse_registry_url("memory://a,b/app")
