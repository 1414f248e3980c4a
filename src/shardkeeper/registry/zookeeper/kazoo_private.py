"""The adapter of the ZooKeeper backend onto kazoo: every use of kazoo's private API.

Checked on kazoo 2.11 (2.11.0): when upgrading kazoo, re-check each item below against
its source (``kazoo/client.py``, ``kazoo/protocol/connection.py``,
``kazoo/protocol/serialization.py``); ``tests/registry/test_client_privates.py`` reads
the private names this module uses from its source and probes each on the installed
kazoo. No other module of the package touches a private name of kazoo or its protocol
modules (that test checks it too): they use kazoo's public client API, :class:`Client`
and the functions here. Nothing is patched on a live object: the two hooks in kazoo's
connection thread are overrides in :class:`_Connection`, a subclass of kazoo's
``ConnectionHandler`` that :class:`Client` (a ``KazooClient`` subclass) puts in place
of kazoo's own when it is built, before any thread or socket exists.

Private names used: ``KazooClient._call``, ``_connection``, ``_data_watchers``,
``_child_watchers``, ``_session_id``, ``_session_passwd``; ``ConnectionHandler``'s
``_read_watch_event``, ``_connect`` (overridden) and ``_socket``; the records and
helpers of the undocumented ``kazoo.protocol.serialization``; ``kazoo.exceptions.
EXCEPTIONS`` (the error-code table). Behaviours relied on are named where they are
used: ``last_zxid`` set before a reply is deserialized, ``Transaction.unchroot``
passing our ``(results, zxid)`` pair through, ``chroot`` assignable after start,
``_read`` skipping ``select`` while ``socket.pending()`` (``handler.py``).

The multi and its zxid (:func:`submit_multi` and the ``*_op`` builders)
    A commit's result carries the zxid of its ``multi`` (``CommitResult.revision``),
    which equals the ``created_revision`` of every node the commit created; watchers
    rely on that to recognise implicit parents. kazoo's public ``client.transaction()``
    gives only the per-operation results, so the backend sends its own request through
    the private ``KazooClient._call(request, async_result)``. The request subclasses
    kazoo's ``Transaction`` record: kazoo's connection thread stores the reply header's
    zxid in ``client.last_zxid`` right before it deserializes the body, so reading it
    in ``deserialize`` is race-free (afterwards it may already belong to a later
    reply). The operations inside are kazoo's protocol records (``Create``,
    ``Delete``, ``SetData``, ``CheckVersion`` of ``kazoo.protocol.serialization``),
    which kazoo exposes only through its own ``TransactionRequest``; multi operations
    take absolute paths (kazoo's chroot is not applied to them).

The read-only multi (:func:`submit_multi_read`, :func:`get_data_op`, :func:`get_children_op`)
    ZooKeeper 3.6+ answers a ``multiRead`` (opcode 22): many ``getData`` and
    ``getChildren`` in one request, each answered on its own (a missing node is an
    error result for that operation only, the others are still read). kazoo has no
    API for it, so the backend builds the request like its ``Transaction`` record
    (same framing: a ``MultiHeader`` before each operation) with kazoo's ``GetData``
    and ``GetChildren`` records, and parses the reply itself. Paths are absolute, as
    in a multi. One request instead of one per node: a subtree of a hundred leaves is
    read in two requests, a commit's pre-reads in one.

The persistent recursive watch (:func:`submit_add_watch`, ``_Connection._read_watch_event``)
    ZooKeeper 3.6+ has ``addWatch`` (opcode 106) with mode ``PERSISTENT_RECURSIVE``:
    one request, and the server notifies every create, data change and delete at or
    below the path until the connection ends. kazoo 2.11 has no API for it, so the
    backend sends the request record itself (path and mode, an empty reply). kazoo
    dispatches a notification only to the one-shot watchers it keeps for that exact
    path (``client._data_watchers`` and ``client._child_watchers``), so the backend
    also wraps the private ``ConnectionHandler._read_watch_event`` (on
    ``client._connection``, called by kazoo's connection thread for every
    notification, in the order the server sent them): kazoo's own handling runs
    when kazoo holds a one-shot watcher of the path (it has nothing to do
    otherwise), then the tap gets the event type and the path (chroot stripped, as
    kazoo strips it). kazoo never re-sends watches after a reconnect (no
    ``SetWatches``), and the server drops a connection's watches with it: the backend
    sends ``addWatch`` again after each reconnect, then re-reads the subtree.

The negotiated session timeout (``_Connection._connect``)
    kazoo logs the session timeout the server negotiated but does not keep it. Its
    private ``ConnectionHandler._connect`` returns ``(read timeout, connect
    timeout)`` with connect = negotiated / number of hosts (in milliseconds): the
    override recovers the negotiated value. A kazoo without either hook is refused
    at start (:func:`missing_hooks`).

The session's identity (:meth:`Client.forget_session`) and the late chroot
(:meth:`Client.root_at`)
    ``relinquish_session`` makes kazoo ask for a new session at its next connect by
    clearing ``_session_id`` and ``_session_passwd`` (kazoo has no API for it). The
    client starts unrooted and is rooted once the namespace node exists.

The connection's socket (:func:`connection_socket`)
    The ``drop_connection`` fault hook (tests) shuts down the client's socket,
    ``client._connection._socket`` (the real socket under the handler's read buffer,
    ``handler.BufferedSocket``), so kazoo sees the connection drop and reconnects.
"""

