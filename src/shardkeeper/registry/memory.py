"""The reference in-memory :class:`~shardkeeper.registry.base.CoordinationStore`, with step hooks.

A :class:`MemoryServer` is a store server living in the process: one tree of nodes per
namespace, one store-wide revision counter, sessions. Several :class:`MemoryStore`
objects on one server behave like several processes on one real store: each has its
own session, its own ephemeral nodes, its own event thread and connection state.

It implements the whole contract of ``base.py`` and passes
``tests/registry/test_contract.py`` next to the real backends. It is a reference and a
test seam (deterministic tests replay races with the hooks below), never a replacement
for the real stores in multi-process, chaos or CLI tests.

Model (the stricter choice wherever the real backends differ)
-------------------------------------------------------------
* Parents are implicit as in etcd: a *pure parent* has no node of its own;
  ``exists`` is true, ``children`` lists it, ``get``/``get_tree`` return it as a
  synthetic ``Node(path, b"", version=0, revision=0, created_revision=0)`` and it
  produces no watch event. It vanishes with its last descendant.
* Every write call (``put``, ``create``, ``delete``, ``commit``, a session's end) is
  one transaction with one new store-wide revision. ``Node.version`` and
  ``Node.revision`` are the revision of the node's last write (so a version never
  repeats, even across a delete and re-create); ``created_revision`` is the revision
  of its creation (a Delete and a Create of one path in one commit make a new
  incarnation).
* Checks of a commit see the state before the commit. ``Check(version/value/
  created_revision)`` look at the node's own record: a pure parent never passes them.
  A ``Create`` after a write of the same path in one commit fails the commit.
* An ephemeral node cannot have children: a write below one, or making a node with
  children ephemeral, raises StoreError and applies nothing. ``delete(path,
  recursive=False)`` of a node with children raises StoreError (as ZooKeeper does);
  a ``Delete`` inside a commit removes only the node's own record.
* Values: at most ``max_request_bytes`` (default 1,000,000, ZooKeeper's limit) of
  values per request, else StoreLimitError; at most 128 operations per commit.

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

Sessions
--------
:meth:`MemoryStore.start` opens a session (``session_id``: hex). It ends on
:meth:`MemoryStore.close` (ephemerals deleted at once, no state event), on
:meth:`MemoryStore.expire`, or when the store stays suspended longer than its
``session_timeout`` (a server-side timer, as a real server's): its ephemeral nodes
are deleted in one transaction (watchers see DELETED events) and the store gets LOST;
it gets CONNECTED with a new session id as soon as it is connected again.

Step hooks
----------
* :meth:`MemoryServer.pause`: block the next matching call before or after it is
  applied, until :meth:`Pause.release` (or the pause's time limit, or close/shutdown).
* :meth:`MemoryStore.fail_next`: the next matching call(s) raise a StoreError, before
  or after being applied (a lost reply: unknown outcome).
* :meth:`MemoryStore.suspend` / :meth:`MemoryStore.resume`: a connection drop and its
  end; :meth:`MemoryStore.expire`: the session expires now.
* :meth:`MemoryServer.drop_events` / :meth:`MemoryServer.delay_events`: lose or hold
  watch events under a prefix.

Hooks match calls by operation name (``get``, ``exists``, ``children``, ``get_tree``,
``put``, ``create``, ``delete``, ``commit``) and by path *prefix*, segment-wise:
``/jobs/a`` matches ``/jobs/a`` and ``/jobs/a/x``, never ``/jobs/ab`` (for a commit,
any of its operations' paths). Every public call of a store counts as one round trip.

URLs
----
``memory://NAME/namespace?session_timeout=S`` (see ``registry/url.py``) opens a store
on the process-wide server called NAME (created on first use, forgotten by its
:meth:`MemoryServer.shutdown`): :func:`named_server`.
"""

from __future__ import annotations

