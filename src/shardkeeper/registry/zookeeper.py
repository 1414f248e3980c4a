"""ZooKeeper backend of the :class:`~shardkeeper.registry.base.CoordinationStore` contract.

Built on kazoo 2.11. The contract is documented once, in ``base.py``; this module only
records how each part maps onto ZooKeeper and the choices that mapping forced.

Namespace
    The store confines itself to the znode ``/<namespace>`` with a client-side chroot
    (as the Java client and kazoo do: ZooKeeper itself has no chroot). A ``/`` inside
    the namespace is escaped as ``%2F`` (as the etcd backend does), so namespace
    ``team/app`` is the single znode ``/team%2Fapp`` and never nests inside the tree
    of namespace ``team``. :meth:`start` creates the node if it is absent.

Credentials
    With a user name, the session adds ``digest`` auth and every node it creates gets a
    digest ACL for that user only (``make_digest_acl(..., all=True)``). Another client
    without those credentials gets ``NoAuth`` -> :class:`StoreAuthError`; :meth:`start`
    probes the namespace node so that wrong credentials fail there, not later.

    Nodes that already exist keep the ACL they were created with. So :meth:`start`
    with credentials, on an existing namespace, also reads the ACL of the namespace
    node and of its direct children, and refuses (StoreAuthError naming the node, its
    ACL and the fix) when one lets any client (``world:anyone``) in, as a namespace
    first created without credentials does. With ``acl_repair=true`` in the registry
    URL it sets the digest ACL on every node of the namespace instead (also
    :meth:`ZooKeeperStore.repair_acl`, behind ``shardkeeper registry fix-acl``). kazoo
    logs the digest auth request, password included, at DEBUG: the store installs a
    filter on kazoo's loggers that blanks credentials out (``zk_security``).

Node fields
    ``version`` = ``stat.version``, ``revision`` = ``stat.mzxid``, ``created_revision`` =
    ``stat.czxid``, ``ephemeral`` = ``stat.ephemeralOwner != 0``.

Commits
    A commit is one ZooKeeper ``multi``. ZooKeeper can only check a data *version*
    inside a multi, so the other conditions are derived from a pre-read:

    ============================== ================================================
    operation                      inside the multi
    ============================== ================================================
    ``Check(version=v)``           ``check(path, v)`` (native)
    ``Check(exists=True)``         ``check(path, -1)`` (native: existence only)
    ``Check(value/created_        if the pre-read satisfies the condition:
    revision)``                    ``check(path, pre-read version)``; else the
                                   commit fails without sending anything
    ``Check(exists=False)``        *absence guard*, no pre-read: ``create(g)`` +
                                   ``delete(g)`` where ``g`` is the path (or, when
                                   its parent is missing, the first missing
                                   ancestor segment); NodeExists on the path itself
                                   is the failed condition
    ``Create``                     ``create`` (NodeExists -> failed commit)
    ``Put``                        present with the right kind: ``set_data(path,
                                   pre-read version)``; wrong ephemeral kind:
                                   ``delete`` + ``create``; absent: ``create``
    ``Put(existing=True)``         persistent: ``set_data(path, -1)`` with no
                                   pre-read (a missing node fails the multi, which
                                   is then planned again with the pre-read)
    ``Delete``                     present: ``delete``; absent: absence guard;
                                   no pre-read when an existence check on the path
                                   or a descendant is in the same commit (then it
                                   exists whenever the multi applies)
    ============================== ================================================

    Every check and guard comes first in the multi, so conditions are evaluated against
    the state *before* the commit (as etcd's ``If``/``Then`` does). When the multi
    fails on an operation derived from the pre-read, something changed concurrently:
    the commit re-reads and retries, at most ``_COMMIT_ATTEMPTS`` times; if the store
    keeps changing it reports a failed commit naming the contended path. Missing parents
    of ``Create``/``Put`` (found with one batch of exists after the multi failed for
    them) are created, persistent and empty, inside the retried multi, so a failed
    commit leaves no parents behind. The result's ``revision`` is the multi's
    own zxid, read from the reply header (``_Multi``), so it equals the
    ``created_revision`` of every node the commit created.

    Known limit: a version check cannot tell two incarnations of a node apart. If a
    node is deleted and re-created with the same data version between the pre-read
    and the multi, a derived ``value``/``created_revision`` check passes against the
    new incarnation. An ephemeral node of our own session is immune (it can only be
    deleted explicitly, or by expiry, which also kills the multi).

Ephemeral nodes
    Bound to the kazoo session. ``put(ephemeral=True)`` on a node that is persistent
    or owned by another session replaces it (``delete`` + ``create`` in one multi).

Watches
    kazoo 2.11 has no persistent recursive watch (``addWatch``), and it forgets every
    one-shot watch when the connection drops (it never sends ``SetWatches``). So each
    :meth:`ZooKeeperStore.watch` runs a lean tree watcher: a data watch and a child
    watch on every node under the prefix (an exists watch on the prefix while it is
    absent) and a cache ``{path: (czxid, mzxid)}``. kazoo callbacks only enqueue; the
    store's single event thread re-reads the node that fired (re-arming its watch),
    diffs against the cache and emits CREATED/CHANGED/DELETED. Consequences (the
    contract's Watches section, in ``base.py``, allows exactly these): rapid changes
    to one node may be coalesced into one event carrying the latest value; a node
    created and deleted between two reads gives no event; a delete + re-create seen
    late is emitted as DELETED then CREATED (czxid differs); a re-read can discover a
    change before older changes of other nodes whose events are still queued, so
    events of different paths are not in store order.

    Per-path order holds: one session's reads are monotonic (ZooKeeper's guarantee),
    and an event is emitted only for a (czxid, mzxid) newer than the cached one, so
    the revisions of one path's events strictly increase. ZooKeeper does not report
    the zxid of a delete, so a DELETED event carries a bound: the parent's pzxid when
    its listing missed the node, the new czxid - 1 when it was re-created, and never
    less than the node's last mzxid + 1 (see ``_drop``).
    After RECONNECTED, or CONNECTED on a new session, every watcher re-reads its whole
    subtree, diffs and emits what changed, so no change is silently lost. A read that
    fails inside the event thread marks the watcher dirty; it is re-synced as soon as
    the connection allows. Initial state is not emitted: a watch reports changes.

    Excluded subtrees (``watch(..., exclude=...)``): a listed child for which
    ``exclude`` is True is dropped from the listing before anything else happens, so
    the watcher never reads it, never lists its children and sets no watch on it; a
    write below it costs the watcher nothing (a create or delete of the excluded node
    itself still fires its parent's child watch: one re-listing of the parent). An
    excluded prefix makes a watch that reads nothing at all.

    Implicit parents: ZooKeeper needs real parent nodes where etcd has none, so the
    store creates missing parents in the same multi as the node that needs them. They
    share its czxid, which is how a watcher recognises them: a new, empty, never
    written node with a child of the same czxid is an implicit parent and produces no
    events (as in etcd); a value later put on it is reported as CREATED. (An empty node
    created on purpose in the same commit as its child is indistinguishable and is
    treated as implicit too.)

Connection states
    kazoo CONNECTED on the first session -> CONNECTED; SUSPENDED -> SUSPENDED;
    CONNECTED with the same session id -> RECONNECTED; LOST -> LOST, and kazoo's next
    session -> CONNECTED. kazoo's listener only enqueues; listeners run on the event
    thread. Threads per store: kazoo's three (connection, completion, callback) plus
    the one event thread, whatever the number of watches.

Errors and timeouts
    Every request is sent asynchronously and awaited against a per-call deadline of
    ``operation_timeout``; kazoo exceptions are translated in :meth:`_errors` only.
    A read (``get``, ``exists``, ``children``, ``get_tree``) that fails with
    ConnectionLoss (in flight when its member died or froze) is sent once more within
    the same deadline: kazoo queues it until it has reconnected, to another member if
    need be. Writes are not re-sent: their outcome is unknown.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol import serialization as zkproto
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from shardkeeper.errors import (
    ConfigError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionLostError,
    StoreAuthError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry import zk_security
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
from shardkeeper.registry.url import RegistrySettings

__all__ = ["ZooKeeperStore"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: how often a commit re-reads and retries when a pre-read node changed under it
_COMMIT_ATTEMPTS = 8
#: ZooKeeper refuses packets over jute.maxbuffer (1 MiB - 1) by dropping the
#: connection, which would suspend every user of the session: refuse earlier
_MAX_PAYLOAD = 1_000_000
#: how often a dirty watcher is retried while its re-sync keeps failing
_DIRTY_RETRY = 0.25


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _child(path: str, name: str) -> str:
    return f"{path}/{name}" if path != "/" else f"/{name}"


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of ``path`` below ``/``, top-down (``/a/b/c`` -> ``/a``, ``/a/b``)."""
    segs = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(segs[: i + 1]) for i in range(len(segs))]