from __future__ import annotations

import logging
import socket
from collections import namedtuple
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol import serialization as zkproto
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.states import ZnodeStat

_log = logging.getLogger("shardkeeper.registry.zookeeper")

__all__ = [
    "PERSISTENT_RECURSIVE",
    "Client",
    "check_op",
    "connection_socket",
    "create_op",
    "created",
    "delete_op",
    "deleted",
    "get_children_op",
    "get_data_op",
    "missing_hooks",
    "set_data_op",
    "submit_add_watch",
    "submit_multi",
    "submit_multi_read",
]

#: ``addWatch`` mode: every change at or below the path, until the connection ends
PERSISTENT_RECURSIVE = 1
#: notification types (``Watcher.Event.EventType``) the tap passes on
NODE_CREATED, NODE_DELETED, NODE_DATA_CHANGED = 1, 2, 3


#: a multi operation's header (type, not done, no error), by operation type
_OP_HEADERS: dict[int, bytes] = {}
_MULTI_END = zkproto.multiheader_struct.pack(-1, True, -1)


def _string(text: str) -> bytes:
    if not text:  # as kazoo's write_string
        return bytes(zkproto.int_struct.pack(-1))
    raw = text.encode("utf-8")
    return bytes(zkproto.int_struct.pack(len(raw))) + raw


def _serialize(operations: list[Any]) -> bytes:
    """The same bytes as kazoo's ``Transaction.serialize``, made faster for ``Create``:
    a start-up's multis hold thousands, each with the same ACL, which kazoo
    re-encodes per node on its connection thread."""
    parts: list[bytes] = []
    acls: dict[int, bytes] = {}
    pack_int = zkproto.int_struct.pack
    for op in operations:
        header = _OP_HEADERS.get(op.type)
        if header is None:
            header = _OP_HEADERS[op.type] = zkproto.multiheader_struct.pack(op.type, False, -1)
        parts.append(header)
        if type(op) is not zkproto.Create:
            parts.append(bytes(op.serialize()))
            continue
        parts.append(_string(op.path))
        parts.append(pack_int(-1) if op.data is None else pack_int(len(op.data)) + op.data)
        acl = acls.get(id(op.acl))
        if acl is None:
            acl = acls[id(op.acl)] = pack_int(len(op.acl)) + b"".join(
                pack_int(a.perms) + _string(a.id.scheme) + _string(a.id.id) for a in op.acl
            )
        parts.append(acl)
        parts.append(pack_int(op.flags))
    parts.append(_MULTI_END)
    return b"".join(parts)


class _Multi(zkproto.Transaction):  # type: ignore[misc]
    """A ``multi`` request whose result also carries the reply header's zxid (see the
    module docstring)."""

    client: KazooClient
    #: called with (operations, zxid) when the multi applied, on kazoo's connection
    #: thread: after the notifications of the multi's own changes, before any later
    #: one (the server sends them in that order on one connection)
    on_applied: Callable[[list[Any], int], None] | None = None

    def serialize(self) -> bytes:
        return _serialize(self.operations)

    def deserialize(self, data: bytes, offset: int) -> tuple[list[Any], int]:
        results = zkproto.Transaction.deserialize(data, offset)
        zxid = self.client.last_zxid
        if self.on_applied is not None and not any(isinstance(r, Exception) for r in results):
            try:
                self.on_applied(self.operations, zxid)
            except Exception:
                _log.exception("multi applied hook failed")
        return results, zxid


def submit_multi(
    client: KazooClient,
    ops: list[Any],
    on_applied: Callable[[list[Any], int], None] | None = None,
) -> Any:
    """Send ``ops`` (built with the ``*_op`` functions) as one multi; the returned async
    result gives ``(per-operation results, the multi's zxid)``. ``on_applied(ops,
    zxid)`` runs on kazoo's connection thread as the reply of a multi that applied is
    read, in order with the watch notifications (it must be quick, like the tap)."""
    request = _Multi(ops)
    request.client = client
    request.on_applied = on_applied
    async_result = client.handler.async_result()
    client._call(request, async_result)
    return async_result