import functools
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from shardkeeper.errors import (
    ConfigError,
    OperationTimeoutError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry.base import (
    Check,
    CommitResult,
    ConnectionState,
    CoordinationStore,
    Create,
    Delete,
    EventKind,
    Node,
    Op,
    PathFilter,
    Put,
    StateListener,
    Subscription,
    WatchEvent,
    WatchListener,
    check_path,
    is_excluded,
)

__all__ = [
    "OPERATIONS",
    "EventHold",
    "MemoryServer",
    "MemoryStore",
    "Pause",
    "named_server",
]

_log = logging.getLogger(__name__)

#: the store calls the hooks can match
OPERATIONS = ("get", "exists", "children", "get_tree", "put", "create", "delete", "commit")
#: ZooKeeper's request limit (jute.maxbuffer is 1 MiB - 1); etcd's is higher
_MAX_REQUEST_BYTES = 1_000_000
#: how long a pause blocks at most unless told otherwise (a forgotten release
#: must not hang a test)
_PAUSE_LIMIT = 30.0
_NS_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]+$")

_T = TypeVar("_T")
When = Literal["before", "after"]
ErrorSpec = type[StoreError] | StoreError


def _under(path: str, prefix: str) -> bool:
    """Segment-wise prefix: ``/a`` covers ``/a`` and ``/a/x``, not ``/ab``."""
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _ancestors(path: str) -> list[str]:
    """Strict ancestors of ``path``, nearest first, ``/`` last (none for ``/``)."""
    out: list[str] = []
    while path != "/":
        path = _parent(path)
        out.append(path)
    return out


def _check_op(op: str) -> str:
    if op not in OPERATIONS:
        raise ConfigError(f"unknown store operation {op!r}; valid ones are {', '.join(OPERATIONS)}")
    return op


def _check_when(when: str) -> When:
    if when not in ("before", "after"):
        raise ConfigError(f"when={when!r} is not valid; use 'before' or 'after'")
    return "before" if when == "before" else "after"


