"""The ZooKeeper store: :class:`ZooKeeperStore` composes its parts and implements the
public methods (start and close, reads, writes, commits, watches and the fault hooks
of the tests) on them; each part is in a sibling module (see the package docstring).

Parts
-----
Each part owns its state; they talk through small named interfaces, never through
attributes of the store::

    ZooKeeperStore
      ├─ Transport   (transport.py) the kazoo client and every request: ALONE touches
      │              the client (kazoo's private names: kazoo_private.py)
      ├─ Session     (session.py)   connection states, the session id, the namespace
      │                             node, credentials, relinquish
      ├─ TreeWatch   (watch.py)     one recursive watch per prefix, the drains and
      │                             re-reads on the event thread
      ├─ Commits     (planner.py)   pre-reads and sends what the PURE planner builds
      │                             (plan.py), retries
      ├─ Reads       (reads.py)     many nodes in one multiRead, subtrees by level
      ├─ OwnedEphemerals (owned.py) our ephemeral nodes of known incarnation
      └─ EventLoop   (registry/_events.py) the connection state, events in order

    Transport ──ConnectionListener.kazoo_state/negotiated──> Session
    Transport ──MultiListener.notified/take_off/applied/landed──> TreeWatch
    Session ──Resync.resync_all──> TreeWatch
    Commits ──Coverage.covered──> TreeWatch
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from kazoo import exceptions as kz

from shardkeeper.errors import (
    ConfigError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry import reach, tls
from shardkeeper.registry._events import EventLoop, Retry
from shardkeeper.registry.base import (
    Check,
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
from shardkeeper.registry.batching import plain_commit_groups
from shardkeeper.registry.clock import ServerTime
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.errors import _first_error
from shardkeeper.registry.zookeeper.nodes import _node
from shardkeeper.registry.zookeeper.owned import OwnedEphemerals
from shardkeeper.registry.zookeeper.planner import COMMIT_ATTEMPTS, Commits
from shardkeeper.registry.zookeeper.reads import Reads
from shardkeeper.registry.zookeeper.session import Session
from shardkeeper.registry.zookeeper.transport import Transport
from shardkeeper.registry.zookeeper.watch import DIRTY_RETRY, TreeWatch

__all__ = ["ZooKeeperStore"]

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")

_T = TypeVar("_T")

#: ZooKeeper refuses packets over jute.maxbuffer (1 MiB - 1) by dropping the
#: connection, which would suspend every user of the session: refuse earlier
_MAX_PAYLOAD = 1_000_000


class ZooKeeperStore(CoordinationStore):
    """The :class:`CoordinationStore` on a ZooKeeper ensemble, composed of its parts
    (see the module docstring and the package docstring).

    Construct with :class:`RegistrySettings` (no I/O), then :meth:`start`. Implements
    the contract, :class:`~shardkeeper.registry.batching.BatchingStore`,
    :class:`~shardkeeper.registry.counting.CountsRequests`,
    :class:`~shardkeeper.registry.faults.SessionFaults` and
    :class:`~shardkeeper.registry.clock.ServerClock`.
    """

    #: ZooKeeper has no operation limit for a multi, only its request size
    #: (jute.maxbuffer, 1 MiB), which :meth:`commit` checks (``max_commit_bytes``): 4,096
    #: operations carry the start or the completion of a 1,000-item batch (a check, a
    #: delete and a result write per item) in one commit, where etcd's default of 128
    #: takes 8 and 24; the runtime packs by both limits (``registry/packing.py``)
    max_ops_per_commit = 4096

    #: what the runtime packs a commit's operations to (``registry/packing.py``): the
    #: multi itself may add missing parents, unknown before it is planned, so the
    #: budget leaves a fifth of the request limit for them; the multi as sent is
    #: checked against the request limit itself (``transport.py``, ``multi``)
    max_commit_bytes = 800_000

    def __init__(self, settings: RegistrySettings) -> None:
        self._settings = settings
        self.namespace = settings.namespace
        self._lifecycle_lock = threading.Lock()
        self._closed = False
        #: our ephemeral nodes whose incarnation is known (owned.py): their
        #: created-revision checks need no pre-read
        self._owned = OwnedEphemerals()
        self._transport = Transport(settings)
        #: built below, over the event loop whose idle retry re-syncs its dirty watches
        self._watches: TreeWatch
        # the shared event thread (registry/_events.py): kazoo's callbacks only post to
        # it; it retries the re-sync of dirty watchers while idle (watch.py)
        self._loop = EventLoop(
            f"shardkeeper-zk-events[{self.namespace}]",
            ConnectionState.LOST,
            log=_log,
            retry=Retry(
                lambda: self._watches.dirty(), lambda: self._watches.resync_dirty(), DIRTY_RETRY
            ),
        )
        self._session = Session(settings, self._transport, self._loop, self._owned)
        self._reads = Reads(self._transport)
        self._watches = TreeWatch(settings, self._transport, self._reads, self._loop, self._owned)
        self._commits = Commits(
            self._transport, self._reads, self._owned, self._watches, self._session.acl
        )
        # the back-edges, each a small named interface (see the module docstring)
        self._transport.bind(self._session, self._watches)
        self._session.bind(self._watches)

    # -- properties -------------------------------------------------------------------

    def identity(self) -> str:
        """The registry and namespace (``RegistrySettings.identity``)."""
        return self._settings.identity()

    @property
    def session_id(self) -> str:
        """The ZooKeeper session id in hex (``''`` before the first session)."""
        return self._session.session_id

    @property
    def state(self) -> ConnectionState:
        """The latest connection state, as delivered to state listeners."""
        return self._loop.state

    @property
    def session_timeout(self) -> float:
        """The session timeout the server negotiated, in seconds."""
        return self._session.session_timeout

    @property
    def operation_timeout(self) -> float:
        """The registry URL's ``operation_timeout``: the longest one request waits."""
        return self._settings.operation_timeout

    @property
    def round_trips(self) -> int:
        """Requests sent so far (a multi counts as one): :class:`CountsRequests`."""
        return self._transport.round_trips

    @property
    def acl_repaired(self) -> int:
        """Nodes whose ACL the last repair set (``acl_repair`` at start, or
        :meth:`repair_acl`)."""
        return self._session.acl_repaired

    @property
    def kazoo_client(self) -> Any:
        """The underlying KazooClient, for the ZooKeeper backend's own tests (ACLs
        set by hand, the socket of the fault tests); nothing outside
        ``registry/zookeeper/`` uses it."""
        return self._transport.client

    # -- the server's clock (registry.clock.ServerClock) -------------------------------

    def server_time(self, path: str, value: bytes) -> ServerTime | None:
        """:class:`~shardkeeper.registry.clock.ServerClock`: write ``value`` on the
        existing clock node ``path`` (one request through the transport, not counted in
        :attr:`round_trips`) and return the leader's ``mtime`` of the write, to the
        millisecond; None when ``path`` does not exist."""
        t = self._transport
        with t.errors(f"clock sample (set {path})"):
            try:
                stat = t.stamp(path, value)
            except kz.NoNodeError:
                return None
        return ServerTime(stat.mtime / 1000.0, 0.001, "zookeeper mtime")

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Connect, create the namespace node if absent and check our credentials on it."""
        t = self._transport
        if t.closed:
            raise StoreUnavailableError(
                f"ZooKeeper store for namespace {self.namespace!r} is closed; open a new one"
            )
        if t.started:
            return
        s = self._settings
        t.connect(self._session.acl)
        self._loop.start()
        deadline = time.monotonic() + s.connection_timeout
        t.start()
        answers: list[reach.HostAnswer] = []
        if not self._session.wait_first(min(reach.PROBE_AFTER, s.connection_timeout)):
            # refused, unknown host, no route: certain now, not after the timeout
            answers = reach.probe(s.hosts, min(reach.PROBE_TIMEOUT, s.connection_timeout))
            refused = reach.refusal("ZooKeeper", answers)
            if refused is not None and not self._session.wait_first(0):
                self.close()
                raise StoreUnavailableError(refused)
        if not self._session.wait_first(max(deadline - time.monotonic(), 0.0)):
            self.close()
            raise StoreUnavailableError(
                f"cannot reach ZooKeeper at {s.hosts_string} within the connection "
                f"timeout of {s.connection_timeout:g}s{reach.silence_note(answers)}"
                f"{tls.unreachable_note(s)}"
            )
        try:
            self._session.prepare_namespace(max(deadline, time.monotonic() + 0.5))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the session, stop the event thread and every watch; idempotent."""
        with self._lifecycle_lock:
            if self._closed:
                return
            self._closed = True
            self._transport.refuse()
        self._watches.close()
        self._transport.close()
        self._loop.stop(self._settings.operation_timeout + 1)
        self._loop.record(ConnectionState.LOST)

    def repair_acl(self) -> int:
        """Set this store's digest ACL on every node of the namespace (top-down, the
        namespace node included); return how many nodes. Needs credentials."""
        return self._session.repair_acl()

    # -- watches ----------------------------------------------------------------------

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch every change at or below ``prefix`` (established when this returns),
        leaving out the subtrees ``exclude`` rejects without reading them (``watch.py``)."""
        return self._watches.watch(prefix, listener, exclude=exclude)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        return self._loop.add_state_listener(listener)

    # -- batching (registry.batching.BatchingStore) -----------------------------------

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """What :meth:`commit` counts against ``max_commit_bytes``: every operation's
        full path (the namespace node included), its value and its framing (a create's
        header, lengths, flags and digest ACL; less for a check or delete; an absence
        check is sent as a guard create and delete)."""
        full = self._transport.full
        size = 0
        for op in ops:
            length = len(full(op.path))
            if isinstance(op, Create | Put):
                size += length + kazoo_private.CREATE_FRAMING + len(op.value)
            elif isinstance(op, Check) and op.exists is False:
                size += 2 * length + kazoo_private.CREATE_FRAMING + kazoo_private.SMALL_OP_FRAMING
            else:
                size += length + kazoo_private.SMALL_OP_FRAMING
        return size

    def group_bytes(self, group: Sequence[Op]) -> int:
        """A group goes into the one plain multi: :meth:`commit_bytes`."""
        return self.commit_bytes(group)

    #: groups are not checked apart: ``commit_groups`` is one plain multi
    max_groups_per_commit: int | None = None

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """One plain multi of everything (ZooKeeper has no nested transaction): one
        failed check refuses it all (:func:`~shardkeeper.registry.batching.plain_commit_groups`)."""
        return plain_commit_groups(self, fixed, groups)

    # -- reads -----------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``, or None."""
        check_path(path)

        def read(dl: float) -> Node | None:
            try:
                data, stat = self._transport.get(dl, path)
            except kz.NoNodeError:
                return None
            return _node(path, data, stat)

        return self._read(path, read)

    def exists(self, path: str) -> bool:
        """Whether a node exists at ``path`` (ZooKeeper keeps parents as real nodes)."""
        check_path(path)
        return self._read(path, lambda dl: self._transport.exists(dl, path) is not None)

    def children(self, path: str) -> list[str]:
        """Sorted names of the children of ``path``; empty if it does not exist."""
        check_path(path)

        def read(dl: float) -> list[str]:
            try:
                return sorted(self._transport.children(dl, path))
            except kz.NoNodeError:
                return []

        return self._read(path, read)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path``, read level by level with pipelined requests."""
        check_path(path)

        def read(dl: float) -> dict[str, Node]:
            tree = self._reads.walk(dl, path, with_data=True)
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
        with self._transport.errors(what):
            deadline = self._transport.deadline()
            try:
                return read(deadline)
            except kz.ConnectionLoss:
                if time.monotonic() >= deadline:
                    raise
                _log.info("ZooKeeper read of %s lost its connection; reading again", what)
            return read(deadline)

    # -- writes ----------------------------------------------------------------------

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite ``path``; afterwards it is ephemeral (ours) iff asked."""
        check_path(path)
        _check_payload(path, len(value))
        if ephemeral and path == "/":
            raise ConfigError("the namespace root '/' cannot be ephemeral")
        t = self._transport
        with t.errors(path):
            dl = t.deadline()
            for _ in range(COMMIT_ATTEMPTS):
                try:
                    stat = t.set(dl, path, value)
                except kz.NoNodeError:
                    created = self._commits.create_node(dl, path, value, ephemeral)
                    if created is not None:
                        return created
                    continue  # created by someone else meanwhile: overwrite it
                ctx = self._commits.context()
                if stat.ephemeralOwner == ctx.wanted_owner(ephemeral):
                    return _node(path, value, stat)
                # wrong kind: replace it in one multi, guarded by the version just written
                results, zxid = t.multi(
                    dl,
                    [
                        kazoo_private.delete_op(t.full(path), stat.version),
                        ctx.create(path, value, ephemeral),
                    ],
                )
                if _first_error(results) is None:
                    return Node(path, value, 0, zxid, zxid, ephemeral)
            raise StoreError(f"put {path}: the node kept changing concurrently; try again")

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Create ``path`` if absent (parents made persistent); None if it existed."""
        check_path(path)
        _check_payload(path, len(value))
        if path == "/":
            return None
        t = self._transport
        with t.errors(path):
            return self._commits.create_node(t.deadline(), path, value, ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete ``path`` (and its subtree if recursive); ``/`` keeps the namespace node."""
        check_path(path)
        t = self._transport
        with t.errors(path):
            dl = t.deadline()
            if not recursive:
                if path == "/":
                    if t.children(dl, path):
                        raise StoreError("cannot delete '/': it has children (use recursive)")
                    return
                try:
                    t.delete(dl, path)
                except kz.NoNodeError:
                    pass
                except kz.NotEmptyError:
                    raise StoreError(
                        f"cannot delete {path}: it has children (use recursive=True)"
                    ) from None
                return
            for _ in range(COMMIT_ATTEMPTS):
                tree = self._reads.walk(dl, path, with_data=False)
                tree.pop("/", None)
                by_depth: dict[int, list[str]] = {}
                for p in tree:
                    by_depth.setdefault(p.count("/"), []).append(p)
                try:
                    for depth in sorted(by_depth, reverse=True):
                        sent = [t.send_delete(p) for p in by_depth[depth]]
                        for ar in sent:
                            with suppress(kz.NoNodeError):
                                t.wait(ar, dl)
                    return
                except kz.NotEmptyError:
                    continue  # a child appeared while we walked: walk again
            raise StoreError(f"delete {path}: children kept appearing concurrently")

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` in one ZooKeeper multi (see the table in ``planner.py``)."""
        ops = list(ops)
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit carries at most {self.max_ops_per_commit} operations; got {len(ops)}"
            )
        for op in ops:
            check_path(op.path)
            if isinstance(op, Create | Put) and op.ephemeral and op.path == "/":
                raise ConfigError("the namespace root '/' cannot be ephemeral")
        # the path, the ACL and the framing of every operation count too: a thousand
        # creates are about a seventh of the request limit
        size = self.commit_bytes(ops)
        if size > self.max_commit_bytes:
            raise StoreLimitError(
                f"commit: {size} bytes (values, and paths and framing of its "
                f"operations) exceed what a commit may carry under ZooKeeper's request "
                f"limit; keep them under {self.max_commit_bytes} bytes in total"
            )
        t = self._transport
        with t.errors("commit"):
            return self._commits.commit(t.deadline(), ops)

    # -- giving the session up (the gray link: runtime/health/graylink.py) ---------------------

    def relinquish_session(self) -> None:
        """:meth:`CoordinationStore.relinquish_session` on ZooKeeper.

        First the session stops being renewed, whatever the link does: kazoo forgets
        its id and password and its connection is cut, so it connects again asking
        for a NEW session and nothing pings the old one (the server ends it one
        session timeout after its last ping at the latest). Then the old session is
        closed on the server now, by a second client holding its id and password (as
        :meth:`expire_session`), given a quarter of the session timeout (at most the
        operation timeout): its ephemeral nodes go at once when the server can be
        reached. A close that gets no reply in that time is given up and the second
        client's connection cut, because attaching to the session renewed it: the
        server then ends it at most T/4 + T after this call. The store reports
        SUSPENDED, LOST, then CONNECTED with the new session."""
        self._session.relinquish()

    # -- fault hooks (registry.faults.SessionFaults), for tests ------------------------

    def expire_session(self, timeout: float = 15.0) -> None:
        """End the current session on the server: a second client connects with the
        same session id and password and closes it, so the server ends the session
        and deletes its ephemeral nodes; this store learns it at its next contact
        (LOST, then CONNECTED with a new session)."""
        self._session.expire(timeout)

    def drop_connection(self) -> None:
        """Shut the client's socket down: kazoo sees the connection drop and reconnects
        (SUSPENDED, then RECONNECTED while the session lives)."""
        self._session.drop_connection()


def _check_payload(what: str, size: int) -> None:
    if size > _MAX_PAYLOAD:
        raise StoreLimitError(
            f"{what}: {size} bytes (values, and paths and framing of a commit's "
            f"operations) exceed ZooKeeper's request limit; keep them under "
            f"{_MAX_PAYLOAD} bytes in total"
        )
