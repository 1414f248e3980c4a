"""The in-memory store server: transactions, sessions and event fan-out.

Events
------
A transaction's changes become watch events (CREATED, CHANGED, DELETED; revision =
the transaction's revision) in one global order, handed to every store of the
namespace under the server lock and delivered on each store's own event thread (a
daemon thread), never while the lock is held: every change, exactly, in store order,
like etcd. A watch gets the events produced after :meth:`MemoryStore.watch`
returned. While a store is suspended its events are held back and delivered after
its RECONNECTED/CONNECTED (nothing is lost by a suspension; use
:meth:`MemoryServer.drop_events` for a lost event).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from shardkeeper.errors import ConfigError, StoreError, StoreUnavailableError
from shardkeeper.registry._events import WatchDelivery
from shardkeeper.registry.base import (
    Check,
    CommitResult,
    ConnectionState,
    Create,
    Delete,
    EventKind,
    GroupsResult,
    Op,
    WatchEvent,
)
from shardkeeper.registry.memory.hooks import (
    _PAUSE_LIMIT,
    EventHold,
    Pause,
    When,
    _check_op,
    _check_prefix,
    _check_when,
    _Drop,
)
from shardkeeper.registry.memory.tree import _guard_ephemerals, _holds, _Rec, _Tree, _under

if TYPE_CHECKING:
    from shardkeeper.registry.memory.store import MemoryStore

__all__ = ["MemoryServer", "named_server"]

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.memory")

#: ZooKeeper's request limit (jute.maxbuffer is 1 MiB - 1); etcd's is higher
_MAX_REQUEST_BYTES = 1_000_000

_T = TypeVar("_T")


@dataclass(frozen=True)
class _EventItem:
    """A watch event in a store's queue; ``seq`` is its place in the server's order."""

    seq: int
    event: WatchEvent


@dataclass(frozen=True)
class _StateItem:
    """A connection-state change in a store's queue, placed in the server's order."""

    seq: int
    state: ConnectionState


_Item = _EventItem | _StateItem


@dataclass(eq=False, kw_only=True)
class _Watch(WatchDelivery):
    """A watch of a store: the loop's delivery state, and where in the server's order
    it began."""

    #: events with a sequence number above this are delivered
    since: int


# ---- the server ---------------------------------------------------------------------------


class MemoryServer:
    """An in-process coordination store server shared by :class:`MemoryStore` clients.

    ``max_request_bytes`` bounds the values of one request (StoreLimitError beyond);
    ``pause_limit`` is the default longest block of a :class:`Pause`. Thread-safe: one
    lock guards everything; listeners never run under it.
    """

    def __init__(
        self,
        name: str = "",
        *,
        max_request_bytes: int = _MAX_REQUEST_BYTES,
        pause_limit: float = _PAUSE_LIMIT,
        groups_apart: bool = False,
    ) -> None:
        if max_request_bytes <= 0:
            raise ConfigError(f"max_request_bytes={max_request_bytes!r} must be > 0")
        if not pause_limit > 0:
            raise ConfigError(f"pause_limit={pause_limit!r} must be seconds > 0")
        self.name = name
        self.max_request_bytes = max_request_bytes
        self.pause_limit = pause_limit
        #: commit_groups checks each group apart, as etcd's nested transactions do
        #: (False: one all-or-nothing commit, as on ZooKeeper)
        self.groups_apart = groups_apart
        self._lock = threading.RLock()
        self._trees: dict[str, _Tree] = {}
        self._revision = 0
        self._seq = 0
        self._next_session = 0x5EED0000
        self._stores: list[MemoryStore] = []
        self._pauses: list[Pause] = []
        self._blocked: list[Pause] = []
        self._drops: list[_Drop] = []
        self._holds: list[EventHold] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryServer({self.name!r}, revision={self._revision})"

    @property
    def revision(self) -> int:
        """The store-wide revision of the last transaction (0 before any)."""
        return self._revision

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called."""
        return self._closed

    def url(self, namespace: str = "default", **options: float | str) -> str:
        """A ``memory://`` registry URL on this server (it must be the one
        :func:`named_server` gives for its name), e.g. ``url("t1", session_timeout=2)``;
        ``options`` become query parameters (see :mod:`shardkeeper.registry.url`)."""
        with _NAMED_LOCK:
            if not self.name or _NAMED.get(self.name) is not self:
                raise ConfigError(
                    f"{self!r} has no URL: only a server from named_server(name) is "
                    "reachable through memory:// URLs"
                )
        query = "&".join(
            f"{k}={v:g}" if isinstance(v, float | int) else f"{k}={v}" for k, v in options.items()
        )
        return f"memory://{self.name}/{namespace.strip('/')}" + (f"?{query}" if query else "")

    def store(self, namespace: str = "default", *, session_timeout: float = 2.0) -> MemoryStore:
        """A new (not started) :class:`MemoryStore` on this server."""
        # imported here: the store module imports this one
        from shardkeeper.registry.memory.store import MemoryStore

        return MemoryStore(self, namespace, session_timeout=session_timeout)

    # -- hooks -------------------------------------------------------------------

    def pause(
        self,
        op: str,
        *,
        when: str = "before",
        path: str | None = None,
        store: MemoryStore | None = None,
        thread: str | None = None,
        limit: float | None = None,
    ) -> Pause:
        """Arm a pause: the next call of ``op`` that matches blocks until released.

        ``when="before"``: before the call is applied (nothing changed yet);
        ``"after"``: applied (other callers see the change, events are out) but not
        yet returned to its caller. The call matches when ``path`` is None or a
        segment-wise prefix of its path (for a commit: of any of its ops' paths),
        ``store`` is None or the store it was made on, and ``thread`` is None or a
        prefix of the calling thread's name. One pause catches one call; arm several
        for several. ``limit`` (default ``pause_limit``) bounds the block.
        """
        pause = Pause(
            self,
            _check_op(op),
            _check_when(when),
            _check_prefix(path, "pause path"),
            store,
            thread,
            self.pause_limit if limit is None else limit,
        )
        with self._lock:
            if self._closed:
                raise StoreUnavailableError(f"{self!r} is shut down")
            self._pauses.append(pause)
        return pause

    def drop_events(
        self, path_prefix: str, count: int = 1, *, namespace: str | None = None
    ) -> None:
        """The next ``count`` watch events at or below ``path_prefix`` (in ``namespace``,
        or any) are never delivered to any store: lost events."""
        prefix = _check_prefix(path_prefix, "drop_events")
        if count < 1:
            raise ConfigError(f"drop_events count={count!r} must be >= 1")
        with self._lock:
            self._drops.append(_Drop(prefix or "/", namespace, count))

    def delay_events(self, path_prefix: str, *, namespace: str | None = None) -> EventHold:
        """Hold every watch event at or below ``path_prefix`` (in ``namespace``, or any)
        until the returned handle is released; their order is kept (events of other
        paths flow meanwhile, so they overtake the held ones)."""
        prefix = _check_prefix(path_prefix, "delay_events") or "/"
        hold = EventHold(self, prefix, namespace)
        with self._lock:
            self._holds.append(hold)
        return hold

    def shutdown(self) -> None:
        """Stop everything: release every pause and hold, close every store (their
        calls then raise StoreUnavailableError), forget the server's name. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stores = list(self._stores)
            pauses = self._pauses + self._blocked
            self._pauses, self._blocked = [], []
            for hold in self._holds:
                hold._events.clear()
                hold.released = True
            self._holds = []
        for pause in pauses:
            pause._released.set()
        for store in stores:
            store.close()
        with _NAMED_LOCK:
            if _NAMED.get(self.name) is self:
                del _NAMED[self.name]

    # -- calls -----------------------------------------------------------------

    def _serve(
        self,
        store: MemoryStore,
        op: str,
        paths: Sequence[str],
        apply: Callable[[_Tree], _T],
    ) -> _T:
        """Run one call of ``store``: hooks, connection state, then ``apply`` under the
        lock (on the namespace's tree)."""
        thread = threading.current_thread().name
        store._count()
        self._hold_at(store, op, paths, thread, "before")
        with self._lock:
            store._require_connected(op)
            # taken only by a call that reached the server (not one refused as
            # disconnected), so a rule armed for the next call really hits it
            failure = store._take_failure(op, paths)
            if failure is not None and not failure.applied:
                failure.raise_it(op, paths)
            result = apply(self._tree(store.namespace))
        self._hold_at(store, op, paths, thread, "after")
        if failure is not None:
            failure.raise_it(op, paths)
        return result

    def _hold_at(
        self, store: MemoryStore, op: str, paths: Sequence[str], thread: str, when: When
    ) -> None:
        with self._lock:
            pause = next(
                (
                    p
                    for p in self._pauses
                    if p.when == when and p._matches(store, op, paths, thread)
                ),
                None,
            )
            if pause is None:
                return
            self._pauses.remove(pause)
            self._blocked.append(pause)
        try:
            pause._block(store)
        finally:
            self._disarm(pause)

    def _disarm(self, pause: Pause) -> None:
        with self._lock:
            if pause in self._pauses:
                self._pauses.remove(pause)
            if pause in self._blocked:
                self._blocked.remove(pause)

    def _release_pauses_of(self, store: MemoryStore) -> None:
        with self._lock:
            mine = [p for p in self._pauses + self._blocked if store in (p.store, p._caller)]
            self._pauses = [p for p in self._pauses if p not in mine]
        for pause in mine:
            pause._released.set()

    def _tree(self, namespace: str) -> _Tree:
        tree = self._trees.get(namespace)
        if tree is None:
            tree = self._trees[namespace] = _Tree()
        return tree

    # -- transactions (under the lock) -------------------------------------------

    def _commit_groups(
        self, store: MemoryStore, tree: _Tree, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]
    ) -> GroupsResult:
        """Evaluate ``fixed`` and each group apart on the state before the commit, then
        apply ``fixed`` and the groups whose checks hold as one commit."""
        failed = self._verdict(tree, fixed)[0]
        if failed is not None:
            return GroupsResult(False, failed_path=failed)
        refused: dict[int, str | None] = {}
        for n, group in enumerate(groups):
            why = self._verdict(tree, group)[0]
            if why is not None:
                refused[n] = why
        kept = [n for n in range(len(groups)) if n not in refused]
        done = self._commit(store, tree, [*fixed, *(op for n in kept for op in groups[n])])
        if not done:  # groups that clash with each other: nothing was applied
            return GroupsResult(False, failed_path=done.failed_path)
        return GroupsResult(True, done.revision, dict.fromkeys(kept, done.revision), refused)

    def _verdict(
        self, tree: _Tree, ops: Sequence[Op]
    ) -> tuple[str | None, dict[str, tuple[bytes, bool] | None], set[str]]:
        """The first condition of ``ops`` found false on ``tree`` (None: all hold),
        their net writes and the paths they create anew."""
        failed: str | None = None
        final: dict[str, tuple[bytes, bool] | None] = {}
        fresh: set[str] = set()
        for op in ops:
            if isinstance(op, Check):
                if failed is None and not _holds(tree, op):
                    failed = op.path
            elif isinstance(op, Delete):
                final[op.path] = None
            elif isinstance(op, Create):
                if op.path in final:
                    if final[op.path] is not None and failed is None:
                        failed = op.path  # created after being written in this commit
                    fresh.add(op.path)
                elif tree.exists(op.path) and failed is None:
                    failed = op.path
                final[op.path] = (op.value, op.ephemeral)
            else:
                if op.path in final and final[op.path] is None:
                    fresh.add(op.path)
                final[op.path] = (op.value, op.ephemeral)
        return failed, final, fresh

    def _commit(self, store: MemoryStore, tree: _Tree, ops: Sequence[Op]) -> CommitResult:
        """Evaluate and apply one commit on ``tree`` (the model of ``tree.py``)."""
        failed, final, fresh = self._verdict(tree, ops)
        _guard_ephemerals(tree, final)
        if failed is not None:
            return CommitResult(False, 0, failed)
        revision = self._revision + 1
        owner = store._session
        if not owner and any(w is not None and w[1] for w in final.values()):
            # only after stop_refreshing(): the session ended without the client
            # knowing, and an ephemeral node needs a live one
            raise StoreError(f"memory store {store.namespace!r}: the session has ended")
        changes: list[WatchEvent] = []
        for path, write in final.items():
            old = tree.nodes.get(path)
            if write is None:
                if tree.remove(path) is not None:
                    changes.append(WatchEvent(EventKind.DELETED, path, None, revision))
                continue
            value, ephemeral = write
            created = revision if old is None or path in fresh else old.created_revision
            tree.set(path, _Rec(value, revision, created, owner if ephemeral else 0))
            kind = EventKind.CHANGED if old is not None else EventKind.CREATED
            changes.append(WatchEvent(kind, path, value, revision))
        self._revision = revision
        self._publish(store.namespace, changes)
        return CommitResult(True, revision)

    def _delete(self, namespace: str, tree: _Tree, paths: Iterable[str]) -> int:
        """Remove the records of ``paths`` (children first) in one transaction."""
        doomed = sorted(
            (p for p in set(paths) if p in tree.nodes),
            key=lambda p: (-p.count("/"), p),
        )
        if not doomed:
            return self._revision
        self._revision += 1
        for p in doomed:
            tree.remove(p)
        self._publish(
            namespace, [WatchEvent(EventKind.DELETED, p, None, self._revision) for p in doomed]
        )
        return self._revision

    def _end_session(self, store: MemoryStore) -> None:
        """The store's session is over: delete its ephemeral nodes (one transaction)."""
        sid = store._session
        if not sid:
            return
        store._session = 0
        tree = self._trees.get(store.namespace)
        if tree is not None:
            self._delete(
                store.namespace, tree, [p for p, r in tree.nodes.items() if r.owner == sid]
            )

    def _new_session(self) -> int:
        self._next_session += 1
        return self._next_session

    # -- events (under the lock) ---------------------------------------------------

    def _publish(self, namespace: str, events: list[WatchEvent]) -> None:
        stores = [s for s in self._stores if s.namespace == namespace]
        for event in events:
            self._seq += 1
            drop = next(
                (
                    d
                    for d in self._drops
                    if d.remaining > 0
                    and (d.namespace is None or d.namespace == namespace)
                    and _under(event.path, d.prefix)
                ),
                None,
            )
            if drop is not None:
                drop.remaining -= 1
                if drop.remaining == 0:
                    self._drops.remove(drop)
                _log.info("memory store: dropped the event %s (drop_events)", event)
                continue
            hold = next((h for h in self._holds if h._takes(namespace, event.path)), None)
            if hold is not None:
                hold._events.append((namespace, _EventItem(self._seq, event)))
                hold._changed.notify_all()
                continue
            item = _EventItem(self._seq, event)
            for s in stores:
                s._enqueue(item)

    def _release_hold(self, hold: EventHold) -> None:
        with self._lock:
            if hold.released:
                return
            hold.released = True
            if hold in self._holds:
                self._holds.remove(hold)
            for namespace, item in hold._events:
                for s in self._stores:
                    if s.namespace == namespace:
                        s._enqueue(item)
            hold._events.clear()
            hold._changed.notify_all()


# ---- process-wide named servers (memory:// URLs) ------------------------------------------

_NAMED: dict[str, MemoryServer] = {}
_NAMED_LOCK = threading.Lock()


def named_server(name: str) -> MemoryServer:
    """The process-wide :class:`MemoryServer` called ``name``, created on first use
    (``memory://NAME/ns`` URLs use it). Its :meth:`~MemoryServer.shutdown` forgets it."""
    with _NAMED_LOCK:
        server = _NAMED.get(name)
        if server is None or server.closed:
            server = _NAMED[name] = MemoryServer(name)
        return server
