"""The CoordinationStore contract: the one interface both backends implement.

Everything above the registry layer talks to a :class:`CoordinationStore` and never
knows whether ZooKeeper or etcd is underneath. This module is the contract; the
backends (``zookeeper/``, ``etcd/``) are kept lean and must pass the same
behavioural suite (``tests/registry/test_contract.py``).

Model
-----
The store holds a tree of *nodes* addressed by absolute paths inside a namespace
(``/jobs/order-sync/config``). Paths start with ``/``, have no trailing ``/``, no
empty segments, and their segments use only ``[A-Za-z0-9._@:=+-]``. ``/`` is the
namespace root. Values are ``bytes``.

* Namespace isolation: a store opened on namespace ``a`` never sees a key of
  namespace ``b`` (ZooKeeper chroot ``/shardkeeper/a``-style; etcd key prefix).
* Parents are implicit: writing ``/a/b/c`` makes ``/a`` and ``/a/b`` visible to
  :meth:`children`. (ZooKeeper creates persistent parent nodes; etcd derives
  children from the keys under a prefix.) ``exists('/a')`` is true once something
  lives at or below ``/a``; ``get('/a')`` of a pure parent returns a node with an
  empty value.
* Ephemeral nodes belong to the store's *session* (ZooKeeper session; in etcd ONE
  lease per store, kept alive by the store). When the session ends (close, crash,
  expiry), the server deletes them. An ephemeral node cannot have children.
* Every node carries three integers (see :class:`Node`): ``version`` (opaque, for
  optimistic checks), ``revision`` (store-wide monotonic revision of its last
  change) and ``created_revision`` (store-wide monotonic revision of its creation:
  used as a fencing token).

Threads and events
------------------
A store owns one event thread. Watch events and connection-state events are
delivered on it, in the order the store produced them (see Watches for what that order
promises). Listeners must not block for long (they may call the store's synchronous
methods; they must not wait on other events to arrive).

Connection states (:class:`ConnectionState`):

* ``CONNECTED``: a NEW session is established (the first one after :meth:`start`,
  or a fresh one after ``LOST``). Ephemeral nodes of earlier sessions are gone:
  whoever needs them re-creates them now.
* ``SUSPENDED``: the connection is down; the session may still be alive. Stop
  acting on cached state (a leader stops leading) until RECONNECTED or LOST.
* ``RECONNECTED``: the connection is back and the SAME session survived.
* ``LOST``: the session expired (or was closed by the server); its ephemeral
  nodes are deleted. The store keeps trying to establish a new session and sends
  ``CONNECTED`` when it has one.

Watches
-------
:meth:`CoordinationStore.watch` subscribes to every change under a prefix
(the prefix node itself and all descendants). Events are :class:`WatchEvent`:
``CREATED``, ``CHANGED``, ``DELETED`` with the path and new value (None for DELETED).

Both backends guarantee:

(a) **Convergence.** Replaying the events (plus RESYNC, below) onto what the listener
    knew gives the store's current state once the store is quiet: no final state of a
    node is ever missed. After a reconnect a watch resumes from the last revision it
    saw (etcd), or re-reads the subtree and emits what changed (ZooKeeper).
(b) **Per-path order.** The events of one path arrive in that path's store order:
    their ``revision`` strictly increases, and each CREATED/CHANGED carries a value
    the node really had, later than the one before.

How much more depends on the store:

(c) **etcd** delivers every individual change, exactly, in global store order (one
    event per write, revisions strictly increasing across paths). **ZooKeeper**'s
    one-shot watches cannot: a node changed several times before it is re-read gives
    one event carrying the latest value (a CREATED followed by changes may arrive as
    one CREATED), a node created and deleted between two reads may give no event at
    all, and events of different paths arrive in the order the store discovered them,
    not in store order. On ZooKeeper the ``revision`` of a DELETED event is a bound
    (ZooKeeper does not report the zxid of a delete): above the node's last reported
    revision and below that of any later incarnation.

So a listener must not count events, rely on seeing intermediate values, or infer the
order of changes to different paths (one event arriving does not mean that changes made
before it elsewhere have been delivered). It can rely on ending up with each node's
latest state, in per-path order.

When a resume is impossible (etcd compaction) the watch emits one ``RESYNC`` event
(path = the prefix) and then ``CREATED`` events for the current state; listeners treat
RESYNC as "forget what you know under this prefix". Watches are hints for re-reading,
never the only source of truth.

Excluded subtrees. A watch may be given ``exclude``, a :data:`PathFilter`: it is
called with absolute node paths inside the namespace (on the store's event thread; it
must be fast, pure and never raise). When ``exclude(path)`` is True, no event is
delivered for ``path`` or anything below it, and the backend may skip reading that
subtree entirely: ZooKeeper sets no watch on it, never reads it and never lists its
children (a busy subtree then costs the watcher nothing); etcd filters the events of
its single watch stream client-side (no extra requests). Everything above holds for
the paths that are not excluded: convergence, per-path order and resume after a
reconnect (a RESYNC replays only the state that is not excluded). ``exclude`` must
give the same answer for a path every time it is asked. :func:`is_excluded` tells
whether a path or one of its ancestors is excluded.

Errors
------
Backends translate library exceptions into :mod:`shardkeeper.errors` at this
boundary. Every call is bounded by the operation timeout; a timeout raises
:class:`~shardkeeper.errors.OperationTimeoutError` (outcome unknown).

Beyond coordination
-------------------
The contract is coordination only: a new backend or a user's test double implements
it and works. What scale, benchmarks and tests also need are small protocols next to
it, which every store of the project implements and callers check with
``isinstance``: :class:`~shardkeeper.registry.batching.BatchingStore` (the operation
and byte limits of a commit, ``commit_groups``: callers use the functions of
``batching.py``, which fall back to plain commits),
:class:`~shardkeeper.registry.counting.CountsRequests` (``round_trips``, the requests
sent) and :class:`~shardkeeper.registry.faults.SessionFaults` (``expire_session``,
``drop_connection``).
"""

