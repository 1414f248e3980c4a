"""The etcd store's public methods: start and close, reads, writes, commits and the
fault hooks of the tests; the roles they rely on are in the sibling modules (see the
package docstring).

Authentication
--------------
With a user name, :meth:`EtcdStore.start` authenticates and sends the token as gRPC
metadata (the ``etcd3`` client would attach it as call credentials, which gRPC
refuses on a plaintext channel). A token the server forgot (restart, token TTL) is
renewed once and the refused request re-sent. ``start`` also reads the namespace
root key once, because etcd 3.4 grants leases without checking credentials: missing
or wrong credentials fail in ``start``, not at the first read.

Costs
-----
:attr:`EtcdStore.round_trips` counts requests made by the public methods (a
transaction counts 1, each re-sent request too); background keep-alives and watch
recovery are not counted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence

import etcd3
import etcd3.etcdrpc as rpc

from shardkeeper.errors import (
    OperationTimeoutError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry import tls
from shardkeeper.registry.base import CommitResult, ConnectionState, Create, Node, Op, Put
from shardkeeper.registry.etcd.client_private import replace_channel, stream_thread
from shardkeeper.registry.etcd.core import CHANNEL_OPTIONS, RETRY_DELAY
from shardkeeper.registry.etcd.keys import below_op, below_prefix, range_op, subtree, synthetic_node
from shardkeeper.registry.etcd.nesting import GroupsMixin
from shardkeeper.registry.etcd.session import SessionMixin
from shardkeeper.registry.etcd.watch import end_watcher

__all__ = ["EtcdStore"]

_log = logging.getLogger(__name__)


class EtcdStore(SessionMixin, GroupsMixin):
    """A :class:`CoordinationStore` on etcd v3 (see the package docstring for the mapping).

    Construct with :class:`RegistrySettings` (no I/O), then :meth:`start`.
    """

    def identity(self) -> str:
        """The registry and namespace (``RegistrySettings.identity``)."""
        return self.settings.identity()

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
            creds = tls.grpc_credentials(s) if s.tls else None
            endpoints = [
                etcd3.Endpoint(
                    host, port, secure=s.tls, creds=creds, time_retry=0.5, opts=CHANNEL_OPTIONS
                )
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
                            f"last error: {exc}){tls.unreachable_note(s)}"
                        ) from exc
                    time.sleep(min(RETRY_DELAY * attempt, 0.5, remaining))
                except BaseException:
                    self._client.close()
                    raise
            self._lease = int(grant.ID)
            self._ttl = int(grant.TTL) or self._ttl_wanted
            # recorded now, delivered on the event thread once it runs
            self._loop.post_state(ConnectionState.CONNECTED)
            self._started = True
            tag = self.namespace.replace("/", ".")
            self._session_thread = threading.Thread(
                target=self._run_session, name=f"shardkeeper-etcd-session[{tag}]", daemon=True
            )
            self._loop.start()
            self._session_thread.start()

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
        end_watcher(watcher, watch_stub)
        self._loop.stop(join_timeout)
        with contextlib.suppress(Exception):
            self._client.close()
        # closing the channel ends the stream; wait for the etcd3 stream thread so a
        # closed store leaves no thread behind
        thread = stream_thread(watcher)
        if thread is not None and thread is not me:
            thread.join(join_timeout)

    # -- reads ------------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``; a synthetic empty node for a pure parent; else None."""
        key = self._key(path)
        resp = self._read(
            f"get {path}",
            "Txn",
            rpc.TxnRequest(success=[range_op(key), below_op(key, keys_only=True, limit=1)]),
        )
        own = resp.responses[0].response_range.kvs
        if own:
            return self._node(own[0])
        if resp.responses[1].response_range.kvs:
            return synthetic_node(path)
        return None

    def exists(self, path: str) -> bool:
        """Whether ``path`` has a key or any key lives below it."""
        key = self._key(path)
        resp = self._read(
            f"exists {path}",
            "Txn",
            rpc.TxnRequest(
                success=[
                    range_op(key, keys_only=True),
                    below_op(key, keys_only=True, limit=1),
                ]
            ),
        )
        return any(r.response_range.kvs for r in resp.responses)

    def children(self, path: str) -> list[str]:
        """Sorted distinct next segments of the keys below ``path``."""
        key = self._key(path)
        below, end = subtree(key)
        req = rpc.RangeRequest(key=below, range_end=end, keys_only=True)
        resp = self._read(f"children {path}", "Range", req)
        start = len(below_prefix(key))
        names = {kv.key[start:].split(b"/", 1)[0].decode() for kv in resp.kvs}
        return sorted(names)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path``, pure parents included as synthetic nodes,
        from one read (a read-only transaction: one request, one revision)."""
        key = self._key(path)
        resp = self._read(
            f"get_tree {path}", "Txn", rpc.TxnRequest(success=[range_op(key), below_op(key)])
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
                tree[parent] = synthetic_node(parent)
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
            below, end = subtree(key)
            ops.append(
                rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=below, range_end=end))
            )
        self._txn(f"delete {path}", success=ops)

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` as one etcd transaction (checks: see ``conditions.py``).

        On failure the same transaction returns the checked keys, so ``failed_path``
        is found without another request and reflects exactly what was compared.
        """
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit of {len(ops)} operations exceeds the limit of "
                f"{self.max_ops_per_commit} (etcd --max-txn-ops); split the work or write "
                "fewer, larger nodes"
            )
        size = self.commit_bytes(ops)
        if self.max_commit_bytes is not None and size > self.max_commit_bytes:
            raise StoreLimitError(
                f"a commit of {len(ops)} operations and about {size} bytes exceeds the "
                f"{self.max_commit_bytes} bytes kept under etcd's request limit "
                "(--max-request-bytes, 1.5 MiB by default); split the work or write "
                "fewer, smaller nodes"
            )
        resp, failed_path = self._write(f"commit of {len(ops)} operations", ops)
        if resp is not None and resp.succeeded:
            return CommitResult(True, int(resp.header.revision))
        return CommitResult(False, 0, failed_path)

    # -- fault hooks (registry.faults.SessionFaults), for tests ------------------------

    def relinquish_session(self) -> None:
        """:meth:`CoordinationStore.relinquish_session` on etcd: the lease stops being
        kept alive at once (the store is LOST from now on, and its session thread
        grants a new lease instead of refreshing the old one: CONNECTED with the new
        ``session_id``), then the old lease is revoked, bounded by the operation
        timeout and the TTL: etcd deletes its keys at once when it can be reached, and
        at the latest one TTL after the last keep-alive it received."""
        self._require_started()
        old = self._lease
        # LOST first: a keep-alive in flight may still land, none is sent after it
        self._set_state(ConnectionState.LOST)
        self._check_session_now = True
        self._wake.set()
        timeout = max(0.5, min(self.settings.operation_timeout, float(self._ttl)))
        try:
            with self._translated("relinquish_session: revoke lease"):
                self._send(
                    "leasestub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=old), timeout=timeout
                )
        except StoreError as exc:
            _log.warning(
                "etcd session lease %x could not be revoked now (%s): it runs out within its TTL",
                old,
                exc,
            )

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
        old = replace_channel(endpoint, CHANNEL_OPTIONS)
        with contextlib.suppress(Exception):
            old.close()
        if self._loop.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            self._set_state(ConnectionState.SUSPENDED)
        self._check_session_now = True
        self._wake.set()