def _check_prefix(path: str | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        return check_path(path)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None


# ---- the data ---------------------------------------------------------------------------


@dataclass
class _Rec:
    """A node's own record (pure parents have none)."""

    value: bytes
    revision: int
    created_revision: int
    owner: int  # session id of an ephemeral node, 0 for a persistent one


class _Tree:
    """One namespace: records by path plus the index that makes parents implicit."""

    def __init__(self) -> None:
        self.nodes: dict[str, _Rec] = {}
        #: path -> number of records at or below it (present iff > 0)
        self.weight: dict[str, int] = {}
        #: path -> names of its children that are present
        self.kids: dict[str, set[str]] = {}

    def exists(self, path: str) -> bool:
        return self.weight.get(path, 0) > 0

    def node(self, path: str) -> Node | None:
        rec = self.nodes.get(path)
        if rec is not None:
            return Node(
                path, rec.value, rec.revision, rec.revision, rec.created_revision, rec.owner != 0
            )
        if self.exists(path):
            return Node(path, b"", 0, 0, 0)
        return None

    def children(self, path: str) -> list[str]:
        return sorted(self.kids.get(path, ()))

    def subtree(self, path: str) -> list[str]:
        """Every present path at or below ``path``, parents before children."""
        if not self.exists(path):
            return []
        out: list[str] = []
        todo = [path]
        while todo:
            p = todo.pop()
            out.append(p)
            base = "" if p == "/" else p
            todo.extend(f"{base}/{name}" for name in sorted(self.kids.get(p, ()), reverse=True))
        return out

    def has_descendants(self, path: str) -> bool:
        return self.weight.get(path, 0) > (1 if path in self.nodes else 0)

    def set(self, path: str, rec: _Rec) -> None:
        if path not in self.nodes:
            self._count(path, +1)
        self.nodes[path] = rec

    def remove(self, path: str) -> _Rec | None:
        rec = self.nodes.pop(path, None)
        if rec is not None:
            self._count(path, -1)
        return rec

    def _count(self, path: str, delta: int) -> None:
        for p in [path, *_ancestors(path)]:
            w = self.weight.get(p, 0) + delta
            if w > 0:
                self.weight[p] = w
            else:
                self.weight.pop(p, None)
            if p == "/":
                continue
            # a path appears in its parent's listing with its first record and
            # leaves it with its last (delta is +1 or -1)
            if delta > 0 and w == 1:
                self.kids.setdefault(_parent(p), set()).add(p.rsplit("/", 1)[1])
            elif w == 0:
                names = self.kids.get(_parent(p), set())
                names.discard(p.rsplit("/", 1)[1])
                if not names:
                    self.kids.pop(_parent(p), None)


# ---- hooks ---------------------------------------------------------------------------


class Pause:
    """A handle on one armed pause (:meth:`MemoryServer.pause`).

    The first call that matches blocks in it (``reached`` turns true) until
    :meth:`release`, until the pause's ``limit`` has passed (it then releases itself
    and logs a warning, so a forgotten release cannot hang a test), or until the
    store or server closes. A pause released before it was reached is disarmed. Also
    a context manager that releases on exit.
    """

    def __init__(
        self,
        server: MemoryServer,
        op: str,
        when: When,
        path: str | None,
        store: MemoryStore | None,
        thread: str | None,
        limit: float,
    ) -> None:
        self.op = op
        self.when: When = when
        self.path = path
        self.store = store
        self.thread = thread
        self.limit = limit
        #: the name of the thread whose call reached the pause (None before)
        self.reached_by: str | None = None
        self._server = server
        self._caller: MemoryStore | None = None
        self._reached = threading.Event()
        self._released = threading.Event()

    def __repr__(self) -> str:
        state = "released" if self.released else "reached" if self.reached else "armed"
        return f"Pause({self.op!r}, when={self.when!r}, path={self.path!r}, {state})"

    @property
    def reached(self) -> bool:
        """Whether a call has reached the pause (it may have been released since)."""
        return self._reached.is_set()

    @property
    def released(self) -> bool:
        """Whether the pause was released (or disarmed)."""
        return self._released.is_set()

    def wait_reached(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a call to reach the pause; True if one has."""
        return self._reached.wait(timeout)

    def release(self) -> None:
        """Let the blocked call go on (or disarm the pause if none reached it yet)."""
        self._released.set()
        self._server._disarm(self)

    def __enter__(self) -> Pause:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _matches(self, store: MemoryStore, op: str, paths: Sequence[str], thread: str) -> bool:
        if self.op != op or self.released:
            return False
        if self.store is not None and self.store is not store:
            return False
        if self.thread is not None and not thread.startswith(self.thread):
            return False
        return self.path is None or any(_under(p, self.path) for p in paths)

    def _block(self, caller: MemoryStore) -> None:
        self._caller = caller
        self.reached_by = threading.current_thread().name
        self._reached.set()
        if not self._released.wait(self.limit):
            _log.warning("%r was never released: it released itself after %g s", self, self.limit)
            self._released.set()


class EventHold:
    """A handle on held watch events (:meth:`MemoryServer.delay_events`).

    Events under the prefix are kept, in their order, until :meth:`release`, which
    hands them to the stores and stops holding. Also a context manager.
    """

    def __init__(self, server: MemoryServer, prefix: str, namespace: str | None) -> None:
        self.prefix = prefix
        self.namespace = namespace
        self._server = server
        self._events: list[tuple[str, _EventItem]] = []
        self._changed = threading.Condition(server._lock)
        self.released = False

    @property
    def held(self) -> int:
        """How many events are held now."""
        with self._server._lock:
            return len(self._events)

    def wait_held(self, count: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until at least ``count`` events are held."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self._events) >= count, timeout)

    def release(self) -> None:
        """Deliver the held events (in their order) and stop holding; idempotent."""
        self._server._release_hold(self)

    def __enter__(self) -> EventHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _takes(self, namespace: str, path: str) -> bool:
        return (self.namespace is None or self.namespace == namespace) and _under(path, self.prefix)


@dataclass
class _Drop:
    prefix: str
    namespace: str | None
    remaining: int


@dataclass
class _Failure:
    op: str
    error: ErrorSpec
    applied: bool
    path: str | None
    remaining: int

    def matches(self, op: str, paths: Sequence[str]) -> bool:
        return (
            self.op == op
            and self.remaining > 0
            and (self.path is None or any(_under(p, self.path) for p in paths))
        )

    def raise_it(self, op: str, paths: Sequence[str]) -> None:
        if isinstance(self.error, StoreError):
            raise self.error
        where = f" {paths[0]}" if len(paths) == 1 else f" of {len(paths)} operations"
        outcome = "applied, reply lost" if self.applied else "not applied"
        raise self.error(f"{op}{where}: injected failure ({outcome})")


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


@dataclass(eq=False)
class _Watch:
    prefix: str
    listener: WatchListener
    exclude: PathFilter | None
    #: events with a sequence number above this are delivered
    since: int
    cancelled: bool = False


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
    ) -> None:
        if max_request_bytes <= 0:
            raise ConfigError(f"max_request_bytes={max_request_bytes!r} must be > 0")
        if not pause_limit > 0:
            raise ConfigError(f"pause_limit={pause_limit!r} must be seconds > 0")
        self.name = name
        self.max_request_bytes = max_request_bytes
        self.pause_limit = pause_limit
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

    def _commit(self, store: MemoryStore, tree: _Tree, ops: Sequence[Op]) -> CommitResult:
        """Evaluate and apply one commit on ``tree`` (see the module docstring)."""
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
        _guard_ephemerals(tree, final)
        if failed is not None:
            return CommitResult(False, 0, failed)
        revision = self._revision + 1
        owner = store._session
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


def _holds(tree: _Tree, check: Check) -> bool:
    """Whether ``check`` is true on ``tree`` now."""
    if check.exists is not None:
        return tree.exists(check.path) is check.exists
    rec = tree.nodes.get(check.path)
    if rec is None:
        return False
    if check.version is not None:
        return rec.revision == check.version
    if check.value is not None:
        return rec.value == check.value
    return rec.created_revision == check.created_revision


def _guard_ephemerals(tree: _Tree, final: dict[str, tuple[bytes, bool] | None]) -> None:
    """Raise StoreError when the commit would leave an ephemeral node with children."""

    def ephemeral_after(path: str) -> bool:
        if path in final:
            write = final[path]
            return write is not None and write[1]
        rec = tree.nodes.get(path)
        return rec is not None and rec.owner != 0

    for path, write in final.items():
        if write is None:
            continue
        for ancestor in _ancestors(path):
            if ephemeral_after(ancestor):
                raise StoreError(
                    f"cannot write {path!r}: {ancestor!r} is ephemeral and an ephemeral "
                    "node cannot have children"
                )
        if write[1] and tree.has_descendants(path):
            below = [p for p in tree.subtree(path)[1:] if p in tree.nodes]
            if any(final.get(p, (b"", False)) is not None for p in below):
                raise StoreError(
                    f"cannot make {path!r} ephemeral: it has children and an ephemeral "
                    "node cannot have children"
                )


# ---- the store ---------------------------------------------------------------------------


class MemoryStore(CoordinationStore):
    """A client of a :class:`MemoryServer`: the whole CoordinationStore contract plus
    the fault hooks (:meth:`fail_next`, :meth:`suspend`, :meth:`resume`,
    :meth:`expire`; :class:`~shardkeeper.registry.faults.SessionFaults`).

    Construct (no threads), :meth:`start` (session, event thread), use, :meth:`close`.
    """

    def __init__(
        self, server: MemoryServer, namespace: str = "default", *, session_timeout: float = 2.0
    ) -> None:
        if not isinstance(server, MemoryServer):
            raise ConfigError(f"MemoryStore needs a MemoryServer, got {server!r}")
        segments = namespace.strip("/").split("/")
        if not namespace.strip("/") or not all(
            _NS_SEGMENT.match(s) and s not in (".", "..") for s in segments
        ):
            raise ConfigError(
                f"invalid namespace {namespace!r}: use segments of letters, digits, '_', '.', "
                "'-' separated by '/'"
            )
        if not isinstance(session_timeout, int | float) or not session_timeout > 0:
            raise ConfigError(f"session_timeout={session_timeout!r} must be seconds > 0")
        self.namespace = namespace.strip("/")
        self._server = server
        self._timeout = float(session_timeout)
        self._session = 0
        self._sid_shown = 0
        self._state = ConnectionState.LOST
        self._started = False
        self._closed = False
        self._suspended = False
        self._backlog: list[_Item] = []
        self._expiry: threading.Timer | None = None
        self._lock = threading.Lock()
        self._round_trips = 0
        self._failures: list[_Failure] = []
        self._watches: list[_Watch] = []
        #: id -> (listener, the server's sequence number when it was added)
        self._state_listeners: dict[int, tuple[StateListener, int]] = {}
        self._next_listener = 0
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return (
            f"MemoryStore({self._server.name!r}, {self.namespace!r}, "
            f"session={self.session_id or '-'}, {self._state.name})"
        )

    # -- properties --------------------------------------------------------------

    @property
    def server(self) -> MemoryServer:
        """The server this store talks to."""
        return self._server

    @property
    def session_id(self) -> str:
        """The current session id in hex (``''`` before :meth:`start`; kept after the
        session ended until a new one replaces it)."""
        return f"{self._sid_shown:x}" if self._sid_shown else ""

    @property
    def state(self) -> ConnectionState:
        """The latest connection state (set when it changes; listeners get it on the
        event thread, in order with the watch events)."""
        return self._state

    @property
    def session_timeout(self) -> float:
        """The session timeout in seconds (as given: nothing to negotiate)."""
        return self._timeout

    @property
    def round_trips(self) -> int:
        """Calls made through this store so far (each public call counts one)."""
        return self._round_trips

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Open a session (CONNECTED) and start the event thread. Idempotent."""
        server = self._server
        with server._lock:
            if self._closed or server._closed:
                raise StoreUnavailableError(
                    f"memory store {self.namespace!r} is closed; open a new one"
                    if self._closed
                    else f"{server!r} is shut down"
                )
            if self._started:
                return
            self._started = True
            self._session = self._sid_shown = server._new_session()
            server._stores.append(self)
            self._thread = threading.Thread(
                target=self._run_events,
                name=f"shardkeeper-memory-events[{self.namespace}]",
                daemon=True,
            )
            self._thread.start()
            self._set_state(ConnectionState.CONNECTED)

    def close(self) -> None:
        """End the session (ephemerals deleted before this returns), release the pauses
        of this store, stop the event thread. Idempotent; never raises."""
        server = self._server
        with server._lock:
            if self._closed:
                return
            self._closed = True
            self._cancel_expiry()
            if self in server._stores:
                server._stores.remove(self)
            if self._started:
                server._end_session(self)
            self._state = ConnectionState.LOST
        server._release_pauses_of(self)
        self._queue.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    # -- reads --------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``; a synthetic empty node for a pure parent; else None."""
        check_path(path)
        return self._server._serve(self, "get", (path,), lambda t: t.node(path))

    def exists(self, path: str) -> bool:
        """Whether a node exists at ``path`` or anything lives below it."""
        check_path(path)
        return self._server._serve(self, "exists", (path,), lambda t: t.exists(path))

    def children(self, path: str) -> list[str]:
        """Sorted names of the present children of ``path``."""
        check_path(path)
        return self._server._serve(self, "children", (path,), lambda t: t.children(path))

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path`` (pure parents as synthetic nodes), read at
        one revision."""
        check_path(path)

        def read(tree: _Tree) -> dict[str, Node]:
            found = {p: tree.node(p) for p in tree.subtree(path)}
            return {p: n for p, n in sorted(found.items()) if n is not None}

        return self._server._serve(self, "get_tree", (path,), read)

    # -- writes -------------------------------------------------------------------

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite ``path``; afterwards it is ephemeral (ours) iff asked."""
        op = Put(path, value, ephemeral)
        self._validate("put", [op])

        def write(tree: _Tree) -> Node:
            result = self._server._commit(self, tree, [op])
            node = tree.node(path)
            if not result or node is None:  # a lone Put has no condition
                raise StoreError(f"put {path}: not applied")
            return node

        return self._server._serve(self, "put", (path,), write)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Create ``path`` if nothing is at or below it; None if something is."""
        op = Create(path, value, ephemeral)
        self._validate("create", [op])

        def write(tree: _Tree) -> Node | None:
            if not self._server._commit(self, tree, [op]):
                return None
            return tree.node(path)

        return self._server._serve(self, "create", (path,), write)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete ``path`` (and, if recursive, everything below it) in one transaction.
        Non-recursive on a node with children raises StoreError."""
        check_path(path)

        def write(tree: _Tree) -> None:
            if recursive:
                self._server._delete(self.namespace, tree, tree.subtree(path))
                return
            if tree.has_descendants(path):
                raise StoreError(f"cannot delete {path}: it has children (use recursive=True)")
            self._server._delete(self.namespace, tree, [path])

        self._server._serve(self, "delete", (path,), write)

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` atomically (module docstring: checks see the state before it)."""
        ops = list(ops)
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit carries at most {self.max_ops_per_commit} operations; got {len(ops)}"
            )
        self._validate("commit", ops)
        server = self._server
        return server._serve(
            self, "commit", [op.path for op in ops], lambda t: server._commit(self, t, ops)
        )

    def _validate(self, what: str, ops: Sequence[Op]) -> None:
        size = 0
        for op in ops:
            check_path(op.path)
            if isinstance(op, Create | Put):
                if not isinstance(op.value, bytes):
                    raise ConfigError(
                        f"{what} {op.path}: value must be bytes, got {type(op.value).__name__}"
                    )
                size += len(op.value)
                if op.ephemeral and op.path == "/":
                    raise ConfigError("the namespace root '/' cannot be ephemeral")
            elif not isinstance(op, Check | Delete):
                raise ConfigError(f"unknown commit operation {op!r}")
        if size > self._server.max_request_bytes:
            raise StoreLimitError(
                f"{what}: {size} bytes of values exceed the request limit; keep values "
                f"under {self._server.max_request_bytes} bytes in total"
            )

    # -- watches and listeners ----------------------------------------------------

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Deliver every change at or below ``prefix`` made after this returns, in
        store order, except what ``exclude`` leaves out (asked on the event thread)."""
        check_path(prefix)
        server = self._server
        self._count()
        with server._lock:
            self._require_connected("watch")
            w = _Watch(prefix, listener, exclude, server._seq)
            with self._lock:
                self._watches.append(w)
        return Subscription(functools.partial(self._unwatch, w))

    def _unwatch(self, w: _Watch) -> None:
        w.cancelled = True
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver the connection-state changes made after this call to ``listener`` on
        the event thread (not the CONNECTED of a store started earlier)."""
        with self._server._lock, self._lock:
            lid = self._next_listener
            self._next_listener += 1
            self._state_listeners[lid] = (listener, self._server._seq)
        return Subscription(functools.partial(self._remove_state_listener, lid))

    def _remove_state_listener(self, lid: int) -> None:
        with self._lock:
            self._state_listeners.pop(lid, None)

    # -- fault hooks ----------------------------------------------------------------

    def fail_next(
        self,
        op: str,
        *,
        error: ErrorSpec = OperationTimeoutError,
        applied: bool = False,
        path: str | None = None,
        count: int = 1,
    ) -> None:
        """The next ``count`` calls of ``op`` on this store (whose path is at or below
        ``path``, when given) raise ``error`` (a StoreError class or instance).

        ``applied=False``: nothing is applied. ``applied=True``: the call is applied
        (others see it, events go out) and then the error is raised: a reply lost on
        the way back, the outcome unknown to the caller.
        """
        if not (
            isinstance(error, StoreError)
            or (isinstance(error, type) and issubclass(error, StoreError))
        ):
            raise ConfigError(f"fail_next error={error!r} must be a StoreError class or instance")
        if count < 1:
            raise ConfigError(f"fail_next count={count!r} must be >= 1")
        rule = _Failure(_check_op(op), error, applied, _check_prefix(path, "fail_next"), count)
        with self._lock:
            self._failures.append(rule)

    def suspend(self) -> None:
        """Drop the connection: SUSPENDED; every call raises StoreUnavailableError and
        watch events are held back until :meth:`resume`. If it lasts longer than the
        session timeout, the server expires the session (ephemerals deleted, LOST)."""
        server = self._server
        with server._lock:
            self._require_started("suspend")
            if self._suspended:
                return
            self._suspended = True
            self._set_state(ConnectionState.SUSPENDED)
            timer = threading.Timer(self._timeout, self._expire_if_still_suspended)
            timer.name = f"shardkeeper-memory-expiry[{self.namespace}]"
            timer.daemon = True
            self._expiry = timer
            timer.start()

    def resume(self) -> None:
        """The connection is back: RECONNECTED (same session) or, if the session expired
        meanwhile, CONNECTED with a new session id; then the held-back events."""
        server = self._server
        with server._lock:
            self._require_started("resume")
            if not self._suspended:
                return
            self._suspended = False
            self._cancel_expiry()
            if self._session:
                self._set_state(ConnectionState.RECONNECTED)
            else:
                self._session = self._sid_shown = server._new_session()
                self._set_state(ConnectionState.CONNECTED)
            backlog, self._backlog = self._backlog, []
            for item in backlog:
                self._queue.put(item)

    def expire(self) -> None:
        """The session expires now (server side): its ephemerals are deleted (watchers
        see it), the store gets LOST, then CONNECTED with a new session id (at once, or
        on :meth:`resume` while suspended)."""
        server = self._server
        with server._lock:
            self._require_started("expire")
            self._cancel_expiry()
            if self._session:
                server._end_session(self)
                self._set_state(ConnectionState.LOST)
            if not self._suspended:
                self._session = self._sid_shown = server._new_session()
                self._set_state(ConnectionState.CONNECTED)

    def expire_session(self, timeout: float = 15.0) -> None:
        """:class:`~shardkeeper.registry.faults.SessionFaults`: :meth:`expire`
        (immediate here; ``timeout`` is for the real backends)."""
        self.expire()

    def drop_connection(self) -> None:
        """:class:`~shardkeeper.registry.faults.SessionFaults`: a brief drop, as a
        real client's reconnect: SUSPENDED then RECONNECTED, same session (use
        :meth:`suspend`/:meth:`resume` for a longer one)."""
        self.suspend()
        self.resume()

    # -- internals -------------------------------------------------------------------

    def _count(self) -> None:
        with self._lock:
            self._round_trips += 1

    def _take_failure(self, op: str, paths: Sequence[str]) -> _Failure | None:
        with self._lock:
            for rule in self._failures:
                if rule.matches(op, paths):
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        self._failures.remove(rule)
                    return rule
        return None

    def _require_started(self, what: str) -> None:
        if self._closed or self._server._closed:
            raise StoreUnavailableError(f"{what}: memory store {self.namespace!r} is closed")
        if not self._started:
            raise StoreError(f"{what}: memory store {self.namespace!r} is not started")

    def _require_connected(self, what: str) -> None:
        self._require_started(what)
        if self._suspended:
            raise StoreUnavailableError(
                f"{what}: memory store {self.namespace!r} is disconnected (suspended)"
            )

    def _set_state(self, state: ConnectionState) -> None:
        """Under the server lock: record and queue a state change."""
        self._state = state
        self._server._seq += 1
        self._queue.put(_StateItem(self._server._seq, state))

    def _enqueue(self, item: _EventItem) -> None:
        """Under the server lock: queue a watch event (held back while suspended)."""
        if self._suspended:
            self._backlog.append(item)
        else:
            self._queue.put(item)

    def _cancel_expiry(self) -> None:
        timer, self._expiry = self._expiry, None
        if timer is not None:
            timer.cancel()

    def _expire_if_still_suspended(self) -> None:
        server = self._server
        with server._lock:
            if (
                self._closed
                or not self._suspended
                or threading.current_thread() is not (self._expiry)
            ):
                return
            self._expiry = None
            if self._session:
                server._end_session(self)
                self._set_state(ConnectionState.LOST)

    def _run_events(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _StateItem):
                with self._lock:
                    listeners = [
                        f for f, since in self._state_listeners.values() if since < item.seq
                    ]
                for listener in listeners:
                    try:
                        listener(item.state)
                    except Exception:
                        _log.exception("state listener %r failed", listener)
                continue
            seq, event = item.seq, item.event
            with self._lock:
                watches = list(self._watches)
            for w in watches:
                if w.cancelled or seq <= w.since or not _under(event.path, w.prefix):
                    continue
                try:
                    if is_excluded(event.path, w.exclude):
                        continue
                except Exception:
                    _log.exception("watch %s: exclude filter failed on %s", w.prefix, event.path)
                try:
                    w.listener(event)
                except Exception:
                    _log.exception("watch listener %r failed on %s", w.listener, event)


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