from __future__ import annotations

import enum
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shardkeeper.errors import ConfigError

__all__ = [
    "Check",
    "CommitResult",
    "ConnectionState",
    "CoordinationStore",
    "Create",
    "Delete",
    "EventKind",
    "GroupsResult",
    "Node",
    "Op",
    "PathFilter",
    "Put",
    "StateListener",
    "Subscription",
    "WatchEvent",
    "WatchListener",
    "ancestors",
    "check_path",
    "is_excluded",
    "join_path",
]

_SEGMENT = re.compile(r"^[A-Za-z0-9._@:=+\-]+$")


def ancestors(path: str) -> list[str]:
    """The strict ancestors of ``path`` below the root, nearest first: ``/a/b/c`` ->
    ``["/a/b", "/a"]``; ``[]`` for ``/`` and for a child of the root. (The one
    definition the backends share: reverse it for top-down order.)"""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def check_path(path: str) -> str:
    """Return ``path`` if it is a valid node path, else raise ConfigError naming it."""
    if path == "/":
        return path
    if not path.startswith("/") or path.endswith("/"):
        raise ConfigError(f"invalid node path {path!r}: must start with '/' and not end with '/'")
    for seg in path[1:].split("/"):
        if not seg or not _SEGMENT.match(seg) or seg in (".", ".."):
            raise ConfigError(
                f"invalid node path {path!r}: segment {seg!r} must be non-empty and use "
                "only letters, digits and . _ @ : = + -"
            )
    return path


def join_path(*parts: str) -> str:
    """Join path segments into an absolute node path (``join_path('a','b') == '/a/b'``)."""
    segs = [s for p in parts for s in p.split("/") if s]
    return "/" + "/".join(segs)


