"""The session: one lease per store, kept alive by the session thread, and the
connection-state transitions it drives (delivered, in order with the watch events,
by the store's event thread: the registry's shared
:class:`~shardkeeper.registry._events.EventLoop`).

Sessions
--------
The session is ONE lease per store (TTL = ``session_timeout`` rounded up to whole
seconds; the server may raise it to its minimum), refreshed by the store's session
thread every TTL/3, the first time as soon as the thread starts. Every ephemeral key
is attached to it. A refresh that failed on every member -> SUSPENDED; the next
successful one -> RECONNECTED; a refresh that finds the lease gone (TTL <= 0:
expired or revoked) -> LOST, then a new lease is granted -> CONNECTED with the new
``session_id`` (the lease id in hex).

Validity
--------
Only a keep-alive (or the grant) renews the lease; a read or a commit answered by the
server proves nothing about it. So the store remembers when it sent the latest
renewal that was answered (:meth:`Session.last_renewal`): the server keeps the
lease at least the TTL it then granted from that moment, and the runtime's freshness
clock counts from there (``runtime/health/liveness.py``), never from other answers.

The attempts of one refresh share what is left of the lease: each member gets at most
(time left until the last renewal's send time + TTL) / (members still to try), at
least 0.25 s, at most the operation timeout (once the lease may have run out, a
quarter of the TTL: the answer tells whether it survived). A member that cannot serve is left at
once for the next one (see ``transport.py``); when every member failed the session is
SUSPENDED, no later than the moment the lease may have run out.

The session thread does nothing else: re-creating watches after their stream broke
(which can wait up to the operation timeout on a member that holds the request) runs
on the watch part's own recovery thread (``watch.py``), so that no keep-alive ever
waits behind it. The session asks it through :class:`StreamRestart` to re-create the
stream after a reconnect; the watch part asks the session through
:meth:`Session.check_soon` to check the lease at once after a stream broke.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Protocol

from shardkeeper.errors import OperationTimeoutError, StoreError, StoreUnavailableError
from shardkeeper.registry._events import EventLoop
from shardkeeper.registry.base import ConnectionState
from shardkeeper.registry.etcd.core import RETRY_DELAY
from shardkeeper.registry.etcd.transport import Transport
from shardkeeper.registry.url import RegistrySettings

__all__ = ["MIN_KEEPALIVE_ATTEMPT", "Session", "StreamRestart"]

_log = logging.getLogger(__name__)

#: the shortest wait of one keep-alive attempt
MIN_KEEPALIVE_ATTEMPT = 0.25


class StreamRestart(Protocol):
    """What the session asks of the watch part: after a reconnect, re-create every
    watch from its last revision (the stream may have died silently meanwhile)."""

    def restart_stream(self) -> None: ...


class Session:
    """The lease of :class:`EtcdStore` and its session thread (see the module
    docstring). Owns the lease id, the TTL, the validity and the thread; posts the
    connection states on the store's event loop."""

    def __init__(self, settings: RegistrySettings, transport: Transport, loop: EventLoop) -> None:
        self.settings = settings
        self._transport = transport
        self._loop = loop
        self._watches: StreamRestart | None = None
        self._ttl_wanted = max(1, math.ceil(settings.session_timeout))
        self._ttl = self._ttl_wanted
        self._lease = 0
        # send time of the latest answered renewal of the current lease (-inf: none)
        self._renewed_at = -math.inf
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._check_now = False

    def bind(self, watches: StreamRestart) -> None:
        """``watches`` re-creates the watch stream after a reconnect."""
        self._watches = watches

    # -- what the store reads ---------------------------------------------------------

    @property
    def lease_id(self) -> int:
        """The current (or last) lease id; 0 before the first grant."""
        return self._lease

    @property
    def ttl(self) -> int:
        """The lease TTL granted by the server, in seconds."""
        return self._ttl

    def last_renewal(self) -> float:
        """:meth:`CoordinationStore.last_renewal`: when the latest lease keep-alive
        (or grant) the server answered was sent; ``-inf`` while the store has no
        lease known alive (before the first keep-alive answers, after LOST)."""
        return self._renewed_at

    # -- lifecycle --------------------------------------------------------------------

    def grant(self, timeout: float) -> None:
        """Grant the first lease (``start``); its validity starts at the first
        keep-alive's answer. Call it inside ``Transport.translated``."""
        lease, ttl = self._transport.grant(self._ttl_wanted, timeout=timeout)
        self.adopt(lease, ttl)

    def adopt(self, lease: int, ttl: int) -> None:
        """Make ``lease`` (granted with ``ttl``, 0: the TTL asked) the session's."""
        self._lease = lease
        self._ttl = ttl or self._ttl_wanted

    def start(self, name: str) -> None:
        """Start the session thread ``name``."""
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the session thread (waiting up to ``timeout``); the lease is left as is."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def check_soon(self) -> None:
        """Check the lease now rather than at the next refresh (a stream broke, a
        fault hook ran)."""
        self._check_now = True
        self._wake.set()

    def revoke(self, lease: int, timeout: float | None = None) -> None:
        """Revoke ``lease``. Call it inside ``Transport.translated``."""
        self._transport.revoke(lease, timeout=timeout)

    # -- the session thread -----------------------------------------------------------

    def run(self) -> None:
        """The session thread: refresh (or replace) the lease until stopped."""
        # The grant made by start() was sent at a time this thread does not know:
        # the first keep-alive goes out at once and its answer starts the validity.
        next_check = time.monotonic()
        while not self._stopping.is_set():
            delay = next_check - time.monotonic()
            if delay > 0 and not self._check_now:
                self._wake.wait(delay)
            self._wake.clear()
            if self._stopping.is_set():
                return
            if self._check_now or time.monotonic() >= next_check:
                self._check_now = False
                try:
                    next_check = time.monotonic() + self.step()
                except Exception:
                    _log.exception("etcd session check failed unexpectedly")
                    next_check = time.monotonic() + RETRY_DELAY

    def step(self) -> float:
        """Refresh (or replace) the lease; return the delay until the next step."""
        if self._loop.state is ConnectionState.LOST:
            sent = time.monotonic()
            try:
                with self._transport.translated("grant a new session lease"):
                    lease, ttl = self._transport.grant(self._ttl_wanted)
            except StoreError as exc:
                _log.info("etcd: no new session lease yet: %s", exc)
                return RETRY_DELAY
            self.adopt(lease, ttl)
            self._renewed_at = sent
            self.set_state(ConnectionState.CONNECTED)
            return self._ttl / 3
        try:
            ttl = self._keep_alive()
        except StoreError as exc:
            if self._loop.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
                _log.warning("etcd session %x suspended: %s", self._lease, exc)
                self.set_state(ConnectionState.SUSPENDED)
            return RETRY_DELAY
        if ttl <= 0:
            _log.warning("etcd session lease %x expired or was revoked", self._lease)
            self.set_state(ConnectionState.LOST)
            return 0.0
        if self._loop.state is ConnectionState.SUSPENDED:
            self.set_state(ConnectionState.RECONNECTED)
            # The stream may have died silently while we were cut off: re-create
            # every watch from its last revision (nothing lost, nothing doubled).
            if self._watches is not None:
                self._watches.restart_stream()
        return self._ttl / 3

    def _attempt_timeout(self, members_left: int) -> float:
        """The wait of the next keep-alive attempt when ``members_left`` members may
        still be tried: an equal share of what is left of the lease (module
        docstring, Validity), within [MIN_KEEPALIVE_ATTEMPT, operation timeout]."""
        if self._renewed_at == -math.inf:
            left = float(self._ttl)  # the first keep-alive, just after the grant
        else:
            left = self._renewed_at + self._ttl - time.monotonic()
        # once the lease may have run out: long enough for a slow link to hear whether
        # it did (a longer wait gives nothing more: the validity has ended anyway)
        share = self._ttl / 4 if left <= 0 else left / max(members_left, 1)
        return min(self.settings.operation_timeout, max(share, MIN_KEEPALIVE_ATTEMPT))

    def _keep_alive(self) -> int:
        """Refresh the lease once; return the TTL left (<= 0: the lease is gone).

        Each attempt waits its share of what is left of the lease
        (:meth:`_attempt_timeout`), so that every member is tried before the lease
        may have run out. A member that cannot serve it (no answer in time,
        unreachable, no leader) is left at once for the next one, and the keep-alive
        is sent again there, each member at most once per refresh. Only when every
        member failed is the error raised (the session goes SUSPENDED). (A deadline
        that followed slow answers kept clients on an isolated member too long: a
        600 s chaos run lost a session that way.) An answered keep-alive records its
        send time: the validity of everything the session owns counts from it.
        """
        members = self._transport.members
        for left in range(members, 0, -1):
            lease = self._lease
            sent = time.monotonic()
            try:
                ttl = self._transport.keep_alive(lease, self._attempt_timeout(left))
            except (StoreUnavailableError, OperationTimeoutError) as exc:
                if left == 1:
                    raise
                _log.info("etcd: lease keep-alive failed (%s); sending it to another member", exc)
                continue
            self._renewed(lease, sent, ttl)
            return ttl
        raise AssertionError("unreachable")

    def _renewed(self, lease: int, sent: float, ttl: int) -> None:
        """Record the answer ``ttl`` of a keep-alive of ``lease`` sent at ``sent``."""
        if lease != self._lease or self._loop.state is ConnectionState.LOST:
            return  # the lease was given up meanwhile: its renewal proves nothing now
        if ttl <= 0:
            self._renewed_at = -math.inf
            return
        self._renewed_at = max(self._renewed_at, sent)
        self._ttl = ttl

    def set_state(self, state: ConnectionState) -> None:
        """Record ``state`` and queue its delivery, unless it is the current state.
        LOST ends the validity of the lease at once (it is gone, or given up)."""
        if state is ConnectionState.LOST:
            self._renewed_at = -math.inf
        self._loop.post_state(state)
