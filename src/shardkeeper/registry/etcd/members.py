"""Requests and members: sending a request to the member in use, re-sending reads,
authenticating, and moving on to another member when one cannot serve.

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


Reads (``get``, ``exists``, ``children``, ``get_tree``) are re-sent when that is safe
and useful, within their one operation timeout: at once to the next member after a
failure that means the member cannot serve (a read fails fast when every member was
found dead; each attempt gets half the time left, so a member that holds it leaves
time for another), pausing 0.2 s after each round of "no leader"/"leader changed"
refusals while the cluster elects a leader. Writes are never re-sent: a commit whose
outcome is unknown raises OperationTimeoutError, and only the NEXT request goes to
another member. See :meth:`EtcdStore._read`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import etcd3.etcdrpc as rpc
import grpc

from shardkeeper.errors import OperationTimeoutError, StoreLimitError, StoreUnavailableError
from shardkeeper.registry.etcd.client_private import (
    forget_failure,
    set_token,
    token_metadata,
    use_endpoint,
)
from shardkeeper.registry.etcd.core import RETRY_DELAY, EtcdCore
from shardkeeper.registry.etcd.errors import cannot_serve, during_election, is_stale_token

#: a transaction larger than this is refused before sending: etcd's default
#: --max-request-bytes is 1,572,864, and the gRPC envelope takes a little
_MAX_TXN_BYTES = 1_560_000

__all__ = ["REQUIRE_LEADER", "MembersMixin", "attempt_timeout"]

_log = logging.getLogger(__name__)

STUB_CLASSES: dict[str, Callable[[Any], Any]] = {
    "kvstub": rpc.KVStub,
    "leasestub": rpc.LeaseStub,
    "authstub": rpc.AuthStub,
}


#: gRPC metadata of every request: etcd's "require leader". A member that has no
#: leader (cut off from its peers, or during an election) then refuses the request at
#: once with "etcdserver: no leader" instead of holding it until the deadline, and
#: cancels a watch stream after a few election timeouts without a leader (a member
#: with no leader receives no changes: its watches would fall silent).
REQUIRE_LEADER = ("hasleader", "true")


def attempt_timeout(remaining: float, several: bool) -> float:
    """The deadline of one attempt of a read that may be sent again: with other
    members to try, half of what is left (at least 0.5 s, or all of it), so that a
    member that holds the read without answering leaves time to ask another."""
    if not several or remaining <= 1.0:
        return remaining
    return remaining / 2


class MembersMixin(EtcdCore):
    """Requests, member selection and failover of :class:`EtcdStore` (see the module
    docstring)."""

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
                forget_failure(nxt)
            use_endpoint(client, nxt)
            self.member_moves += 1
        _log.info("etcd: leaving member %s for %s: %s", endpoint.netloc, nxt.netloc, reason)
        with self._wlock:
            stale = self._watcher is not None and self._watcher_endpoint is endpoint
        if stale:
            # (wakes the watch-recovery thread, which re-creates them)
            self._restart_watch_stream()

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
        stub = STUB_CLASSES[name](channel)
        self._stubs[name] = (channel, stub)
        return endpoint, stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """Every request's metadata: require a leader, and the auth token if any."""
        token = token_metadata(self._client)
        return (REQUIRE_LEADER, *(token or ()))

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
                if attempt == 1 and self.settings.username is not None and is_stale_token(exc):
                    self._authenticate(limit)
                    continue
                if cannot_serve(exc):
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
          one) refuses it at once with "no leader" (see ``REQUIRE_LEADER``) or
          "leader changed"; after a whole round of such refusals the next round waits
          ``RETRY_DELAY``;
        * a member that holds it without answering (it has not noticed yet that it
          lost its peers) is given half of the time left, so that another member can
          still be asked (:func:`attempt_timeout`).

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
                        timeout=max(attempt_timeout(remaining, members > 1), 0.01),
                    )
            except (StoreUnavailableError, OperationTimeoutError) as exc:
                election = during_election(exc)
                if isinstance(exc, StoreUnavailableError) and not election:
                    dead += 1
                if (members == 1 and not election) or dead >= members:
                    raise  # nowhere else to go, or every member is down
                refused += 1
                pause = RETRY_DELAY if refused % members == 0 else 0.0
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
        size = req.ByteSize()
        if size > _MAX_TXN_BYTES:
            # the server would refuse it anyway: say so without sending it
            raise StoreLimitError(
                f"{what}: the transaction would be {size} bytes, over etcd's request "
                f"limit (--max-request-bytes, 1.5 MiB by default); commit fewer or "
                "smaller nodes at once"
            )
        with self._translated(what):
            return self._send("kvstub", "Txn", req, counted=True)

    def _authenticate(self, timeout: float) -> None:
        with self._auth_lock:
            req = rpc.AuthenticateRequest(
                name=self.settings.username, password=self.settings.password or ""
            )
            endpoint, stub = self._stub("authstub")
            try:
                resp = stub.Authenticate(req, timeout, metadata=(REQUIRE_LEADER,))
            except grpc.RpcError as exc:
                if cannot_serve(exc):
                    self._move_on(endpoint, f"Authenticate: {exc.code().name} {exc.details()}")
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # "authentication is not enabled": the server accepts everyone
                    _log.warning(
                        "etcd at %s has authentication disabled; ignoring the credentials",
                        self.settings.hosts_string,
                    )
                    set_token(self._client, None)
                    return
                raise
            set_token(self._client, (("token", resp.token),))
