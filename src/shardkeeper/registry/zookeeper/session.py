"""The ZooKeeper session of a store: connecting, the namespace node, credentials, requests.

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
    filter on kazoo's loggers that blanks credentials out (``security.py``).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from shardkeeper.errors import (
    ConfigError,
    StoreAuthError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry import tls
from shardkeeper.registry._events import EventLoop, Retry
from shardkeeper.registry.base import ConnectionState, CoordinationStore
from shardkeeper.registry.logthrottle import RetryLogFilter
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.registry.zookeeper import kazoo_private, security
from shardkeeper.registry.zookeeper.errors import translate
from shardkeeper.registry.zookeeper.handler import PollingHandler
from shardkeeper.registry.zookeeper.owned import OwnedEphemerals, Ticket

if TYPE_CHECKING:
    from shardkeeper.registry.zookeeper.watch import _TreeWatch

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")

#: kazoo's lines of one reconnect attempt (kazoo/protocol/connection.py): while the
#: ensemble is down it tries again every ~0.5 s, and each try logged a WARNING (55 in
#: 26 s in the newcomer review, D17); one line per 30 s now, like the skip summary
KAZOO_RETRY_MESSAGES = (
    "Connection dropped: %s",
    "Connection time-out: %s",
    "Connecting to %s(%s):%s, use_ssl: %r",
    "Cannot resolve %s: %s",
)
#: the one filter on kazoo's loggers, shared by every store of the process
KAZOO_RETRY_FILTER = RetryLogFilter(KAZOO_RETRY_MESSAGES)


def install_retry_log_filter() -> None:
    """Put :data:`KAZOO_RETRY_FILTER` on kazoo's loggers; idempotent."""
    # the connection handler logs through the client's logger ("kazoo.client") unless
    # given its own; both, so either way is covered
    for name in ("kazoo.client", "kazoo.protocol.connection"):
        logger = logging.getLogger(name)
        if KAZOO_RETRY_FILTER not in logger.filters:
            logger.addFilter(KAZOO_RETRY_FILTER)


#: ZooKeeper refuses packets over jute.maxbuffer (1 MiB - 1) by dropping the
#: connection, which would suspend every user of the session: refuse earlier
_MAX_PAYLOAD = 1_000_000

#: a multi as sent (guards and missing parents included) stays under jute.maxbuffer
#: (1,048,575 bytes) with room for its header: a larger one is refused before sending
_MULTI_LIMIT = 1_040_000

#: how often a dirty watcher is retried while its re-sync keeps failing
_DIRTY_RETRY = 0.25


@dataclass(frozen=True)
class _Flight:
    """What one multi of ours in flight creates, as its reply will tell the watches."""

    #: the nodes it leaves created (path -> value): its reply adopts them unread
    made: dict[str, bytes]
    #: every path it creates, absence guards included: a drain holds their CREATED
    #: until the reply (counted in ``_Session._inflight``; one entry per create)
    paths: tuple[str, ...]


