"""What the ZooKeeper and etcd backends need of their clients beyond the public API.

The backends use private names and implicit behaviours of kazoo
(``registry/zookeeper/kazoo_private.py``, ``handler.py``, ``session.py``) and of
cslab-etcd3 (``registry/etcd/client_private.py`` and the generated ``etcdrpc`` stubs),
listed with their reasons in those modules' docstrings. None of it is visible to mypy
(the clients are ``Any``), and a new client release that moved one of them would
break the backends in ways the contract suite sees only on a real server, or not at
all (a multi's zxid taken from the previous reply gives wrong fencing tokens).

These tests need no server: they probe the installed clients directly, each failure
naming what is missing and where we use it, so a new release is checked here first
(``make test-latest`` runs them on the newest releases) before pyproject.toml's range
and constraints.txt admit it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import shardkeeper

#: the client versions checked against every item below and against the modules'
#: docstrings; pyproject.toml admits only these (kazoo<2.12, cslab-etcd3<0.13)
CHECKED = {"kazoo": {"2.11.0"}, "cslab-etcd3": {"0.12.1"}}

#: where each client is used privately (for the failure messages)
WHERE = {
    "kazoo": "src/shardkeeper/registry/zookeeper/kazoo_private.py",
    "cslab-etcd3": "src/shardkeeper/registry/etcd/client_private.py",
}


def _missing(names: dict[str, tuple[object, str]]) -> list[str]:
    """The labels of ``names`` (label -> (object, attribute)) that do not exist."""
    return [label for label, (obj, attr) in names.items() if not hasattr(obj, attr)]


def _params(function: Any) -> list[str]:
    return [p for p in inspect.signature(function).parameters if p != "self"]


@pytest.mark.parametrize("dist", sorted(CHECKED))
def test_the_installed_client_is_a_checked_version(dist: str) -> None:
    """A version not checked yet fails by name: the other tests here tell what it
    broke; if none fails, re-read the client's changes against the module docstring,
    then add the version to CHECKED, pyproject.toml's range and constraints.txt."""
    version = importlib.metadata.version(dist)
    assert version in CHECKED[dist], (
        f"{dist} {version} is installed, but shardkeeper's private use of {dist} "
        f"({WHERE[dist]}) was checked only on {sorted(CHECKED[dist])}: check it "
        "against that module's list, then add the version to CHECKED in this file, "
        "pyproject.toml's range and constraints.txt"
    )


