"""The public methods of :class:`ZooKeeperStore`: reads and writes.

Each part of the mapping onto ZooKeeper is described in the module that does it (see
the package docstring).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TypeVar

from kazoo import exceptions as kz
from kazoo.client import KazooClient

from shardkeeper.errors import (
    ConfigError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry import tls
from shardkeeper.registry.base import (
    Check,
    CommitResult,
    Create,
    GroupsResult,
    Node,
    Op,
    Put,
    check_path,
)
from shardkeeper.registry.batching import plain_commit_groups
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.errors import _first_error
from shardkeeper.registry.zookeeper.nodes import _node
from shardkeeper.registry.zookeeper.planner import _COMMIT_ATTEMPTS, _Planner
from shardkeeper.registry.zookeeper.watch import _TreeWatcher

__all__ = ["ZooKeeperStore"]

#: the package's logger (one name for all its modules, as before the split)
_log = logging.getLogger("shardkeeper.registry.zookeeper")

_T = TypeVar("_T")


class ZooKeeperStore(_Planner, _TreeWatcher):
    """The :class:`CoordinationStore` on a ZooKeeper ensemble (see the package docstring)."""

    #: ZooKeeper has no operation limit for a multi, only its request size
    #: (jute.maxbuffer, 1 MiB), which :meth:`commit` checks (``max_commit_bytes``): 4,096
    #: operations carry the start or the completion of a 1,000-item batch (a check, a
    #: delete and a result write per item) in one commit, where etcd's default of 128
    #: takes 8 and 24; the runtime packs by both limits (``registry/packing.py``)
    max_ops_per_commit = 4096

    #: what the runtime packs a commit's operations to (``registry/packing.py``): the
    #: multi itself may add missing parents, unknown before it is planned, so the
    #: budget leaves a fifth of the request limit for them; the multi as sent is
    #: checked against the request limit itself (``session.py``, ``_multi``)
    max_commit_bytes = 800_000

    def identity(self) -> str:
        """The registry and namespace (``RegistrySettings.identity``)."""
        return self._settings.identity()

    def commit_bytes(self, ops: Sequence[Op]) -> int:
        """What :meth:`commit` counts against ``max_commit_bytes``: every operation's
        full path (the namespace node included), its value and its framing (a create's
        header, lengths, flags and digest ACL; less for a check or delete; an absence
        check is sent as a guard create and delete)."""
        size = 0
        for op in ops:
            full = len(self._full(op.path))
            if isinstance(op, Create | Put):
                size += full + kazoo_private.CREATE_FRAMING + len(op.value)
            elif isinstance(op, Check) and op.exists is False:
                size += 2 * full + kazoo_private.CREATE_FRAMING + kazoo_private.SMALL_OP_FRAMING
            else:
                size += full + kazoo_private.SMALL_OP_FRAMING
        return size

    def group_bytes(self, group: Sequence[Op]) -> int:
        """A group goes into the one plain multi: :meth:`commit_bytes`."""
        return self.commit_bytes(group)

    #: groups are not checked apart: ``commit_groups`` is one plain multi
    max_groups_per_commit: int | None = None

    def commit_groups(self, fixed: Sequence[Op], groups: Sequence[Sequence[Op]]) -> GroupsResult:
        """One plain multi of everything (ZooKeeper has no nested transaction): one
        failed check refuses it all (:func:`~shardkeeper.registry.batching.plain_commit_groups`)."""
        return plain_commit_groups(self, fixed, groups)

    # -- reads -----------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        """The node at ``path``, or None."""
        check_path(path)

        def read(dl: float) -> Node | None:
            try:
                data, stat = self._call(dl, self._zk.get_async, path)
            except kz.NoNodeError:
                return None
            return _node(path, data, stat)

        return self._read(path, read)

    def exists(self, path: str) -> bool:
        """Whether a node exists at ``path`` (ZooKeeper keeps parents as real nodes)."""
        check_path(path)
        return self._read(path, lambda dl: self._call(dl, self._zk.exists_async, path) is not None)

    def children(self, path: str) -> list[str]:
        """Sorted names of the children of ``path``; empty if it does not exist."""
        check_path(path)

        def read(dl: float) -> list[str]:
            try:
                return sorted(self._call(dl, self._zk.get_children_async, path))
            except kz.NoNodeError:
                return []

        return self._read(path, read)

    def get_tree(self, path: str) -> dict[str, Node]:
        """Every node at or below ``path``, read level by level with pipelined requests."""
        check_path(path)

        def read(dl: float) -> dict[str, Node]:
            tree = self._walk(dl, path, with_data=True)
            return {p: _node(p, *ds) for p, ds in tree.items() if ds is not None}

        return self._read(path, read)

    def _read(self, what: str, read: Callable[[float], _T]) -> _T:
        """Run ``read`` (given the deadline); once more if the connection was lost.

        A request in flight when the connection drops fails with ConnectionLoss; kazoo
        then reconnects (to another member if this one is gone) and queues new requests
        until it has. A read changes nothing, so sending it again is safe; both
        attempts share one operation timeout. Writes are not re-sent: a lost
        connection leaves their outcome unknown.
        """
        with self._errors(what):
            deadline = self._deadline()
            try:
                return read(deadline)
            except kz.ConnectionLoss:
                if time.monotonic() >= deadline:
                    raise
                _log.info("ZooKeeper read of %s lost its connection; reading again", what)
            return read(deadline)

    # -- writes ----------------------------------------------------------------

    def put(self, path: str, value: bytes, *, ephemeral: bool = False) -> Node:
        """Create or overwrite ``path``; afterwards it is ephemeral (ours) iff asked."""
        check_path(path)
        self._check_payload(path, len(value))
        if ephemeral and path == "/":
            raise ConfigError("the namespace root '/' cannot be ephemeral")
        with self._errors(path):
            dl = self._deadline()
            zk = self._zk
            for _ in range(_COMMIT_ATTEMPTS):
                try:
                    stat = self._call(dl, zk.set_async, path, value)
                except kz.NoNodeError:
                    created = self._create_node(dl, path, value, ephemeral)
                    if created is not None:
                        return created
                    continue  # created by someone else meanwhile: overwrite it
                if stat.ephemeralOwner == self._wanted_owner(ephemeral):
                    return _node(path, value, stat)
                # wrong kind: replace it in one multi, guarded by the version just written
                results, zxid = self._multi(
                    dl,
                    [
                        kazoo_private.delete_op(self._full(path), stat.version),
                        self._create_op(path, value, ephemeral),
                    ],
                )
                if _first_error(results) is None:
                    return Node(path, value, 0, zxid, zxid, ephemeral)
            raise StoreError(f"put {path}: the node kept changing concurrently; try again")

    def create(self, path: str, value: bytes = b"", *, ephemeral: bool = False) -> Node | None:
        """Create ``path`` if absent (parents made persistent); None if it existed."""
        check_path(path)
        self._check_payload(path, len(value))
        if path == "/":
            return None
        with self._errors(path):
            return self._create_node(self._deadline(), path, value, ephemeral)

    def delete(self, path: str, *, recursive: bool = True) -> None:
        """Delete ``path`` (and its subtree if recursive); ``/`` keeps the namespace node."""
        check_path(path)
        with self._errors(path):
            dl = self._deadline()
            zk = self._zk
            if not recursive:
                if path == "/":
                    if self._call(dl, zk.get_children_async, path):
                        raise StoreError("cannot delete '/': it has children (use recursive)")
                    return
                try:
                    self._call(dl, zk.delete_async, path)
                except kz.NoNodeError:
                    pass
                except kz.NotEmptyError:
                    raise StoreError(
                        f"cannot delete {path}: it has children (use recursive=True)"
                    ) from None
                return
            for _ in range(_COMMIT_ATTEMPTS):
                tree = self._walk(dl, path, with_data=False)
                tree.pop("/", None)
                by_depth: dict[int, list[str]] = {}
                for p in tree:
                    by_depth.setdefault(p.count("/"), []).append(p)
                try:
                    for depth in sorted(by_depth, reverse=True):
                        sent = [self._send(zk.delete_async, p) for p in by_depth[depth]]
                        for ar in sent:
                            with suppress(kz.NoNodeError):
                                self._wait(ar, dl)
                    return
                except kz.NotEmptyError:
                    continue  # a child appeared while we walked: walk again
            raise StoreError(f"delete {path}: children kept appearing concurrently")

    def commit(self, ops: Sequence[Op]) -> CommitResult:
        """Apply ``ops`` in one ZooKeeper multi (see the table in ``planner.py``)."""
        ops = list(ops)
        if len(ops) > self.max_ops_per_commit:
            raise StoreLimitError(
                f"a commit carries at most {self.max_ops_per_commit} operations; got {len(ops)}"
            )
        for op in ops:
            check_path(op.path)
            if isinstance(op, Create | Put) and op.ephemeral and op.path == "/":
                raise ConfigError("the namespace root '/' cannot be ephemeral")
        # the path, the ACL and the framing of every operation count too: a thousand
        # creates are about a seventh of the request limit
        size = self.commit_bytes(ops)
        if size > self.max_commit_bytes:
            raise StoreLimitError(
                f"commit: {size} bytes (values, and paths and framing of its "
                f"operations) exceed what a commit may carry under ZooKeeper's request "
                f"limit; keep them under {self.max_commit_bytes} bytes in total"
            )
        with self._errors("commit"):
            return self._commit(self._deadline(), ops)

    # -- giving the session up (the gray link: runtime/graylink.py) ---------------------

    def relinquish_session(self) -> None:
        """:meth:`CoordinationStore.relinquish_session` on ZooKeeper.

        First the session stops being renewed, whatever the link does: kazoo forgets
        its id and password and its connection is cut, so it connects again asking
        for a NEW session and nothing pings the old one (the server ends it one
        session timeout after its last ping at the latest). Then the old session is
        closed on the server now, by a second client holding its id and password (as
        :meth:`expire_session`), given a quarter of the session timeout (at most the
        operation timeout): its ephemeral nodes go at once when the server can be
        reached. A close that gets no reply in that time is given up and the second
        client's connection cut, because attaching to the session renewed it: the
        server then ends it at most T/4 + T after this call. The store reports
        SUSPENDED, LOST, then CONNECTED with the new session."""
        client = self._zk
        old = client.client_id
        if old is None:
            raise StoreUnavailableError("relinquish_session: the ZooKeeper store has no session")
        # kazoo's connection thread reads the session id and password only when it
        # (re)connects: forgotten now, the reconnect after the cut below asks for a
        # new session
        client.forget_session()
        sock = kazoo_private.connection_socket(client)
        if sock is not None:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        # short: the twin's connection renews the session it attaches to, so a close
        # that is held (the link holds requests) must not keep it alive for long
        timeout = max(0.25, min(self._settings.operation_timeout, self.session_timeout / 4))
        twin = KazooClient(
            hosts=self._settings.hosts_string,
            client_id=old,
            timeout=self.session_timeout,
            **tls.kazoo_options(self._settings),
        )
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

        # on its own daemon thread: a link that holds requests would hold the close
        # too, and the caller must not wait for kazoo's own bound
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
            why = failed[0] if failed else f"no reply within {timeout:g}s"
            _log.warning(
                "ZooKeeper session %#x could not be closed now (%s): it expires within "
                "the session timeout",
                old[0],
                why,
            )
