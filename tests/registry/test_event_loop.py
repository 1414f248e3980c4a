"""The shared event thread of the stores (registry/_events.py) and the small protocols
next to the contract (registry/counting.py, registry/faults.py).

The loop is tested on its own first (ordering, states, filters, bounded waits, the
idle retry), then through every store (ZooKeeper, etcd and the in-memory reference,
which all run on it): one event thread per store, the one every listener runs on, and
the capabilities the benchmarks and tests check with ``isinstance``. Every wait is on
a condition with a deadline.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from shardkeeper.errors import OperationTimeoutError
from shardkeeper.registry import ConnectionState, CoordinationStore, EventKind, WatchEvent
from shardkeeper.registry._events import CallTimeout, EventLoop, Retry, WatchDelivery
from shardkeeper.registry.counting import CountsRequests, request_count
from shardkeeper.registry.faults import SessionFaults
from shardkeeper.testing.faults import wait_until

_log = logging.getLogger("test.events")


@pytest.fixture
def loop() -> Iterator[EventLoop]:
    """A started loop (state LOST), stopped after the test."""
    lp = EventLoop("test-events", ConnectionState.LOST, log=_log)
    lp.start()
    yield lp
    lp.stop(5)


def _event(path: str, n: int = 0) -> WatchEvent:
    return WatchEvent(EventKind.CHANGED, path, b"%d" % n, n)


def _hold(gate: threading.Event) -> Callable[[], None]:
    """A task that holds the loop's thread until ``gate`` is set (5 s at most)."""

    def task() -> None:
        gate.wait(5)

    return task


# ---- the loop on its own ------------------------------------------------------------


def test_everything_posted_runs_on_one_thread_in_the_order_posted(loop: EventLoop) -> None:
    """Tasks, states and watch events posted from several threads come out in each
    poster's order, interleaved as they were queued, all on the loop's one thread."""
    seen: list[tuple[str, int]] = []
    threads: set[threading.Thread] = set()
    watch = WatchDelivery(prefix="/", listener=lambda e: seen.append(("w", e.revision)))
    loop.add_state_listener(lambda s: seen.append(("s", 0)))

    def record(tag: str, n: int) -> None:
        seen.append((tag, n))
        threads.add(threading.current_thread())

    def poster(tag: str) -> None:
        for n in range(200):
            loop.post(functools.partial(record, tag, n))

    posters = [threading.Thread(target=poster, args=(t,)) for t in ("a", "b")]
    for p in posters:
        p.start()
    for n in range(50):
        loop.post_watch(watch, _event("/x", n))
    loop.post_state(ConnectionState.CONNECTED)
    for p in posters:
        p.join(10)
    wait_until(lambda: len(seen) == 451, 10, message=lambda: f"{len(seen)} delivered")
    for tag in ("a", "b", "w"):
        assert [n for t, n in seen if t == tag] == list(range(200 if tag != "w" else 50))
    assert seen.index(("s", 0)) > seen.index(("w", 49)), "the state came after the events"
    assert len(threads) == 1 and threading.current_thread() not in threads


def test_a_posted_state_is_recorded_at_once_and_delivered_only_when_it_changed(
    loop: EventLoop,
) -> None:
    got: list[ConnectionState] = []
    gate = threading.Event()
    loop.post(_hold(gate))  # hold the thread: nothing is delivered yet
    sub = loop.add_state_listener(got.append)
    assert loop.post_state(ConnectionState.CONNECTED)
    assert loop.state is ConnectionState.CONNECTED, "recorded before the listeners hear it"
    assert not loop.post_state(ConnectionState.CONNECTED), "no change, nothing queued"
    assert loop.post_state(ConnectionState.SUSPENDED)
    assert loop.post_state(ConnectionState.RECONNECTED)
    gate.set()
    wait_until(lambda: len(got) == 3, 5, message=lambda: f"states: {got}")
    assert got == [
        ConnectionState.CONNECTED,
        ConnectionState.SUSPENDED,
        ConnectionState.RECONNECTED,
    ]
    sub.cancel()
    loop.post_state(ConnectionState.LOST)
    done = threading.Event()
    loop.post(done.set)
    assert done.wait(5)
    assert got[-1] is ConnectionState.RECONNECTED, "a cancelled listener gets nothing"
    loop.record(ConnectionState.CONNECTED)
    assert loop.state is ConnectionState.CONNECTED


def test_failing_listeners_and_filters_do_not_stop_the_thread(loop: EventLoop) -> None:
    """A listener that raises is logged and the others still run; a cancelled watch
    gets nothing; an excluded path is not delivered; a filter that raises excludes
    nothing."""
    got: list[str] = []

    def boom(event: WatchEvent) -> None:
        raise RuntimeError("listener failure")

    def bad_filter(path: str) -> bool:
        raise ValueError("filter failure")

    def bad_state_listener(state: ConnectionState) -> None:
        raise RuntimeError("state listener failure")

    loop.add_state_listener(bad_state_listener)
    loop.add_state_listener(lambda s: got.append(s.value))
    failing = WatchDelivery(prefix="/", listener=boom)
    kept = WatchDelivery(
        prefix="/", listener=lambda e: got.append(e.path), exclude=lambda p: p == "/skip"
    )
    gone = WatchDelivery(prefix="/", listener=lambda e: got.append("gone " + e.path))
    gone.cancelled = True
    broken = WatchDelivery(
        prefix="/", listener=lambda e: got.append("broken " + e.path), exclude=bad_filter
    )
    for path in ("/a", "/skip", "/skip/below", "/b"):
        for w in (failing, kept, gone, broken):
            loop.post_watch(w, _event(path))
    loop.post_state(ConnectionState.CONNECTED)
    wait_until(lambda: "connected" in got, 5, message=lambda: f"delivered: {got}")
    assert got == [
        "/a",
        "broken /a",
        "broken /skip",
        "broken /skip/below",
        "/b",
        "broken /b",
        "connected",
    ]


