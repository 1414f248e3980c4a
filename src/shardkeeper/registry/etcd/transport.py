"""The transport: the one part of the etcd store that touches the ``etcd3`` client.

It owns the client (its endpoints and channels), the gRPC stubs, the auth token and
the count of requests, and it sends every request: reads re-sent while that is safe,
transactions, the lease's requests and keep-alives, and the watch stream (a
:class:`WatchStream` whose callbacks get plain :class:`Change` records, never the
client's types). The private parts of the client it needs are in
``client_private.py``, which only this module imports. The other parts (``session``,
``watch``, the commits in ``planner``/``nesting``, ``store``) ask it through its
methods, describing their requests as plain records (``records.py``: compares, reads,
puts, deletes, transactions); it turns them into etcd3's generated messages through
``messages.py``, which only this module imports, and uses the generated code itself
for the gRPC stubs alone. It tells the watch part that a member was left through
:class:`MemberListener`.

Members
-------
The client starts on a random endpoint of the URL and stays there until a request, a
refresh or the watch stream fails in a way that means "this member cannot serve": no
answer within the deadline, UNAVAILABLE (unreachable, "no leader", "leader changed",
"request timed out") or CANCELLED. :meth:`Transport.move_on` then marks it failed
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
another member. See :meth:`Transport.read`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import etcd3
import etcd3.etcdrpc as rpc  # the gRPC stubs only: the messages are messages.py's
import etcd3.events
import etcd3.exceptions
import etcd3.watch
import grpc

from shardkeeper.errors import OperationTimeoutError, StoreLimitError, StoreUnavailableError
from shardkeeper.registry import tls
from shardkeeper.registry.etcd import messages
from shardkeeper.registry.etcd.client_private import (
    WatchStub,
    forget_failure,
    open_watcher,
    replace_channel,
    set_token,
    stream_thread,
    token_metadata,
    use_endpoint,
)
from shardkeeper.registry.etcd.core import CHANNEL_OPTIONS, RETRY_DELAY
from shardkeeper.registry.etcd.errors import (
    cannot_serve,
    during_election,
    is_stale_token,
    translated,
)
from shardkeeper.registry.etcd.records import Compare, Range, Request, Txn
from shardkeeper.registry.url import RegistrySettings

#: a transaction larger than this is refused before sending: etcd's default
#: --max-request-bytes is 1,572,864, and the gRPC envelope takes a little
_MAX_TXN_BYTES = 1_560_000

__all__ = [
    "REQUIRE_LEADER",
    "STUB_CLASSES",
    "Change",
    "MemberListener",
    "StreamEnd",
    "Transport",
    "WatchStream",
    "attempt_timeout",
]

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


class MemberListener(Protocol):
    """What the transport tells the watch part: it left ``endpoint``'s member (the
    watch stream, if it runs there, must be re-created on the next one)."""

    def member_left(self, endpoint: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Change:
    """One change a watch stream reported: a key put (``deleted`` False) or deleted at
    ``mod_revision``."""

    key: bytes
    value: bytes
    mod_revision: int
    create_revision: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """A watch on the stream ended: its start revision was ``compacted``, or the whole
    stream ended (``leave``: because its member could not serve it)."""

    compacted: bool
    leave: bool
    reason: str


class WatchStream:
    """One etcd watch stream on one member: the client's ``Watcher`` over our own stub
    (see ``client_private.open_watcher``). Its callbacks run on the stream's thread."""

    def __init__(self, endpoint: Any, watcher: Any, stub: WatchStub) -> None:
        #: the endpoint whose channel carries the stream
        self.endpoint = endpoint
        self._watcher = watcher
        self._stub = stub

    def add(
        self,
        key: bytes,
        end: bytes,
        start_revision: int,
        on_changes: Callable[[list[Change]], None],
        on_end: Callable[[StreamEnd], None],
    ) -> int | None:
        """Watch ``[key, end)`` from ``start_revision``; the watch id, or None when that
        revision is compacted (nothing created). Raises the client's errors: call it
        inside :meth:`Transport.translated`."""

        def callback(resp: Any) -> None:
            if isinstance(resp, etcd3.watch.WatchResponse):
                # etcd3 events read through to the KeyValue
                on_changes(
                    [
                        Change(
                            kv.key,
                            bytes(kv.value),
                            int(kv.mod_revision),
                            int(kv.create_revision),
                            isinstance(kv, etcd3.events.DeleteEvent),
                        )
                        for kv in resp.events
                    ]
                )
                return
            compacted = isinstance(resp, etcd3.exceptions.RevisionCompactedError)
            leave = isinstance(resp, grpc.RpcError) and resp.code() in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            )
            on_end(StreamEnd(compacted, leave and not compacted, str(resp)))

        try:
            wid: int = self._watcher.add_callback(
                key, callback, range_end=end, start_revision=start_revision
            )
        except etcd3.exceptions.RevisionCompactedError:
            return None
        return wid

    def cancel(self, watch_id: int) -> None:
        """End one watch of the stream (errors ignored: the stream may be gone)."""
        with contextlib.suppress(Exception):
            self._watcher.cancel(watch_id)

    def close(self) -> None:
        """Stop the stream: no more requests, and its call cancelled (its thread ends)."""
        with contextlib.suppress(Exception):
            self._watcher.close()
        self._stub.cancel()

    def thread(self) -> threading.Thread | None:
        """The thread that reads the stream, if it has one."""
        return stream_thread(self._watcher)


