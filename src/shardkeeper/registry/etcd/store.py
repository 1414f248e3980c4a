"""The etcd store: :class:`EtcdStore` composes its parts and implements the public
methods (start and close, reads, writes, commits and the fault hooks of the tests) on
them; the parts are in the sibling modules (see the package docstring).

Parts
-----
Each part owns its state; they talk through small named interfaces, never through
attributes of the store::

    EtcdStore
      ├─ Transport   (transport.py) the client, members, auth, requests: ALONE
      │              touches the etcd3 client (its private parts: client_private.py)
      │              and turns the parts' request records (records.py) into the
      │              generated messages (messages.py)
      ├─ Session     (session.py)   the lease, its thread, the connection states
      ├─ TreeWatch   (watch.py)     the watches on one stream, their recovery thread
      ├─ Commits     (planner.py)   sends what the pure planner builds (planner.py,
      │                             conditions.py; nesting.py for commit_groups)
      ├─ Keyspace    (keys.py)      paths to keys and back (pure)
      └─ EventLoop   (registry/_events.py) the connection state, events in order

    Transport ──MemberListener.member_left──> TreeWatch
    Session ──StreamRestart.restart_stream──> TreeWatch
    TreeWatch ──SessionCheck.check_soon──> Session
    Commits ──Txns.txn──> Transport

Authentication
--------------
With a user name, :meth:`EtcdStore.start` authenticates and sends the token as gRPC
metadata (the ``etcd3`` client would attach it as call credentials, which gRPC
refuses on a plaintext channel). A token the server forgot (restart, token TTL) is
renewed once and the refused request re-sent. ``start`` also reads the namespace
root key once, because etcd 3.4 grants leases without checking credentials: missing
or wrong credentials fail in ``start``, not at the first read.

Costs
-----
:attr:`EtcdStore.round_trips` counts requests made by the public methods (a
transaction counts 1, each re-sent request too); background keep-alives and watch
recovery are not counted.
"""

from __future__ import annotations

import logging
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
from shardkeeper.registry import reach, tls
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
)
from shardkeeper.registry.batching import plain_commit_groups
from shardkeeper.registry.etcd import nesting
from shardkeeper.registry.etcd.core import RETRY_DELAY, groups_per_commit
from shardkeeper.registry.etcd.keys import (
    Keyspace,
    below_op,
    below_prefix,
    range_op,
    subtree,
    synthetic_node,
)
from shardkeeper.registry.etcd.planner import Commits, PlanContext
from shardkeeper.registry.etcd.records import DeleteRange, Range, Request, Txn
from shardkeeper.registry.etcd.session import Session
from shardkeeper.registry.etcd.transport import Transport
from shardkeeper.registry.etcd.watch import TreeWatch
from shardkeeper.registry.url import RegistrySettings

__all__ = ["EtcdStore"]

_log = logging.getLogger(__name__)
#: gets the failures of listeners on the event thread
_events_log = logging.getLogger("shardkeeper.registry.etcd.session")