def test_call_runs_on_the_thread_and_its_wait_is_bounded(loop: EventLoop) -> None:
    assert loop.call(lambda: threading.current_thread().name, 5) == "test-events"

    def times_out() -> None:
        raise OperationTimeoutError("from fn")

    with pytest.raises(OperationTimeoutError, match="from fn"):
        # the function's own timeout is its error, not the loop's
        loop.call(times_out, 5)
    # from the thread itself (a listener setting up a watch) it runs at once
    nested: list[str] = []
    loop.post(lambda: nested.append(loop.call(lambda: "inline", 0.01)))
    wait_until(lambda: nested == ["inline"], 5)
    gate = threading.Event()
    loop.post(_hold(gate))
    with pytest.raises(CallTimeout, match=r"not run within 0\.2s"):
        loop.call(lambda: None, 0.2)
    gate.set()
    assert loop.call(lambda: 7, 5) == 7


def test_stop_runs_what_was_posted_and_never_joins_from_the_thread() -> None:
    lp = EventLoop("test-stop", ConnectionState.LOST, log=_log)
    ran: list[int] = []
    lp.start()
    lp.post(lambda: ran.append(1))

    # a listener that closes its store stops the loop from its own thread: the stop
    # returns at once (no join of itself, which would wait its 30 s or fail)
    def stop_from_the_thread() -> None:
        lp.stop(30)
        ran.append(2)

    lp.post(stop_from_the_thread)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "test-stop"], 5)
    assert ran == [1, 2]
    lp.stop(5)  # idempotent once ended


def test_the_retry_runs_while_pending_even_when_nothing_is_posted() -> None:
    runs: list[float] = []
    pending = threading.Event()
    pending.set()
    lp = EventLoop(
        "test-retry",
        ConnectionState.LOST,
        log=_log,
        retry=Retry(pending.is_set, lambda: runs.append(1), interval=0.02),
    )
    lp.start()
    try:
        wait_until(lambda: len(runs) >= 3, 5, message=lambda: f"{len(runs)} retries")
        pending.clear()
        for _ in range(2):  # the turn under way may still retry once; the next one not
            settled = threading.Event()
            lp.post(settled.set)
            assert settled.wait(5)
        count = len(runs)
        done = threading.Event()
        lp.post(done.set)
        assert done.wait(5)
        assert len(runs) == count, "no retry once nothing is pending"
    finally:
        lp.stop(5)


# ---- through the stores ---------------------------------------------------------------


@pytest.fixture(params=["zookeeper", "etcd", "memory"], ids=["zk", "etcd", "mem"])
def backend(request: pytest.FixtureRequest) -> str:
    """Every store of the project."""
    return str(request.param)


def test_the_contract_is_coordination_and_the_stores_add_the_capabilities(
    store: CoordinationStore,
) -> None:
    """round_trips is not part of CoordinationStore; every store counts its requests
    and injects session faults through the small protocols."""
    assert not hasattr(CoordinationStore, "round_trips")
    assert isinstance(store, CountsRequests)
    assert isinstance(store, SessionFaults)
    before = request_count(store)
    store.put("/counted", b"1")
    assert request_count(store) > before
    with pytest.raises(TypeError, match="object does not count its requests"):
        request_count(object())


def test_one_event_thread_delivers_every_listener(store: CoordinationStore) -> None:
    """States and the events of several watches all arrive on the same thread, the
    store's one event thread, whatever the number of watches."""
    on: set[str] = set()
    seen: list[str] = []

    def listener(event: WatchEvent) -> None:
        on.add(threading.current_thread().name)
        seen.append(event.path)

    for n in range(5):
        store.watch(f"/w{n}", listener)
    store.add_state_listener(lambda s: on.add(threading.current_thread().name))
    for n in range(5):
        store.put(f"/w{n}/x", b"1")
    wait_until(lambda: len(set(seen)) == 5, 15, message=lambda: f"events: {seen}")
    assert isinstance(store, SessionFaults)
    store.drop_connection()
    wait_until(
        lambda: store.state is ConnectionState.RECONNECTED, 15, message=lambda: str(store.state)
    )
    store.put("/w0/y", b"2")
    wait_until(lambda: "/w0/y" in seen, 15, message=lambda: f"events: {seen}")
    assert len(on) == 1, f"listeners ran on {on}"
    name = on.pop()
    assert "-events[" in name and store.namespace.replace("/", ".") in name
    assert [t.name for t in threading.enumerate()].count(name) == 1
