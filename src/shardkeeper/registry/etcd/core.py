"""The state every part of :class:`~shardkeeper.registry.etcd.EtcdStore` shares: its
settings, client, lease, connection state, threads and watch bookkeeping, the key
mapping of its namespace, and the constants of the backend.

The store is assembled from one class per role, each in its own module, all built on
:class:`EtcdCore`: ``members`` (requests, member selection and failover), ``watch``,
``session``, ``planner`` (commits), and ``store`` (the public methods).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry._events import EventLoop
from shardkeeper.registry.base import (
    ConnectionState,
    CoordinationStore,
    Create,
    Node,
    Op,
    Put,
    check_path,
)
from shardkeeper.registry.etcd.errors import translated
from shardkeeper.registry.url import RegistrySettings

if TYPE_CHECKING:
    from shardkeeper.registry.etcd.client_private import WatchStub
    from shardkeeper.registry.etcd.watch import Watch

__all__ = ["CHANNEL_OPTIONS", "RETRY_DELAY", "EtcdCore", "groups_per_commit"]

# gRPC's default reconnect backoff grows to two minutes: after a long outage the
# channel would sit idle long after the server is back. Cap it at one second.
#
# gRPC's client also refuses answers over 4 MiB by default, and etcd sends a range as
# one answer: a namespace with a job of 10,000 items made every read of /jobs (the
# CLI's disable and enable of an instance) fail with "Received message larger than
# max" (600 s chaos on etcd). etcd bounds requests (--max-request-bytes), not answers;
# the tree a store reads is the user's data, so the client takes any size gRPC can.
MAX_ANSWER_BYTES = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", MAX_ANSWER_BYTES),
]
#: pause between attempts while the server is unreachable (session thread, start)
RETRY_DELAY = 0.2

#: gets the failures of listeners on the event thread
_log = logging.getLogger("shardkeeper.registry.etcd.session")


def groups_per_commit(limit: int) -> int:
    """Groups one request carries at ``limit`` operations per transaction: containers
    and groups per container each take at most half of the limit (etcd 3.4 checks each
    nested transaction against the whole limit; older servers counted the outer
    operations against the nested ones, which halves keep within)."""
    return (limit // 2 - 8) * (limit // 2)


class EtcdCore(CoordinationStore):
    """What the role classes of :class:`~shardkeeper.registry.etcd.EtcdStore` share
    (see the package docstring for the mapping).

    Construct with :class:`RegistrySettings` (no I/O). Implements the contract,
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
        # '/' inside a namespace is escaped so that namespace X never sees X/sub
        self._root = "/" + settings.namespace.strip("/").replace("/", "%2F")
        self._ttl_wanted = max(1, math.ceil(settings.session_timeout))
        self._ttl = self._ttl_wanted
        self._client: Any = None
        self._lease = 0
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

        # the shared event thread (registry/_events.py): the connection state, and the
        # delivery of state and watch events in the order they are posted
        tag = settings.namespace.replace("/", ".")
        self._loop = EventLoop(
            f"shardkeeper-etcd-events[{tag}]", ConnectionState.SUSPENDED, log=_log
        )
        self._session_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._check_session_now = False

        # guards watch bookkeeping; never held while waiting on the server
        self._wlock = threading.Lock()
        self._watches: set[Watch] = set()
        self._pending: set[Watch] = set()
        self._watcher: Any = None
        self._watcher_broken = False
        # the endpoint and stub of the current watcher's stream
        self._watcher_endpoint: Any = None
        self._watcher_stub: WatchStub | None = None

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
        return self._loop.state

    @property
    def session_timeout(self) -> float:
        """The lease TTL granted by the server, in seconds."""
        return float(self._ttl)

    @property
    def operation_timeout(self) -> float:
        """The registry URL's ``operation_timeout``: the longest one request waits."""
        return self.settings.operation_timeout

    @property
    def round_trips(self) -> int:
        """Requests sent by the public methods (see ``store.py``: Costs):
        :class:`~shardkeeper.registry.counting.CountsRequests`."""
        return self._round_trips

    # -- internals: keys and nodes ----------------------------------------------------

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """What a commit's transaction takes, generously, against ``max_commit_bytes``:
        each operation's key (namespace included) nine times, its value and 32 bytes
        of framing. An absence check is two compares, each with its failure-branch
        read, and every written path's ancestors get guards: a registration-shaped
        commit measured 7.5 key lengths an operation."""
        root = len(self._root)
        return sum(
            9 * (root + len(op.path)) + 32 + (len(op.value) if isinstance(op, Create | Put) else 0)
            for op in ops
        )

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

    def _translated(self, what: str) -> contextlib.AbstractContextManager[None]:
        """THE boundary: turn grpc/etcd3 exceptions into shardkeeper errors (see
        :func:`~shardkeeper.registry.etcd.errors.translated`)."""
        return translated(what, self.settings, lambda: self._lease)

    # -- provided by the watch role ----------------------------------------------------

    def _restart_watch_stream(self) -> None:
        """Re-create every watch on a new stream from its last revision."""
        raise NotImplementedError