class Transport:
    """The client and every request of :class:`EtcdStore` (see the module docstring):
    member selection and failover, authentication, re-sent reads, the request count.

    Built with the settings (no I/O); :meth:`connect` makes the client. ``bind`` names
    who hears of a member left and where the lease id of an error message comes from.
    """

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._stubs: dict[str, tuple[Any, Any]] = {}
        # guards the choice of the endpoint in use (see move_on)
        self._endpoint_lock = threading.Lock()
        self._auth_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._round_trips = 0
        #: how often the store left a member that could not serve (see move_on)
        self.member_moves = 0
        self._listener: MemberListener | None = None
        self._lease: Callable[[], int] = lambda: 0
        #: fault hook (tests): cleared while a gray link holds the unary requests
        self._flowing = threading.Event()
        self._flowing.set()

    def bind(self, listener: MemberListener, lease: Callable[[], int]) -> None:
        """``listener`` hears of every member left; ``lease`` gives the session's lease
        id for the message of a lost lease."""
        self._listener = listener
        self._lease = lease

    # -- the client -------------------------------------------------------------------

    def connect(self) -> None:
        """Make the client (no request yet). user/password are NOT given to it: it
        would attach the token as call credentials, which gRPC refuses on a plaintext
        channel. We send the token as metadata ourselves (see :meth:`authenticate`)."""
        s = self.settings
        creds = tls.grpc_credentials(s) if s.tls else None
        endpoints = [
            etcd3.Endpoint(
                host, port, secure=s.tls, creds=creds, time_retry=0.5, opts=CHANNEL_OPTIONS
            )
            for host, port in s.hosts
        ]
        # (the client starts on a random endpoint: the instances of a job spread
        # over the members, as ZooKeeper clients do)
        self.attach(
            etcd3.MultiEndpointEtcd3Client(
                endpoints=endpoints, timeout=s.operation_timeout, failover=True
            )
        )

    def attach(self, client: Any) -> None:
        """Use ``client`` (an ``etcd3.MultiEndpointEtcd3Client``; tests give their own)."""
        self._client = client

    def close(self) -> None:
        """Close the client and its channels; never raises."""
        with contextlib.suppress(Exception):
            self._client.close()

    @property
    def members(self) -> int:
        """How many endpoints the URL names."""
        return len(self._client.endpoints)

    @property
    def round_trips(self) -> int:
        """Requests counted so far (``counted=True``, :meth:`count`)."""
        return self._round_trips

    def translated(self, what: str) -> contextlib.AbstractContextManager[None]:
        """THE boundary: turn grpc/etcd3 exceptions into shardkeeper errors (see
        :func:`~shardkeeper.registry.etcd.errors.translated`)."""
        return translated(what, self.settings, self._lease)

    # -- members ----------------------------------------------------------------------

    def move_on(self, endpoint: Any, reason: object) -> None:
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
        if self._listener is not None:
            self._listener.member_left(endpoint)

    def use(self, netloc: str) -> None:
        """Make the member at ``netloc`` (``host:port``) the one in use (tests steer
        the store onto a member they are about to stop)."""
        with self._endpoint_lock:
            use_endpoint(self._client, self._client.endpoints[netloc])

    def endpoint_in_use(self) -> Any:
        """The endpoint requests go to now."""
        return self._client.endpoint_in_use

    def _endpoint(self) -> tuple[Any, Any]:
        """The endpoint to use now and its channel."""
        with self._endpoint_lock:
            channel = self._client.channel
            return self._client.endpoint_in_use, channel

    def _stub(self, name: str) -> tuple[Any, Any]:
        """The endpoint to use now and the stub ``name`` on its channel.

        The client's own stub properties are cached across endpoint changes; asking
        for the channel each time follows :meth:`move_on`.
        """
        endpoint, channel = self._endpoint()
        cached = self._stubs.get(name)
        if cached is not None and cached[0] is channel:
            return endpoint, cached[1]
        stub = STUB_CLASSES[name](channel)
        self._stubs[name] = (channel, stub)
        return endpoint, stub

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Every request's metadata: require a leader, and the auth token if any."""
        token = token_metadata(self._client)
        return (REQUIRE_LEADER, *(token or ()))

    def count(self) -> None:
        """Count one request of a public method (:attr:`round_trips`)."""
        with self._count_lock:
            self._round_trips += 1

    # -- requests ---------------------------------------------------------------------

    def send(
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
        re-sent here). Call it inside :meth:`translated`."""
        limit = self.settings.operation_timeout if timeout is None else timeout
        for attempt in (1, 2):
            if counted:
                self.count()
            if not self._flowing.is_set():
                limit = self._held(method, limit)
            endpoint, grpc_stub = self._stub(stub)
            try:
                return getattr(grpc_stub, method)(request, limit, metadata=self.metadata())
            except grpc.RpcError as exc:
                if attempt == 1 and self.settings.username is not None and is_stale_token(exc):
                    self.authenticate(limit)
                    continue
                if cannot_serve(exc):
                    self.move_on(endpoint, f"{method}: {exc.code().name} {exc.details()}")
                raise
        raise AssertionError("unreachable")

    def hold_requests(self, on: bool) -> None:
        """Fault hook (tests): while on, every unary request (reads, transactions, a
        lease's grant or revoke) waits unsent, as behind a link that holds them, while
        the lease keep-alives and the watch stream go on: a gray link the proxy
        cannot make for etcd (its keep-alives share one HTTP/2 connection with the
        requests)."""
        if on:
            self._flowing.clear()
        else:
            self._flowing.set()

    def _held(self, method: str, limit: float) -> float:
        """Wait while requests are held: the time left of ``limit`` once they flow
        again, or OperationTimeoutError when it runs out first (never sent, as a
        request held past its deadline)."""
        began = time.monotonic()
        if not self._flowing.wait(limit):
            raise OperationTimeoutError(
                f"etcd {method}: no answer within {limit:.1f}s (requests held: gray link)"
            )
        return max(limit - (time.monotonic() - began), 0.01)

    def read_once(self, request: Range, *, timeout: float) -> Any:
        """One Range request within ``timeout``, neither counted nor re-sent (the
        start's read of the namespace root). Call it inside :meth:`translated`."""
        return self.send("kvstub", "Range", messages.range_request(request), timeout=timeout)

    def read(self, what: str, request: Range | Txn) -> Any:
        """Send a read-only KV request (a Range, or a transaction of reads), re-sending
        it while that is safe and useful, all within one operation timeout.

        A read a member cannot serve is sent again at once to the next member
        (:meth:`send` has moved on, see :meth:`move_on`):

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
        method, message = messages.kv_request(request)
        deadline = time.monotonic() + self.settings.operation_timeout
        members = self.members
        refused = dead = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                with self.translated(what):
                    return self.send(
                        "kvstub",
                        method,
                        message,
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

    def txn(
        self,
        what: str,
        *,
        compare: Sequence[Compare] = (),
        success: Sequence[Request] = (),
        failure: Sequence[Request] = (),
    ) -> Any:
        """One transaction of the records given, counted (refused before sending when
        it is over etcd's request size)."""
        req = messages.txn_request(Txn(tuple(compare), tuple(success), tuple(failure)))
        size = req.ByteSize()
        if size > _MAX_TXN_BYTES:
            # the server would refuse it anyway: say so without sending it
            raise StoreLimitError(
                f"{what}: the transaction would be {size} bytes, over etcd's request "
                f"limit (--max-request-bytes, 1.5 MiB by default); commit fewer or "
                "smaller nodes at once"
            )
        with self.translated(what):
            return self.send("kvstub", "Txn", req, counted=True)

    def authenticate(self, timeout: float) -> None:
        """Get a token for the URL's user (none when the server has authentication
        off) and send it with every request from now on."""
        with self._auth_lock:
            req = messages.authenticate(self.settings.username, self.settings.password or "")
            endpoint, stub = self._stub("authstub")
            try:
                resp = stub.Authenticate(req, timeout, metadata=(REQUIRE_LEADER,))
            except grpc.RpcError as exc:
                if cannot_serve(exc):
                    self.move_on(endpoint, f"Authenticate: {exc.code().name} {exc.details()}")
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

    def keep_alive(self, lease: int, timeout: float) -> int:
        """One keep-alive of ``lease`` on the member in use: the TTL left (<= 0: the
        lease is gone). A member that cannot serve it is left (the caller tries the
        next); re-sent once after re-authenticating when the server forgot the token."""
        req = messages.lease_keep_alive(lease)
        with self.translated("lease keep-alive"):
            for attempt in (1, 2):
                endpoint, stub = self._stub("leasestub")
                try:
                    stream = stub.LeaseKeepAlive(iter([req]), timeout, metadata=self.metadata())
                    for resp in stream:
                        return int(resp.TTL)
                except grpc.RpcError as exc:
                    if attempt == 1 and self.settings.username is not None and is_stale_token(exc):
                        self.authenticate(timeout)
                        continue
                    if cannot_serve(exc):
                        self.move_on(endpoint, f"keep-alive: {exc.code().name} {exc.details()}")
                    raise
                self.move_on(endpoint, "keep-alive: the stream closed without reply")
                raise StoreUnavailableError("lease keep-alive: the stream closed without reply")
        raise AssertionError("unreachable")

    def grant(self, ttl: int, *, timeout: float | None = None) -> tuple[int, int]:
        """Grant a lease of ``ttl`` seconds: its id and the TTL granted. Call it
        inside :meth:`translated`."""
        grant = self.send("leasestub", "LeaseGrant", messages.lease_grant(ttl), timeout=timeout)
        return int(grant.ID), int(grant.TTL)

    def revoke(self, lease: int, *, timeout: float | None = None) -> None:
        """Revoke ``lease`` (etcd deletes its keys at once). Call it inside
        :meth:`translated`."""
        self.send("leasestub", "LeaseRevoke", messages.lease_revoke(lease), timeout=timeout)

    # -- the watch stream -------------------------------------------------------------

    def open_watch_stream(self) -> WatchStream:
        """A new watch stream on the member in use. Built here rather than by the
        client, to send our metadata (require a leader, the token) and to keep the
        stream call (see ``client_private``)."""
        with self.translated("open the watch stream"):
            endpoint, channel = self._endpoint()
        watcher, stub = open_watcher(channel, self.settings.operation_timeout, self.metadata())
        return WatchStream(endpoint, watcher, stub)

    # -- the fault hook ---------------------------------------------------------------

    def drop_connection(self) -> None:
        """Close the gRPC channel in use and put a new one in its place: requests and
        the watch stream in flight fail, the next ones connect again."""
        endpoint = self._client.endpoint_in_use
        if endpoint is None:
            raise StoreUnavailableError("drop_connection: the etcd store has no channel in use")
        old = replace_channel(endpoint, CHANNEL_OPTIONS)
        with contextlib.suppress(Exception):
            old.close()