class _Session(CoordinationStore):
    """The connection half of :class:`~shardkeeper.registry.zookeeper.ZooKeeperStore`:
    lifecycle, properties, request plumbing, the namespace node, fault hooks.

    Implements the contract, :class:`~shardkeeper.registry.counting.CountsRequests`
    and :class:`~shardkeeper.registry.faults.SessionFaults`."""

    def __init__(self, settings: RegistrySettings) -> None:
        self._settings = settings
        self.namespace = settings.namespace
        # escaped so that namespace X never sees X/sub as its node /sub
        self._chroot = "/" + settings.namespace.strip("/").replace("/", "%2F")
        self._client: kazoo_private.Client | None = None
        self._lock = threading.Lock()
        self._closed = False
        # the shared event thread (registry/_events.py): kazoo's callbacks only post to
        # it; it retries the re-sync of dirty watchers while idle (events.py)
        self._loop = EventLoop(
            f"shardkeeper-zk-events[{self.namespace}]",
            ConnectionState.LOST,
            log=_log,
            retry=Retry(self._watches_dirty, self._resync_dirty, _DIRTY_RETRY),
        )
        self._sid: int | None = None
        self._first_session = threading.Event()
        self._negotiated: float | None = None
        self._round_trips = 0
        self._watches: list[_TreeWatch] = []
        #: path -> creates of it in multis of ours in flight (events.py: _own_multi)
        self._inflight: dict[str, int] = {}
        #: our ephemeral nodes whose incarnation is known (owned.py): their
        #: created-revision checks need no pre-read
        self._owned = OwnedEphemerals()
        self._acl: list[Any] | None = None
        if settings.username:
            self._acl = [make_digest_acl(settings.username, settings.password or "", all=True)]
        #: nodes whose ACL the last repair set (acl_repair at start, or repair_acl())
        self.acl_repaired = 0
        # kazoo logs the auth request (password included) at DEBUG: blank it out
        security.install_credential_filter()
        install_retry_log_filter()
        security.register_secret(settings.password)

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
        missing = kazoo_private.missing_hooks()
        if missing:
            raise StoreError(
                f"this kazoo has no {', '.join(missing)}, which the ZooKeeper backend's "
                "watches and session timeout need: install the kazoo version the "
                "package requires"
            )
        client = kazoo_private.Client(
            hosts=s.hosts_string,
            timeout=s.session_timeout,
            # kazoo's default back-off grows to an hour; a restarted server must be
            # found again well within the session timeout so the session survives
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_jitter=0.2, max_delay=0.5
            ),
            auth_data=auth,
            default_acl=self._acl,
            handler=PollingHandler(),
            watch_tap=self._on_watch_tap,
            on_negotiated=self._record_negotiated,
            **tls.kazoo_options(s),
        )
        client.add_listener(self._on_kazoo_state)
        self._client = client
        self._loop.start()
        deadline = time.monotonic() + s.connection_timeout
        client.start_async()
        connected = self._first_session.wait(s.connection_timeout)
        if not connected:
            self.close()
            raise StoreUnavailableError(
                f"cannot reach ZooKeeper at {s.hosts_string} within the connection "
                f"timeout of {s.connection_timeout:g}s{tls.unreachable_note(s)}"
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
        self._loop.stop(self._settings.operation_timeout + 1)
        self._loop.record(ConnectionState.LOST)

    def repair_acl(self) -> int:
        """Set this store's digest ACL on every node of the namespace (top-down, the
        namespace node included); return how many nodes. Needs credentials."""
        if self._acl is None:
            raise ConfigError(
                f"cannot repair the ACLs of namespace {self.namespace!r} without "
                "credentials: give user:password in the registry URL"
            )
        with self._errors(self._chroot):
            self.acl_repaired = security.repair_acls(
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
        return self._loop.state

    @property
    def session_timeout(self) -> float:
        """The session timeout the server negotiated, in seconds."""
        if self._negotiated is not None:
            return self._negotiated
        return self._settings.session_timeout

    @property
    def operation_timeout(self) -> float:
        """The registry URL's ``operation_timeout``: the longest one request waits."""
        return self._settings.operation_timeout

    @property
    def round_trips(self) -> int:
        """Requests sent so far (a multi counts as one): :class:`CountsRequests`."""
        return self._round_trips

    @property
    def kazoo_client(self) -> KazooClient:
        """The underlying KazooClient, for fault-injection helpers in tests."""
        return self._zk

    # -- plumbing: requests, deadlines, errors ---------------------------------------

    @property
    def _zk(self) -> kazoo_private.Client:
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
        size = kazoo_private.multi_size(ops)
        if size > _MULTI_LIMIT:
            # jute.maxbuffer would make the server drop the connection, suspending
            # every user of the session: refuse before sending
            raise StoreLimitError(
                f"commit: the multi would be {size} bytes with its guards and parents, "
                f"over ZooKeeper's request limit ({_MULTI_LIMIT}); commit fewer or "
                "smaller nodes at once"
            )
        flight = self._in_flight(ops) if self._watches else None
        try:
            applied = (
                functools.partial(self._own_multi, flight.made)
                if flight is not None and flight.made
                else None
            )
            async_result = self._send(kazoo_private.submit_multi, self._zk, ops, applied)
            results, zxid = self._wait(async_result, deadline)
        finally:
            if flight is not None and flight.paths:
                self._landed(flight.paths)
        return list(results), int(zxid)

    def _in_flight(self, ops: list[Any]) -> _Flight:
        """Note the nodes ``ops`` create as in flight (see :class:`_Flight`).

        In op order: a node the same multi deletes after creating it (an absence
        guard's create+delete pair) is in flight but not made by it. Adopting it
        would report a node that no longer exists (review finding 9); holding its
        CREATED until the reply lets its DELETED, drained before or after, cost no
        read.
        """
        root = len(self._chroot)
        made: dict[str, bytes] = {}
        paths: list[str] = []
        for op in ops:
            got = kazoo_private.created(op)
            if got is not None:
                path = got[0][root:] or "/"
                made[path] = got[1]
                paths.append(path)
                continue
            gone = kazoo_private.deleted(op)
            if gone is not None:
                made.pop(gone[root:] or "/", None)
        with self._lock:
            for path in paths:
                self._inflight[path] = self._inflight.get(path, 0) + 1
        return _Flight(made, tuple(paths))

    def _landed(self, paths: Iterable[str]) -> None:
        """The multi creating ``paths`` was answered (or given up on)."""
        with self._lock:
            for path in paths:
                left = self._inflight.get(path, 0) - 1
                if left > 0:
                    self._inflight[path] = left
                else:
                    self._inflight.pop(path, None)
        self._release_held()

    def _release_held(self) -> None:
        """Hand held notifications back to the watches' drains (events.py)."""

    def _own_multi(self, made: dict[str, bytes], ops: list[Any], zxid: int) -> None:
        """A multi of ours creating ``made`` applied (on kazoo's connection thread):
        the watches learn those nodes without reading them (``events.py``)."""

    def _covered(self, path: str) -> bool:
        """Whether a recursive watch armed on the current connection covers ``path``:
        then every delete of it reaches the tap (see ``owned.py``)."""
        epoch = self._owned.epoch
        return any(
            w.armed == epoch and not w.cancelled and w.covers(path) for w in list(self._watches)
        )

    def _learn(self, paths: list[str]) -> Ticket:
        """Start learning the incarnation of those ``paths`` a watch covers (see
        ``owned.py``); hand the ticket to ``self._owned.end``."""
        return self._owned.begin([p for p in paths if self._covered(p)])

    def _own_session(self) -> int | None:
        """The session id requests are sent on now (None between sessions, and
        before the client exists)."""
        client = self._client
        cid = client.client_id if client is not None else None
        return cid[0] if cid else None

    def _create_op(self, path: str, value: bytes, ephemeral: bool) -> Any:
        return kazoo_private.create_op(
            self._full(path), value, self._acl or OPEN_ACL_UNSAFE, ephemeral
        )

    def _wanted_owner(self, ephemeral: bool) -> int | None:
        return self._own_session() if ephemeral else 0

    def _check_payload(self, what: str, size: int) -> None:
        if size > _MAX_PAYLOAD:
            raise StoreLimitError(
                f"{what}: {size} bytes (values, and paths and framing of a commit's "
                f"operations) exceed ZooKeeper's request limit; keep them under "
                f"{_MAX_PAYLOAD} bytes in total"
            )

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Translate kazoo exceptions into shardkeeper's (see ``errors.py``)."""
        with translate(what, self._settings.hosts_string, self._settings.operation_timeout):
            yield

    def _prepare_namespace(self, client: kazoo_private.Client, deadline: float) -> None:
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
        # the client starts unrooted and is rooted once the node exists
        client.root_at(self._chroot)

    def _check_namespace_acl(self, client: KazooClient) -> None:
        """Refuse (or, with ``acl_repair``, repair) an existing namespace whose node or
        top-level nodes any client may use (see the module docstring)."""
        assert self._acl is not None
        s = self._settings
        found, checked = security.find_open_nodes(client, self._chroot, s.operation_timeout)
        if not found:
            return
        path, acls = found[0]
        more = f" (and {len(found) - 1} more of the {checked} nodes checked)" if found[1:] else ""
        if s.acl_repair:
            self.acl_repaired = security.repair_acls(
                client, self._chroot, self._acl, s.operation_timeout
            )
            _log.warning(
                "ZooKeeper namespace %r: node %s had ACL %s%s; acl_repair set user %r's "
                "digest ACL on all %d nodes of the namespace",
                self.namespace,
                path,
                security.describe_acl(acls),
                more,
                s.username,
                self.acl_repaired,
            )
            return
        raise StoreAuthError(
            f"ZooKeeper namespace {self.namespace!r} is open to any client: node {path} "
            f"has ACL {security.describe_acl(acls)}{more}, so a client without "
            "credentials can read, change or delete it (the namespace was first created "
            f"without credentials). Refusing to start with user {s.username!r}. Fix: run "
            "'shardkeeper registry fix-acl' with this registry URL, or add "
            "acl_repair=true to the URL once; either sets the user's digest ACL on every "
            "node of the namespace"
        )

    def _record_negotiated(self, seconds: float) -> None:
        # kazoo logs the negotiated session timeout but does not keep it
        self._negotiated = seconds

    # -- the event thread's entry points (events.py) --------------------------------

    @abstractmethod
    def _on_kazoo_state(self, kstate: str) -> None:
        """kazoo's state listener (on kazoo's connection thread)."""

    @abstractmethod
    def _on_watch_tap(self, etype: int, path: str) -> None:
        """Every watch notification (on kazoo's connection thread; must not block)."""

    @abstractmethod
    def _watches_dirty(self) -> bool:
        """Whether a watcher waits for a re-sync that failed (on the event thread)."""

    @abstractmethod
    def _resync_dirty(self) -> None:
        """Re-sync the dirty watchers if the connection allows (on the event thread)."""

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
                hosts=self._settings.hosts_string,
                client_id=client_id,
                timeout=timeout,
                **tls.kazoo_options(self._settings),
            )
            try:
                twin.start(timeout=timeout)
                twin.stop()
            finally:
                twin.close()

    def drop_connection(self) -> None:
        """Shut the client's socket down: kazoo sees the connection drop and reconnects
        (SUSPENDED, then RECONNECTED while the session lives)."""
        sock = kazoo_private.connection_socket(self._zk)
        if sock is None:
            raise StoreUnavailableError("drop_connection: the ZooKeeper store is not connected")
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