def _node(path: str, value: bytes, stat: ZnodeStat) -> Node:
    return Node(
        path=path,
        value=value,
        version=stat.version,
        revision=stat.mzxid,
        created_revision=stat.czxid,
        ephemeral=stat.ephemeralOwner != 0,
    )


class _Multi(zkproto.Transaction):  # type: ignore[misc]
    """A ``multi`` request whose result also carries the reply header's zxid.

    kazoo stores the header zxid in ``client.last_zxid`` on its connection thread right
    before it deserializes the body, so reading it here is race-free; afterwards it may
    already belong to a later reply. (kazoo 2.11 internals: keep in step when upgrading.)
    """

    client: KazooClient

    def deserialize(self, data: bytes, offset: int) -> tuple[list[Any], int]:
        return zkproto.Transaction.deserialize(data, offset), self.client.last_zxid


@dataclass
class _TreeWatch:
    """State of one prefix watch; only the event thread touches the cache."""

    prefix: str
    listener: WatchListener
    events: queue.SimpleQueue[Any]
    #: path -> (czxid, mzxid, implicit) of every node seen under the prefix; implicit
    #: parents (made only to hold a child) produce no events, as in etcd
    cache: dict[str, tuple[int, int, bool]] = field(default_factory=dict)
    #: path -> cached child paths (so a vanished subtree is found without a scan)
    kids: dict[str, set[str]] = field(default_factory=dict)
    dirty: bool = False
    cancelled: bool = False
    #: subtrees never read, listed or watched (see the module docstring)
    exclude: PathFilter | None = None
    #: the prefix itself is excluded: nothing to read, nothing to report
    void: bool = False

    def skips(self, path: str) -> bool:
        """Whether ``path`` is excluded. Only the node itself is asked: the walk
        reached it through ancestors that were asked (and kept) on the way down."""
        return self.exclude is not None and self.exclude(path)

    def on_zk(self, event: WatchedEvent) -> None:
        # runs on kazoo's callback thread: never read here, only hand over
        self.events.put(("watch", self, event))


@dataclass
class _Pending:
    """A request handed to the event thread by a caller that waits for it."""

    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


_STOP = object()