class ConnectionState(enum.Enum):
    """Connection/session states delivered to state listeners (see module docstring)."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    RECONNECTED = "reconnected"
    LOST = "lost"


class EventKind(enum.Enum):
    """Kind of a watch event."""

    CREATED = "created"
    CHANGED = "changed"
    DELETED = "deleted"
    RESYNC = "resync"


@dataclass(frozen=True)
class Node:
    """A node as read from the store.

    ``version``: opaque; pass it to ``Check(path, version=...)`` to commit only if the
    node is unchanged (ZooKeeper ``stat.version``; etcd ``mod_revision``).
    ``revision``: store-wide monotonic revision of the last change (zxid / revision).
    ``created_revision``: store-wide monotonic revision of the creation; it only grows
    across deletes and re-creates, so it is a fencing token.
    """

    path: str
    value: bytes
    version: int
    revision: int
    created_revision: int
    ephemeral: bool = False


@dataclass(frozen=True)
class WatchEvent:
    """One change under a watched prefix. ``value`` is None for DELETED and RESYNC.
    ``revision`` orders the events of one path (see the module docstring, Watches)."""

    kind: EventKind
    path: str
    value: bytes | None = None
    revision: int = 0


WatchListener = Callable[[WatchEvent], None]
StateListener = Callable[[ConnectionState], None]
#: ``exclude`` of :meth:`CoordinationStore.watch`: True for a path whose subtree the
#: watch must not report (see the module docstring, Excluded subtrees)
PathFilter = Callable[[str], bool]


def is_excluded(path: str, exclude: PathFilter | None) -> bool:
    """Whether ``exclude`` rejects ``path`` or one of its ancestors (``/`` included).

    An exclusion covers a whole subtree, so a path is out as soon as any node on the
    way down to it is; the ancestors are asked top-down, cheapest verdict first.
    """
    if exclude is None:
        return False
    if exclude("/"):
        return True
    at = 0
    while at >= 0:
        at = path.find("/", at + 1)
        if exclude(path if at < 0 else path[:at]):
            return True
    return False


# ---- operations of an atomic commit -------------------------------------------------


@dataclass(frozen=True)
class Check:
    """A precondition of a commit. Exactly one of the conditions is given.

    ``exists=True``: the node exists; ``exists=False``: it does not;
    ``version=v``: it exists with that :attr:`Node.version`;
    ``value=b``: it exists with exactly that value;
    ``created_revision=r``: it exists and was created at revision r (fencing).
    """

    path: str
    exists: bool | None = None
    version: int | None = None
    value: bytes | None = None
    created_revision: int | None = None

    def __post_init__(self) -> None:
        # counted without building a list: commits are made of thousands of these
        given = (
            (self.exists is not None)
            + (self.version is not None)
            + (self.value is not None)
            + (self.created_revision is not None)
        )
        if given != 1:
            raise ConfigError(
                f"Check({self.path!r}) needs exactly one of exists, version, value, "
                f"created_revision; got {given}"
            )


@dataclass(frozen=True)
class Create:
    """Create a node; the whole commit fails if it already exists."""

    path: str
    value: bytes = b""
    ephemeral: bool = False


@dataclass(frozen=True)
class Put:
    """Create the node or overwrite its value. After the commit the node is
    ephemeral iff ``ephemeral`` is true.

    ``existing`` is a hint: the writer believes the node exists as a persistent node
    (it wrote it before). A backend may then write it without reading it first
    (ZooKeeper sets its data natively in the multi instead of pre-reading it); the
    outcome is the same either way (a missing node is still created)."""

    path: str
    value: bytes = b""
    ephemeral: bool = False
    existing: bool = False


@dataclass(frozen=True)
class Delete:
    """Delete a node if it exists (a missing node is not an error). Children of the
    node are NOT deleted inside a commit: delete leaves (keep commits small)."""

    path: str


Op = Check | Create | Put | Delete


@dataclass(frozen=True)
class CommitResult:
    """Outcome of :meth:`CoordinationStore.commit`.

    ``succeeded`` is False when a check failed (or a Create found its node); then
    nothing was applied. ``revision`` is the store revision of the applied commit
    (0 when it failed): every node the commit created has it as its created_revision.
    ``failed_path`` names the first condition found false when known.
    """

    succeeded: bool
    revision: int = 0
    failed_path: str | None = None

    def __bool__(self) -> bool:
        return self.succeeded


@dataclass(frozen=True)
class GroupsResult:
    """Outcome of ``commit_groups`` (:class:`~shardkeeper.registry.batching.BatchingStore`).

    ``succeeded`` is False when a ``fixed`` check failed, or, on a store that checks
    groups together, any check: then nothing was applied and ``failed_path`` names
    the condition found false when known. Otherwise ``applied`` maps the index of each
    group applied to the revision of the commit that applied it (``revision``, the
    request's, for all but a group a store had to commit again alone), and
    ``refused`` maps each other group to the path of its condition found false (None
    when not known)."""

    succeeded: bool
    revision: int = 0
    applied: dict[int, int] = field(default_factory=dict)
    refused: dict[int, str | None] = field(default_factory=dict)
    failed_path: str | None = None


@dataclass
class Subscription:
    """Handle of a watch or listener; :meth:`cancel` stops deliveries (idempotent)."""

    cancel_fn: Callable[[], None]
    cancelled: bool = field(default=False)

    def cancel(self) -> None:
        """Stop deliveries; safe to call more than once."""
        if not self.cancelled:
            self.cancelled = True
            self.cancel_fn()


class CoordinationStore(ABC):
    """A connection to one namespace of a coordination store (ZooKeeper or etcd).

    Lifecycle: construct (no I/O) -> :meth:`start` -> use -> :meth:`close`. Also a
    context manager (``with open_store(url) as store:`` starts and closes it).
    """

    #: the namespace this store is confined to
    namespace: str

    # -- lifecycle -------------------------------------------------------------

    @abstractmethod
    def start(self) -> None:
        """Connect and establish a session within the connection timeout.

        Raises StoreUnavailableError (unreachable, naming the address and timeout) or
        StoreAuthError (bad credentials). Never hangs beyond the connection timeout.
        """

    @abstractmethod
    def close(self) -> None:
        """End the session (the server deletes our ephemeral nodes), stop every thread
        and watch. Idempotent; never raises for a store that is already down."""

    def identity(self) -> str:
        """Which registry and namespace this store talks to, with no credentials
        (:meth:`RegistrySettings.identity <shardkeeper.registry.url.RegistrySettings.identity>`
        for the backends; execution history scopes its rows by it). This default,
        for a store built without settings, is its class name and namespace."""
        return f"{type(self).__name__}/{self.namespace}"

    def relinquish_session(self) -> None:
        """End this session now so that its ephemeral nodes are removed, and stay usable.

        For an instance whose commits are not answered while its session lives (a gray
        link; runtime/health/graylink.py): the others may take over only once its ephemeral
        nodes are gone. The store stops renewing the session at once, whatever the
        link does (so the server ends it at the latest one session timeout after its
        last renewal), and asks the server to end it now as far as the server can be
        reached (bounded by the operation timeout). Listeners then get LOST (on
        ZooKeeper after a SUSPENDED: its connection is cut), and the store establishes
        a new session by itself: CONNECTED with a new :attr:`session_id`, as after an
        expiry; this returns without waiting for it.

        The backends implement it; this default raises StoreError naming the store."""
        from shardkeeper.errors import StoreError  # local: this edit keeps to its method

        raise StoreError(f"{type(self).__name__} cannot give up its session on demand")

    def __enter__(self) -> CoordinationStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    @abstractmethod
    def session_id(self) -> str:
        """Identity of the current session (changes after LOST -> CONNECTED).
        ZooKeeper session id in hex; etcd lease id in hex."""

    @property
    @abstractmethod
    def state(self) -> ConnectionState:
        """The latest connection state."""

    @property
    @abstractmethod
    def session_timeout(self) -> float:
        """The negotiated session timeout in seconds."""

    def last_renewal(self) -> float | None:
        """When (``time.monotonic()``) this client sent the latest renewal of its
        current session that the server answered, for a store whose session lives
        only on renewals of its own: the server keeps the session at least
        :attr:`session_timeout` from then, and answers to other requests prove
        nothing about it (etcd: a read does not touch the lease; only a lease
        keep-alive does). ``float('-inf')`` when the current session has no such
        renewal (it is gone).

        None (this default) for a store whose session every answered request
        renews (ZooKeeper: reads and pings alike; the MemoryStore): its callers
        measure the session by the requests they send themselves (sent +
        :attr:`session_timeout`)."""
        return None

    # -- reads -----------------------------------------------------------------

    @abstractmethod
    def get(self, path: str) -> Node | None:
        """The node at ``path``, or None if nothing is there."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a node exists at ``path`` (or anything lives below it)."""

    @abstractmethod
    def children(self, path: str) -> list[str]:
        """Sorted names (last segment only) of the direct children of ``path``;
        empty if none or if ``path`` does not exist."""

    @abstractmethod
    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path`` (absolute path -> Node), read consistently
        enough for inspection (etcd: one range read; ZooKeeper: a walk)."""

    # -- writes ----------------------------------------------------------------

    @abstractmethod
    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite (see :class:`Put`); returns the node as written."""

    @abstractmethod
    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Atomically create ``path`` if absent. Returns the created node, or None if it
        already existed (nothing changed). Safe to race: exactly one caller wins."""

    @abstractmethod
    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete ``path`` (and, if recursive, everything below it). Missing: no error."""

    @abstractmethod
    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` atomically: all or nothing, checks evaluated in the same
        transaction. Returns a falsy CommitResult when a check failed (nothing applied).

        A store takes only so many operations (and bytes) in one commit; more raise
        StoreLimitError naming the limit. A store says how many by implementing
        :class:`~shardkeeper.registry.batching.BatchingStore`; without it, callers
        assume :data:`~shardkeeper.registry.batching.DEFAULT_MAX_OPS`."""

    # -- watches and listeners ------------------------------------------------------

    @abstractmethod
    def watch(
        self, prefix: str, listener: WatchListener, *, exclude: PathFilter | None = None
    ) -> Subscription:
        """Deliver the changes at or below ``prefix`` to ``listener``, with the
        guarantees of the module docstring's Watches section (convergence and per-path
        order everywhere; every change in store order on etcd only). The watch is
        established when this returns: changes made after the call are delivered.

        ``exclude(path)`` True leaves ``path`` and its whole subtree out: no event for
        it, and the backend may not even read it (ZooKeeper sets no watch there). The
        guarantees hold for every path that is not excluded (module docstring,
        Excluded subtrees)."""

    @abstractmethod
    def add_state_listener(self, listener: StateListener) -> Subscription:
        """Deliver connection-state changes to ``listener`` on the event thread."""
