"""Review 2026-12 finding 9: an absence guard (create + delete of one node in our own
multi) must never be adopted by the ZooKeeper watch as a created node.

No server: the tree watch's own tap (``notified``), drain, ``applied`` and ``landed``
run in the order kazoo's connection thread and the event thread would run them, with
the event loop's posts captured and run by hand, so each interleaving is forced
exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from shardkeeper.registry.base import Check, Create, EventKind, Op, WatchEvent
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.owned import OwnedEphemerals
from shardkeeper.registry.zookeeper.planner import Commits
from shardkeeper.registry.zookeeper.reads import Reads
from shardkeeper.registry.zookeeper.transport import Flight, Transport
from shardkeeper.registry.zookeeper.watch import TreeWatch, Watch

NECESSARY = "/jobs/j/necessary"
MARK = "/jobs/j/running/0"
CREATED = kazoo_private.NODE_CREATED
DELETED = kazoo_private.NODE_DELETED
CHANGED = kazoo_private.NODE_DATA_CHANGED


class _Loop:
    """Stands in for the store's event loop: posts are queued, events recorded."""

    def __init__(self) -> None:
        self.posted: list[Callable[[], None]] = []
        self.emitted: list[WatchEvent] = []

    def post(self, fn: Callable[[], None]) -> None:
        self.posted.append(fn)

    def deliver_watch(self, w: object, event: WatchEvent) -> None:
        self.emitted.append(event)

    def run(self) -> None:
        """Run what was posted (as the event thread would, in order)."""
        while self.posted:
            self.posted.pop(0)()


class _Harness(TreeWatch):
    """The store's tree watch with its event loop captured and its re-reads recorded
    (no server), and the store's commits over the same transport."""

    def __init__(self) -> None:
        self.transport = Transport(RegistrySettings.from_url("zk://127.0.0.1:1/phantom"))
        self.loop = _Loop()
        self.reads = Reads(self.transport)
        owned = OwnedEphemerals()
        super().__init__(
            self.transport.settings,
            self.transport,
            self.reads,
            self.loop,  # type: ignore[arg-type]
            owned,
        )
        self.commits = Commits(self.transport, self.reads, owned, self, None)
        self.reread: list[str] = []
        self.w = Watch(prefix="/", listener=lambda event: None)
        self._watches.append(self.w)

    def _sync(  # type: ignore[override]
        self, w: Watch, paths: list[str], *, full: bool, **kwargs: Any
    ) -> None:
        self.reread.extend(paths)

    def tap(self, etype: int, path: str) -> None:
        """A notification read on kazoo's connection thread."""
        self.notified(etype, path)

    def reply(self, made: dict[str, bytes], zxid: int, paths: Iterable[str] = ()) -> None:
        """The multi's reply read on the connection thread (``made`` adopted), then
        its waiter woken (``paths``, or ``made``'s, no longer in flight)."""
        self.applied(made, [], zxid)
        self.landed(paths or list(made))


def _made(flight: Flight) -> dict[str, bytes]:
    """What a multi in flight makes."""
    return dict(flight.made)


def _flying(flight: Flight) -> list[str]:
    """Every path a multi in flight creates."""
    return list(flight.paths)


def _guarded_start_ops(store: _Harness) -> list[Any]:
    """The multi of a start commit: the absence guard of ``necessary`` (create +
    delete, as planner.py builds it) and the running mark it creates."""
    full = store.transport.full
    return [
        kazoo_private.create_op(full(NECESSARY), b"", [], False),
        kazoo_private.delete_op(full(NECESSARY), -1),
        kazoo_private.create_op(full(MARK), b"mark", [], False),
    ]


@pytest.fixture
def store() -> _Harness:
    return _Harness()


def test_a_guard_pair_is_not_counted_as_made(store: _Harness) -> None:
    """The paths a multi creates and then deletes are not in flight as made by it."""
    flight = store.in_flight(_guarded_start_ops(store))
    assert _made(flight) == {MARK: b"mark"}
    # still in flight: its CREATED is held until the reply, so it costs no read
    assert store.inflight == {NECESSARY: 1, MARK: 1}
    store.landed(_flying(flight))
    assert store.inflight == {}


