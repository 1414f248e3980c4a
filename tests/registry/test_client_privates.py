"""What the ZooKeeper and etcd backends need of their clients beyond the public API.

The backends use private names and implicit behaviours of kazoo (only in
``registry/zookeeper/kazoo_private.py``; ``handler.py`` relies on one behaviour) and of
cslab-etcd3 (``registry/etcd/client_private.py``, used by ``transport.py`` alone, and the
generated ``etcdrpc`` stubs and messages: the messages built by ``messages.py`` alone),
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

import ast
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


# ---- what the adapters use, read from their source -------------------------------------

SRC = Path(shardkeeper.__file__).resolve().parent
ZK = SRC / "registry" / "zookeeper"
ETCD = SRC / "registry" / "etcd"


def _private_attributes(path: Path) -> set[str]:
    """Every ``x._name`` a module reads or writes on an object other than ``self``
    or ``cls`` of a class of its own that kazoo/etcd3 does not define, plus each
    private method its classes override: the client's private names it uses."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name.startswith("_") and not name.startswith("__"):
                found.add(name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
        ):
            found.add(str(node.args[1].value))  # getattr(conn, "_socket", None)
        elif isinstance(node, ast.ClassDef):
            found.update(
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef)
                and item.name.startswith("_")
                and not item.name.startswith("__")
            )
    # namedtuple's documented API (ZnodeStat._make), not a private name
    return found - {"_make", "_fields", "_replace", "_asdict"}


def _module_attributes(path: Path, alias: str) -> set[str]:
    """The names a module reads from the module it imported as ``alias``."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == alias
    }


#: private names of the adapter modules that are their own, not the client's
OWN_KAZOO = {"_serialize", "_string", "_OP_HEADERS", "_MULTI_END", "_log"}


def test_kazoo_has_every_private_name_the_adapter_uses(kazoo_client: Any) -> None:
    """Each private attribute or method of kazoo that kazoo_private.py touches or
    overrides (read from its source, so the list is exactly what it uses), each name
    it takes from kazoo's undocumented protocol module, and the public attributes
    whose behaviour it relies on."""
    from kazoo import exceptions
    from kazoo.protocol import connection, serialization

    adapter = ZK / "kazoo_private.py"
    private = _private_attributes(adapter) - OWN_KAZOO
    # what the adapter needs of kazoo, exactly (a new use must be added here, and to
    # the adapter's docstring and docs/registry-backends.md)
    assert private == {
        "_call",
        "_child_watchers",
        "_connect",
        "_connection",
        "_data_watchers",
        "_read_watch_event",
        "_session_id",
        "_session_passwd",
        "_socket",
    }, private
    conn = kazoo_client._connection
    missing = [
        name
        for name in sorted(private)
        if not any(
            hasattr(owner, name) for owner in (kazoo_client, conn, connection.ConnectionHandler)
        )
    ]
    names: dict[str, tuple[object, str]] = {
        # public, but relied on for a behaviour (see the tests below)
        "KazooClient.last_zxid": (kazoo_client, "last_zxid"),
        "KazooClient.chroot": (kazoo_client, "chroot"),
        "KazooClient.hosts": (kazoo_client, "hosts"),
        "KazooClient.unchroot": (kazoo_client, "unchroot"),
        "KazooClient.client_id": (kazoo_client, "client_id"),
        "ConnectionHandler.retry_sleeper": (conn, "retry_sleeper"),
        "ConnectionHandler.logger": (conn, "logger"),
        "ConnectionHandler.sasl_options": (conn, "sasl_options"),
        "kazoo.exceptions.EXCEPTIONS": (exceptions, "EXCEPTIONS"),
    }
    for name in sorted(_module_attributes(adapter, "zkproto")):
        names[f"kazoo.protocol.serialization.{name}"] = (serialization, name)
    missing += _missing(names)
    assert not missing, (
        f"kazoo {importlib.metadata.version('kazoo')} lacks {missing}, which the "
        f"ZooKeeper backend uses ({WHERE['kazoo']})"
    )


def test_only_the_adapter_touches_kazoo_privates(kazoo_client: Any) -> None:
    """No other module of the ZooKeeper backend uses a private name of kazoo's client
    or connection handler, nor kazoo's protocol modules (states, a documented one,
    aside): the adapter is the one place to re-check on a new kazoo."""
    from kazoo.protocol import connection

    def kazoo_private_name(name: str) -> bool:
        return any(
            name in vars(type(owner)) or name in vars(owner)
            for owner in (kazoo_client, kazoo_client._connection)
        ) or hasattr(connection.ConnectionHandler, name)

    offenders = []
    for path in sorted(ZK.glob("*.py")):
        if path.name == "kazoo_private.py":
            continue
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and kazoo_private_name(node.attr)
            ):
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("kazoo.protocol.serialization", "kazoo.protocol.connection")
            ):
                offenders.append(f"{path.name}:{node.lineno} from {node.module}")
        if "from kazoo.protocol import serialization" in source:
            offenders.append(f"{path.name}: imports kazoo.protocol.serialization")
    assert not offenders, offenders


def test_no_method_is_replaced_on_a_live_kazoo_object() -> None:
    """The hooks are overrides in subclasses (kazoo_private.Client, _Connection), never
    a method assigned on an instance (``conn._read_watch_event = ...``)."""
    offenders = []
    for path in sorted(ZK.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in (
                        "_read_watch_event",
                        "_connect",
                        "_call",
                    ):
                        offenders.append(f"{path.name}:{node.lineno} {target.attr}")
    assert not offenders, offenders


def test_the_adapter_client_installs_its_connection_handler() -> None:
    """kazoo_private.Client replaces kazoo's connection handler with its subclass,
    keeping kazoo's retry policy; the hooks it overrides exist in this kazoo."""
    from kazoo.protocol.connection import ConnectionHandler

    from shardkeeper.registry.zookeeper import kazoo_private

    client = kazoo_private.Client(hosts="127.0.0.1:1", timeout=4.0)
    try:
        conn = client._connection
        assert type(conn).__name__ == "_Connection" and isinstance(conn, ConnectionHandler)
        assert conn.client is client and conn.retry_sleeper is not None
        assert kazoo_private.missing_hooks() == []
    finally:
        client.close()


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
        "our multi through (transport.py unpacks it)"
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
        "_Connection._connect)"
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