class EtcdStore(CoordinationStore):
    """A :class:`CoordinationStore` on etcd v3, composed of its parts (see the module
    docstring).

    Construct with :class:`RegistrySettings` (no I/O), then :meth:`start`. Implements
    the contract, :class:`~shardkeeper.registry.batching.BatchingStore`,
    :class:`~shardkeeper.registry.counting.CountsRequests` and
    :class:`~shardkeeper.registry.faults.SessionFaults`.
    """

    def __init__(self, settings: RegistrySettings) -> None:
        if settings.backend != "etcd":
            raise ConfigError(
                f"EtcdStore needs an etcd:// registry, got backend {settings.backend!r}"
            )
        #: the settings this store was built from (also used by test fault helpers)
        self.settings = settings
        self.namespace = settings.namespace
        #: the URL's max_txn_ops (etcd's --max-txn-ops, default 128)
        self.max_ops_per_commit = settings.max_txn_ops
        #: groups checked apart in one request (nested transactions: nesting.py);
        #: None switches nesting off (commit_groups is then one plain commit)
        self.max_groups_per_commit: int | None = groups_per_commit(settings.max_txn_ops)
        #: under etcd's default request limit (--max-request-bytes, 1.5 MiB), as
        #: commit_bytes counts (generously): room for the request's own framing
        self.max_commit_bytes = 1_400_000
        self._started = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()

        tag = settings.namespace.replace("/", ".")
        self._tag = tag
        # '/' inside a namespace is escaped so that namespace X never sees X/sub
        self._keys = Keyspace.of(settings.namespace)
        # the shared event thread (registry/_events.py): the connection state, and the
        # delivery of state and watch events in the order they are posted
        self._loop = EventLoop(
            f"shardkeeper-etcd-events[{tag}]", ConnectionState.SUSPENDED, log=_events_log
        )
        self._transport = Transport(settings)
        self._session = Session(settings, self._transport, self._loop)
        self._watches = TreeWatch(
            settings, self._transport, self._keys, self._loop, session=self._session
        )
        self._commits = Commits(self._transport, PlanContext(self._keys, self._lease_for))
        # the back-edges, each a small named interface (see the module docstring)
        self._transport.bind(self._watches, lambda: self._session.lease_id)
        self._session.bind(self._watches)

    # -- properties -------------------------------------------------------------------

    def identity(self) -> str:
        """The registry and namespace (``RegistrySettings.identity``)."""
        return self.settings.identity()

    @property
    def lease_id(self) -> int:
        """The id of the current (or last) session lease; 0 before :meth:`start`."""
        return self._session.lease_id

    @property
    def session_id(self) -> str:
        """The current lease id in hex (kept until a new lease replaces it after LOST)."""
        if not self._session.lease_id:
            raise StoreError("the etcd store has no session: call start() first")
        return f"{self._session.lease_id:x}"

    @property
    def state(self) -> ConnectionState:
        """The latest connection state."""
        return self._loop.state

    @property
    def session_timeout(self) -> float:
        """The lease TTL granted by the server, in seconds."""
        return float(self._session.ttl)

    @property
    def operation_timeout(self) -> float:
        """The registry URL's ``operation_timeout``: the longest one request waits."""
        return self.settings.operation_timeout

    @property
    def round_trips(self) -> int:
        """Requests sent by the public methods (see Costs):
        :class:`~shardkeeper.registry.counting.CountsRequests`."""
        return self._transport.round_trips

    @property
    def member_moves(self) -> int:
        """How often the store left a member that could not serve (``Transport.move_on``)."""
        return self._transport.member_moves

    def last_renewal(self) -> float:
        """:meth:`CoordinationStore.last_renewal`: when the latest lease keep-alive
        (or grant) the server answered was sent; ``-inf`` while the store has no
        lease known alive (before the first keep-alive answers, after LOST)."""
        return self._session.last_renewal()

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Connect, authenticate and grant the session lease within the connection timeout.

        Retries an unreachable server until the timeout, then raises
        StoreUnavailableError naming the hosts and the timeout. Bad credentials raise
        StoreAuthError at once.
        """
        with self._lifecycle_lock:
            if self._closed:
                raise StoreError("this etcd store was closed; open a new one")
            if self._started:
                return
            s = self.settings
            transport = self._transport
            transport.connect()
            deadline = time.monotonic() + s.connection_timeout
            attempt = 0
            answers: list[reach.HostAnswer] | None = None
            while True:
                remaining = deadline - time.monotonic()
                try:
                    with transport.translated("start"):
                        if s.username is not None:
                            transport.authenticate(max(remaining, 0.05))
                        # etcd 3.4 grants leases to anybody: a read of our root
                        # key makes missing credentials or permissions fail here
                        # one operation timeout per request: a member that holds
                        # it is left for the next one (see Transport.move_on)
                        transport.read_once(
                            Range(self._keys.key("/"), keys_only=True, limit=1),
                            timeout=self._start_timeout(deadline),
                        )
                        self._session.grant(self._start_timeout(deadline))
                    break
                except (StoreUnavailableError, OperationTimeoutError) as exc:
                    attempt += 1
                    if answers is None:
                        # refused, unknown host, no route: certain now, not after
                        # the timeout (a black hole still waits it: reach.py)
                        answers = reach.probe(
                            s.hosts, min(reach.PROBE_TIMEOUT, s.connection_timeout)
                        )
                        refused = reach.refusal("etcd", answers)
                        if refused is not None:
                            transport.close()
                            raise StoreUnavailableError(refused) from exc
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        transport.close()
                        raise StoreUnavailableError(
                            f"cannot reach etcd at {s.hosts_string} within the connection "
                            f"timeout of {s.connection_timeout:g}s ({attempt} attempts; "
                            f"last error: {exc}){reach.silence_note(answers)}"
                            f"{tls.unreachable_note(s)}"
                        ) from exc
                    time.sleep(min(RETRY_DELAY * attempt, 0.5, remaining))
                except BaseException:
                    transport.close()
                    raise
            # recorded now, delivered on the event thread once it runs
            self._loop.post_state(ConnectionState.CONNECTED)
            self._started = True
            self._loop.start()
            self._watches.start(f"shardkeeper-etcd-watches[{self._tag}]")
            self._session.start(f"shardkeeper-etcd-session[{self._tag}]")

    def _start_timeout(self, deadline: float) -> float:
        return max(min(deadline - time.monotonic(), self.settings.operation_timeout), 0.05)

    def close(self) -> None:
        """Revoke the lease (the server deletes our ephemeral keys at once), stop every
        thread and watch. Idempotent; never raises."""
        with self._lifecycle_lock:
            if self._closed:
                return
            self._closed = True
            if not self._started:
                return
        join_timeout = self.settings.operation_timeout + 1.0
        self._session.stop(join_timeout)
        self._watches.stop(join_timeout)
        lease = self._session.lease_id
        try:
            with self._transport.translated("close: revoke lease"):
                self._session.revoke(lease)
        except StoreError as exc:
            # a lease we cannot revoke simply expires after its TTL
            _log.info("etcd lease %x not revoked at close: %s", lease, exc)
        stream = self._watches.close()
        self._loop.stop(join_timeout)
        self._transport.close()
        # closing the channel ends the stream; wait for the etcd3 stream thread so a
        # closed store leaves no thread behind
        thread = stream.thread() if stream is not None else None
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout)

    # -- watches ----------------------------------------------------------------------

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch the key of ``prefix`` and its subtree on the store's shared stream.

        Events are read from the revision current when this is called, so every later
        change is delivered, except those ``exclude`` rejects (dropped on the event
        thread). Raises StoreUnavailableError if the stream cannot be set up now.
        """
        self._keys.key(prefix)  # (a bad path is refused before the store's state)
        self._require_started()
        return self._watches.watch(prefix, listener, exclude=exclude)

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        return self._loop.add_state_listener(listener)

    # -- reads ------------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``; a synthetic empty node for a pure parent; else None."""
        key = self._keys.key(path)
        resp = self._transport.read(
            f"get {path}",
            Txn(success=(range_op(key), below_op(key, keys_only=True, limit=1))),
        )
        own = resp.responses[0].response_range.kvs
        if own:
            return self._keys.node(own[0])
        if resp.responses[1].response_range.kvs:
            return synthetic_node(path)
        return None

    def exists(self, path: str) -> bool:
        """Whether ``path`` has a key or any key lives below it."""
        key = self._keys.key(path)
        resp = self._transport.read(
            f"exists {path}",
            Txn(
                success=(
                    range_op(key, keys_only=True),
                    below_op(key, keys_only=True, limit=1),
                )
            ),
        )
        return any(r.response_range.kvs for r in resp.responses)

    def children(self, path: str) -> list[str]:
        """Sorted distinct next segments of the keys below ``path``."""
        key = self._keys.key(path)
        below, end = subtree(key)
        resp = self._transport.read(f"children {path}", Range(below, end, keys_only=True))
        start = len(below_prefix(key))
        names = {kv.key[start:].split(b"/", 1)[0].decode() for kv in resp.kvs}
        return sorted(names)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path``, pure parents included as synthetic nodes,
        from one read (a read-only transaction: one request, one revision)."""
        key = self._keys.key(path)
        resp = self._transport.read(f"get_tree {path}", Txn(success=(range_op(key), below_op(key))))
        tree: dict[str, Node] = {}
        for r in resp.responses:
            for kv in r.response_range.kvs:
                node = self._keys.node(kv)
                tree[node.path] = node
        # fill in the implicit parents between ``path`` and each key
        for p in list(tree):
            parent = p
            while parent != path:
                parent = parent.rsplit("/", 1)[0] or "/"
                if parent in tree:
                    break
                tree[parent] = synthetic_node(parent)
        return dict(sorted(tree.items()))

    # -- writes -----------------------------------------------------------------------

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite; the key is attached to our lease iff ``ephemeral``
        (a put without it detaches the key from any lease). One transaction that also
        checks that no ancestor is ephemeral."""
        resp, _ = self._commits.write(
            f"put {path}", [Put(path, value, ephemeral)], self.max_ops_per_commit, prev_kv=True
        )
        if resp is None or not resp.succeeded:
            raise StoreError(f"put {path}: refused by etcd")  # a lone put has no compare
        rev = int(resp.header.revision)
        put = resp.responses[0].response_put
        created = int(put.prev_kv.create_revision) if put.HasField("prev_kv") else rev
        return Node(path, value, rev, rev, created, ephemeral)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Create ``path`` if its key is absent (one transaction); None if it existed."""
        resp, _ = self._commits.write(
            f"create {path}", [Create(path, value, ephemeral)], self.max_ops_per_commit
        )
        if resp is None or not resp.succeeded:
            return None
        rev = int(resp.header.revision)
        return Node(path, value, rev, rev, rev, ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete the key (and, if recursive, the range below it) in one transaction."""
        key = self._keys.key(path)
        ops: list[Request] = [DeleteRange(key)]
        if recursive:
            below, end = subtree(key)
            ops.append(DeleteRange(below, end))
        self._transport.txn(f"delete {path}", success=ops)

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` as one etcd transaction (checks: see ``conditions.py``).

        On failure the same transaction returns the checked keys, so ``failed_path``
        is found without another request and reflects exactly what was compared.
        """
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit of {len(ops)} operations exceeds the limit of "
                f"{self.max_ops_per_commit} (etcd --max-txn-ops); split the work or write "
                "fewer, larger nodes"
            )
        size = self.commit_bytes(ops)
        if self.max_commit_bytes is not None and size > self.max_commit_bytes:
            raise StoreLimitError(
                f"a commit of {len(ops)} operations and about {size} bytes exceeds the "
                f"{self.max_commit_bytes} bytes kept under etcd's request limit "
                "(--max-request-bytes, 1.5 MiB by default); split the work or write "
                "fewer, smaller nodes"
            )
        resp, failed_path = self._commits.write(
            f"commit of {len(ops)} operations", ops, self.max_ops_per_commit
        )
        if resp is not None and resp.succeeded:
            return CommitResult(True, int(resp.header.revision))
        return CommitResult(False, 0, failed_path)

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """What a commit's transaction takes, generously, against ``max_commit_bytes``:
        each operation's key (namespace included) nine times, its value and 32 bytes
        of framing. An absence check is two compares, each with its failure-branch
        read, and every written path's ancestors get guards: a registration-shaped
        commit measured 7.5 key lengths an operation."""
        root = len(self._keys.root)
        return sum(
            9 * (root + len(op.path)) + 32 + (len(op.value) if isinstance(op, Create | Put) else 0)
            for op in ops
        )

    def group_bytes(self, group: Sequence[Op]) -> int:
        """A group's nested transaction, generously (:func:`nesting.group_bytes`)."""
        return nesting.group_bytes(group, len(self._keys.root))

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """``fixed`` as the outer transaction and each group nested in it, checked
        apart (see ``nesting.py``); one request whatever the number of groups, within
        :attr:`max_groups_per_commit` and the byte limit."""
        if not any(groups) or self.max_groups_per_commit is None:
            # nothing to nest, or nesting switched off: one plain commit
            return plain_commit_groups(self, fixed, groups)
        return nesting.commit_groups(self, self._commits, self.max_ops_per_commit, fixed, groups)

    # -- internals --------------------------------------------------------------------

    def _lease_for(self, ephemeral: bool) -> int:
        """The lease a write is attached to: the session's for an ephemeral node."""
        if not ephemeral:
            return 0
        self._require_started()
        return self._session.lease_id

    def _require_started(self) -> None:
        if not self._started or self._closed:
            raise StoreError(
                "the etcd store is not started" if not self._closed else "the etcd store is closed"
            )

    # -- fault hooks (registry.faults.SessionFaults), for tests ------------------------

    def relinquish_session(self) -> None:
        """:meth:`CoordinationStore.relinquish_session` on etcd: the lease stops being
        kept alive at once (the store is LOST from now on, and its session thread
        grants a new lease instead of refreshing the old one: CONNECTED with the new
        ``session_id``), then the old lease is revoked, bounded by the operation
        timeout and the TTL: etcd deletes its keys at once when it can be reached, and
        at the latest one TTL after the last keep-alive it received."""
        self._require_started()
        old = self._session.lease_id
        # LOST first: a keep-alive in flight may still land, none is sent after it
        self._session.set_state(ConnectionState.LOST)
        self._session.check_soon()
        timeout = max(0.5, min(self.settings.operation_timeout, float(self._session.ttl)))
        try:
            with self._transport.translated("relinquish_session: revoke lease"):
                self._session.revoke(old, timeout=timeout)
        except StoreError as exc:
            _log.warning(
                "etcd session lease %x could not be revoked now (%s): it runs out within its TTL",
                old,
                exc,
            )

    def expire_session(self, timeout: float = 15.0) -> None:
        """End the current session on the server: revoke its lease (etcd deletes every
        key attached to it at once). The session thread is woken to find the lease
        gone: LOST, then CONNECTED with a new lease."""
        self._require_started()
        with self._transport.translated("expire_session: revoke lease"):
            self._session.revoke(self._session.lease_id, timeout=timeout)
        self._session.check_soon()

    def hold_requests(self, on: bool) -> None:
        """Fault hook (tests): a gray link. While on, every request (reads, commits, a
        lease's revoke) waits unsent and fails with OperationTimeoutError at its
        deadline, while the session's lease keep-alives and the watch stream go on
        (the proxy cannot hold etcd's requests apart from its keep-alives: one HTTP/2
        connection carries both)."""
        self._transport.hold_requests(on)

    def drop_connection(self) -> None:
        """Close the gRPC channel in use and put a new one in its place: requests and
        the watch stream in flight fail, the next ones connect again. The store reports
        SUSPENDED now and RECONNECTED at its next keep-alive (the lease lives on, the
        watches resume from their last revision)."""
        self._require_started()
        self._transport.drop_connection()
        if self._loop.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            self._session.set_state(ConnectionState.SUSPENDED)
        self._session.check_soon()