def test_the_planners_own_start_multi_leaves_the_guard_out(
    store: _Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The multi ``Commits.plan`` builds for a start-shaped commit (an absence check of the
    reshard flag, the running mark) makes only the mark."""
    # the planner reads the parents and the checked paths before it builds the multi:
    # every one of them is there except the flag (and the mark, which it creates)
    monkeypatch.setattr(store.commits, "_missing_ancestors", lambda deadline, path, seen: [])
    monkeypatch.setattr(store.reads, "read_many", lambda deadline, paths: dict.fromkeys(paths))
    ops: list[Op] = [Check(NECESSARY, exists=False), Create(MARK, b"mark")]
    planned = store.commits.plan(store.transport.deadline(), ops, {}, set())
    assert isinstance(planned, tuple), planned
    multi, _origins = planned
    creates = [kazoo_private.created(op) for op in multi]
    assert (store.transport.full(NECESSARY), b"") in creates, "the guard is a create + delete"
    assert _made(store.in_flight(multi)) == {MARK: b"mark"}


def test_a_held_guard_create_whose_delete_is_drained_apart_is_no_phantom(
    store: _Harness,
) -> None:
    """The review's interleaving: the guard's CREATED is held by one drain, its
    DELETED dropped by the next, then the multi's reply. Nothing may be adopted
    (even when the path is counted in flight, as another multi creating it would)."""
    store.inflight[NECESSARY] = 1
    made = {NECESSARY: b""}
    store.tap(CREATED, NECESSARY)
    store.loop.run()  # drain 1: holds it for the multi in flight
    assert store.w.held == {NECESSARY: CREATED}
    store.tap(DELETED, NECESSARY)
    store.loop.run()  # drain 2: the later delete outdates what was held
    store.reply(made, zxid=100)
    store.loop.run()
    assert store.loop.emitted == []
    assert NECESSARY not in store.w.cache
    assert store.w.held == {}
    assert store.w.known == {}


def test_a_start_multi_with_its_guard_drained_apart_adopts_only_the_mark(
    store: _Harness,
) -> None:
    """The whole path: ``in_flight`` of the real multi, the guard's notifications
    drained one by one, then the reply: the mark is adopted, the flag is not."""
    flight = store.in_flight(_guarded_start_ops(store))
    store.tap(CREATED, NECESSARY)
    store.loop.run()
    store.tap(DELETED, NECESSARY)
    store.loop.run()
    store.tap(CREATED, MARK)
    store.loop.run()  # held: the multi in flight creates it
    store.reply(_made(flight), 101, _flying(flight))
    store.loop.run()
    assert [(e.kind, e.path, e.value) for e in store.loop.emitted] == [
        (EventKind.CREATED, MARK, b"mark")
    ]
    assert NECESSARY not in store.w.cache
    assert MARK in store.w.cache
    assert store.reread == []  # neither the guard nor the mark needed a read


def test_a_held_create_outdated_by_a_change_is_read_not_adopted(store: _Harness) -> None:
    """A later CHANGED of a held path is handled as usual (re-read), and the reply no
    longer adopts the value the multi wrote, which is not the latest."""
    flight = store.in_flight(
        [kazoo_private.create_op(store.transport.full(MARK), b"old", [], False)]
    )
    store.tap(CREATED, MARK)
    store.loop.run()
    store.tap(CHANGED, MARK)
    store.loop.run()
    assert store.reread == [MARK]
    store.reply(_made(flight), 102, _flying(flight))
    store.loop.run()
    assert store.loop.emitted == []
    assert store.w.known == {}


def test_the_guard_pair_in_one_drain_stays_silent(store: _Harness) -> None:
    """Both guard notifications coalesced into one drain: no event, no read (as
    before the fix)."""
    flight = store.in_flight(_guarded_start_ops(store))
    store.tap(CREATED, NECESSARY)
    store.tap(DELETED, NECESSARY)
    store.loop.run()
    store.reply(_made(flight), 103, _flying(flight))
    store.loop.run()
    assert store.loop.emitted == []
    assert store.reread == []
    assert NECESSARY not in store.w.cache
