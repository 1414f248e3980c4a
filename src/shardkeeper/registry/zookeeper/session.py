"""The session of a ZooKeeper store: connection states, the session id, the namespace
node, credentials, and giving the session up.

Connection states
    kazoo CONNECTED on the first session -> CONNECTED; SUSPENDED -> SUSPENDED;
    CONNECTED with the same session id -> RECONNECTED; LOST -> LOST, and kazoo's next
    session -> CONNECTED. kazoo's listener (:meth:`Session.kazoo_state`, on kazoo's
    connection thread) only posts to the store's event thread (the registry's shared
    :class:`~shardkeeper.registry._events.EventLoop`); the states are delivered there,
    followed, after a reconnect or a new session, by the re-sync of every watch (asked
    of the tree watch through :class:`Resync`; its changes reported after the state).
    Threads per store: kazoo's three (connection, completion, callback) plus the one
    event thread, whatever the number of watches.

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
import threading
from contextlib import suppress
from typing import Any, Protocol

from kazoo import exceptions as kz
from kazoo.protocol.states import KazooState
from kazoo.security import make_digest_acl

from shardkeeper.errors import ConfigError, StoreAuthError, StoreUnavailableError
from shardkeeper.registry._events import EventLoop
from shardkeeper.registry.base import ConnectionState
from shardkeeper.registry.logthrottle import RetryLogFilter
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.registry.zookeeper import security
from shardkeeper.registry.zookeeper.owned import OwnedEphemerals
from shardkeeper.registry.zookeeper.transport import Transport

__all__ = [
    "KAZOO_RETRY_FILTER",
    "KAZOO_RETRY_MESSAGES",
    "Resync",
    "Session",
    "install_retry_log_filter",
]

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


class Resync(Protocol):
    """What the session asks of the tree watch: after a reconnect or a new session,
    set every watch again and re-read its subtree (the server dropped the watches
    with the connection)."""

    def resync_all(self) -> None: ...


class Session:
    """The session of :class:`~shardkeeper.registry.zookeeper.ZooKeeperStore` (see the
    module docstring): its connection states, its id, the negotiated timeout, the
    credentials and the namespace node. Implements the transport's
    :class:`~.transport.ConnectionListener`."""

    def __init__(
        self,
        settings: RegistrySettings,
        transport: Transport,
        loop: EventLoop,
        owned: OwnedEphemerals,
    ) -> None:
        self._settings = settings
        self.namespace = settings.namespace
        self._transport = transport
        self._loop = loop
        #: our ephemeral nodes of known incarnation: void at every state change
        self._owned = owned
        self._watches: Resync | None = None
        self._sid: int | None = None
        self._first_session = threading.Event()
        self._negotiated: float | None = None
        #: the ACL of every node the session creates (None: no credentials, open)
        self.acl: list[Any] | None = None
        if settings.username:
            self.acl = [make_digest_acl(settings.username, settings.password or "", all=True)]
        #: nodes whose ACL the last repair set (acl_repair at start, or repair_acl())
        self.acl_repaired = 0
        # kazoo logs the auth request (password included) at DEBUG: blank it out
        security.install_credential_filter()
        install_retry_log_filter()
        security.register_secret(settings.password)

    def bind(self, watches: Resync) -> None:
        """``watches`` re-syncs every watch after a reconnect or a new session."""
        self._watches = watches

    # -- what the store reads ---------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The ZooKeeper session id in hex (``''`` before the first session)."""
        return hex(self._sid) if self._sid is not None else ""

    @property
    def session_timeout(self) -> float:
        """The session timeout the server negotiated, in seconds."""
        if self._negotiated is not None:
            return self._negotiated
        return self._settings.session_timeout

    def wait_first(self, timeout: float) -> bool:
        """Wait for the first session (``start``); whether it came in time."""
        return self._first_session.wait(timeout)

    # -- kazoo's connection thread (transport.ConnectionListener) ----------------------

    def kazoo_state(self, kstate: str) -> None:
        """kazoo's state listener: record the session id, hand over, return (known
        incarnations hold for one connection only: see owned.py)."""
        self._owned.reset()
        sid = self._transport.session() if kstate == KazooState.CONNECTED else None
        self._loop.post(functools.partial(self._handle_state, kstate, sid))

    def negotiated(self, seconds: float) -> None:
        """kazoo logs the negotiated session timeout but does not keep it."""
        self._negotiated = seconds

    # -- on the event thread ------------------------------------------------------------

    def _handle_state(self, kstate: str, sid: int | None) -> None:
        if self._transport.closed:
            return
        loop = self._loop
        if kstate == KazooState.SUSPENDED:
            loop.deliver_state(ConnectionState.SUSPENDED)
        elif kstate == KazooState.LOST:
            loop.deliver_state(ConnectionState.LOST)
        elif kstate == KazooState.CONNECTED:
            first = self._sid is None
            if not first and sid == self._sid and loop.state != ConnectionState.LOST:
                loop.deliver_state(ConnectionState.RECONNECTED)
            else:
                if not first and loop.state != ConnectionState.LOST:
                    # a new session without a LOST seen: its ephemerals are gone all the same
                    loop.deliver_state(ConnectionState.LOST)
                self._sid = sid
                loop.deliver_state(ConnectionState.CONNECTED)
            self._first_session.set()
            if not first and self._watches is not None:
                self._watches.resync_all()

    # -- the namespace node and its ACL -----------------------------------------------

    def prepare_namespace(self, deadline: float) -> None:
        """Create the namespace node if absent, check our credentials on it, then root
        the client there (it starts unrooted)."""
        t = self._transport
        chroot = t.chroot
        with t.errors(chroot):
            try:
                # reading the children needs READ: wrong credentials fail here, at start
                t.children(deadline, chroot)
            except kz.NoNodeError:
                with suppress(kz.NodeExistsError):
                    t.create(deadline, chroot, b"")
                t.children(deadline, chroot)
            else:
                if self.acl is not None:
                    self._check_namespace_acl()
        # the client starts unrooted and is rooted once the node exists
        t.root_at_namespace()

    def repair_acl(self) -> int:
        """Set this store's digest ACL on every node of the namespace (top-down, the
        namespace node included); return how many nodes. Needs credentials."""
        if self.acl is None:
            raise ConfigError(
                f"cannot repair the ACLs of namespace {self.namespace!r} without "
                "credentials: give user:password in the registry URL"
            )
        t = self._transport
        chroot = t.chroot
        with t.errors(chroot):
            self.acl_repaired = security.repair_acls(
                t,
                "/",
                self.acl,
                self._settings.operation_timeout,
                shown=lambda p: chroot if p == "/" else chroot + p,
            )
        return self.acl_repaired

    def _check_namespace_acl(self) -> None:
        """Refuse (or, with ``acl_repair``, repair) an existing namespace whose node or
        top-level nodes any client may use (see the module docstring)."""
        assert self.acl is not None
        s = self._settings
        t = self._transport
        found, checked = security.find_open_nodes(t, t.chroot, s.operation_timeout)
        if not found:
            return
        path, acls = found[0]
        more = f" (and {len(found) - 1} more of the {checked} nodes checked)" if found[1:] else ""
        if s.acl_repair:
            self.acl_repaired = security.repair_acls(t, t.chroot, self.acl, s.operation_timeout)
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

    # -- giving the session up, ending it (the fault hooks) -----------------------------

    def relinquish(self) -> None:
        """:meth:`ZooKeeperStore.relinquish_session` (see there)."""
        t = self._transport
        old = t.session_key()
        if old is None:
            raise StoreUnavailableError("relinquish_session: the ZooKeeper store has no session")
        # kazoo's connection thread reads the session id and password only when it
        # (re)connects: forgotten now, the reconnect after the cut below asks for a
        # new session
        t.ask_new_session()
        t.cut()
        # short: the twin's connection renews the session it attaches to, so a close
        # that is held (the link holds requests) must not keep it alive for long
        timeout = max(0.25, min(self._settings.operation_timeout, self.session_timeout / 4))
        why = t.end_session_soon(old, self.session_timeout, timeout)
        if why is not None:
            _log.warning(
                "ZooKeeper session %#x could not be closed now (%s): it expires within "
                "the session timeout",
                old[0],
                why,
            )

    def expire(self, timeout: float) -> None:
        """:meth:`ZooKeeperStore.expire_session` (see there)."""
        t = self._transport
        client_id = t.session_key()
        if client_id is None:
            raise StoreUnavailableError("expire_session: the ZooKeeper store has no session now")
        with t.errors("expire_session"):
            t.end_session(client_id, timeout)

    def drop_connection(self) -> None:
        """:meth:`ZooKeeperStore.drop_connection` (see there)."""
        if not self._transport.cut():
            raise StoreUnavailableError("drop_connection: the ZooKeeper store is not connected")