def _requirements() -> dict[str, Requirement]:
    """pyproject.toml's requirements (core and extras) of the shardkeeper imported."""
    pyproject = Path(shardkeeper.__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        found.extend(Requirement(r) for r in extra)
    return {r.name: r for r in found}


@pytest.mark.parametrize("dist", sorted(CHECKED))
def test_pyproject_admits_no_release_past_the_checked_ones(dist: str) -> None:
    """The version range of each client admits the checked versions and not the next
    minor release, which nobody has checked against our private use (review
    finding 13: ``kazoo>=2.11,<3`` let in any 2.x)."""
    specifier = _requirements()[dist].specifier
    newest = max(Version(v) for v in CHECKED[dist])
    untested = Version(f"{newest.major}.{newest.minor + 1}")
    assert all(specifier.contains(v) for v in CHECKED[dist]), (
        f"pyproject.toml's {dist}{specifier} refuses a checked version {CHECKED[dist]}"
    )
    assert not specifier.contains(untested), (
        f"pyproject.toml's {dist}{specifier} admits {untested}, which was never checked "
        f"against {WHERE[dist]}: cap it below {untested} until it is"
    )


# ---- kazoo ------------------------------------------------------------------------


@pytest.fixture
def kazoo_client() -> Iterator[Any]:
    """A kazoo client that is never started (no thread, no socket): two hosts."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts="127.0.0.1:1,127.0.0.2:2", timeout=6.0)
    yield client
    client.close()


def test_kazoo_has_every_private_name_we_use(kazoo_client: Any) -> None:
    """Each private attribute or method, and each name of kazoo's undocumented
    protocol module, that kazoo_private.py, handler.py or session.py use."""
    from kazoo import exceptions
    from kazoo.handlers import threading as kthreading
    from kazoo.protocol import connection, serialization, states

    conn = kazoo_client._connection if hasattr(kazoo_client, "_connection") else None
    names: dict[str, tuple[object, str]] = {
        "KazooClient._call": (kazoo_client, "_call"),
        "KazooClient._connection": (kazoo_client, "_connection"),
        "KazooClient._data_watchers": (kazoo_client, "_data_watchers"),
        "KazooClient._child_watchers": (kazoo_client, "_child_watchers"),
        "KazooClient._pending": (kazoo_client, "_pending"),
        "KazooClient._session_callback": (kazoo_client, "_session_callback"),
        # relinquish_session (zookeeper/store.py): the gray-link give-up forgets them
        "KazooClient._session_id": (kazoo_client, "_session_id"),
        "KazooClient._session_passwd": (kazoo_client, "_session_passwd"),
        "KazooClient.last_zxid": (kazoo_client, "last_zxid"),
        "KazooClient.chroot": (kazoo_client, "chroot"),
        "KazooClient.hosts": (kazoo_client, "hosts"),
        "KazooClient.unchroot": (kazoo_client, "unchroot"),
        "ConnectionHandler._read_watch_event": (connection.ConnectionHandler, "_read_watch_event"),
        "ConnectionHandler._read_response": (connection.ConnectionHandler, "_read_response"),
        "ConnectionHandler._connect": (connection.ConnectionHandler, "_connect"),
        "ConnectionHandler._read": (connection.ConnectionHandler, "_read"),
        "ConnectionHandler._socket": (conn, "_socket"),
        "SequentialThreadingHandler.select": (kthreading.SequentialThreadingHandler, "select"),
        "SequentialThreadingHandler.create_connection": (
            kthreading.SequentialThreadingHandler,
            "create_connection",
        ),
        "kazoo.exceptions.EXCEPTIONS": (exceptions, "EXCEPTIONS"),
        "kazoo.protocol.states.ZnodeStat": (states, "ZnodeStat"),
    }
    for name in [
        "Transaction",
        "Create",
        "Delete",
        "SetData",
        "CheckVersion",
        "GetData",
        "GetChildren",
        "Watch",
        "MultiHeader",
        "ReplyHeader",
        "multiheader_struct",
        "int_struct",
        "stat_struct",
        "read_buffer",
        "read_string",
        "write_string",
    ]:
        names[f"kazoo.protocol.serialization.{name}"] = (serialization, name)
    missing = _missing(names)
    assert not missing, (
        f"kazoo {importlib.metadata.version('kazoo')} lacks {missing}, which the "
        f"ZooKeeper backend uses ({WHERE['kazoo']}, handler.py, session.py)"
    )


def test_kazoo_private_methods_keep_their_shape() -> None:
    """The wrapped and called private methods take the arguments we pass."""
    from kazoo.client import KazooClient
    from kazoo.protocol import serialization
    from kazoo.protocol.connection import ConnectionHandler

    shapes = {
        "KazooClient._call": (_params(KazooClient._call), ["request", "async_object"]),
        "ConnectionHandler._read_watch_event": (
            _params(ConnectionHandler._read_watch_event),
            ["buffer", "offset"],
        ),
        "ConnectionHandler._connect": (
            _params(ConnectionHandler._connect),
            ["host", "hostip", "port"],
        ),
        "Transaction.type": ([str(serialization.Transaction.type)], ["14"]),
        "Watch fields": (list(serialization.Watch._fields), ["type", "state", "path"]),
    }
    changed = {name: got for name, (got, want) in shapes.items() if got != want}
    assert not changed, (
        f"kazoo {importlib.metadata.version('kazoo')} changed the shape of {changed} "
        f"(expected { ({n: w for n, (_, w) in shapes.items() if n in changed}) }); "
        f"see {WHERE['kazoo']}"
    )


def test_kazoo_sets_last_zxid_before_deserializing_and_passes_a_pair_through(
    kazoo_client: Any,
) -> None:
    """kazoo's connection thread stores the reply header's zxid in ``last_zxid``
    before it deserializes the body (so the multi's ``deserialize`` reads its own
    zxid, the ``CommitResult.revision`` and fencing tokens), and its ``unchroot`` of a
    ``Transaction`` reply keeps a ``(results, zxid)`` pair unpackable."""
    from kazoo.protocol import serialization as zkproto

    seen: list[int] = []

    class Multi(zkproto.Transaction):  # type: ignore[misc]
        def deserialize(self, data: bytes, offset: int) -> tuple[list[Any], int]:
            results = zkproto.Transaction.deserialize(data, offset)
            seen.append(kazoo_client.last_zxid)
            return results, kazoo_client.last_zxid

    kazoo_client.last_zxid = 41
    reply = kazoo_client.handler.async_result()
    kazoo_client._pending.append((Multi([]), reply, 7))
    body = bytes(zkproto.multiheader_struct.pack(-1, True, -1))
    header = zkproto.ReplyHeader(7, 42, 0)
    kazoo_client._connection._read_response(header, body, 0)

    assert seen == [42], (
        "kazoo no longer sets client.last_zxid from the reply header before "
        f"request.deserialize (deserialize saw {seen}, the header said 42): every "
        f"multi would get the previous reply's zxid ({WHERE['kazoo']}, _Multi)"
    )
    assert reply.ready(), "kazoo did not answer the multi's async result"
    results, zxid = reply.get(timeout=1)
    assert (list(results), zxid) == ([], 42), (
        "kazoo's Transaction.unchroot no longer passes the (results, zxid) pair of "
        "our multi through (session.py unpacks it)"
    )


def test_kazoo_skips_select_while_the_socket_has_pending_bytes(kazoo_client: Any) -> None:
    """kazoo's ``_read`` asks ``socket.pending()`` before its ``select``: handler.py's
    BufferedSocket serves a burst from its buffer relying on that."""

    class Buffered:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def pending(self) -> int:
            return len(self.data)

        def recv(self, size: int) -> bytes:
            chunk, self.data = self.data[:size], self.data[size:]
            return chunk

    def no_select(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("select called although the socket had pending bytes")

    conn = kazoo_client._connection
    conn._socket = Buffered(b"abcdef")
    conn.handler.select = no_select
    try:
        assert conn._read(4, 0.1) == b"abcd"
    finally:
        conn._socket = None
        del conn.handler.select


def test_kazoo_connect_returns_the_negotiated_timeout_split_per_host(
    kazoo_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ConnectionHandler._connect`` returns ``(read timeout, connect timeout)`` with
    connect = negotiated / number of hosts (kazoo_private recovers the negotiated
    session timeout from it) and reports CONNECTED before it returns."""
    from types import SimpleNamespace

    conn = kazoo_client._connection
    states: list[str] = []

    class Sock:
        def setblocking(self, flag: int) -> None:
            pass

    reply = SimpleNamespace(
        time_out=4000, session_id=5, protocol_version=0, passwd=b"p" * 16, read_only=False
    )
    monkeypatch.setattr(conn.handler, "create_connection", lambda *a, **k: Sock())
    monkeypatch.setattr(conn, "_invoke", lambda *a, **k: (reply, 0))
    monkeypatch.setattr(kazoo_client, "_session_callback", states.append)
    monkeypatch.setattr(kazoo_client, "auth_data", set())

    got = conn._connect("127.0.0.1", "127.0.0.1", 1)
    conn._socket = None
    assert len(kazoo_client.hosts) == 2
    assert tuple(got) == (4000 * 2.0 / 3.0, 4000 / 2), (
        f"kazoo's _connect returned {got}, not (read timeout, negotiated / hosts): "
        f"the negotiated session timeout would be wrong ({WHERE['kazoo']}, "
        "capture_negotiated_timeout)"
    )
    assert [str(s) for s in states] == ["CONNECTED"], (
        f"kazoo's _connect reported {states} before returning, not CONNECTED"
    )


def test_kazoo_dispatches_a_notification_only_to_one_shot_watchers(kazoo_client: Any) -> None:
    """``_read_watch_event(buffer, offset)`` parses a ``Watch`` record and hands it to
    the one-shot watchers of that path (which it pops): the watch tap calls it only
    when such a watcher exists; paths are unchrooted with ``client.chroot``, which may
    be assigned after the client was built (session.py roots the client late)."""
    from kazoo.protocol import serialization as zkproto

    kazoo_client.chroot = "/ns"
    assert kazoo_client.unchroot("/ns/a") == "/a"
    assert kazoo_client.unchroot("/ns") == "/"

    def watch_record(etype: int, path: str) -> bytes:
        return bytes(zkproto.int_struct.pack(etype) + zkproto.int_struct.pack(3)) + bytes(
            zkproto.write_string(path)
        )

    fired: list[Any] = []
    dispatched: list[Any] = []
    kazoo_client.handler.dispatch_callback = dispatched.append
    kazoo_client._stopped.clear()  # as when started: kazoo drops events once stopped
    try:
        kazoo_client._data_watchers["/ns/a"].add(fired.append)
        kazoo_client._connection._read_watch_event(watch_record(3, "/ns/a"), 0)
        kazoo_client._connection._read_watch_event(watch_record(3, "/ns/b"), 0)
    finally:
        kazoo_client._stopped.set()
        del kazoo_client.handler.dispatch_callback
    assert "/ns/a" not in kazoo_client._data_watchers, "the one-shot watcher was not popped"
    assert len(dispatched) == 1, f"kazoo dispatched {dispatched} for one watched path"
    event = dispatched[0].args[0]
    assert (event.path, event.type) == ("/a", "CHANGED"), event


# ---- cslab-etcd3 --------------------------------------------------------------------


def test_etcd3_has_every_private_name_we_use() -> None:
    """Each private or undocumented part of cslab-etcd3 that client_private.py and the
    backend's modules use, and the generated stubs and messages they build."""
    etcd3 = pytest.importorskip("etcd3")
    rpc = importlib.import_module("etcd3.etcdrpc")
    watch = importlib.import_module("etcd3.watch")
    events = importlib.import_module("etcd3.events")
    exceptions = importlib.import_module("etcd3.exceptions")

    endpoint = etcd3.Endpoint("127.0.0.1", 1, secure=False, time_retry=0.5)
    client = etcd3.MultiEndpointEtcd3Client(endpoints=[endpoint], timeout=1, failover=True)
    try:
        names: dict[str, tuple[object, str]] = {
            "MultiEndpointEtcd3Client._current_endpoint_label": (
                etcd3.MultiEndpointEtcd3Client,
                "_current_endpoint_label",
            ),
            "MultiEndpointEtcd3Client.metadata": (client, "metadata"),
            "MultiEndpointEtcd3Client.endpoints": (client, "endpoints"),
            "MultiEndpointEtcd3Client.endpoint_in_use": (client, "endpoint_in_use"),
            "Endpoint._mkchannel": (endpoint, "_mkchannel"),
            "Endpoint.channel": (endpoint, "channel"),
            "Endpoint.last_failed": (endpoint, "last_failed"),
            "Endpoint.netloc": (endpoint, "netloc"),
            "Endpoint.fail": (endpoint, "fail"),
            "Endpoint.is_failed": (endpoint, "is_failed"),
            "etcd3.watch.Watcher": (watch, "Watcher"),
            "etcd3.watch.WatchResponse": (watch, "WatchResponse"),
            "etcd3.events.DeleteEvent": (events, "DeleteEvent"),
        }
        for name in [
            "Etcd3Exception",
            "NoServerAvailableError",
            "WatchTimedOut",
            "RevisionCompactedError",
        ]:
            names[f"etcd3.exceptions.{name}"] = (exceptions, name)
        for name in [
            "KVStub",
            "LeaseStub",
            "AuthStub",
            "WatchStub",
            "RangeRequest",
            "TxnRequest",
            "Compare",
            "RequestOp",
            "PutRequest",
            "DeleteRangeRequest",
            "LeaseGrantRequest",
            "LeaseRevokeRequest",
            "LeaseKeepAliveRequest",
            "AuthenticateRequest",
        ]:
            names[f"etcd3.etcdrpc.{name}"] = (rpc, name)
        missing = _missing(names)
        assert not missing, (
            f"cslab-etcd3 {importlib.metadata.version('cslab-etcd3')} lacks {missing}, "
            f"which the etcd backend uses ({WHERE['cslab-etcd3']}, registry/etcd/)"
        )
        label = inspect.getattr_static(etcd3.MultiEndpointEtcd3Client, "_current_endpoint_label")
        assert isinstance(label, property) and label.fset is not None, (
            "MultiEndpointEtcd3Client._current_endpoint_label is no longer a settable "
            f"property ({WHERE['cslab-etcd3']}, use_endpoint)"
        )
        assert _params(watch.Watcher.__init__) == [
            "watchstub",
            "timeout",
            "call_credentials",
            "metadata",
        ], f"etcd3.watch.Watcher takes {_params(watch.Watcher.__init__)} (open_watcher)"
    finally:
        client.close()


def test_etcd3_endpoint_label_selects_the_endpoint_and_drops_cached_stubs() -> None:
    """Setting ``_current_endpoint_label`` makes that endpoint the one in use and drops
    the client's cached stubs (the store chooses members itself, members.py); a
    marked failure is forgotten by writing ``last_failed``; ``_mkchannel`` makes a new
    channel for the ``drop_connection`` hook."""
    etcd3 = pytest.importorskip("etcd3")
    first = etcd3.Endpoint("127.0.0.1", 1, secure=False, time_retry=60)
    second = etcd3.Endpoint("127.0.0.1", 2, secure=False, time_retry=60)
    client = etcd3.MultiEndpointEtcd3Client(endpoints=[first, second], timeout=1, failover=True)
    try:
        assert client.metadata is None
        client._current_endpoint_label = first.netloc
        stub = client.kvstub
        client._current_endpoint_label = second.netloc
        assert client.endpoint_in_use is second
        assert client.kvstub is not stub, "changing the endpoint kept the cached stubs"

        second.fail()
        assert second.is_failed()
        second.last_failed = 0
        assert not second.is_failed(), "writing last_failed = 0 no longer clears a failure"

        old = second.channel
        second.channel = second._mkchannel([("grpc.max_receive_message_length", 1 << 20)])
        assert second.channel is not old and hasattr(second.channel, "close")
        old.close()
    finally:
        client.close()


def test_etcd3_watcher_streams_over_our_stub_with_our_metadata() -> None:
    """``etcd3.watch.Watcher`` built over our own stub calls
    ``stub.Watch(requests, credentials=..., metadata=ours)`` on a thread it keeps in
    ``_callback_thread`` (client_private's open_watcher and stream_thread)."""
    pytest.importorskip("etcd3")
    rpc = importlib.import_module("etcd3.etcdrpc")
    watch = importlib.import_module("etcd3.watch")

    calls: list[dict[str, Any]] = []
    release = threading.Event()

    class Stub:
        def Watch(self, requests: Iterator[Any], **kwargs: Any) -> Iterator[Any]:
            calls.append(kwargs)
            next(requests)  # the create request of add_callback
            yield rpc.WatchResponse(watch_id=9, created=True)
            release.wait(5)

    metadata = (("token", "t"),)
    watcher = watch.Watcher(Stub(), timeout=5, metadata=metadata)
    try:
        watch_id = watcher.add_callback(b"/ns/", lambda response: None, range_end=b"/ns0")
        thread = watcher._callback_thread
        assert watch_id == 9
        assert isinstance(thread, threading.Thread) and thread.is_alive()
        assert calls and calls[0].get("metadata") == metadata, calls
    finally:
        release.set()
        watcher.close()
