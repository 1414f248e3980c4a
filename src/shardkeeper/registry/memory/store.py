"""A client of the in-memory store server: its calls, session and event thread (the
registry's shared :class:`~shardkeeper.registry._events.EventLoop`, as the real
backends'; what it delivers is placed in the server's one order).

Sessions
--------
:meth:`MemoryStore.start` opens a session (``session_id``: hex). It ends on
:meth:`MemoryStore.close` (ephemerals deleted at once, no state event), on
:meth:`MemoryStore.expire`, or when the store stays suspended longer than its
``session_timeout`` (a server-side timer, as a real server's): its ephemeral nodes
are deleted in one transaction (watchers see DELETED events) and the store gets LOST;
it gets CONNECTED with a new session id as soon as it is connected again.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Sequence

from shardkeeper.errors import (
    ConfigError,
    OperationTimeoutError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry._events import EventLoop
from shardkeeper.registry.base import (
    CommitResult,
    ConnectionState,
    CoordinationStore,
    Create,
    GroupsResult,
    Node,
    Op,
    PathFilter,
    Put,
    StateListener,
    Subscription,
    WatchListener,
    check_path,
)
from shardkeeper.registry.batching import DEFAULT_MAX_OPS, default_commit_bytes, plain_commit_groups
from shardkeeper.registry.memory.hooks import ErrorSpec, _check_op, _check_prefix, _Failure
from shardkeeper.registry.memory.server import (
    MemoryServer,
    _EventItem,
    _Item,
    _StateItem,
    _Watch,
)
from shardkeeper.registry.memory.tree import _Tree, _under, _validate

__all__ = ["MemoryStore"]

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.memory")

_NS_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]+$")


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
        self._started = False
        self._closed = False
        self._suspended = False
        self._backlog: list[_Item] = []
        self._expiry: threading.Timer | None = None
        # stop_refreshing(): when it was called, and the timer that ends the session
        self._refresh_stopped_at: float | None = None
        self._silent_expiry: threading.Timer | None = None
        self._lock = threading.Lock()
        self._round_trips = 0
        self._failures: list[_Failure] = []
        self._watches: list[_Watch] = []
        #: id -> (listener, the server's sequence number when it was added)
        self._state_listeners: dict[int, tuple[StateListener, int]] = {}
        self._next_listener = 0
        # the event thread; states are posted in the server's order (_set_state)
        self._loop = EventLoop(
            f"shardkeeper-memory-events[{self.namespace}]", ConnectionState.LOST, log=_log
        )

    def identity(self) -> str:
        """The server and namespace, as ``RegistrySettings.identity`` spells a
        ``memory://`` URL's."""
        return f"memory://{self._server.name}/{self.namespace}"

    def __repr__(self) -> str:
        return (
            f"MemoryStore({self._server.name!r}, {self.namespace!r}, "
            f"session={self.session_id or '-'}, {self._loop.state.name})"
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
        return self._loop.state

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
            self._loop.start()
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
            if self._silent_expiry is not None:
                self._silent_expiry.cancel()
            if self in server._stores:
                server._stores.remove(self)
            if self._started:
                server._end_session(self)
            self._loop.record(ConnectionState.LOST)
        server._release_pauses_of(self)
        self._loop.stop(5)

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
        _validate("put", [op], self._server.max_request_bytes)

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
        _validate("create", [op], self._server.max_request_bytes)

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
        """Apply ``ops`` atomically (``tree.py``: checks see the state before it)."""
        ops = list(ops)
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit carries at most {self.max_ops_per_commit} operations; got {len(ops)}"
            )
        _validate("commit", ops, self._server.max_request_bytes)
        server = self._server
        return server._serve(
            self, "commit", [op.path for op in ops], lambda t: server._commit(self, t, ops)
        )

    # -- batching (registry/batching.py: BatchingStore) ------------------------------

    #: operations a commit carries: etcd's default --max-txn-ops (tests lower it)
    max_ops_per_commit: int = DEFAULT_MAX_OPS

    #: no byte limit of its own besides the server's request limit (tests set one)
    max_commit_bytes: int | None = None

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """Values, paths and a framing each (``batching.default_commit_bytes``)."""
        return default_commit_bytes(ops)

    def group_bytes(self, group: Sequence[Op]) -> int:
        """As :meth:`commit_bytes`."""
        return default_commit_bytes(group)

    @property
    def max_groups_per_commit(self) -> int | None:
        """As many groups as etcd's nested transactions carry when the server checks
        groups apart (``MemoryServer(groups_apart=True)``); else None."""
        return 4096 if self._server.groups_apart else None

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """One plain commit, or (``groups_apart``) each group checked apart, as etcd does
        (see :meth:`CoordinationStore.commit_groups`)."""
        if not self._server.groups_apart:
            return plain_commit_groups(self, fixed, groups)
        ops = [*fixed, *(op for group in groups for op in group)]
        _validate("commit", ops, self._server.max_request_bytes)
        server = self._server
        return server._serve(
            self,
            "commit",
            [op.path for op in ops],
            lambda t: server._commit_groups(self, t, fixed, groups),
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
            w = _Watch(prefix=prefix, listener=listener, exclude=exclude, since=server._seq)
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
                self._post(item)

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

    def relinquish_session(self) -> None:
        """:meth:`CoordinationStore.relinquish_session`: the session ends now on the
        server (its ephemerals are deleted in one transaction, watchers see it), LOST,
        then CONNECTED with a new session id (while suspended, on :meth:`resume`). No
        :meth:`fail_next` rule applies: a real store stops renewing the session
        whatever its link does, and the server then ends it anyway."""
        self.expire()

    def last_renewal(self) -> float | None:
        """:meth:`CoordinationStore.last_renewal`: None (every answered call renews
        the session), unless :meth:`stop_refreshing` was called: then the time of
        that call, the last renewal this session gets."""
        return self._refresh_stopped_at

    def stop_refreshing(self) -> None:
        """The session is no longer renewed while every call is still answered: etcd's
        lease keep-alives failing while its reads and commits succeed (review finding
        1). From now on the session lives on renewals of its own, and
        :meth:`last_renewal` reports the last one: this moment. One session timeout
        later the server ends the session (its ephemeral nodes are deleted, watchers
        see it) without telling the client, whose state stays as it was and whose
        calls go on; an ephemeral write under the ended session is refused, as etcd
        refuses a put with a lease it no longer has."""
        server = self._server
        with server._lock:
            self._require_connected("stop_refreshing")
            if self._refresh_stopped_at is not None:
                return
            self._refresh_stopped_at = time.monotonic()
            timer = threading.Timer(self._timeout, self._end_silently)
            timer.name = f"shardkeeper-memory-lease[{self.namespace}]"
            timer.daemon = True
            self._silent_expiry = timer
            timer.start()

    def _end_silently(self) -> None:
        with self._server._lock:
            if not self._closed:
                self._server._end_session(self)

    def clear_failures(self) -> None:
        """Drop every rule armed by :meth:`fail_next` that has not run out yet (the
        link is healthy again)."""
        with self._lock:
            self._failures.clear()

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
        """Under the server lock: record and queue a state change (every one, in the
        server's order: the loop's change check is not the reference's to make)."""
        self._loop.record(state)
        self._server._seq += 1
        self._post(_StateItem(self._server._seq, state))

    def _enqueue(self, item: _EventItem) -> None:
        """Under the server lock: queue a watch event (held back while suspended)."""
        if self._suspended:
            self._backlog.append(item)
        else:
            self._post(item)

    def _post(self, item: _Item) -> None:
        if isinstance(item, _StateItem):
            self._loop.post(functools.partial(self._deliver_state, item))
        else:
            self._loop.post(functools.partial(self._deliver_event, item))

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

    # -- on the event thread ------------------------------------------------------------

    def _deliver_state(self, item: _StateItem) -> None:
        # only the listeners added before the change (see add_state_listener)
        with self._lock:
            listeners = [f for f, since in self._state_listeners.values() if since < item.seq]
        for listener in listeners:
            try:
                listener(item.state)
            except Exception:
                _log.exception("state listener %r failed", listener)

    def _deliver_event(self, item: _EventItem) -> None:
        seq, event = item.seq, item.event
        with self._lock:
            watches = list(self._watches)
        for w in watches:
            if seq > w.since and _under(event.path, w.prefix):
                # cancelled, excluded (a filter that raises excludes nothing), listener
                # failures: the loop's rules, as for the real backends
                self._loop.deliver_watch(w, event)
