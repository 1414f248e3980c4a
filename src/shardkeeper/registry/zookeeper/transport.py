"""The transport of the ZooKeeper store: the ONE part that touches the kazoo client.

It builds the client (``kazoo_private.Client``: kazoo's public client with the two
hooks of its connection thread, over :class:`~.handler.PollingHandler`), sends every
request and waits for it against a deadline, counts them (``round_trips``), cuts the
connection for the fault hooks and runs the second clients that end a session on the
server. The other parts ask it through its methods and build only kazoo_private's
request records (the multi's operations, as etcd's parts build the generated
messages); ``tests/registry/test_client_privates.py``
(``test_only_the_transport_touches_the_kazoo_client``) checks that.

What kazoo's connection thread tells goes to two small named interfaces, bound by the
store: :class:`ConnectionListener` (the session: kazoo's states, the negotiated
timeout) and :class:`MultiListener` (the tree watch: every notification, and the
multis of ours in flight, so that their own creations are adopted unread).

Errors and timeouts
    Every request is sent asynchronously and awaited against a per-call deadline of
    ``operation_timeout``; kazoo exceptions are translated in :meth:`Transport.errors`
    (``errors.py``) only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from shardkeeper.errors import StoreError, StoreLimitError, StoreUnavailableError
from shardkeeper.registry import tls
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.errors import translate
from shardkeeper.registry.zookeeper.handler import PollingHandler

__all__ = ["ConnectionListener", "Flight", "MultiListener", "Transport"]

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")

#: a multi as sent (guards and missing parents included) stays under jute.maxbuffer
#: (1,048,575 bytes) with room for its header: a larger one is refused before sending
_MULTI_LIMIT = 1_040_000


@dataclass(frozen=True)
class Flight:
    """What one multi of ours in flight creates, as its reply will tell the watches."""

    #: the nodes it leaves created (path -> value): its reply adopts them unread
    made: dict[str, bytes]
    #: every path it creates, absence guards included: a drain holds their CREATED
    #: until the reply (counted in the tree watch's ``inflight``; one entry per create)
    paths: tuple[str, ...]


class ConnectionListener(Protocol):
    """What the transport tells the session, on kazoo's connection thread (quick)."""

    def kazoo_state(self, kstate: str) -> None:
        """kazoo's state listener: ``CONNECTED``, ``SUSPENDED`` or ``LOST``."""
        ...

    def negotiated(self, seconds: float) -> None:
        """The session timeout the server negotiated, at each connect."""
        ...


class MultiListener(Protocol):
    """What the transport tells the tree watch: notifications and our multis."""

    def notified(self, etype: int, path: str) -> None:
        """Every watch notification (kazoo's connection thread; must not block)."""
        ...

    def take_off(self, ops: list[Any]) -> Flight | None:
        """A multi of ours is about to be sent: note what it creates (None: nothing
        to note, no watch)."""
        ...

    def applied(self, made: dict[str, bytes], ops: list[Any], zxid: int) -> None:
        """A multi of ours creating ``made`` applied (kazoo's connection thread, as
        its reply is read: after its own notifications, before any later one)."""
        ...

    def landed(self, paths: tuple[str, ...]) -> None:
        """The multi creating ``paths`` was answered (or given up on)."""
        ...


