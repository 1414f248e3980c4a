"""The etcd backend of :class:`~shardkeeper.registry.base.CoordinationStore` (etcd v3 API).

Built on the ``etcd3`` package (cslab-etcd3): its client manages the gRPC channels
and endpoint failover, its ``Watcher`` multiplexes every watch of a store over ONE
gRPC watch stream. Requests are sent through the client's stubs with explicit
protobuf messages so that every call carries the operation timeout and the response
header (the store revision) is available.

Mapping onto etcd's flat keyspace
---------------------------------
* Node ``/a/b`` of namespace ``ns`` is the key ``/ns/a/b``; the root ``/`` is the
  key ``/ns/``. A ``/`` inside the namespace is escaped as ``%2F`` (namespace
  ``prod/orders`` -> ``/prod%2Forders/a/b``) so that namespace ``prod`` never sees
  ``prod/orders``. The subtree of a key ``K`` is the range ``[K + '/', K + '0')``
  (``'0'`` follows ``'/'`` in ASCII), so namespace ``a`` never sees ``ab`` and ``/x``
  never matches ``/xy``; the subtree of the root key ``/ns/`` is ``[/ns/ + '\0',
  /ns0)`` (see ``_subtree``). So every key and range the store reads, writes, compares
  or watches lies inside the prefix ``/ns/``: an etcd role granted
  ``--prefix /ns/`` (which, unlike ``--prefix /ns``, does not also cover namespace
  ``nsX``) is all a user needs.
* Parents are implicit. A *pure parent* is a path with no key of its own but keys
  below it: ``exists`` is true, ``children`` lists it, ``get`` and ``get_tree``
  return it as a synthetic node ``Node(path, b"", version=0, revision=0,
  created_revision=0)``. It vanishes with its last descendant.
* ``Node.version`` and ``Node.revision`` are the key's ``mod_revision``,
  ``created_revision`` its ``create_revision``, ``ephemeral`` is ``lease != 0``.
* Checks and creates see pure parents, as ``exists`` does. etcd compares support a
  key range (``range_end``): the compare must hold for every key in it, and an empty
  range compares as one zero KeyValue (version 0). So "absent" (``create``, ``Create``,
  ``Check(exists=False)``) is ``version(K) == 0`` AND ``version([K/, K0)) == 0``: no
  own key and nothing below (never ``[K, K0)``, which also holds siblings such as
  ``K-x``). "Exists" would be an OR, which a transaction cannot express (it ANDs its
  compares): ``Check(exists=True)`` is sent as ``version(K) > 0``, and when the failure
  branch's reads show a pure parent, the transaction is sent again with
  ``version([K/, K0)) > 0`` (one more request, only for a pure parent).
  ``Check(version=v)``, ``Check(value=b)`` and ``Check(created_revision=r)`` look at
  the own key: a pure parent has no version, value or creation of its own, and
  ``v``/``r`` <= 0 never pass (synthetic numbers do not identify a real node).
* Compares and the failure branch's reads each count against etcd's 128 operations
  per transaction. An exact absence takes two compares; when a commit has no room for
  that (e.g. 128 ``Create``), the last absences take a compact form: a pre-read at
  revision R finds no key at K nor below it, and one compare ``create_revision <
  R + 1`` over ``[K, K0)`` says no key of that range was created since (a sibling
  such as ``K-x`` created since fails it spuriously: read again and re-send). Only
  such large commits pay the extra read. See ``_Condition``.
* Checks see the state before the commit. etcd refuses a transaction that writes
  one key twice, so repeated writes of a path are folded into their net effect.
* "An ephemeral node cannot have children": every write also compares ``lease == 0``
  on each strict ancestor (one compare per distinct ancestor, in the same
  transaction) and raises StoreError when one is ephemeral. The guards use what is
  left of the 128 operations after the checks and creates; in a commit that exceeds
  them, the farthest ancestors are not guarded.

Sessions
--------
The session is ONE lease per store (TTL = ``session_timeout`` rounded up to whole
seconds; the server may raise it to its minimum), refreshed by the store's session
thread every TTL/3. Every ephemeral key is attached to it. Each refresh attempt waits
at most TTL/4; one that fails on a member that cannot serve is sent again at once to
the next member (see Members below). A refresh that failed on every member ->
SUSPENDED; the next successful one -> RECONNECTED; a refresh that finds the lease gone
(TTL <= 0: expired or revoked) -> LOST, then a new lease is granted -> CONNECTED with
the new ``session_id`` (the lease id in hex).

Members
-------
The client starts on a random endpoint of the URL and stays there until a request, a
refresh or the watch stream fails in a way that means "this member cannot serve": no
answer within the deadline, UNAVAILABLE (unreachable, "no leader", "leader changed",
"request timed out") or CANCELLED. :meth:`EtcdStore._move_on` then marks it failed
(for the endpoint's ``time_retry``, 0.5 s) and switches to the next endpoint in URL
order that is not marked, and re-creates the watch stream there if it ran on the member
left. Every request carries etcd's "require leader" metadata, so a member cut off from
its peers (it still accepts connections, but cannot commit nor serve a linearizable
read) refuses at once with "no leader" once it notices, instead of holding requests
until their deadline, and cancels its watch streams after a few election timeouts.
Reads stay linearizable: serializable ones would be served stale by such a member.

Threads
-------
Fixed per store, whatever the number of watches: the event thread (delivers watch
and state events in order), the session thread (keep-alive, watch recovery) and,
while any watch exists, the ``etcd3`` watch-stream thread, whose callbacks only
enqueue. Each watch remembers the last revision it received; after the stream
breaks (or after a reconnect) it is re-created from ``last revision + 1``. If that
revision was compacted, the listener gets RESYNC and CREATED for the current state.
A watch's ``exclude`` filter is applied on the event thread to every event, the
RESYNC replay included: the server still streams the excluded changes on the same
stream (no request is added, and the watch's resume revision keeps moving with them).

Authentication
--------------
With a user name, :meth:`EtcdStore.start` authenticates and sends the token as gRPC
metadata (the ``etcd3`` client would attach it as call credentials, which gRPC
refuses on a plaintext channel). A token the server forgot (restart, token TTL) is
renewed once and the refused request re-sent. ``start`` also reads the namespace
root key once, because etcd 3.4 grants leases without checking credentials: missing
or wrong credentials fail in ``start``, not at the first read.

Errors and costs
----------------
Every request carries ``operation_timeout``. gRPC errors are translated in one place
(:meth:`EtcdStore._translated`): DEADLINE_EXCEEDED and etcd's own "request timed
out" -> OperationTimeoutError (outcome unknown); UNAVAILABLE -> StoreUnavailableError
(a write that failed so may have been applied too: re-read, never re-send blindly);
UNAUTHENTICATED, PERMISSION_DENIED and refused credentials -> StoreAuthError; too many
operations or a request too large -> StoreLimitError; a lost lease -> SessionLostError.

Reads (``get``, ``exists``, ``children``, ``get_tree``) are re-sent when that is safe
and useful, within their one operation timeout: at once to the next member after a
failure that means the member cannot serve (a read fails fast when every member was
found dead; each attempt gets half the time left, so a member that holds it leaves
time for another), pausing 0.2 s after each round of "no leader"/"leader changed"
refusals while the cluster elects a leader. Writes are never re-sent: a commit whose
outcome is unknown raises OperationTimeoutError, and only the NEXT request goes to
another member. See :meth:`EtcdStore._read`.

:attr:`EtcdStore.round_trips` counts requests made by the public methods (a
transaction counts 1, each re-sent request too); background keep-alives and watch
recovery are not counted.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import etcd3
import etcd3.etcdrpc as rpc
import etcd3.events
import etcd3.exceptions
import etcd3.watch
import grpc

from shardkeeper.errors import (
    ConfigError,
    OperationTimeoutError,
    SessionLostError,
    ShardkeeperError,
    StoreAuthError,
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
from shardkeeper.registry.url import RegistrySettings

__all__ = ["EtcdStore"]

_log = logging.getLogger(__name__)

# gRPC's default reconnect backoff grows to two minutes: after a long outage the
# channel would sit idle long after the server is back. Cap it at one second.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
#: pause between attempts while the server is unreachable (session thread, start)
_RETRY_DELAY = 0.2

_STUB_CLASSES: dict[str, Callable[[Any], Any]] = {
    "kvstub": rpc.KVStub,
    "leasestub": rpc.LeaseStub,
    "authstub": rpc.AuthStub,
}

_EQUAL = rpc.Compare.EQUAL
_GREATER = rpc.Compare.GREATER
_LESS = rpc.Compare.LESS

#: how often a commit is re-sent when a condition needs another form (see _Condition)
_COMMIT_ATTEMPTS = 8


def _is_stale_token(exc: grpc.RpcError) -> bool:
    # The server forgets simple auth tokens on restart and after their TTL; the
    # request was refused before being applied, so re-authenticating and sending it
    # again is safe.
    details = (exc.details() or "").lower()
    return (exc.code() == grpc.StatusCode.UNAUTHENTICATED and "invalid auth token" in details) or (
        exc.code() == grpc.StatusCode.INVALID_ARGUMENT and "auth store is old" in details
    )


#: gRPC metadata of every request: etcd's "require leader". A member that has no
#: leader (cut off from its peers, or during an election) then refuses the request at
#: once with "etcdserver: no leader" instead of holding it until the deadline, and
#: cancels a watch stream after a few election timeouts without a leader (a member
#: with no leader receives no changes: its watches would fall silent).
_REQUIRE_LEADER = ("hasleader", "true")

#: gRPC codes that mean "the member that got this request cannot serve it now": no
#: answer within the deadline, unreachable, no leader, leader changed, "request timed
#: out", or the channel closed under the request. The next request goes to another.
_CANNOT_SERVE = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
    }
)


def _cannot_serve(exc: grpc.RpcError) -> bool:
    """Whether ``exc`` says its member cannot serve now (see ``_CANNOT_SERVE``)."""
    return exc.code() in _CANNOT_SERVE


def _during_election(exc: BaseException) -> bool:
    """Whether ``exc`` (a gRPC error, or one translated from it) is a live member
    refusing a request because it has no leader ("no leader": cut off from its peers,
    or its cluster elects one; "leader changed"): the request was not served."""
    cause = exc if isinstance(exc, grpc.RpcError) else exc.__cause__
    if not isinstance(cause, grpc.RpcError) or cause.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (cause.details() or "").lower()
    return "leader changed" in details or "no leader" in details


def _attempt_timeout(remaining: float, several: bool) -> float:
    """The deadline of one attempt of a read that may be sent again: with other
    members to try, half of what is left (at least 0.5 s, or all of it), so that a
    member that holds the read without answering leaves time to ask another."""
    if not several or remaining <= 1.0:
        return remaining
    return remaining / 2


class _WatchStub:
    """The watch stub of one channel, keeping the stream call so that a watcher
    replaced by another can end its stream (the server keeps a stream whose client
    only stopped sending, and its thread would live on)."""

    def __init__(self, channel: Any) -> None:
        self._stub = rpc.WatchStub(channel)
        self.call: Any = None

    def Watch(self, *args: Any, **kwargs: Any) -> Any:  # the gRPC method name
        self.call = self._stub.Watch(*args, **kwargs)
        return self.call

    def cancel(self) -> None:
        """End the stream (its thread gets CANCELLED and stops)."""
        call = self.call
        if call is not None:
            with contextlib.suppress(Exception):
                call.cancel()


def _range_op(key: bytes, end: bytes | None = None, *, keys_only: bool = False) -> Any:
    req = rpc.RangeRequest(key=key, keys_only=keys_only)
    if end is not None:
        req.range_end = end
    return rpc.RequestOp(request_range=req)


@dataclass(eq=False)
class _Watch:
    """One subscription: an etcd watch on ``[key, end)``, filtered to the subtree."""

    prefix: str
    key: bytes
    end: bytes
    listener: WatchListener
    #: highest revision received (events up to it are enqueued); resume from +1
    last_rev: int = 0
    #: bumped on every (re)creation: responses of an older generation are ignored
    gen: int = 0
    watch_id: int | None = None
    watcher: Any = None
    cancelled: bool = False
    #: the server reported our start revision compacted: resume needs a RESYNC
    compacted: bool = False
    subscription: Subscription | None = field(default=None, repr=False)
    #: subtrees whose events are dropped before delivery (the watch's ``exclude``)
    exclude: PathFilter | None = None

    def covers(self, key: bytes) -> bool:
        # the etcd range [K, K0) also holds siblings such as K-x and K.x
        return _in_subtree(self.key, key, own=True)

    def leaves_out(self, event: WatchEvent) -> bool:
        """Whether ``event`` falls in an excluded subtree (a filter that raises
        excludes nothing: it must not take the event thread down)."""
        if self.exclude is None:
            return False
        try:
            return is_excluded(event.path, self.exclude)
        except Exception:
            _log.exception("watch %s: exclude filter failed on %s", self.prefix, event.path)
            return False


class EtcdStore(CoordinationStore):
    """A :class:`CoordinationStore` on etcd v3 (see the module docstring for the mapping).

    Construct with :class:`RegistrySettings` (no I/O), then :meth:`start`.
    """

    def __init__(self, settings: RegistrySettings) -> None:
        if settings.backend != "etcd":
            raise ConfigError(
                f"EtcdStore needs an etcd:// registry, got backend {settings.backend!r}"
            )
        #: the settings this store was built from (also used by test fault helpers)
        self.settings = settings
        self.namespace = settings.namespace
        # '/' inside a namespace is escaped so that namespace X never sees X/sub
        self._root = "/" + settings.namespace.strip("/").replace("/", "%2F")
        self._ttl_wanted = max(1, math.ceil(settings.session_timeout))
        self._ttl = self._ttl_wanted
        self._client: Any = None
        self._lease = 0
        #: monotonic time the lease runs out unless refreshed (as last known)
        self._lease_until = 0.0
        #: recent keep-alive answer time (moving average, seconds)
        self._keep_alive_latency = 0.0
        self._state = ConnectionState.SUSPENDED
        self._started = False
        self._closed = False
        self._lifecycle_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._round_trips = 0
        self._auth_lock = threading.Lock()
        self._stubs: dict[str, tuple[Any, Any]] = {}
        # guards the choice of the endpoint in use (see _move_on)
        self._endpoint_lock = threading.Lock()
        #: how often the store left a member that could not serve (see _move_on)
        self.member_moves = 0

        self._events: queue.Queue[tuple[str, Any, Any] | None] = queue.Queue()
        self._event_thread: threading.Thread | None = None
        self._session_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._check_session_now = False

        self._state_listeners: dict[int, StateListener] = {}
        self._next_listener_id = 0
        # guards watch bookkeeping; never held while waiting on the server
        self._wlock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._pending: set[_Watch] = set()
        self._watcher: Any = None
        self._watcher_broken = False
        # the endpoint and stub of the current watcher's stream
        self._watcher_endpoint: Any = None
        self._watcher_stub: _WatchStub | None = None

    # -- properties -------------------------------------------------------------------

    @property
    def lease_id(self) -> int:
        """The id of the current (or last) session lease; 0 before :meth:`start`."""
        return self._lease

    @property
    def session_id(self) -> str:
        """The current lease id in hex (kept until a new lease replaces it after LOST)."""
        if not self._lease:
            raise StoreError("the etcd store has no session: call start() first")
        return f"{self._lease:x}"

    @property
    def state(self) -> ConnectionState:
        """The latest connection state."""
        return self._state

    @property
    def session_timeout(self) -> float:
        """The lease TTL granted by the server, in seconds."""
        return float(self._ttl)

    @property
    def round_trips(self) -> int:
        """Requests sent by the public methods (see the module docstring)."""
        return self._round_trips

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
            endpoints = [
                etcd3.Endpoint(host, port, secure=False, time_retry=0.5, opts=_CHANNEL_OPTIONS)
                for host, port in s.hosts
            ]
            # user/password are NOT given to the client: it would attach the token as
            # call credentials, which gRPC refuses on a plaintext channel. We send the
            # token as metadata ourselves (see _authenticate).
            self._client = etcd3.MultiEndpointEtcd3Client(
                endpoints=endpoints, timeout=s.operation_timeout, failover=True
            )
            # (the client starts on a random endpoint: the instances of a job spread
            # over the members, as ZooKeeper clients do)
            deadline = time.monotonic() + s.connection_timeout
            attempt = 0
            while True:
                remaining = deadline - time.monotonic()
                try:
                    with self._translated("start"):
                        if s.username is not None:
                            self._authenticate(max(remaining, 0.05))
                        # etcd 3.4 grants leases to anybody: a read of our root
                        # key makes missing credentials or permissions fail here
                        # one operation timeout per request: a member that holds
                        # it is left for the next one (see _move_on)
                        self._send(
                            "kvstub",
                            "Range",
                            rpc.RangeRequest(key=self._key("/"), keys_only=True, limit=1),
                            timeout=self._start_timeout(deadline),
                        )
                        grant = self._send(
                            "leasestub",
                            "LeaseGrant",
                            rpc.LeaseGrantRequest(TTL=self._ttl_wanted),
                            timeout=self._start_timeout(deadline),
                        )
                    break
                except (StoreUnavailableError, OperationTimeoutError) as exc:
                    attempt += 1
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._client.close()
                        raise StoreUnavailableError(
                            f"cannot reach etcd at {s.hosts_string} within the connection "
                            f"timeout of {s.connection_timeout:g} s ({attempt} attempts; "
                            f"last error: {exc})"
                        ) from exc
                    time.sleep(min(_RETRY_DELAY * attempt, 0.5, remaining))
                except BaseException:
                    self._client.close()
                    raise
            self._lease = int(grant.ID)
            self._ttl = int(grant.TTL) or self._ttl_wanted
            self._lease_until = time.monotonic() + self._ttl
            self._state = ConnectionState.CONNECTED
            self._started = True
            tag = self.namespace.replace("/", ".")
            self._event_thread = threading.Thread(
                target=self._run_events, name=f"shardkeeper-etcd-events[{tag}]", daemon=True
            )
            self._session_thread = threading.Thread(
                target=self._run_session, name=f"shardkeeper-etcd-session[{tag}]", daemon=True
            )
            self._event_thread.start()
            self._session_thread.start()
            self._emit_state(ConnectionState.CONNECTED)

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
        me = threading.current_thread()
        self._stopping.set()
        self._wake.set()
        join_timeout = self.settings.operation_timeout + 1.0
        if self._session_thread is not None and self._session_thread is not me:
            self._session_thread.join(join_timeout)
        try:
            with self._translated("close: revoke lease"):
                self._send("leasestub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=self._lease))
        except StoreError as exc:
            # a lease we cannot revoke simply expires after its TTL
            _log.info("etcd lease %x not revoked at close: %s", self._lease, exc)
        with self._wlock:
            watcher, self._watcher = self._watcher, None
            watch_stub, self._watcher_stub = self._watcher_stub, None
            for w in self._watches:
                w.cancelled = True
            self._watches.clear()
            self._pending.clear()
        _end_watcher(watcher, watch_stub)
        self._events.put(None)
        if self._event_thread is not None and self._event_thread is not me:
            self._event_thread.join(join_timeout)
        with contextlib.suppress(Exception):
            self._client.close()
        # closing the channel ends the stream; wait for the etcd3 stream thread so a
        # closed store leaves no thread behind
        stream_thread = getattr(watcher, "_callback_thread", None)
        if isinstance(stream_thread, threading.Thread) and stream_thread is not me:
            stream_thread.join(join_timeout)

    # -- reads ------------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``; a synthetic empty node for a pure parent; else None."""
        key = self._key(path)
        resp = self._read(
            f"get {path}",
            "Txn",
            rpc.TxnRequest(success=[_range_op(key), self._below_op(key, keys_only=True, limit=1)]),
        )
        own = resp.responses[0].response_range.kvs
        if own:
            return self._node(own[0])
        if resp.responses[1].response_range.kvs:
            return _synthetic(path)
        return None

    def exists(self, path: str) -> bool:
        """Whether ``path`` has a key or any key lives below it."""
        key = self._key(path)
        resp = self._read(
            f"exists {path}",
            "Txn",
            rpc.TxnRequest(
                success=[
                    _range_op(key, keys_only=True),
                    self._below_op(key, keys_only=True, limit=1),
                ]
            ),
        )
        return any(r.response_range.kvs for r in resp.responses)

    def children(self, path: str) -> list[str]:
        """Sorted distinct next segments of the keys below ``path``."""
        key = self._key(path)
        below, end = _subtree(key)
        req = rpc.RangeRequest(key=below, range_end=end, keys_only=True)
        resp = self._read(f"children {path}", "Range", req)
        start = len(_below_prefix(key))
        names = {kv.key[start:].split(b"/", 1)[0].decode() for kv in resp.kvs}
        return sorted(names)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path``, pure parents included as synthetic nodes,
        from one read (a read-only transaction: one request, one revision)."""
        key = self._key(path)
        resp = self._read(
            f"get_tree {path}", "Txn", rpc.TxnRequest(success=[_range_op(key), self._below_op(key)])
        )
        tree: dict[str, Node] = {}
        for r in resp.responses:
            for kv in r.response_range.kvs:
                node = self._node(kv)
                tree[node.path] = node
        # fill in the implicit parents between ``path`` and each key
        for p in list(tree):
            parent = p
            while parent != path:
                parent = parent.rsplit("/", 1)[0] or "/"
                if parent in tree:
                    break
                tree[parent] = _synthetic(parent)
        return dict(sorted(tree.items()))

    # -- writes -----------------------------------------------------------------------

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite; the key is attached to our lease iff ``ephemeral``
        (a put without it detaches the key from any lease). One transaction that also
        checks that no ancestor is ephemeral."""
        resp, _ = self._write(f"put {path}", [Put(path, value, ephemeral)], prev_kv=True)
        if resp is None or not resp.succeeded:
            raise StoreError(f"put {path}: refused by etcd")  # a lone put has no compare
        rev = int(resp.header.revision)
        put = resp.responses[0].response_put
        created = int(put.prev_kv.create_revision) if put.HasField("prev_kv") else rev
        return Node(path, value, rev, rev, created, ephemeral)

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Create ``path`` if its key is absent (one transaction); None if it existed."""
        resp, _ = self._write(f"create {path}", [Create(path, value, ephemeral)])
        if resp is None or not resp.succeeded:
            return None
        rev = int(resp.header.revision)
        return Node(path, value, rev, rev, rev, ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete the key (and, if recursive, the range below it) in one transaction."""
        key = self._key(path)
        ops = [rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))]
        if recursive:
            below, end = _subtree(key)
            ops.append(
                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=below, range_end=end))
            )
        self._txn(f"delete {path}", success=ops)

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` as one etcd transaction (see the module docstring for checks).

        On failure the same transaction returns the checked keys, so ``failed_path``
        is found without another request and reflects exactly what was compared.
        """
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit of {len(ops)} operations exceeds the limit of "
                f"{self.max_ops_per_commit} (etcd --max-txn-ops); split the work or write "
                "fewer, larger nodes"
            )
        resp, failed_path = self._write(f"commit of {len(ops)} operations", ops)
        if resp is not None and resp.succeeded:
            return CommitResult(True, int(resp.header.revision))
        return CommitResult(False, 0, failed_path)

    def _write(
        self, what: str, ops: Sequence[Op], *, prev_kv: bool = False
    ) -> tuple[Any, str | None]:
        """Send ``ops`` as one transaction; return the response (None when the commit
        cannot succeed and nothing was sent) and, if it failed, the path of the first
        condition found false.

        Checks are evaluated on the state before the commit. etcd refuses a
        transaction that writes one key twice, so several writes of one path are
        folded into their net effect (Delete then Create -> put without a compare;
        Create after a write of the same path -> the commit fails).

        Conditions see pure parents (see :class:`_Condition`). One that needs another
        form (a pure parent checked for existence, a sibling that spoiled a compact
        absence compare) has the transaction re-sent, at most ``_COMMIT_ATTEMPTS``
        times; then the commit fails naming that path. Besides the conditions the ops
        ask for, every strict ancestor of a written path must have no lease (an
        ephemeral node cannot have children); a write below an ephemeral node raises
        StoreError. Ancestor guards are added, nearest parents first, while the
        compares and the failure-branch reads stay within etcd's 128 operations.
        """
        conditions: dict[object, _Condition] = {}
        # path -> net write: (value, ephemeral) to put, or None to delete
        final: dict[str, tuple[bytes, bool] | None] = {}
        doomed: str | None = None
        for op in ops:
            key = self._key(op.path)
            if isinstance(op, Check):
                cond = _Condition.for_check(key, op)
                conditions.setdefault(cond.identity(op), cond)
            elif isinstance(op, Delete):
                final[op.path] = None
            elif isinstance(op, Create | Put):
                if op.ephemeral and op.path == "/":
                    raise ConfigError("the namespace root '/' cannot be ephemeral")
                if isinstance(op, Create):
                    if op.path not in final:
                        cond = _Condition(op.path, key, "absent")
                        conditions.setdefault(cond.identity(op), cond)
                    elif final[op.path] is not None and doomed is None:
                        doomed = op.path  # created after being written in this commit
                final[op.path] = (op.value, op.ephemeral)
            else:
                raise ConfigError(f"unknown commit operation {op!r}")
        success: list[Any] = []
        guarded: dict[str, None] = {}
        for path, write in final.items():
            key = self._key(path)
            if write is None:
                success.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key)))
                continue
            value, ephemeral = write
            put = rpc.PutRequest(
                key=key, value=value, lease=self._lease_for(ephemeral), prev_kv=prev_kv
            )
            success.append(rpc.RequestOp(request_put=put))
            for ancestor in _ancestors(path):
                guarded.setdefault(ancestor, None)
                # an ephemeral node this commit writes cannot receive children in it
                parent = final.get(ancestor)
                if parent is not None and parent[1]:
                    raise StoreError(
                        f"{what}: cannot write {path!r}: {ancestor!r} is ephemeral and an "
                        "ephemeral node cannot have children"
                    )
        if doomed is not None:
            return None, doomed
        conds = list(conditions.values())
        limit = self.max_ops_per_commit
        # Every condition costs at least one compare and one read, an exact absence two
        # of each. When they do not all fit, the absences last in op order take the
        # compact form (one compare, after a pre-read).
        slack = limit - len(conds)
        for cond in conds:
            if cond.kind == "absent":
                cond.compact = slack <= 0
                slack -= 1
        resp: Any = None
        contended = conds[0].path if conds else None
        for _attempt in range(_COMMIT_ATTEMPTS):
            refuted = self._read_absences(what, [c for c in conds if c.compact and c.since < 0])
            if refuted is not None:
                return None, refuted
            compares = [cmp for c in conds for cmp in c.compares()]
            probes = [p for c in conds for p in c.probes()]
            room = limit - max(len(compares), len(probes))
            guards = list(guarded)[: max(room, 0)]
            room -= len(guards)
            # spare reads let a failed existence check tell its two forms apart at once
            spare = [c for c in conds if c.kind == "exists"][: max(room, 0)]
            for ancestor in guards:
                key = self._key(ancestor)
                compares.append(
                    rpc.Compare(key=key, target=rpc.Compare.LEASE, result=_EQUAL, lease=0)
                )
                probes.append(rpc.RangeRequest(key=key, keys_only=True))
            probes.extend(c.other_probe() for c in spare)
            resp = self._txn(
                what,
                compare=compares,
                success=success,
                failure=[rpc.RequestOp(request_range=p) for p in probes],
            )
            if resp.succeeded:
                return resp, None
            reads = iter([list(r.response_range.kvs) for r in resp.responses])
            cond_reads = [[next(reads) for _ in c.probes()] for c in conds]
            for ancestor in guards:
                kvs = next(reads)
                if kvs and kvs[0].lease != 0:
                    child = next(
                        p
                        for p, w in final.items()
                        if w is not None and p.startswith(ancestor + "/")
                    )
                    raise StoreError(
                        f"{what}: cannot write {child!r}: {ancestor!r} is an ephemeral node and "
                        "an ephemeral node cannot have children"
                    )
            spare_reads = {id(c): next(reads) for c in spare}
            retry = False
            for cond, got in zip(conds, cond_reads, strict=True):
                verdict = cond.judge(got, spare_reads.get(id(cond)))
                if verdict is _Verdict.FALSE:
                    return resp, cond.path
                if verdict is _Verdict.RETRY and not retry:
                    retry, contended = True, cond.path
            if not retry:
                return resp, None
        return resp, contended

    def _read_absences(self, what: str, conds: list[_Condition]) -> str | None:
        """The pre-read of compact absence conditions: note the revision at which each
        path had no key and nothing below it, or return the first path that had."""
        per_txn = self.max_ops_per_commit // 2  # two reads per path
        for i in range(0, len(conds), per_txn):
            chunk = conds[i : i + per_txn]
            reads = [
                rpc.RequestOp(request_range=r)
                for c in chunk
                for r in (_own_range(c.key), _below_range(c.key))
            ]
            resp = self._txn(f"{what}: read before the commit", success=reads)
            for j, c in enumerate(chunk):
                if any(resp.responses[2 * j + k].response_range.kvs for k in (0, 1)):
                    return c.path
                c.since = int(resp.header.revision)
        return None

    # -- watches and listeners --------------------------------------------------------

    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Watch the key of ``prefix`` and its subtree on the store's shared stream.

        Events are read from the revision current when this is called, so every later
        change is delivered, except those ``exclude`` rejects (dropped on the event
        thread). Raises StoreUnavailableError if the stream cannot be set up now.
        """
        key = self._key(prefix)
        self._require_started()
        req = rpc.RangeRequest(key=key, keys_only=True, limit=1)
        rev = int(self._read(f"watch {prefix}", "Range", req).header.revision)
        w = _Watch(
            prefix=prefix,
            key=key,
            end=_subtree(key)[1],  # [K, K0): the node and its subtree (and siblings)
            listener=listener,
            last_rev=rev,
            exclude=exclude,
        )
        with self._wlock:
            self._watches.add(w)
        try:
            if not self._establish(w, counted=True):
                # compacted between our read and the watch: start from the current state
                self._resync(w)
        except BaseException:
            with self._wlock:
                self._watches.discard(w)
            raise
        w.subscription = Subscription(functools.partial(self._cancel_watch, w))
        return w.subscription

    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
        with self._wlock:
            lid = self._next_listener_id
            self._next_listener_id += 1
            self._state_listeners[lid] = listener
        return Subscription(functools.partial(self._remove_state_listener, lid))

    def _remove_state_listener(self, lid: int) -> None:
        with self._wlock:
            self._state_listeners.pop(lid, None)

    # -- internals: keys and nodes ----------------------------------------------------

    def _key(self, path: str) -> bytes:
        check_path(path)
        # the root's key ends with '/' so that it too lies inside the namespace prefix
        return (self._root + path).encode()

    def _path(self, key: bytes) -> str:
        return key.decode()[len(self._root) :] or "/"

    def _node(self, kv: Any) -> Node:
        return Node(
            path=self._path(kv.key),
            value=bytes(kv.value),
            version=int(kv.mod_revision),
            revision=int(kv.mod_revision),
            created_revision=int(kv.create_revision),
            ephemeral=kv.lease != 0,
        )

    @staticmethod
    def _below_op(key: bytes, *, keys_only: bool = False, limit: int = 0) -> Any:
        below, end = _subtree(key)
        req = rpc.RangeRequest(key=below, range_end=end, keys_only=keys_only)
        req.limit = limit
        return rpc.RequestOp(request_range=req)

    def _lease_for(self, ephemeral: bool) -> int:
        if not ephemeral:
            return 0
        self._require_started()
        return self._lease

    def _require_started(self) -> None:
        if not self._started or self._closed:
            raise StoreError(
                "the etcd store is not started" if not self._closed else "the etcd store is closed"
            )

    # -- internals: requests and error translation ------------------------------------

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        """THE boundary: turn grpc/etcd3 exceptions into shardkeeper errors."""
        try:
            yield
        except ShardkeeperError:
            raise
        except grpc.RpcError as exc:
            raise self._error_for(exc, what) from exc
        except etcd3.exceptions.NoServerAvailableError as exc:
            raise StoreUnavailableError(
                f"{what}: no etcd endpoint of {self.settings.hosts_string} is reachable"
            ) from exc
        except etcd3.exceptions.WatchTimedOut as exc:
            raise OperationTimeoutError(
                f"{what}: etcd at {self.settings.hosts_string} did not confirm the watch "
                f"within {self.settings.operation_timeout:g} s"
            ) from exc
        except etcd3.exceptions.Etcd3Exception as exc:
            raise StoreError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def _error_for(self, exc: grpc.RpcError, what: str) -> StoreError:
        code = exc.code()
        details = exc.details() or str(code)
        low = details.lower()
        hosts = self.settings.hosts_string
        if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
            code == grpc.StatusCode.UNAVAILABLE and "timed out" in low
        ):
            return OperationTimeoutError(
                f"{what}: no answer from etcd at {hosts} within "
                f"{self.settings.operation_timeout:g} s ({details}); the outcome is unknown"
            )
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
            return StoreUnavailableError(f"{what}: etcd at {hosts} is unavailable: {details}")
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or (
            code == grpc.StatusCode.INVALID_ARGUMENT
            and ("authentication failed" in low or "user name is empty" in low)
        ):
            user = self.settings.username
            who = f"user {user!r}" if user else "no credentials (give user:password in the URL)"
            return StoreAuthError(f"{what}: etcd at {hosts} refused {who}: {details}")
        if code == grpc.StatusCode.INVALID_ARGUMENT and (
            "too many operations" in low or "too large" in low
        ):
            return StoreLimitError(f"{what}: refused by etcd: {details}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return StoreLimitError(f"{what}: refused by etcd: {details}")
        if code == grpc.StatusCode.NOT_FOUND and "lease not found" in low:
            return SessionLostError(
                f"{what}: the session lease {self._lease:x} has expired; wait for CONNECTED "
                "and retry"
            )
        return StoreError(f"{what}: etcd error {code.name}: {details}")

    def _move_on(self, endpoint: Any, reason: object) -> None:
        """Leave ``endpoint``, whose member could not serve a request (``reason``),
        for the next one in the URL's order that has not failed in the last
        ``time_retry`` (0.5 s); when all have, the one that failed longest ago.

        Only the endpoint still in use is left: when several requests fail on one
        member, the first moves and the others find the move done. A watch stream on
        the member left is re-created on the new one from its last revisions (nothing
        lost): a member with no leader gets no changes, its watches would fall silent.
        With one endpoint there is nowhere to go: nothing happens.
        """
        client = self._client
        if client is None or len(client.endpoints) < 2:
            return
        with self._endpoint_lock:
            if client.endpoint_in_use is not endpoint:
                return
            endpoint.fail()
            labels = list(client.endpoints)
            at = labels.index(endpoint.netloc)
            order = [client.endpoints[x] for x in labels[at + 1 :] + labels[:at]]
            nxt = next((e for e in order if not e.is_failed()), None)
            if nxt is None:
                nxt = min(order, key=lambda e: e.last_failed)
                nxt.last_failed = 0
            client._current_endpoint_label = nxt.netloc
            self.member_moves += 1
        _log.info("etcd: leaving member %s for %s: %s", endpoint.netloc, nxt.netloc, reason)
        with self._wlock:
            stale = self._watcher is not None and self._watcher_endpoint is endpoint
        if stale:
            self._restart_watch_stream()
            self._wake.set()

    def _endpoint(self) -> tuple[Any, Any]:
        """The endpoint to use now and its channel."""
        with self._endpoint_lock:
            channel = self._client.channel
            return self._client.endpoint_in_use, channel

    def _stub(self, name: str) -> tuple[Any, Any]:
        """The endpoint to use now and the stub ``name`` on its channel.

        The client's own stub properties are cached across endpoint changes; asking
        for the channel each time follows :meth:`_move_on`.
        """
        endpoint, channel = self._endpoint()
        cached = self._stubs.get(name)
        if cached is not None and cached[0] is channel:
            return endpoint, cached[1]
        stub = _STUB_CLASSES[name](channel)
        self._stubs[name] = (channel, stub)
        return endpoint, stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """Every request's metadata: require a leader, and the auth token if any."""
        token = self._client.metadata
        return (_REQUIRE_LEADER, *(token or ()))

    def _count(self) -> None:
        with self._count_lock:
            self._round_trips += 1

    def _send(
        self,
        stub: str,
        method: str,
        request: Any,
        *,
        counted: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """One unary request with the operation timeout and our auth token; re-sends
        once after re-authenticating when the server forgot the token. A member that
        cannot serve it is left: the NEXT request goes to another (this one is not
        re-sent here). Call it inside :meth:`_translated`."""
        limit = self.settings.operation_timeout if timeout is None else timeout
        for attempt in (1, 2):
            if counted:
                self._count()
            endpoint, grpc_stub = self._stub(stub)
            try:
                return getattr(grpc_stub, method)(request, limit, metadata=self._metadata())
            except grpc.RpcError as exc:
                if attempt == 1 and self.settings.username is not None and _is_stale_token(exc):
                    self._authenticate(limit)
                    continue
                if _cannot_serve(exc):
                    self._move_on(endpoint, f"{method}: {exc.code().name} {exc.details()}")
                raise
        raise AssertionError("unreachable")

    def _read(self, what: str, method: str, request: Any) -> Any:
        """Send a read-only KV request, re-sending it while that is safe and useful,
        all within one operation timeout.

        A read a member cannot serve is sent again at once to the next member
        (:meth:`_send` has moved on, see :meth:`_move_on`):

        * a member that just died fails it at once with UNAVAILABLE; when every
          member was found dead in this read, it fails at once too;
        * a member with no leader (cut off from its peers, or while its cluster elects
          one) refuses it at once with "no leader" (see ``_REQUIRE_LEADER``) or
          "leader changed"; after a whole round of such refusals the next round waits
          ``_RETRY_DELAY``;
        * a member that holds it without answering (it has not noticed yet that it
          lost its peers) is given half of the time left, so that another member can
          still be asked (:func:`_attempt_timeout`).

        Reads stay linearizable: a serializable read would be answered from its own,
        possibly stale, data by a member cut off from its peers. A read changes nothing,
        so sending it again is safe. Writes are never re-sent: a write that failed so
        may have been applied.
        """
        deadline = time.monotonic() + self.settings.operation_timeout
        members = len(self._client.endpoints)
        refused = dead = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                with self._translated(what):
                    return self._send(
                        "kvstub",
                        method,
                        request,
                        counted=True,
                        timeout=max(_attempt_timeout(remaining, members > 1), 0.01),
                    )
            except (StoreUnavailableError, OperationTimeoutError) as exc:
                election = _during_election(exc)
                if isinstance(exc, StoreUnavailableError) and not election:
                    dead += 1
                if (members == 1 and not election) or dead >= members:
                    raise  # nowhere else to go, or every member is down
                refused += 1
                pause = _RETRY_DELAY if refused % members == 0 else 0.0
                if deadline - time.monotonic() <= pause + 0.01:
                    raise
                _log.info("etcd: %s; reading again", exc)
                if pause:
                    time.sleep(pause)

    def _txn(
        self,
        what: str,
        *,
        compare: Sequence[Any] = (),
        success: Sequence[Any] = (),
        failure: Sequence[Any] = (),
    ) -> Any:
        req = rpc.TxnRequest(compare=compare, success=success, failure=failure)
        with self._translated(what):
            return self._send("kvstub", "Txn", req, counted=True)

    def _authenticate(self, timeout: float) -> None:
        with self._auth_lock:
            req = rpc.AuthenticateRequest(
                name=self.settings.username, password=self.settings.password or ""
            )
            endpoint, stub = self._stub("authstub")
            try:
                resp = stub.Authenticate(req, timeout, metadata=(_REQUIRE_LEADER,))
            except grpc.RpcError as exc:
                if _cannot_serve(exc):
                    self._move_on(endpoint, f"Authenticate: {exc.code().name} {exc.details()}")
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # "authentication is not enabled": the server accepts everyone
                    _log.warning(
                        "etcd at %s has authentication disabled; ignoring the credentials",
                        self.settings.hosts_string,
                    )
                    self._client.metadata = None
                    return
                raise
            self._client.metadata = (("token", resp.token),)

    # -- internals: session ------------------------------------------------------------

    def _run_session(self) -> None:
        next_check = time.monotonic() + self._ttl / 3
        while not self._stopping.is_set():
            delay = next_check - time.monotonic()
            with self._wlock:
                if self._pending:
                    delay = min(delay, _RETRY_DELAY)
            if delay > 0 and not self._check_session_now:
                self._wake.wait(delay)
            self._wake.clear()
            if self._stopping.is_set():
                return
            if self._check_session_now or time.monotonic() >= next_check:
                self._check_session_now = False
                try:
                    next_check = time.monotonic() + self._session_step()
                except Exception:
                    _log.exception("etcd session check failed unexpectedly")
                    next_check = time.monotonic() + _RETRY_DELAY
            try:
                self._restore_watches()
            except Exception:
                _log.exception("etcd watch recovery failed unexpectedly")

    def _session_step(self) -> float:
        """Refresh (or replace) the lease; return the delay until the next step."""
        if self._state is ConnectionState.LOST:
            try:
                with self._translated("grant a new session lease"):
                    grant = self._send(
                        "leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=self._ttl_wanted)
                    )
            except StoreError as exc:
                _log.info("etcd: no new session lease yet: %s", exc)
                return _RETRY_DELAY
            self._lease = int(grant.ID)
            self._ttl = int(grant.TTL) or self._ttl_wanted
            self._lease_until = time.monotonic() + self._ttl
            self._set_state(ConnectionState.CONNECTED)
            return self._ttl / 3
        try:
            ttl = self._keep_alive()
        except StoreError as exc:
            if self._state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
                _log.warning("etcd session %x suspended: %s", self._lease, exc)
                self._set_state(ConnectionState.SUSPENDED)
            return _RETRY_DELAY
        if ttl <= 0:
            _log.warning("etcd session lease %x expired or was revoked", self._lease)
            self._set_state(ConnectionState.LOST)
            return 0.0
        if self._state is ConnectionState.SUSPENDED:
            self._set_state(ConnectionState.RECONNECTED)
            # The stream may have died silently while we were cut off: re-create
            # every watch from its last revision (nothing lost, nothing doubled).
            self._restart_watch_stream()
        return self._ttl / 3

    def _keep_alive(self) -> int:
        """Refresh the lease once; return the TTL left (<= 0: the lease is gone).

        Each attempt has a deadline of a quarter of the TTL (a reply slower than that
        already eats into the lease), or twice the recent answer time when that is
        longer (within half of what is left of the lease): on a slow link of this
        client every member answers slowly, and a deadline below that would fail them
        all and let the lease run out on a link that works. A member that cannot serve
        it (no answer in time, unreachable, no leader) is left at once for the next
        one, and the keep-alive is sent again there, each member at most once per
        refresh: with refreshes every TTL/3, a client on a member cut off from its
        peers reaches another member within about TTL/3 + TTL/4, before the lease runs
        out. Only when every member failed is the error raised (the session goes
        SUSPENDED).
        """
        quarter = max(self._ttl / 4, 0.25)
        members = len(self._client.endpoints)
        for left in range(members - 1, -1, -1):
            slow = min(2 * self._keep_alive_latency, (self._lease_until - time.monotonic()) / 2)
            timeout = min(self.settings.operation_timeout, max(quarter, slow))
            sent = time.monotonic()
            try:
                ttl = self._keep_alive_once(timeout)
            except (StoreUnavailableError, OperationTimeoutError) as exc:
                if isinstance(exc, OperationTimeoutError):
                    # no answer within the deadline: it takes at least that long now
                    self._keep_alive_latency = max(self._keep_alive_latency, timeout)
                if left == 0:
                    raise
                _log.info("etcd: lease keep-alive failed (%s); sending it to another member", exc)
                continue
            took = time.monotonic() - sent
            self._keep_alive_latency = 0.7 * self._keep_alive_latency + 0.3 * took
            if ttl > 0:
                # the server restarted the TTL between our send and its answer
                self._lease_until = sent + ttl
            return ttl
        raise AssertionError("unreachable")

    def _keep_alive_once(self, timeout: float) -> int:
        req = rpc.LeaseKeepAliveRequest(ID=self._lease)
        with self._translated("lease keep-alive"):
            for attempt in (1, 2):
                endpoint, stub = self._stub("leasestub")
                try:
                    stream = stub.LeaseKeepAlive(iter([req]), timeout, metadata=self._metadata())
                    for resp in stream:
                        return int(resp.TTL)
                except grpc.RpcError as exc:
                    if attempt == 1 and self.settings.username is not None and _is_stale_token(exc):
                        self._authenticate(timeout)
                        continue
                    if _cannot_serve(exc):
                        self._move_on(endpoint, f"keep-alive: {exc.code().name} {exc.details()}")
                    raise
                self._move_on(endpoint, "keep-alive: the stream closed without reply")
                raise StoreUnavailableError("lease keep-alive: the stream closed without reply")
        raise AssertionError("unreachable")

    def _set_state(self, state: ConnectionState) -> None:
        if state is not self._state:
            self._state = state
            self._emit_state(state)

    def _emit_state(self, state: ConnectionState) -> None:
        self._events.put(("state", None, state))

    # -- internals: events ------------------------------------------------------------

    def _run_events(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            kind, target, payload = item
            if kind == "watch":
                if target.cancelled or target.leaves_out(payload):
                    continue
                listeners: list[Callable[[Any], None]] = [target.listener]
            else:
                with self._wlock:
                    listeners = list(self._state_listeners.values())
            for listener in listeners:
                try:
                    listener(payload)
                except Exception:
                    _log.exception("listener %r failed on %r", listener, payload)

    # -- internals: watches -----------------------------------------------------------

    def _current_watcher(self) -> Any:
        with self._wlock:
            if self._watcher is not None and not self._watcher_broken:
                return self._watcher
            old, self._watcher = self._watcher, None
            old_stub, self._watcher_stub = self._watcher_stub, None
        _end_watcher(old, old_stub)
        with self._translated("open the watch stream"):
            endpoint, channel = self._endpoint()
        stub = _WatchStub(channel)
        # built here rather than by the client, to send our metadata (require a
        # leader, the token) and to keep the stream call (see _WatchStub)
        new = etcd3.watch.Watcher(
            stub, timeout=self.settings.operation_timeout, metadata=self._metadata()
        )
        with self._wlock:
            if self._watcher is None:
                self._watcher, self._watcher_broken = new, False
                self._watcher_endpoint, self._watcher_stub = endpoint, stub
            return self._watcher

    def _establish(self, w: _Watch, *, counted: bool = False) -> bool:
        """(Re)create ``w`` on the shared stream from ``w.last_rev + 1``.

        Returns False (and creates nothing) when that revision is compacted.
        """
        watcher = self._current_watcher()
        with self._wlock:
            w.gen += 1
            gen, start = w.gen, w.last_rev + 1
        callback = functools.partial(self._on_watch_response, w, gen)
        if counted:
            self._count()
        try:
            with self._translated(f"watch {w.prefix}"):
                try:
                    wid = watcher.add_callback(
                        w.key, callback, range_end=w.end, start_revision=start
                    )
                except etcd3.exceptions.RevisionCompactedError:
                    return False
        except StoreError as exc:
            # a stream that failed or hangs is replaced at the next attempt (its other
            # watches resume from their last revisions), on another member when this
            # one could not serve it
            with self._wlock:
                endpoint = self._watcher_endpoint if self._watcher is watcher else None
                if endpoint is not None:
                    self._watcher_broken = True
            if endpoint is not None and isinstance(
                exc, (StoreUnavailableError, OperationTimeoutError)
            ):
                self._move_on(endpoint, f"watch {w.prefix}: {exc}")
            raise
        with self._wlock:
            current = w.gen == gen and not w.cancelled
            if current:
                w.watch_id, w.watcher = wid, watcher
                self._pending.discard(w)
        if not current:
            with contextlib.suppress(Exception):
                watcher.cancel(wid)
        return True

    def _on_watch_response(self, w: _Watch, gen: int, resp: Any) -> None:
        # Runs on the etcd3 stream thread: only record and enqueue, never block.
        if isinstance(resp, etcd3.watch.WatchResponse):
            with self._wlock:
                if w.gen != gen or w.cancelled:
                    return
                for kv in resp.events:  # etcd3 events read through to the KeyValue
                    w.last_rev = max(w.last_rev, int(kv.mod_revision))
                    if not w.covers(kv.key):
                        continue
                    path = self._path(kv.key)
                    if isinstance(kv, etcd3.events.DeleteEvent):
                        event = WatchEvent(EventKind.DELETED, path, None, int(kv.mod_revision))
                    else:
                        kind = (
                            EventKind.CREATED
                            if kv.create_revision == kv.mod_revision
                            else EventKind.CHANGED
                        )
                        event = WatchEvent(kind, path, bytes(kv.value), int(kv.mod_revision))
                    self._events.put(("watch", w, event))
            return
        leave = None
        with self._wlock:
            if w.gen != gen or w.cancelled:
                return
            w.watch_id = None
            self._pending.add(w)
            if isinstance(resp, etcd3.exceptions.RevisionCompactedError):
                # etcd confirms the watch first and reports the compaction after it
                w.compacted = True
            else:
                # the whole stream ended (error, server shutdown, or a member without
                # a leader cancelling it)
                if w.watcher is self._watcher:
                    self._watcher_broken = True
                    if isinstance(resp, grpc.RpcError) and resp.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    ):
                        leave = self._watcher_endpoint
                # a broken stream usually means a lost connection: check the session now
                self._check_session_now = True
        if leave is not None:
            self._move_on(leave, f"watch stream ended: {resp}")
        self._wake.set()

    def _restore_watches(self) -> None:
        with self._wlock:
            pending = sorted(self._pending, key=lambda x: x.prefix)
        for w in pending:
            if self._stopping.is_set():
                return
            try:
                if w.compacted or not self._establish(w):
                    self._resync(w)
            except StoreError as exc:
                _log.info("etcd watch %s not resumed yet: %s", w.prefix, exc)
                return

    def _resync(self, w: _Watch) -> None:
        """The history since ``w.last_rev`` is compacted: RESYNC, then the current state."""
        resp = self._txn(
            f"resync watch {w.prefix}",
            success=[_range_op(w.key), self._below_op(w.key)],
        )
        rev = int(resp.header.revision)
        with self._wlock:
            if w.cancelled:
                return
            w.gen += 1  # drop anything still in flight for the old watch
            w.last_rev = rev
            w.compacted = False
            self._events.put(("watch", w, WatchEvent(EventKind.RESYNC, w.prefix, None, rev)))
            for r in resp.responses:
                for kv in r.response_range.kvs:
                    event = WatchEvent(
                        EventKind.CREATED, self._path(kv.key), bytes(kv.value), int(kv.mod_revision)
                    )
                    self._events.put(("watch", w, event))
        if not self._establish(w):
            raise StoreError(f"watch {w.prefix}: revision {rev + 1} compacted at once")

    def _restart_watch_stream(self) -> None:
        with self._wlock:
            old, self._watcher = self._watcher, None
            old_stub, self._watcher_stub = self._watcher_stub, None
            self._watcher_broken = False
            for w in self._watches:
                w.gen += 1
                w.watch_id = None
                self._pending.add(w)
        _end_watcher(old, old_stub)

    def _cancel_watch(self, w: _Watch) -> None:
        with self._wlock:
            w.cancelled = True
            self._watches.discard(w)
            self._pending.discard(w)
            watcher, wid = w.watcher, w.watch_id
        if watcher is not None and wid is not None:
            with contextlib.suppress(Exception):
                watcher.cancel(wid)

    # -- fault hooks (registry.faults.SessionFaults), for tests ------------------------

    def expire_session(self, timeout: float = 15.0) -> None:
        """End the current session on the server: revoke its lease (etcd deletes every
        key attached to it at once). The session thread is woken to find the lease
        gone: LOST, then CONNECTED with a new lease."""
        self._require_started()
        with self._translated("expire_session: revoke lease"):
            self._send(
                "leasestub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=self._lease), timeout=timeout
            )
        self._check_session_now = True
        self._wake.set()

    def drop_connection(self) -> None:
        """Close the gRPC channel in use and put a new one in its place: requests and
        the watch stream in flight fail, the next ones connect again. The store reports
        SUSPENDED now and RECONNECTED at its next keep-alive (the lease lives on, the
        watches resume from their last revision)."""
        self._require_started()
        endpoint = self._client.endpoint_in_use
        if endpoint is None:
            raise StoreUnavailableError("drop_connection: the etcd store has no channel in use")
        old = endpoint.channel
        endpoint.channel = endpoint._mkchannel(_CHANNEL_OPTIONS)
        with contextlib.suppress(Exception):
            old.close()
        if self._state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            self._set_state(ConnectionState.SUSPENDED)
        self._check_session_now = True
        self._wake.set()


def _end_watcher(watcher: Any, stub: _WatchStub | None) -> None:
    """Stop a watcher: no more requests, and its stream cancelled (its thread ends)."""
    if watcher is not None:
        with contextlib.suppress(Exception):
            watcher.close()
    if stub is not None:
        stub.cancel()


def _ancestors(path: str) -> list[str]:
    """Strict ancestors of ``path``, nearest first, without the root."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _synthetic(path: str) -> Node:
    return Node(path, b"", 0, 0, 0, False)


def _below_prefix(key: bytes) -> bytes:
    """What every key below node key ``key`` starts with: ``K/`` (the root key ``/ns/``
    is its own prefix)."""
    return key if key.endswith(b"/") else key + b"/"


def _subtree(key: bytes) -> tuple[bytes, bytes]:
    """``(start, end)``: the etcd range of the keys strictly below node key ``key``.

    ``[K/, K0)`` for a node ``K``. The root's own key ``/ns/`` ends with the ``/`` that
    other keys lack (a path never does), and its subtree is every other key of the
    namespace: ``[/ns/ + '\0', /ns0)``. The end, ``K0``, is also where the range
    ``[K, end)`` of the node and its subtree stops; so nothing reaches outside the
    namespace prefix ``/ns/`` (see the module docstring)."""
    prefix = _below_prefix(key)
    start = prefix + b"\0" if prefix == key else prefix
    return start, prefix[:-1] + b"0"


def _in_subtree(key: bytes, other: bytes, *, own: bool = False) -> bool:
    """Whether ``other`` is a key strictly below node key ``key`` (or ``key`` itself
    when ``own``)."""
    start, end = _subtree(key)
    return (own and other == key) or start <= other < end


def _own_range(key: bytes) -> Any:
    return rpc.RangeRequest(key=key, keys_only=True)


def _below_range(key: bytes) -> Any:
    """At most one key of the subtree ``[K + '/', K + '0')``: is anything below K?"""
    start, end = _subtree(key)
    return rpc.RangeRequest(key=start, range_end=end, keys_only=True, limit=1)


def _version_compare(key: bytes, result: Any, *, below: bool = False) -> Any:
    """``version`` of ``key`` compared with 0; ``below``: over the subtree range.

    A range compare must hold for every key in the range, and an empty range compares
    as one zero KeyValue (version 0): over a subtree, ``== 0`` means "nothing below"
    and ``> 0`` means "something below"."""
    if below:
        start, end = _subtree(key)
        return rpc.Compare(
            key=start,
            range_end=end,
            target=rpc.Compare.VERSION,
            result=result,
            version=0,
        )
    return rpc.Compare(key=key, target=rpc.Compare.VERSION, result=result, version=0)


class _Verdict(enum.Enum):
    """What a failed transaction's reads say about one condition."""

    HOLDS = "holds"
    FALSE = "false"
    #: neither: the condition must be sent again in another form
    RETRY = "retry"


@dataclass(eq=False)
class _Condition:
    """One precondition of a transaction: its etcd compares and the reads ("probes")
    that, in the failure branch, tell whether it held. A node exists when it has a key
    of its own OR keys below it (a pure parent), as :meth:`EtcdStore.exists` says.

    * ``absent`` (Create, Check(exists=False)): exact form ``version(K) == 0`` AND
      ``version([K/, K0)) == 0`` (two compares). Compact form, when a commit has no
      room for two compares per absence: a pre-read at revision R found no key at K
      nor below it, and ``create_revision < R + 1`` over ``[K, K0)`` (one compare) says
      no key of that range was created since. The range also holds siblings such as
      ``K-x``: one that already existed at R passes, one created since fails the
      compare and its probe tells it apart, so the pre-read is repeated.
    * ``exists`` (Check(exists=True)): ``version(K) > 0`` (own form, tried first) or
      ``version([K/, K0)) > 0`` (below form). etcd ANDs compares, so the OR is one
      form at a time: when the form sent fails but the other one holds (a pure parent,
      or a key of its own with nothing below), the transaction is re-sent in the other
      form. With a spare failure read, both forms are read at one revision; without,
      a check fails once both forms have failed.
    * ``check`` (version, value, created_revision): one compare on the own key.
    """

    path: str
    key: bytes
    kind: Literal["absent", "exists", "check"]
    #: the compare of a ``check``
    check: Any = None
    #: an absence in the compact form
    compact: bool = False
    #: compact absence: revision of the pre-read that found the path absent (-1: none)
    since: int = -1
    #: existence: the form in use is the subtree range
    below: bool = False
    #: existence: forms found false so far
    failed_forms: set[bool] = field(default_factory=set)

    @classmethod
    def for_check(cls, key: bytes, check: Check) -> _Condition:
        path = check.path
        if check.exists is not None:
            return cls(path, key, "exists" if check.exists else "absent")
        return cls(path, key, "check", check=_check_compare(key, check))

    def identity(self, op: Op) -> object:
        """Ops that state the same condition share one (Create + Check(exists=False))."""
        return (self.kind, self.path) if self.kind != "check" else op

    def compares(self) -> list[Any]:
        if self.kind == "check":
            return [self.check]
        if self.kind == "exists":
            return [_version_compare(self.key, _GREATER, below=self.below)]
        if self.compact:
            return [
                rpc.Compare(
                    key=self.key,
                    range_end=_subtree(self.key)[1],
                    target=rpc.Compare.CREATE,
                    result=_LESS,
                    create_revision=self.since + 1,
                )
            ]
        return [
            _version_compare(self.key, _EQUAL),
            _version_compare(self.key, _EQUAL, below=True),
        ]

    def probes(self) -> list[Any]:
        if self.kind == "check":
            return [rpc.RangeRequest(key=self.key)]  # a value check needs the value
        if self.kind == "exists":
            return [_below_range(self.key) if self.below else _own_range(self.key)]
        if self.compact:
            # the first key of the range created since the pre-read, if any
            return [
                rpc.RangeRequest(
                    key=self.key,
                    range_end=_subtree(self.key)[1],
                    keys_only=True,
                    limit=1,
                    min_create_revision=self.since + 1,
                )
            ]
        return [_own_range(self.key), _below_range(self.key)]

    def other_probe(self) -> Any:
        """Existence: the read of the form not in use."""
        return _own_range(self.key) if self.below else _below_range(self.key)

    def judge(self, reads: list[list[Any]], other: list[Any] | None) -> _Verdict:
        """Decide from the probes' results (and the other form's read, if sent)."""
        if self.kind == "check":
            return (
                _Verdict.HOLDS if _compare_holds(self.check, _first(reads[0])) else _Verdict.FALSE
            )
        if self.kind == "absent" and not self.compact:
            return _Verdict.FALSE if any(reads) else _Verdict.HOLDS
        if self.kind == "absent":
            first = _first(reads[0])
            if first is None:
                return _Verdict.HOLDS
            if _in_subtree(self.key, first.key, own=True):
                return _Verdict.FALSE
            self.since = -1  # a new sibling, not our node: read again
            return _Verdict.RETRY
        if reads[0]:
            return _Verdict.HOLDS
        self.failed_forms.add(self.below)
        if other is not None:
            if not other:
                return _Verdict.FALSE
        elif (not self.below) in self.failed_forms:
            return _Verdict.FALSE
        self.below = not self.below
        return _Verdict.RETRY


def _first(kvs: list[Any]) -> Any:
    return kvs[0] if kvs else None


def _check_compare(key: bytes, check: Check) -> Any:
    # (existence checks are _Condition's own kinds)
    if check.value is not None:
        # etcd fails a value compare on a missing key: "exists with this value"
        return rpc.Compare(key=key, target=rpc.Compare.VALUE, result=_EQUAL, value=check.value)
    if check.version is not None and check.version > 0:
        return rpc.Compare(
            key=key, target=rpc.Compare.MOD, result=_EQUAL, mod_revision=check.version
        )
    if check.created_revision is not None and check.created_revision > 0:
        return rpc.Compare(
            key=key,
            target=rpc.Compare.CREATE,
            result=_EQUAL,
            create_revision=check.created_revision,
        )
    # A version/revision <= 0 belongs to no real key ("== 0" would match a missing
    # one): a compare that can never hold keeps failed_path reporting in order.
    return rpc.Compare(key=key, target=rpc.Compare.VERSION, result=_LESS, version=0)


def _compare_holds(cmp: Any, kv: Any) -> bool:
    """Evaluate an etcd compare as the server does (``kv`` None: the key is missing)."""
    actual: Any
    wanted: Any
    if cmp.target == rpc.Compare.LEASE:
        actual, wanted = (kv.lease if kv else 0), cmp.lease
    elif cmp.target == rpc.Compare.VALUE:
        if kv is None:
            return False
        actual, wanted = bytes(kv.value), bytes(cmp.value)
    elif cmp.target == rpc.Compare.VERSION:
        actual, wanted = (kv.version if kv else 0), cmp.version
    elif cmp.target == rpc.Compare.MOD:
        actual, wanted = (kv.mod_revision if kv else 0), cmp.mod_revision
    elif cmp.target == rpc.Compare.CREATE:
        actual, wanted = (kv.create_revision if kv else 0), cmp.create_revision
    else:
        return False
    if cmp.result == _EQUAL:
        return bool(actual == wanted)
    if cmp.result == _GREATER:
        return bool(actual > wanted)
    if cmp.result == _LESS:
        return bool(actual < wanted)
    return bool(actual != wanted)