class ZooKeeperStore(CoordinationStore):
    """The :class:`CoordinationStore` on a ZooKeeper ensemble (see module docstring)."""

    def __init__(self, settings: RegistrySettings) -> None:
        self._settings = settings
        self.namespace = settings.namespace
        # escaped so that namespace X never sees X/sub as its node /sub
        self._chroot = "/" + settings.namespace.strip("/").replace("/", "%2F")
        self._client: KazooClient | None = None
        self._events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._state = ConnectionState.LOST
        self._sid: int | None = None
        self._first_session = threading.Event()
        self._negotiated: float | None = None
        self._round_trips = 0
        self._watches: list[_TreeWatch] = []
        self._state_listeners: list[tuple[Subscription, StateListener]] = []
        self._acl: list[Any] | None = None
        if settings.username:
            self._acl = [make_digest_acl(settings.username, settings.password or "", all=True)]
        #: nodes whose ACL the last repair set (acl_repair at start, or repair_acl())
        self.acl_repaired = 0
        # kazoo logs the auth request (password included) at DEBUG: blank it out
        zk_security.install_credential_filter()
        zk_security.register_secret(settings.password)

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Connect, create the namespace node if absent and check our credentials on it."""
        if self._closed:
            raise StoreUnavailableError(
                f"ZooKeeper store for namespace {self.namespace!r} is closed; open a new one"
            )
        if self._client is not None:
            return
        s = self._settings
        auth = {("digest", f"{s.username}:{s.password or ''}")} if s.username else None
        client = KazooClient(
            hosts=s.hosts_string,
            timeout=s.session_timeout,
            # kazoo's default back-off grows to an hour; a restarted server must be
            # found again well within the session timeout so the session survives
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_jitter=0.2, max_delay=0.5
            ),
            auth_data=auth,
            default_acl=self._acl,
        )
        self._capture_negotiated_timeout(client)
        client.add_listener(self._on_kazoo_state)
        self._client = client
        self._thread = threading.Thread(
            target=self._run, name=f"shardkeeper-zk-events[{self.namespace}]", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + s.connection_timeout
        client.start_async()
        connected = self._first_session.wait(s.connection_timeout)
        if not connected:
            self.close()
            raise StoreUnavailableError(
                f"cannot reach ZooKeeper at {s.hosts_string} within the connection "
                f"timeout of {s.connection_timeout:g}s"
            )
        try:
            self._prepare_namespace(client, max(deadline, time.monotonic() + 0.5))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the session, stop the event thread and every watch; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancelled = True
        client = self._client
        if client is not None:
            try:
                client.stop()
                client.close()
            except Exception:  # a store already down must still close quietly
                _log.debug("error while closing the ZooKeeper client", exc_info=True)
        self._events.put(_STOP)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._settings.operation_timeout + 1)
        self._state = ConnectionState.LOST

    def repair_acl(self) -> int:
        """Set this store's digest ACL on every node of the namespace (top-down, the
        namespace node included); return how many nodes. Needs credentials."""
        if self._acl is None:
            raise ConfigError(
                f"cannot repair the ACLs of namespace {self.namespace!r} without "
                "credentials: give user:password in the registry URL"
            )
        with self._errors(self._chroot):
            self.acl_repaired = zk_security.repair_acls(
                self._zk,
                "/",
                self._acl,
                self._settings.operation_timeout,
                shown=lambda p: self._chroot if p == "/" else self._chroot + p,
            )
        return self.acl_repaired

    @property
    def session_id(self) -> str:
        """The ZooKeeper session id in hex (``''`` before the first session)."""
        return hex(self._sid) if self._sid is not None else ""

    @property
    def state(self) -> ConnectionState:
        """The latest connection state, as delivered to state listeners."""
        return self._state

    @property
    def session_timeout(self) -> float:
        """The session timeout the server negotiated, in seconds."""
        if self._negotiated is not None:
            return self._negotiated
        return self._settings.session_timeout

    @property
    def round_trips(self) -> int:
        """Requests sent so far (a multi counts as one)."""
        return self._round_trips

    @property
    def kazoo_client(self) -> KazooClient:
        """The underlying KazooClient, for fault-injection helpers in tests."""
        return self._zk

    # -- reads -----------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``, or None."""
        check_path(path)

        def read(dl: float) -> Node | None:
            try:
                data, stat = self._call(dl, self._zk.get_async, path)
            except kz.NoNodeError:
                return None
            return _node(path, data, stat)

        return self._read(path, read)

    def exists(self, path: str) -> bool:
        """Whether a node exists at ``path`` (ZooKeeper keeps parents as real nodes)."""
        check_path(path)
        return self._read(path, lambda dl: self._call(dl, self._zk.exists_async, path) is not None)

    def children(self, path: str) -> list[str]:
        """Sorted names of the children of ``path``; empty if it does not exist."""
        check_path(path)

        def read(dl: float) -> list[str]:
            try:
                return sorted(self._call(dl, self._zk.get_children_async, path))
            except kz.NoNodeError:
                return []

        return self._read(path, read)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path``, read level by level with pipelined requests."""
        check_path(path)

        def read(dl: float) -> dict[str, Node]:
            tree = self._walk(dl, path, with_data=True)
            return {p: _node(p, *ds) for p, ds in tree.items() if ds is not None}

        return self._read(path, read)

    def _read(self, what: str, read: Callable[[float], _T]) -> _T:
        """Run ``read`` (given the deadline); once more if the connection was lost.

        A request in flight when the connection drops fails with ConnectionLoss; kazoo
        then reconnects (to another member if this one is gone) and queues new requests
        until it has. A read changes nothing, so sending it again is safe; both
        attempts share one operation timeout. Writes are not re-sent: a lost
        connection leaves their outcome unknown.
        """
        with self._errors(what):
            deadline = self._deadline()
            try:
                return read(deadline)
            except kz.ConnectionLoss:
                if time.monotonic() >= deadline:
                    raise
                _log.info("ZooKeeper read of %s lost its connection; reading again", what)
            return read(deadline)

    # -- writes ----------------------------------------------------------------

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite ``path``; afterwards it is ephemeral (ours) iff asked."""
        check_path(path)
        self._check_payload(path, len(value))
        if ephemeral and path == "/":
            raise ConfigError("the namespace root '/' cannot be ephemeral")
        with self._errors(path):
            dl = self._deadline()
            zk = self._zk
            for _ in range(_COMMIT_ATTEMPTS):
                try:
                    stat = self._call(dl, zk.set_async, path, value)
                except kz.NoNodeError:
                    created = self._create_node(dl, path, value, ephemeral)
                    if created is not None:
                        return created
                    continue  # created by someone else meanwhile: overwrite it
                if stat.ephemeralOwner == self._wanted_owner(ephemeral):
                    return _node(path, value, stat)
                # wrong kind: replace it in one multi, guarded by the version just written
                results, zxid = self._multi(
                    dl,
                    [
                        zkproto.Delete(self._full(path), stat.version),
                        self._create_op(path, value, ephemeral),
                    ],
                )
                if _first_error(results) is None:
                    return Node(path, value, 0, zxid, zxid, ephemeral)
            raise StoreError(f"put {path}: the node kept changing concurrently; try again")

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Create ``path`` if absent (parents made persistent); None if it existed."""
        check_path(path)
        self._check_payload(path, len(value))
        if path == "/":
            return None
        with self._errors(path):
            return self._create_node(self._deadline(), path, value, ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete ``path`` (and its subtree if recursive); ``/`` keeps the namespace node."""
        check_path(path)
        with self._errors(path):
            dl = self._deadline()
            zk = self._zk
            if not recursive:
                if path == "/":
                    if self._call(dl, zk.get_children_async, path):
                        raise StoreError("cannot delete '/': it has children (use recursive)")
                    return
                try:
                    self._call(dl, zk.delete_async, path)
                except kz.NoNodeError:
                    pass
                except kz.NotEmptyError:
                    raise StoreError(
                        f"cannot delete {path}: it has children (use recursive=True)"
                    ) from None
                return
            for _ in range(_COMMIT_ATTEMPTS):
                tree = self._walk(dl, path, with_data=False)
                tree.pop("/", None)
                by_depth: dict[int, list[str]] = {}
                for p in tree:
                    by_depth.setdefault(p.count("/"), []).append(p)
                try:
                    for depth in sorted(by_depth, reverse=True):
                        sent = [self._send(zk.delete_async, p) for p in by_depth[depth]]
                        for ar in sent:
                            with suppress(kz.NoNodeError):
                                self._wait(ar, dl)
                    return
                except kz.NotEmptyError:
                    continue  # a child appeared while we walked: walk again
            raise StoreError(f"delete {path}: children kept appearing concurrently")

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` in one ZooKeeper multi (see the module docstring's table)."""
        ops = list(ops)
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit carries at most {self.max_ops_per_commit} operations; got {len(ops)}"
            )
        size = 0
        for op in ops:
            check_path(op.path)
            if isinstance(op, Create | Put):
                size += len(op.value)
                if op.ephemeral and op.path == "/":
                    raise ConfigError("the namespace root '/' cannot be ephemeral")
        self._check_payload("commit", size)
        with self._errors("commit"):
            return self._commit(self._deadline(), ops)

    # -- watches and listeners ------------------------------------------------------

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch every change at or below ``prefix`` (established when this returns),
        leaving out the subtrees ``exclude`` rejects without reading them."""
        check_path(prefix)
        _ = self._zk  # raises unless started
        w = _TreeWatch(
            prefix, listener, self._events, exclude=exclude, void=is_excluded(prefix, exclude)
        )
        sub = Subscription(cancel_fn=lambda: self._unwatch(w))
        if threading.current_thread() is self._thread:
            self._add_watch(w)
            return sub
        pending = _Pending()
        self._events.put(("add_watch", w, pending))
        if not pending.done.wait(self._settings.operation_timeout + 1):
            w.cancelled = True
            raise OperationTimeoutError(
                f"watch {prefix}: not established within {self._settings.operation_timeout:g}s"
            )
        if pending.error is not None:
            raise pending.error
        return sub

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        entry: list[tuple[Subscription, StateListener]] = []

        def cancel() -> None:
            with self._lock:
                if entry[0] in self._state_listeners:
                    self._state_listeners.remove(entry[0])

        sub = Subscription(cancel_fn=cancel)
        entry.append((sub, listener))
        with self._lock:
            self._state_listeners.append(entry[0])
        return sub

    # -- plumbing: requests, deadlines, errors ---------------------------------------

    @property
    def _zk(self) -> KazooClient:
        client = self._client
        if client is None or self._closed:
            state = "closed" if self._closed else "not started"
            raise StoreUnavailableError(
                f"ZooKeeper store for namespace {self.namespace!r} is {state}"
            )
        return client

    def _deadline(self) -> float:
        return time.monotonic() + self._settings.operation_timeout

    def _send(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._round_trips += 1
        return fn(*args, **kwargs)

    @staticmethod
    def _wait(async_result: Any, deadline: float) -> Any:
        return async_result.get(timeout=max(deadline - time.monotonic(), 0.0))

    def _call(self, deadline: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self._wait(self._send(fn, *args, **kwargs), deadline)

    def _full(self, path: str) -> str:
        """The absolute ZooKeeper path (multi ops bypass kazoo's chroot handling)."""
        return self._chroot if path == "/" else self._chroot + path

    def _multi(self, deadline: float, ops: list[Any]) -> tuple[list[Any], int]:
        request = _Multi(ops)
        request.client = self._zk
        async_result = self._zk.handler.async_result()
        self._send(self._zk._call, request, async_result)
        results, zxid = self._wait(async_result, deadline)
        return list(results), int(zxid)

    def _create_op(self, path: str, value: bytes, ephemeral: bool) -> Any:
        return zkproto.Create(
            self._full(path), value, self._acl or OPEN_ACL_UNSAFE, 1 if ephemeral else 0
        )

    def _wanted_owner(self, ephemeral: bool) -> int | None:
        if not ephemeral:
            return 0
        cid = self._zk.client_id
        return cid[0] if cid else None

    def _check_payload(self, what: str, size: int) -> None:
        if size > _MAX_PAYLOAD:
            raise StoreLimitError(
                f"{what}: {size} bytes of values exceed ZooKeeper's request limit; keep "
                f"values under {_MAX_PAYLOAD} bytes in total"
            )

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Translate kazoo exceptions into shardkeeper's (the one place that does)."""
        hosts, t = self._settings.hosts_string, self._settings.operation_timeout
        try:
            yield
        except KazooTimeoutError:
            raise OperationTimeoutError(
                f"{what}: ZooKeeper at {hosts} did not answer within {t:g}s; the outcome is unknown"
            ) from None
        except (kz.ConnectionLoss, kz.ConnectionClosedError) as e:
            raise StoreUnavailableError(
                f"{what}: lost the connection to ZooKeeper at {hosts} ({type(e).__name__})"
            ) from None
        except (kz.SessionExpiredError, kz.SessionMovedError):
            raise SessionLostError(f"{what}: the ZooKeeper session expired") from None
        except (kz.NoAuthError, kz.AuthFailedError, kz.InvalidACLError) as e:
            raise StoreAuthError(
                f"{what}: ZooKeeper refused access ({type(e).__name__}): check the "
                "user name and password of the registry URL"
            ) from None
        except kz.NoNodeError:
            raise NoNodeError(what) from None
        except kz.NodeExistsError:
            raise NodeExistsError(what) from None
        except kz.NoChildrenForEphemeralsError:
            raise StoreError(f"{what}: an ephemeral node cannot have children") from None
        except kz.KazooException as e:
            raise StoreError(f"{what}: ZooKeeper error {type(e).__name__}: {e}") from e

    # -- plumbing: writes --------------------------------------------------------------

    def _missing_ancestors(self, deadline: float, path: str, stop: set[str]) -> list[str]:
        """Ancestors of ``path`` that do not exist, top-down, up to the first one in
        ``stop`` (paths the caller creates itself). One pipelined batch of exists."""
        todo: list[str] = []
        for a in _ancestors(path):
            if a in stop:
                break
            todo.append(a)
        sent = [self._send(self._zk.exists_async, a) for a in todo]
        stats = [self._wait(ar, deadline) for ar in sent]
        for i, st in enumerate(stats):
            if st is None:
                return todo[i:]  # nothing exists below a missing node
        return []

    def _create_node(
        self, deadline: float, path: str, value: bytes, ephemeral: bool
    ) -> Node | None:
        """Create ``path``, with its missing parents in the same multi; None if it existed.

        Parents are created in the transaction that creates their first child, so they
        share its czxid: that is how watchers tell implicit parents from nodes written
        on purpose (see ``_sync_levels``)."""
        try:
            _, stat = self._call(
                deadline, self._zk.create_async, path, value, ephemeral=ephemeral, include_data=True
            )
            return _node(path, value, stat)
        except kz.NodeExistsError:
            return None
        except kz.NoNodeError:
            pass  # parents usually exist, so only pay for them when they are missing
        for _ in range(_COMMIT_ATTEMPTS):
            parents = self._missing_ancestors(deadline, path, set())
            ops = [self._create_op(a, b"", False) for a in parents]
            ops.append(self._create_op(path, value, ephemeral))
            results, zxid = self._multi(deadline, ops)
            failed = _first_error(results)
            if failed is None:
                return Node(path, value, 0, zxid, zxid, ephemeral)
            index, exc = failed
            if index == len(ops) - 1 and isinstance(exc, kz.NodeExistsError):
                return None
            if isinstance(exc, kz.NoChildrenForEphemeralsError):
                raise exc
            # a parent appeared or vanished meanwhile: look again
        raise StoreError(f"create {path}: its parents kept changing concurrently; try again")

    def _commit(self, deadline: float, ops: list[Op]) -> CommitResult:
        targets = {op.path for op in ops if isinstance(op, Create | Put)}
        # path -> guard to use instead of create+delete of the path itself:
        # ("pair", first missing ancestor) or ("exists", ephemeral ancestor)
        guards: dict[str, tuple[str, str]] = {}
        parents: set[str] = set()  # missing parents of created nodes, made in the multi
        # Put(existing=True) paths found missing: pre-read like any Put from now on
        reread: set[str] = set()
        last_contended = ops[0].path if ops else None
        for _ in range(_COMMIT_ATTEMPTS):
            plan = self._plan(deadline, ops, guards, parents, reread)
            if isinstance(plan, CommitResult):
                return plan
            zk_ops, origins = plan
            results, zxid = self._multi(deadline, zk_ops)
            failed = _first_error(results)
            if failed is None:
                return CommitResult(True, revision=zxid)
            index, exc = failed
            kind, op, zk_path = origins[index]
            if kind == "guard" and isinstance(exc, kz.NoChildrenForEphemeralsError):
                # nothing can live below an ephemeral node: its existence is the guard
                _mode, g = guards.get(op.path, ("pair", op.path))
                guards[op.path] = ("exists", _parent(g))
                continue
            if isinstance(exc, kz.NoChildrenForEphemeralsError):
                raise exc
            if isinstance(exc, kz.NotEmptyError):
                raise StoreError(f"commit cannot delete {op.path}: it has children (delete leaves)")
            if (
                isinstance(exc, kz.NoNodeError)
                and kind in ("user", "create", "parent")
                and (isinstance(op, Create | Put))
            ):
                parents.update(self._missing_ancestors(deadline, zk_path, targets))
                continue
            if kind == "existing" and isinstance(exc, kz.NoNodeError):
                reread.add(op.path)  # the hint was wrong: the node is gone
                continue
            if kind == "parent" and isinstance(exc, kz.NodeExistsError):
                parents.discard(zk_path)  # someone else made it meanwhile
                continue
            if kind == "user":
                return CommitResult(False, failed_path=op.path)
            if kind == "guard" and isinstance(exc, kz.NoNodeError):
                guards[op.path] = ("pair", self._absent_guard(deadline, op.path))
                continue
            if kind == "guard" and isinstance(exc, kz.NodeExistsError):
                if isinstance(op, Check) and zk_path == op.path:
                    return CommitResult(False, failed_path=op.path)  # it exists
                guards.pop(op.path, None)  # a missing ancestor appeared: plan again
                continue
            # an operation derived from the pre-read failed: the store changed, re-read
            last_contended = op.path
        return CommitResult(False, failed_path=last_contended)

    def _absent_guard(self, deadline: float, path: str) -> str:
        """The path whose create+delete proves ``path`` absent when its parent is missing:
        the first missing ancestor segment (nothing can be below a missing node)."""
        missing = self._missing_ancestors(deadline, path, set())
        return missing[0] if missing else path

    def _plan(
        self,
        deadline: float,
        ops: list[Op],
        guards: dict[str, tuple[str, str]],
        parents: set[str],
        reread: set[str] | None = None,
    ) -> CommitResult | tuple[list[Any], list[tuple[str, Op, str]]]:
        """Pre-read what the conditions need and build the multi, checks first; or a
        failed result when a condition is already false. Origins say, per multi
        operation, why it is there: (kind, user op, path)."""
        zk = self._zk
        reread = reread or set()

        def blind(op: Op) -> bool:
            # a Put of a node the writer says exists (persistent): set it natively
            return (
                isinstance(op, Put) and op.existing and not op.ephemeral and op.path not in reread
            )

        # Paths that exist if the commit applies at all: a bare existence check on
        # the path or on one of its descendants (it comes first in the multi and
        # fails it otherwise). Deleting them needs no pre-read.
        known = {op.path for op in ops if _bare_exists(op)}
        present = known | {a for p in known for a in _ancestors(p)}

        def native_delete(op: Op) -> bool:
            return isinstance(op, Delete) and op.path in present and op.path != "/"

        need = {
            op.path
            for op in ops
            if (isinstance(op, Put) and not blind(op))
            or (isinstance(op, Delete) and not native_delete(op))
            or (
                isinstance(op, Check)
                and op.version is None
                and not _bare_exists(op)
                and op.exists is not False
            )
        }
        sent = {p: self._send(zk.get_async, p) for p in sorted(need)}
        seen: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        for p, ar in sent.items():
            try:
                seen[p] = self._wait(ar, deadline)
            except kz.NoNodeError:
                seen[p] = None
        checks: list[tuple[Any, tuple[str, Op, str]]] = []
        writes: list[tuple[Any, tuple[str, Op, str]]] = []
        made: set[str] = set()

        def guard(op: Op) -> None:
            mode, g = guards.get(op.path, ("pair", op.path))
            if mode == "exists":
                checks.append((zkproto.CheckVersion(self._full(g), -1), ("guard", op, g)))
                return
            acl = self._acl or OPEN_ACL_UNSAFE
            checks.append((zkproto.Create(self._full(g), b"", acl, 0), ("guard", op, g)))
            checks.append((zkproto.Delete(self._full(g), -1), ("guard", op, g)))

        def create(op: Create | Put, kind: str) -> None:
            for a in _ancestors(op.path):
                if a in parents and a not in made:
                    made.add(a)
                    writes.append((self._create_op(a, b"", False), ("parent", op, a)))
            writes.append((self._create_op(op.path, op.value, op.ephemeral), (kind, op, op.path)))

        for op in ops:
            full = self._full(op.path)
            if isinstance(op, Check):
                if op.version is not None:
                    checks.append((zkproto.CheckVersion(full, op.version), ("user", op, op.path)))
                    continue
                if _bare_exists(op):
                    # version -1 checks existence only: native, no pre-read
                    checks.append((zkproto.CheckVersion(full, -1), ("user", op, op.path)))
                    continue
                if op.exists is False:
                    # the guard itself fails when the node exists: no pre-read
                    guard(op)
                    continue
                got = seen[op.path]
                if got is None:
                    return CommitResult(False, failed_path=op.path)
                value, stat = got
                if (op.value is not None and value != op.value) or (
                    op.created_revision is not None and stat.czxid != op.created_revision
                ):
                    return CommitResult(False, failed_path=op.path)
                checks.append((zkproto.CheckVersion(full, stat.version), ("derived", op, op.path)))
            elif isinstance(op, Create):
                create(op, "user")
            elif isinstance(op, Put) and blind(op) and op.path not in seen:
                writes.append((zkproto.SetData(full, op.value, -1), ("existing", op, op.path)))
            elif isinstance(op, Put):
                got = seen[op.path]
                if got is None:
                    create(op, "create")
                    continue
                stat = got[1]
                if stat.ephemeralOwner == self._wanted_owner(op.ephemeral):
                    writes.append(
                        (zkproto.SetData(full, op.value, stat.version), ("derived", op, op.path))
                    )
                else:
                    writes.append((zkproto.Delete(full, stat.version), ("derived", op, op.path)))
                    writes.append(
                        (
                            self._create_op(op.path, op.value, op.ephemeral),
                            ("derived", op, op.path),
                        )
                    )
            elif native_delete(op):
                writes.append((zkproto.Delete(full, -1), ("user", op, op.path)))
            elif seen[op.path] is None:
                guard(op)
            else:
                writes.append((zkproto.Delete(full, -1), ("derived", op, op.path)))
        both = checks + writes
        return [z for z, _ in both], [o for _, o in both]

    def _walk(
        self, deadline: float, root: str, *, with_data: bool
    ) -> dict[str, tuple[bytes, ZnodeStat] | None]:
        """The subtree at ``root`` in breadth-first order, one pipelined batch per level."""
        zk = self._zk
        out: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        level = [root]
        while level:
            sent = [
                (
                    p,
                    self._send(zk.get_async, p) if with_data else None,
                    self._send(zk.get_children_async, p),
                )
                for p in level
            ]
            level = []
            for p, data_ar, kids_ar in sent:
                try:
                    data = self._wait(data_ar, deadline) if data_ar is not None else None
                    kids = self._wait(kids_ar, deadline)
                except kz.NoNodeError:
                    continue  # deleted while we walked
                out[p] = data
                level.extend(_child(p, k) for k in sorted(kids))
        return out

    def _prepare_namespace(self, client: KazooClient, deadline: float) -> None:
        with self._errors(self._chroot):
            try:
                # reading the children needs READ: wrong credentials fail here, at start
                self._call(deadline, client.get_children_async, self._chroot)
            except kz.NoNodeError:
                with suppress(kz.NodeExistsError):
                    self._call(deadline, client.create_async, self._chroot, b"")
                self._call(deadline, client.get_children_async, self._chroot)
            else:
                if self._acl is not None:
                    self._check_namespace_acl(client)
        # set_hosts() refuses to change the chroot and start() only warns when it is
        # missing, so the client starts unrooted and is rooted once the node exists
        client.chroot = self._chroot

    def _check_namespace_acl(self, client: KazooClient) -> None:
        """Refuse (or, with ``acl_repair``, repair) an existing namespace whose node or
        top-level nodes any client may use (see the module docstring)."""
        assert self._acl is not None
        s = self._settings
        found, checked = zk_security.find_open_nodes(client, self._chroot, s.operation_timeout)
        if not found:
            return
        path, acls = found[0]
        more = f" (and {len(found) - 1} more of the {checked} nodes checked)" if found[1:] else ""
        if s.acl_repair:
            self.acl_repaired = zk_security.repair_acls(
                client, self._chroot, self._acl, s.operation_timeout
            )
            _log.warning(
                "ZooKeeper namespace %r: node %s had ACL %s%s; acl_repair set user %r's "
                "digest ACL on all %d nodes of the namespace",
                self.namespace,
                path,
                zk_security.describe_acl(acls),
                more,
                s.username,
                self.acl_repaired,
            )
            return
        raise StoreAuthError(
            f"ZooKeeper namespace {self.namespace!r} is open to any client: node {path} "
            f"has ACL {zk_security.describe_acl(acls)}{more}, so a client without "
            "credentials can read, change or delete it (the namespace was first created "
            f"without credentials). Refusing to start with user {s.username!r}. Fix: run "
            "'shardkeeper registry fix-acl' with this registry URL, or add "
            "acl_repair=true to the URL once; either sets the user's digest ACL on every "
            "node of the namespace"
        )

    def _capture_negotiated_timeout(self, client: KazooClient) -> None:
        # kazoo logs the negotiated session timeout but does not keep it; its private
        # _connect returns (read, connect) timeouts with connect = negotiated / #hosts
        conn = getattr(client, "_connection", None)
        original = getattr(conn, "_connect", None)
        if conn is None or original is None:
            return

        def _connect(*args: Any) -> Any:
            read_timeout, connect_timeout = original(*args)
            self._negotiated = connect_timeout * len(client.hosts) / 1000.0
            return read_timeout, connect_timeout

        conn._connect = _connect

    # -- the event thread ---------------------------------------------------------------

    def _on_kazoo_state(self, kstate: str) -> None:
        # runs on kazoo's connection thread: record the session id, hand over, return
        sid = None
        if kstate == KazooState.CONNECTED and self._client is not None:
            cid = self._client.client_id
            sid = cid[0] if cid else None
        self._events.put(("state", kstate, sid))

    def _run(self) -> None:
        while True:
            dirty = any(w.dirty for w in list(self._watches))
            try:
                item = self._events.get(timeout=_DIRTY_RETRY if dirty else None)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if item is not None:
                    self._handle(item)
                if dirty and self._client is not None and self._client.connected:
                    for w in list(self._watches):
                        if w.dirty and not w.cancelled:
                            self._sync(w, [w.prefix], full=True, emit=True)
            except Exception:
                _log.exception("shardkeeper ZooKeeper event thread: unexpected error")

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "watch":
            w, event = item[1], item[2]
            if w.cancelled or event.type == EventType.NONE:
                # NONE: kazoo dropped its watches with the connection; the state
                # event that follows triggers the re-sync
                return
            self._sync(w, [event.path], full=False, data_only=event.type == EventType.CHANGED)
        elif kind == "state":
            self._handle_state(item[1], item[2])
        elif kind == "add_watch":
            w, pending = item[1], item[2]
            try:
                self._add_watch(w)
            except BaseException as e:
                pending.error = e
            pending.done.set()

    def _handle_state(self, kstate: str, sid: int | None) -> None:
        if self._closed:
            return
        if kstate == KazooState.SUSPENDED:
            self._deliver_state(ConnectionState.SUSPENDED)
        elif kstate == KazooState.LOST:
            self._deliver_state(ConnectionState.LOST)
        elif kstate == KazooState.CONNECTED:
            first = self._sid is None
            if not first and sid == self._sid and self._state != ConnectionState.LOST:
                self._deliver_state(ConnectionState.RECONNECTED)
            else:
                if not first and self._state != ConnectionState.LOST:
                    # a new session without a LOST seen: its ephemerals are gone all the same
                    self._deliver_state(ConnectionState.LOST)
                self._sid = sid
                self._deliver_state(ConnectionState.CONNECTED)
            self._first_session.set()
            if not first:
                for w in list(self._watches):
                    if not w.cancelled:
                        self._sync(w, [w.prefix], full=True, emit=True)

    def _deliver_state(self, state: ConnectionState) -> None:
        self._state = state
        with self._lock:
            listeners = list(self._state_listeners)
        for sub, listener in listeners:
            if sub.cancelled:
                continue
            try:
                listener(state)
            except Exception:
                _log.exception("state listener %r failed on %s", listener, state.value)

    def _add_watch(self, w: _TreeWatch) -> None:
        with self._errors(w.prefix):
            self._sync(w, [w.prefix], full=True, emit=False, strict=True)
        with self._lock:
            if self._closed:
                raise StoreUnavailableError(f"ZooKeeper store for {self.namespace!r} is closed")
            if not w.cancelled:  # the caller may have given up waiting
                self._watches.append(w)

    def _unwatch(self, w: _TreeWatch) -> None:
        w.cancelled = True
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _emit(self, w: _TreeWatch, event: WatchEvent) -> None:
        if w.cancelled:
            return
        try:
            w.listener(event)
        except Exception:
            _log.exception("watch listener on %s failed on %s", w.prefix, event)

    def _sync(
        self,
        w: _TreeWatch,
        paths: list[str],
        *,
        full: bool,
        emit: bool = True,
        data_only: bool = False,
        strict: bool = False,
    ) -> None:
        """Re-read ``paths`` (re-arming their watches), diff with the cache, emit, and
        descend into new children (into every child when ``full``). A failed read marks
        the watcher dirty (re-synced later) unless ``strict``, which raises instead."""
        try:
            self._sync_levels(w, paths, full=full, emit=emit, data_only=data_only)
        except (kz.KazooException, KazooTimeoutError, StoreError):
            if strict:
                raise
            _log.debug("watch %s: re-read failed; will re-sync", w.prefix, exc_info=True)
            w.dirty = True
        else:
            if full and paths == [w.prefix]:
                w.dirty = False

    def _sync_levels(
        self, w: _TreeWatch, paths: list[str], *, full: bool, emit: bool, data_only: bool
    ) -> None:
        zk = self._zk
        if w.void:
            return
        level, first = paths, True
        # new empty nodes that had children when read: implicit parents if a child shares
        # their czxid (made in one multi); decided once the next level is read
        undecided: dict[str, tuple[bytes, ZnodeStat]] = {}
        # the undecided nodes with excluded children (not read): their listing's stat
        # and those children, so that _decide can still tell (see _born_with_hidden)
        hidden: dict[str, tuple[ZnodeStat, list[str]]] = {}
        while level and not w.cancelled:
            deadline = self._deadline()
            sent = [
                (
                    p,
                    self._send(zk.get_async, p, watch=w.on_zk),
                    None
                    if data_only and first and p in w.cache
                    else self._send(zk.get_children_async, p, watch=w.on_zk, include_data=True),
                )
                for p in level
            ]
            read: list[tuple[str, tuple[bytes, ZnodeStat] | None, Any]] = []
            for p, data_ar, kids_ar in sent:
                try:
                    got = self._wait(data_ar, deadline)
                    listing = self._wait(kids_ar, deadline) if kids_ar is not None else None
                except kz.NoNodeError:
                    got = listing = None
                read.append((p, got, listing))
            if undecided:
                self._decide(w, undecided, hidden, read, emit)
                undecided, hidden = {}, {}
            # one level may reveal several changes: report them in store order
            read.sort(key=lambda r: r[1][1].mzxid if r[1] is not None else 0)
            level, first = [], False
            for p, got, listing in read:
                if got is None:
                    self._drop(w, p, 0, emit)  # when it went is unknown: see _drop
                    if p == w.prefix:
                        self._watch_absent_prefix(w)
                    continue
                value, stat = got
                old = w.cache.get(p)
                if old is not None and (stat.czxid, stat.mzxid) < old[:2]:
                    # Older than what was reported: never from one session's reads, which
                    # ZooKeeper keeps monotonic, but a path must not go back in time.
                    continue
                if old is not None and old[0] != stat.czxid:
                    # deleted and re-created since we last looked: a new node, and the
                    # delete came before its creation
                    self._drop(w, p, stat.czxid - 1, emit)
                    old = None
                if old is None and listing is None:
                    level.append(p)  # a new node: read it with its children
                    continue
                if p != w.prefix:
                    w.kids.setdefault(_parent(p), set()).add(p)
                if old is None:
                    if value == b"" and stat.version == 0 and listing and listing[0]:
                        undecided[p] = got
                    else:
                        w.cache[p] = (stat.czxid, stat.mzxid, False)
                        self._emit_if(emit, w, EventKind.CREATED, p, value, stat.mzxid)
                elif stat.mzxid > old[1]:
                    w.cache[p] = (stat.czxid, stat.mzxid, False)
                    # a value written onto an implicit parent is, logically, a new node
                    kind = EventKind.CREATED if old[2] else EventKind.CHANGED
                    self._emit_if(emit, w, kind, p, value, stat.mzxid)
                if listing is None:
                    continue
                names, parent_stat = listing
                current = {_child(p, n) for n in names}
                if w.exclude is not None:
                    # dropped here, before anything reads, watches or descends into them
                    out = sorted(c for c in current if w.skips(c))
                    current.difference_update(out)
                    if out and p in undecided:
                        hidden[p] = (parent_stat, out)
                for gone in sorted(w.kids.get(p, set()) - current):
                    self._drop(w, gone, parent_stat.pzxid, emit)
                level.extend(c for c in sorted(current) if full or c not in w.cache)
        if undecided:
            self._decide(w, undecided, hidden, [], emit)

    def _decide(
        self,
        w: _TreeWatch,
        undecided: dict[str, tuple[bytes, ZnodeStat]],
        hidden: dict[str, tuple[ZnodeStat, list[str]]],
        children: list[tuple[str, tuple[bytes, ZnodeStat] | None, Any]],
        emit: bool,
    ) -> None:
        """Settle whether each undecided node is an implicit parent, before any event of
        its children: a child created in the same transaction (same czxid) says so."""
        born_with_child = {
            _parent(p)
            for p, got, _ in children
            if got is not None
            and _parent(p) in undecided
            and got[1].czxid == undecided[_parent(p)][1].czxid
        }
        for p, (value, stat) in undecided.items():
            implicit = p in born_with_child or (
                p in hidden and self._born_with_hidden(stat, *hidden[p])
            )
            w.cache[p] = (stat.czxid, stat.mzxid, implicit)
            if not implicit:
                self._emit_if(emit, w, EventKind.CREATED, p, value, stat.mzxid)

    def _born_with_hidden(self, stat: ZnodeStat, listed: ZnodeStat, kids: list[str]) -> bool:
        """Whether a node was created in one multi with one of its excluded children
        ``kids`` (which the watcher does not read).

        ``listed`` is the node's stat from its listing. A node's pzxid starts at its
        czxid and moves with every child created or deleted, so an unchanged pzxid
        means the children listed were all made with the node: decided without a
        read, the usual case (a runtime's job node born with its first running mark).
        Otherwise the stats of those children are read, once and without a watch."""
        if listed.czxid != stat.czxid:
            # re-created between the two reads: no telling, so it counts as written
            # (as when a visible child of a newer incarnation is read); the data
            # watch fired by the delete re-reads it at once
            return False
        if listed.pzxid == stat.czxid:
            return True
        deadline = self._deadline()
        sent = [self._send(self._zk.exists_async, kid) for kid in kids]
        return any(
            (kid_stat := self._wait(ar, deadline)) is not None and kid_stat.czxid == stat.czxid
            for ar in sent
        )

    def _emit_if(
        self, emit: bool, w: _TreeWatch, kind: EventKind, path: str, value: bytes, rev: int
    ) -> None:
        if emit:
            self._emit(w, WatchEvent(kind, path, value, rev))

    def _watch_absent_prefix(self, w: _TreeWatch) -> None:
        stat = self._call(self._deadline(), self._zk.exists_async, w.prefix, watch=w.on_zk)
        if stat is not None:  # created between our read and the exists watch
            self._sync_levels(w, [w.prefix], full=True, emit=True, data_only=False)

    def _drop(self, w: _TreeWatch, path: str, revision: int, emit: bool) -> None:
        """Forget ``path`` and its cached subtree, emitting DELETED children first
        (implicit parents vanish silently, as they were never reported).

        ZooKeeper does not tell the zxid of a delete. ``revision`` is a bound the
        caller knows to be below any later incarnation of ``path`` (the parent's pzxid
        when the listing missed it, the new czxid - 1 when it was re-created, 0 when
        unknown); it is raised to just above the node's last reported mzxid, so that
        each path's events keep strictly increasing revisions."""
        for kid in sorted(w.kids.pop(path, set())):
            self._drop(w, kid, revision, emit)
        w.kids.get(_parent(path), set()).discard(path)
        seen = w.cache.pop(path, None)
        if emit and seen is not None and not seen[2]:
            rev = max(revision, seen[1] + 1)
            self._emit(w, WatchEvent(EventKind.DELETED, path, None, rev))

    # -- fault hooks (registry.faults.SessionFaults), for tests ------------------------

    def expire_session(self, timeout: float = 15.0) -> None:
        """End the current session on the server: a second client connects with the
        same session id and password and closes it, so the server ends the session
        and deletes its ephemeral nodes; this store learns it at its next contact
        (LOST, then CONNECTED with a new session)."""
        client = self._zk
        client_id = client.client_id
        if client_id is None:
            raise StoreUnavailableError("expire_session: the ZooKeeper store has no session now")
        with self._errors("expire_session"):
            twin = KazooClient(
                hosts=self._settings.hosts_string, client_id=client_id, timeout=timeout
            )
            try:
                twin.start(timeout=timeout)
                twin.stop()
            finally:
                twin.close()

    def drop_connection(self) -> None:
        """Shut the client's socket down: kazoo sees the connection drop and reconnects
        (SUSPENDED, then RECONNECTED while the session lives)."""
        import socket

        sock = getattr(getattr(self._zk, "_connection", None), "_socket", None)
        if sock is None:
            raise StoreUnavailableError("drop_connection: the ZooKeeper store is not connected")
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _bare_exists(op: Op) -> bool:
    """A check of existence alone (no version, value or created revision)."""
    return (
        isinstance(op, Check)
        and op.exists is True
        and op.version is None
        and op.value is None
        and op.created_revision is None
    )


def _first_error(results: list[Any]) -> tuple[int, Exception] | None:
    """The failing operation of a multi: ZooKeeper marks the ones before it rolled back
    and the ones after it inconsistent."""
    for i, r in enumerate(results):
        if isinstance(r, Exception) and not isinstance(
            r, kz.RolledBackError | kz.RuntimeInconsistency
        ):
            return i, r
    if any(isinstance(r, Exception) for r in results):
        return 0, kz.RolledBackError()
    return None