class _MultiRead(zkproto.Transaction):  # type: ignore[misc]
    """A ``multiRead`` request (see the module docstring)."""

    type = 22

    def serialize(self) -> bytes:
        return _serialize(self.operations)

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header, offset = zkproto.MultiHeader.deserialize(data, offset)
        while not header.done:
            if header.type == zkproto.GetData.type:
                value, offset = zkproto.read_buffer(data, offset)
                stat = ZnodeStat._make(zkproto.stat_struct.unpack_from(data, offset))
                offset += zkproto.stat_struct.size
                results.append((value if value is not None else b"", stat))
            elif header.type == zkproto.GetChildren.type:
                count = zkproto.int_struct.unpack_from(data, offset)[0]
                offset += zkproto.int_struct.size
                children: list[str] = []
                for _ in range(max(count, 0)):
                    child, offset = zkproto.read_string(data, offset)
                    children.append(child)
                results.append(children)
            elif header.type == -1:
                err = zkproto.int_struct.unpack_from(data, offset)[0]
                offset += zkproto.int_struct.size
                results.append(EXCEPTIONS[err]())
            else:
                raise ValueError(f"unexpected operation type {header.type} in a multiRead reply")
            header, offset = zkproto.MultiHeader.deserialize(data, offset)
        return results


def submit_multi_read(client: KazooClient, ops: list[Any]) -> Any:
    """Send ``ops`` (built with :func:`get_data_op` / :func:`get_children_op`) as one
    ``multiRead``; the async result gives one entry per operation: ``(data, stat)``,
    a list of child names, or the kazoo exception of that operation (e.g.
    ``NoNodeError``) as a value, not raised."""
    async_result = client.handler.async_result()
    client._call(_MultiRead(ops), async_result)
    return async_result


class _AddWatch(namedtuple("_AddWatch", "path mode")):
    """An ``addWatch`` request (see the module docstring)."""

    type = 106

    def serialize(self) -> bytearray:
        b = bytearray(zkproto.write_string(self.path))
        b.extend(zkproto.int_struct.pack(self.mode))
        return b

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> bool:
        return True  # the reply has no body


def submit_add_watch(client: KazooClient, path: str, mode: int = PERSISTENT_RECURSIVE) -> Any:
    """Send ``addWatch`` for ``path`` (absolute) in ``mode``; the async result is True
    once the server has set the watch (an error such as ``UnimplementedError`` from a
    server older than 3.6 is raised by its ``get``)."""
    async_result = client.handler.async_result()
    client._call(_AddWatch(path, mode), async_result)
    return async_result


def get_data_op(path: str) -> Any:
    """A multiRead operation reading ``path`` (absolute): ``(data, stat)``."""
    return zkproto.GetData(path, None)


def get_children_op(path: str) -> Any:
    """A multiRead operation listing the children of ``path`` (absolute)."""
    return zkproto.GetChildren(path, None)


def create_op(path: str, value: bytes, acl: list[Any], ephemeral: bool) -> Any:
    """A multi operation creating ``path`` (absolute) with ``value`` and ``acl``."""
    return zkproto.Create(path, value, acl, 1 if ephemeral else 0)


def created(op: Any) -> tuple[str, bytes] | None:
    """(absolute path, value) of a multi operation creating a node, else None."""
    if type(op) is zkproto.Create:
        return op.path, op.data if op.data is not None else b""
    return None


def deleted(op: Any) -> str | None:
    """The absolute path of a multi operation deleting a node, else None."""
    if type(op) is zkproto.Delete:
        return str(op.path)
    return None


def is_ephemeral_create(op: Any) -> bool:
    """Whether ``op`` is a multi operation creating an ephemeral node."""
    return isinstance(op, zkproto.Create) and bool(op.flags & 1)


#: bytes a create in a multi takes besides its path and value: its header, the
#: lengths, the flags and a digest ACL (about 80 bytes)
CREATE_FRAMING = 96

#: the same for a check, a delete or a data write: header, path length, version
SMALL_OP_FRAMING = 24


def multi_size(ops: list[Any]) -> int:
    """About the bytes ``ops`` (this module's multi operations) take in a request: each
    path and value, and the framing of its kind."""
    size = 0
    for op in ops:
        size += len(op.path)
        if isinstance(op, zkproto.Create):
            size += CREATE_FRAMING + len(op.data or b"")
        else:
            size += SMALL_OP_FRAMING + len(getattr(op, "data", None) or b"")
    return size


def is_delete(op: Any) -> bool:
    """Whether ``op`` is a multi delete operation."""
    return isinstance(op, zkproto.Delete)


def delete_op(path: str, version: int) -> Any:
    """A multi operation deleting ``path`` (absolute) at data ``version`` (-1: any)."""
    return zkproto.Delete(path, version)


