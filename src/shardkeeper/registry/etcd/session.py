"""The session: one lease per store, kept alive by the session thread, and the
connection-state transitions it drives (delivered, in order with the watch events,
by the store's event thread: the registry's shared
:class:`~shardkeeper.registry._events.EventLoop`).

Sessions
--------
The session is ONE lease per store (TTL = ``session_timeout`` rounded up to whole
seconds; the server may raise it to its minimum), refreshed by the store's session
thread every TTL/3. Every ephemeral key is attached to it. Each refresh attempt waits
at most TTL/4; one that fails on a member that cannot serve is sent again at once to
the next member (see ``members.py``). A refresh that failed on every member ->
SUSPENDED; the next successful one -> RECONNECTED; a refresh that finds the lease gone
(TTL <= 0: expired or revoked) -> LOST, then a new lease is granted -> CONNECTED with
the new ``session_id`` (the lease id in hex).

"""

from __future__ import annotations

import logging
import time

import etcd3.etcdrpc as rpc
import grpc

from shardkeeper.errors import OperationTimeoutError, StoreError, StoreUnavailableError
from shardkeeper.registry.base import ConnectionState
from shardkeeper.registry.etcd.core import RETRY_DELAY
from shardkeeper.registry.etcd.errors import cannot_serve, is_stale_token
from shardkeeper.registry.etcd.watch import WatchMixin

__all__ = ["SessionMixin"]

_log = logging.getLogger(__name__)


class SessionMixin(WatchMixin):
    """The session thread of :class:`EtcdStore` (see the module docstring)."""

    # -- internals: session ------------------------------------------------------------

    def _run_session(self) -> None:
        next_check = time.monotonic() + self._ttl / 3
        while not self._stopping.is_set():
            delay = next_check - time.monotonic()
            with self._wlock:
                if self._pending:
                    delay = min(delay, RETRY_DELAY)
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
                    next_check = time.monotonic() + RETRY_DELAY
            try:
                self._restore_watches()
            except Exception:
                _log.exception("etcd watch recovery failed unexpectedly")

    def _session_step(self) -> float:
        """Refresh (or replace) the lease; return the delay until the next step."""
        if self._loop.state is ConnectionState.LOST:
            try:
                with self._translated("grant a new session lease"):
                    grant = self._send(
                        "leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=self._ttl_wanted)
                    )
            except StoreError as exc:
                _log.info("etcd: no new session lease yet: %s", exc)
                return RETRY_DELAY
            self._lease = int(grant.ID)
            self._ttl = int(grant.TTL) or self._ttl_wanted
            self._set_state(ConnectionState.CONNECTED)
            return self._ttl / 3
        try:
            ttl = self._keep_alive()
        except StoreError as exc:
            if self._loop.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
                _log.warning("etcd session %x suspended: %s", self._lease, exc)
                self._set_state(ConnectionState.SUSPENDED)
            return RETRY_DELAY
        if ttl <= 0:
            _log.warning("etcd session lease %x expired or was revoked", self._lease)
            self._set_state(ConnectionState.LOST)
            return 0.0
        if self._loop.state is ConnectionState.SUSPENDED:
            self._set_state(ConnectionState.RECONNECTED)
            # The stream may have died silently while we were cut off: re-create
            # every watch from its last revision (nothing lost, nothing doubled).
            self._restart_watch_stream()
        return self._ttl / 3

    def _keep_alive(self) -> int:
        """Refresh the lease once; return the TTL left (<= 0: the lease is gone).

        Each attempt has a deadline of a quarter of the TTL (a reply slower than that
        already eats into the lease). A member that cannot serve it (no answer in
        time, unreachable, no leader) is left at once for the next one, and the
        keep-alive is sent again there, each member at most once per refresh: with
        refreshes every TTL/3, a client on a member cut off from its peers reaches
        another member within about TTL/3 + TTL/4, before the lease runs out. Only when
        every member failed is the error raised (the session goes SUSPENDED). (A
        deadline that followed slow answers kept clients on an isolated member too
        long: a 600 s chaos run lost a session that way.)
        """
        timeout = min(self.settings.operation_timeout, max(self._ttl / 4, 0.25))
        members = len(self._client.endpoints)
        for left in range(members - 1, -1, -1):
            try:
                return self._keep_alive_once(timeout)
            except (StoreUnavailableError, OperationTimeoutError) as exc:
                if left == 0:
                    raise
                _log.info("etcd: lease keep-alive failed (%s); sending it to another member", exc)
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
                    if attempt == 1 and self.settings.username is not None and is_stale_token(exc):
                        self._authenticate(timeout)
                        continue
                    if cannot_serve(exc):
                        self._move_on(endpoint, f"keep-alive: {exc.code().name} {exc.details()}")
                    raise
                self._move_on(endpoint, "keep-alive: the stream closed without reply")
                raise StoreUnavailableError("lease keep-alive: the stream closed without reply")
        raise AssertionError("unreachable")

    def _set_state(self, state: ConnectionState) -> None:
        """Record ``state`` and queue its delivery, unless it is the current state."""
        self._loop.post_state(state)