#: what the ZooKeeper backend's modules other than the transport may import of kazoo:
#: its exceptions (errors.py's one translation, and the per-operation results of a
#: multi), its documented records (``ZnodeStat``, ``KazooState``, ACLs) and the
#: threading handler (handler.py extends it; errors.py translates its timeout)
KAZOO_OUTSIDE_TRANSPORT = {
    "kazoo.exceptions",
    "kazoo.protocol.states",
    "kazoo.security",
    "kazoo.handlers.threading",
}
#: what they may use of kazoo_private: its request records and their constants
#: (building and reading a multi's operations, as etcd's parts build their request
#: records); its client, its requests and its hooks are the transport's alone
KAZOO_RECORDS = {
    "create_op",
    "check_op",
    "delete_op",
    "set_data_op",
    "get_data_op",
    "get_children_op",
    "created",
    "deleted",
    "is_delete",
    "is_ephemeral_create",
    "CREATE_FRAMING",
    "SMALL_OP_FRAMING",
    "NODE_CREATED",
    "NODE_DELETED",
    "NODE_DATA_CHANGED",
}
#: the client, its requests and the session's identity: the transport's alone
KAZOO_CLIENT_NAMES = {
    "KazooClient",
    "KazooRetry",
    "Client",
    "get_async",
    "exists_async",
    "get_children_async",
    "create_async",
    "set_async",
    "delete_async",
    "get_acls_async",
    "set_acls_async",
    "add_listener",
    "start_async",
    "client_id",
    "last_zxid",
    "submit_multi",
    "submit_multi_read",
    "submit_add_watch",
    "connection_socket",
    "forget_session",
    "root_at",
    "missing_hooks",
}