def set_data_op(path: str, value: bytes, version: int) -> Any:
    """A multi operation setting ``path`` (absolute) to ``value`` at ``version`` (-1: any)."""
    return zkproto.SetData(path, value, version)


def check_op(path: str, version: int) -> Any:
    """A multi operation checking ``path`` (absolute) is at ``version`` (-1: exists)."""
    return zkproto.CheckVersion(path, version)


def connection_socket(client: KazooClient) -> socket.socket | None:
    """The socket of ``client``'s current connection (any KazooClient: the twin
    clients of ``expire_session`` too), or None when not connected."""
    sock = getattr(getattr(client, "_connection", None), "_socket", None)
    sock = getattr(sock, "raw", sock)  # under the handler's read buffer (handler.py)
    return sock if isinstance(sock, socket.socket) else None


class _Connection(ConnectionHandler):  # type: ignore[misc]
    """kazoo's connection handler with the two hooks the backend needs (the module
    docstring: the persistent recursive watch, the negotiated session timeout).

    A subclass, not methods replaced on a live object: :class:`Client` builds it in
    place of kazoo's own, and kazoo's connection thread calls these overrides."""

    client: Client

    def _read_watch_event(self, buffer: bytes, offset: int) -> Any:
        client = self.client
        watch, _ = zkproto.Watch.deserialize(buffer, offset)
        result = None
        if watch.path in client._data_watchers or watch.path in client._child_watchers:
            # kazoo's one-shot watchers of this path: kazoo's own handling. Without
            # any (the recursive watch's notifications) it would only build an
            # event for nobody, thousands of times in a burst.
            result = super()._read_watch_event(buffer, offset)
        tap = client.watch_tap
        if tap is not None:
            try:
                tap(watch.type, client.unchroot(watch.path))
            except Exception:
                _log.exception("watch notification tap failed")
        return result

    def _connect(self, host: str, hostip: str, port: int) -> Any:
        read_timeout, connect_timeout = super()._connect(host, hostip, port)
        record = self.client.on_negotiated
        if record is not None:
            # kazoo returns connect = negotiated / number of hosts, in milliseconds
            record(connect_timeout * len(self.client.hosts) / 1000.0)
        return read_timeout, connect_timeout


class Client(KazooClient):  # type: ignore[misc]
    """The backend's kazoo client: kazoo's public client plus the requests and hooks
    kazoo has no API for (the module docstring lists each, with its private names).

    ``watch_tap(event type, path)`` gets every watch notification on kazoo's
    connection thread (quick, never raising: an exception is logged and swallowed);
    ``on_negotiated(seconds)`` gets the negotiated session timeout at each connect.
    """

    #: kazoo's connection handler (set by kazoo's ``__init__``, then replaced by ours)
    _connection: Any

    def __init__(
        self,
        *,
        watch_tap: Callable[[int, str], None] | None = None,
        on_negotiated: Callable[[float], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.watch_tap = watch_tap
        self.on_negotiated = on_negotiated
        # kazoo's own handler has only been built (no thread, no socket yet): ours
        # takes its place with the same retry policy, logger and SASL options
        own = self._connection
        self._connection = _Connection(
            self, own.retry_sleeper, logger=own.logger, sasl_options=own.sasl_options
        )

    def submit_multi(
        self, ops: list[Any], on_applied: Callable[[list[Any], int], None] | None = None
    ) -> Any:
        """:func:`submit_multi` on this client."""
        return submit_multi(self, ops, on_applied)

    def submit_multi_read(self, ops: list[Any]) -> Any:
        """:func:`submit_multi_read` on this client."""
        return submit_multi_read(self, ops)

    def submit_add_watch(self, path: str, mode: int = PERSISTENT_RECURSIVE) -> Any:
        """:func:`submit_add_watch` on this client."""
        return submit_add_watch(self, path, mode)

    def connection_socket(self) -> socket.socket | None:
        """:func:`connection_socket` of this client."""
        return connection_socket(self)

    def forget_session(self) -> None:
        """Make the next (re)connection ask for a NEW session: kazoo's connection
        thread reads the session id and password only when it connects, and has no
        API to drop them (``relinquish_session``)."""
        self._session_id = None
        self._session_passwd = b"\x00" * 16

    def root_at(self, chroot: str) -> None:
        """Root the started client at ``chroot``: ``set_hosts()`` refuses to change the
        chroot and ``start()`` only warns when the node is missing, so the client
        starts unrooted and is rooted once the node exists (kazoo reads ``chroot`` on
        every request)."""
        self.chroot = chroot


def missing_hooks() -> list[str]:
    """The private kazoo methods :class:`_Connection` overrides that this kazoo lacks:
    an override of a method kazoo no longer calls would be silently dead."""
    return [
        f"ConnectionHandler.{name}"
        for name in ("_read_watch_event", "_connect")
        if not callable(getattr(ConnectionHandler, name, None))
    ]