class Transport:
    """The kazoo client of one store and every request sent on it (see the module
    docstring). Owns the client, the namespace node's path, the request count and the
    closed flag."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        # escaped so that namespace X never sees X/sub as its node /sub
        self.chroot = "/" + settings.namespace.strip("/").replace("/", "%2F")
        self._client: kazoo_private.Client | None = None
        self._lock = threading.Lock()
        self._round_trips = 0
        self._closed = False
        self._states: ConnectionListener | None = None
        self._multis: MultiListener | None = None

    def bind(self, connection: ConnectionListener, multis: MultiListener) -> None:
        """Who hears kazoo's connection thread: ``connection`` its states and the
        negotiated timeout, ``multis`` the notifications and our multis."""
        self._states = connection
        self._multis = multis

    # -- lifecycle --------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the client was built (:meth:`connect`)."""
        return self._client is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`refuse` was called: every request raises from then on."""
        return self._closed

    def connect(self, acl: list[Any] | None) -> None:
        """Build the client (unrooted; no thread yet): digest auth when the URL has a
        user, ``acl`` on every node it creates."""
        s = self.settings
        missing = kazoo_private.missing_hooks()
        if missing:
            raise StoreError(
                f"this kazoo has no {', '.join(missing)}, which the ZooKeeper backend's "
                "watches and session timeout need: install the kazoo version the "
                "package requires"
            )
        assert self._states is not None and self._multis is not None, "bind() first"
        auth = {("digest", f"{s.username}:{s.password or ''}")} if s.username else None
        client = kazoo_private.Client(
            hosts=s.hosts_string,
            timeout=s.session_timeout,
            # kazoo's default back-off grows to an hour; a restarted server must be
            # found again well within the session timeout so the session survives
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, backoff=2, max_jitter=0.2, max_delay=0.5
            ),
            auth_data=auth,
            default_acl=acl,
            handler=PollingHandler(),
            watch_tap=self._multis.notified,
            on_negotiated=self._states.negotiated,
            **tls.kazoo_options(s),
        )
        client.add_listener(self._states.kazoo_state)
        self._client = client

    def start(self) -> None:
        """Start connecting (kazoo's threads); the session tells when it has one."""
        self.client.start_async()

    def refuse(self) -> None:
        """From now on every request raises (the store is closing)."""
        self._closed = True

    def close(self) -> None:
        """End the session and kazoo's threads; quiet on a store already down."""
        self._closed = True
        client = self._client
        if client is not None:
            try:
                client.stop()
                client.close()
            except Exception:  # a store already down must still close quietly
                _log.debug("error while closing the ZooKeeper client", exc_info=True)

    # -- what the other parts read ----------------------------------------------------

    @property
    def client(self) -> kazoo_private.Client:
        """The client; StoreUnavailableError before :meth:`connect` or once closed."""
        client = self._client
        if client is None or self._closed:
            state = "closed" if self._closed else "not started"
            raise StoreUnavailableError(
                f"ZooKeeper store for namespace {self.namespace!r} is {state}"
            )
        return client

    @property
    def round_trips(self) -> int:
        """Requests sent so far (a multi counts as one)."""
        return self._round_trips

    @property
    def connected(self) -> bool:
        """Whether the client is connected now."""
        client = self._client
        return client is not None and bool(client.connected)

    def session(self) -> int | None:
        """The session id requests are sent on now (None between sessions, and
        before the client exists)."""
        client = self._client
        cid = client.client_id if client is not None else None
        return cid[0] if cid else None

    def session_key(self) -> tuple[int, bytes] | None:
        """The session's (id, password) (StoreUnavailableError once closed)."""
        cid = self.client.client_id
        return tuple(cid) if cid else None  # type: ignore[return-value]

    def full(self, path: str) -> str:
        """The absolute ZooKeeper path (multi ops bypass kazoo's chroot handling)."""
        return self.chroot if path == "/" else self.chroot + path

    def deadline(self) -> float:
        """The deadline of a request sent now: ``operation_timeout`` from now."""
        return time.monotonic() + self.settings.operation_timeout

    def errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Translate kazoo exceptions into shardkeeper's (see ``errors.py``)."""
        return translate(what, self.settings.hosts_string, self.settings.operation_timeout)

    # -- requests ---------------------------------------------------------------------

    def _send(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._round_trips += 1
        return fn(*args, **kwargs)

    @staticmethod
    def wait(async_result: Any, deadline: float) -> Any:
        """The outcome of a request sent (raises its kazoo exception)."""
        return async_result.get(timeout=max(deadline - time.monotonic(), 0.0))

    def _request(self, deadline: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.wait(self._send(fn, *args, **kwargs), deadline)

    def get(self, deadline: float, path: str) -> Any:
        """``(data, stat)`` of ``path`` (kazoo's NoNodeError when absent)."""
        return self._request(deadline, self.client.get_async, path)

    def exists(self, deadline: float, path: str) -> Any:
        """The stat of ``path``, or None."""
        return self._request(deadline, self.client.exists_async, path)

    def children(self, deadline: float, path: str) -> list[str]:
        """The names of the children of ``path`` (kazoo's NoNodeError when absent)."""
        return list(self._request(deadline, self.client.get_children_async, path))

    def create(
        self,
        deadline: float,
        path: str,
        value: bytes,
        *,
        ephemeral: bool = False,
        include_data: bool = False,
    ) -> Any:
        """Create ``path`` (its parent must exist); with ``include_data`` the answer
        is ``(path, stat)``."""
        return self._request(
            deadline,
            self.client.create_async,
            path,
            value,
            ephemeral=ephemeral,
            include_data=include_data,
        )

    def set(self, deadline: float, path: str, value: bytes) -> Any:
        """Write ``value`` on the existing ``path``: its new stat."""
        return self._request(deadline, self.client.set_async, path, value)

    def delete(self, deadline: float, path: str) -> None:
        """Delete the leaf ``path`` (any version)."""
        self._request(deadline, self.client.delete_async, path)

    def send_exists(self, path: str) -> Any:
        """Send an exists of ``path`` (pipelined: :meth:`wait` for it)."""
        return self._send(self.client.exists_async, path)

    def send_delete(self, path: str) -> Any:
        """Send a delete of ``path`` (pipelined: :meth:`wait` for it)."""
        return self._send(self.client.delete_async, path)

    def send_multi_read(self, ops: list[Any]) -> Any:
        """Send ``ops`` (kazoo_private's read records) as one multiRead (pipelined)."""
        return self._send(kazoo_private.submit_multi_read, self.client, ops)

    def multi(self, deadline: float, ops: list[Any]) -> tuple[list[Any], int]:
        """Send ``ops`` (kazoo_private's records) as one multi: its per-operation
        results and its zxid. The tree watch hears of it (:class:`MultiListener`)."""
        size = kazoo_private.multi_size(ops)
        if size > _MULTI_LIMIT:
            # jute.maxbuffer would make the server drop the connection, suspending
            # every user of the session: refuse before sending
            raise StoreLimitError(
                f"commit: the multi would be {size} bytes with its guards and parents, "
                f"over ZooKeeper's request limit ({_MULTI_LIMIT}); commit fewer or "
                "smaller nodes at once"
            )
        listener = self._multis
        flight = listener.take_off(ops) if listener is not None else None
        try:
            applied = (
                functools.partial(listener.applied, flight.made)
                if listener is not None and flight is not None and flight.made
                else None
            )
            async_result = self._send(kazoo_private.submit_multi, self.client, ops, applied)
            results, zxid = self.wait(async_result, deadline)
        finally:
            if listener is not None and flight is not None and flight.paths:
                listener.landed(flight.paths)
        return list(results), int(zxid)

    def add_watch(self, deadline: float, path: str) -> None:
        """Set the persistent recursive watch on ``path`` (absolute)."""
        self._request(deadline, kazoo_private.submit_add_watch, self.client, path)

    def root_at_namespace(self) -> None:
        """Root the started client at the namespace node (it exists now)."""
        self.client.root_at(self.chroot)

    # -- the clock node (registry/clock.py; not counted) ------------------------------

    def stamp(self, path: str, value: bytes) -> Any:
        """Write ``value`` on the existing ``path`` within ``operation_timeout``: its
        new stat, whose ``mtime`` is the time the leader stamped on the write (kazoo's
        NoNodeError when absent). Not counted: a clock sample is none of the public
        methods' requests."""
        return self.wait(self.client.set_async(path, value), self.deadline())

    # -- ACLs (security.AclRequests; not counted) -------------------------------------

    def send_children(self, path: str) -> Any:
        """List the children of ``path`` (pipelined, not counted)."""
        return self.client.get_children_async(path)

    def send_get_acls(self, path: str) -> Any:
        """Read the ACL of ``path`` (pipelined, not counted): ``(acls, stat)``."""
        return self.client.get_acls_async(path)

    def send_set_acls(self, path: str, acl: list[Any]) -> Any:
        """Set the ACL of ``path`` (pipelined, not counted)."""
        return self.client.set_acls_async(path, acl)

    # -- the session's ends -----------------------------------------------------------

    def ask_new_session(self) -> None:
        """The next (re)connection asks for a NEW session (``relinquish_session``)."""
        self.client.forget_session()

    def cut(self) -> bool:
        """Shut the connection's socket down (kazoo sees it drop and reconnects);
        False when not connected."""
        sock = kazoo_private.connection_socket(self.client)
        if sock is None:
            return False
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        return True

    def _twin(self, client_id: tuple[int, bytes], timeout: float) -> KazooClient:
        """A second client attaching to the session ``client_id``."""
        return KazooClient(
            hosts=self.settings.hosts_string,
            client_id=client_id,
            timeout=timeout,
            **tls.kazoo_options(self.settings),
        )

    def end_session(self, client_id: tuple[int, bytes], timeout: float) -> None:
        """End the session ``client_id`` on the server: a second client attaches to
        it and closes it (kazoo's errors raised; call it inside :meth:`errors`)."""
        twin = self._twin(client_id, timeout)
        try:
            twin.start(timeout=timeout)
            twin.stop()
        finally:
            twin.close()

    def end_session_soon(
        self, client_id: tuple[int, bytes], session_timeout: float, timeout: float
    ) -> object | None:
        """Close the session ``client_id`` on the server within ``timeout``, on a
        daemon thread of its own (a link that holds requests holds the close too);
        None when closed, else why not (the close given up and the second client's
        connection cut, since attaching to the session renewed it)."""
        twin = self._twin(client_id, session_timeout)
        failed: list[BaseException] = []

        def close_it() -> None:
            try:
                twin.start(timeout=timeout)
                twin.stop()  # kazoo waits for the close's reply (at most 10 s)
            except Exception as exc:
                failed.append(exc)
            finally:
                with suppress(Exception):
                    twin.close()

        closer = threading.Thread(target=close_it, name="sk-zk-relinquish", daemon=True)
        closer.start()
        closer.join(timeout + 0.25)
        if closer.is_alive():
            # the close is held: cut the twin's connection so that it pings no more
            # (kazoo does not reconnect a client being stopped)
            twin_sock = kazoo_private.connection_socket(twin)
            if twin_sock is not None:
                with suppress(OSError):
                    twin_sock.shutdown(socket.SHUT_RDWR)
        if failed or closer.is_alive():
            return failed[0] if failed else f"no reply within {timeout:g}s"
        return None