def test_only_the_transport_touches_the_kazoo_client() -> None:
    """The ZooKeeper backend's transport (``transport.py``) is the one module that
    builds the kazoo client, sends requests on it and uses kazoo_private's client
    and requests; the other parts import at most kazoo's exceptions and documented
    records, and build kazoo_private's request records (the multi's operations)."""
    offenders: list[str] = []
    for path in sorted(ZK.glob("*.py")):
        if path.name in ("transport.py", "kazoo_private.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("kazoo") and alias.name not in KAZOO_OUTSIDE_TRANSPORT:
                        offenders.append(f"{path.name}:{node.lineno} import {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names = [alias.name for alias in node.names]
                if module == "kazoo":
                    modules = [f"kazoo.{name}" for name in names]
                    bad = [m for m in modules if m not in KAZOO_OUTSIDE_TRANSPORT]
                    offenders.extend(
                        f"{path.name}:{node.lineno} from kazoo import {m}" for m in bad
                    )
                elif module.startswith("kazoo") and module not in KAZOO_OUTSIDE_TRANSPORT:
                    offenders.append(f"{path.name}:{node.lineno} from {module} import ...")
                elif module.endswith("kazoo_private"):
                    offenders.extend(
                        f"{path.name}:{node.lineno} from kazoo_private import {name}"
                        for name in names
                        if name not in KAZOO_RECORDS
                    )
            elif isinstance(node, ast.Attribute):
                if (
                    isinstance(node.value, ast.Name)
                    and node.value.id == "kazoo_private"
                    and node.attr not in KAZOO_RECORDS
                ):
                    offenders.append(f"{path.name}:{node.lineno} kazoo_private.{node.attr}")
                elif node.attr in KAZOO_CLIENT_NAMES:
                    offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not offenders, (
        f"only registry/zookeeper/transport.py may touch the kazoo client: {offenders}"
    )
    # and the transport does (the rule above is not satisfied by an empty backend)
    transport = ZK / "transport.py"
    used = _module_attributes(transport, "kazoo_private")
    assert {"Client", "submit_multi", "submit_multi_read", "submit_add_watch"} <= used, used


def test_nothing_outside_the_zookeeper_backend_uses_its_kazoo_client() -> None:
    """``ZooKeeperStore.kazoo_client`` is for the backend's own tests: no module of
    the package outside ``registry/zookeeper/`` names it (the clock sampler asks the
    store's ``server_time``, registry/clock.py's ``ServerClock``, whose request the
    transport sends)."""
    offenders = [
        f"{path.relative_to(SRC)}:{n}"
        for path in sorted(SRC.rglob("*.py"))
        if ZK not in path.parents
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "kazoo_client" in line
    ]
    assert not offenders, (
        f"kazoo_client is used outside registry/zookeeper/: {offenders}; ask the store "
        "through a method (a Protocol of the caller's module) that its transport serves"
    )


def test_the_zookeeper_store_is_composed_not_a_mixin_tower() -> None:
    """``ZooKeeperStore`` derives from the contract alone and composes its parts: no
    class of ``registry/zookeeper`` derives from another class of the package (a part
    is never a base), none is named or documented as a mixin, and no method is an
    abstract stub for a sibling to fill in."""
    from shardkeeper.registry.base import CoordinationStore
    from shardkeeper.registry.zookeeper import ZooKeeperStore

    assert ZooKeeperStore.__bases__ == (CoordinationStore,)
    own: set[str] = set()
    trees = {path.name: ast.parse(path.read_text()) for path in sorted(ZK.glob("*.py"))}
    for tree in trees.values():
        own.update(n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    offenders: list[str] = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & own:
                    offenders.append(f"{name}:{node.lineno} {node.name}{sorted(bases & own)}")
                doc = ast.get_docstring(node) or ""
                if "mixin" in node.name.lower() or "mixin" in doc.lower():
                    offenders.append(f"{name}:{node.lineno} {node.name} is a mixin")
            elif isinstance(node, ast.Name) and node.id in (
                "abstractmethod",
                "NotImplementedError",
            ):
                offenders.append(f"{name}:{node.lineno} {node.id}")
            elif isinstance(node, ast.Attribute) and node.attr == "abstractmethod":
                offenders.append(f"{name}:{node.lineno} abstractmethod")
    assert not offenders, offenders


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
    the client's cached stubs (the store chooses members itself, transport.py); a
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


#: what the etcd backend's modules other than the transport may import of the client:
#: for the one error boundary, its exceptions; ``__init__`` imports the package to fail
#: early without it (the generated code, ``etcd3.etcdrpc``: see ETCDRPC_USERS)
ETCD_OUTSIDE_TRANSPORT = {"etcd3.exceptions"}
#: the client's objects and the generated gRPC stubs: the transport's alone
ETCD_CLIENT_NAMES = {
    "MultiEndpointEtcd3Client",
    "Endpoint",
    "Watcher",
    "KVStub",
    "LeaseStub",
    "AuthStub",
    "WatchStub",
    "add_callback",
    "endpoint_in_use",
}


def test_only_the_transport_touches_the_etcd3_client() -> None:
    """The etcd backend's transport (``transport.py``) is the one module that imports
    ``client_private`` and uses the client, its watcher or its gRPC stubs; the other
    parts import at most (errors.py) the exceptions, and ``messages.py`` the generated
    messages (``test_only_messages_builds_etcd3s_generated_messages``)."""
    offenders: list[str] = []
    for path in sorted(ETCD.glob("*.py")):
        if path.name in ("transport.py", "client_private.py", "messages.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bare = alias.name == "etcd3" and path.name == "__init__.py"
                    outside = alias.name not in ETCD_OUTSIDE_TRANSPORT
                    if alias.name.startswith("etcd3") and outside and not bare:
                        offenders.append(f"{path.name}:{node.lineno} import {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.endswith("client_private") or module.startswith("etcd3"):
                    offenders.append(f"{path.name}:{node.lineno} from {module} import ...")
            elif isinstance(node, ast.Attribute) and node.attr in ETCD_CLIENT_NAMES:
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
        private = {
            a
            for a in _private_attributes(path)
            if a in {"_current_endpoint_label", "_mkchannel", "_callback_thread"}
        }
        offenders.extend(f"{path.name}: {name}" for name in sorted(private))
    assert not offenders, f"only registry/etcd/transport.py may touch the etcd3 client: {offenders}"


#: the modules that may import etcd3's generated code (``etcd3.etcdrpc`` and its
#: ``*_pb2`` modules), and what for: ``messages.py`` builds every message, from the
#: records the other parts plan (``records.py``); the transport and client_private
#: take the gRPC stubs (``*Stub``) from it and nothing else
ETCDRPC_USERS = {"messages.py": "messages", "transport.py": "stubs", "client_private.py": "stubs"}


def _etcdrpc_imports(tree: ast.Module) -> list[tuple[int, str, str | None]]:
    """(line, what, alias) of each import of etcd3's generated code in ``tree``: the
    alias a module is bound to (None for ``from ... import name``)."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "etcd3.etcdrpc" or alias.name.startswith("etcd3.etcdrpc."):
                    found.append((node.lineno, f"import {alias.name}", alias.asname))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [alias.name for alias in node.names]
            if module == "etcd3" and "etcdrpc" in names:
                bound = next(a.asname or a.name for a in node.names if a.name == "etcdrpc")
                found.append((node.lineno, "from etcd3 import etcdrpc", bound))
            elif module == "etcd3.etcdrpc" or module.startswith("etcd3.etcdrpc."):
                found.append((node.lineno, f"from {module} import {', '.join(names)}", None))
    return found


def test_only_messages_builds_etcd3s_generated_messages() -> None:
    """etcd3's generated protobuf messages (RangeRequest, Compare, RequestOp,
    TxnRequest, ...) are built in ``registry/etcd/messages.py`` alone, which only the
    transport imports: the planner, the conditions, the keyspace, the nesting, the
    watch and the store plan plain records (``records.py``), so the planner's output
    is table-tested without the client's types. No other module of the package
    imports the generated code, and the transport and client_private use it for the
    gRPC stubs only."""
    offenders: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        where = str(path.relative_to(SRC))
        tree = ast.parse(path.read_text())
        imports = _etcdrpc_imports(tree)
        role = ETCDRPC_USERS.get(path.name) if path.parent == ETCD else None
        if role is None:
            offenders.extend(
                f"{where}:{line} {what}: build records (registry/etcd/records.py) and let "
                "the transport turn them into messages (registry/etcd/messages.py)"
                for line, what, _alias in imports
            )
        elif role == "stubs":
            for line, what, alias in imports:
                if alias is None:
                    offenders.append(f"{where}:{line} {what}: import the module, use its stubs")
                    continue
                offenders.extend(
                    f"{where}:{node.lineno} {alias}.{node.attr}: a generated message is "
                    "built by registry/etcd/messages.py, not here"
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == alias
                    and not node.attr.endswith("Stub")
                )
        if path.name != "transport.py" or path.parent != ETCD:
            offenders.extend(
                f"{where}:{node.lineno} imports registry/etcd/messages.py, the transport's alone"
                for node in ast.walk(tree)
                if (
                    isinstance(node, ast.ImportFrom)
                    and (node.module or "").endswith("registry.etcd")
                    and any(a.name == "messages" for a in node.names)
                )
                or (
                    isinstance(node, ast.ImportFrom)
                    and (node.module or "").endswith("registry.etcd.messages")
                )
                or (
                    isinstance(node, ast.Import)
                    and any(a.name.endswith("registry.etcd.messages") for a in node.names)
                )
            )
    assert not offenders, (
        "etcd3's generated messages are built outside registry/etcd/messages.py: "
        + "; ".join(offenders)
    )
    # and messages.py does build them (the rule is not satisfied by an empty module)
    built = _module_attributes(ETCD / "messages.py", "rpc")
    assert {"Compare", "RangeRequest", "RequestOp", "TxnRequest", "PutRequest"} <= built, built
