"""Security of the stores (issue 15, findings 9-11), on real servers.

* ZooKeeper: a store with credentials refuses an existing namespace whose nodes any
  client may use (created without credentials) and, asked to (``acl_repair=true`` or
  ``shardkeeper registry fix-acl``), gives every node the digest ACL, after which an
  unauthenticated client can no longer delete or create nodes there.
* ZooKeeper: kazoo's DEBUG (and lower) logs never show the password.
* etcd: a user granted only the prefix ``/tenantA/`` runs the whole life of a store
  (and of a runtime) on namespace ``tenantA`` and is refused on ``tenantAB``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from shardkeeper.config import JobConfig
from shardkeeper.errors import InvalidRegistryURLError, StoreAuthError
from shardkeeper.ops import Operations
from shardkeeper.registry import (
    Check,
    CoordinationStore,
    Create,
    EventKind,
    Put,
    WatchEvent,
    open_store,
    parse_registry_url,
)
from shardkeeper.registry.zookeeper import ZooKeeperStore
from shardkeeper.registry.zookeeper.security import KAZOO_LOGGERS, CredentialFilter
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob
from shardkeeper.testing.servers import EtcdCluster, ZooKeeperCluster

PASSWORD = "pw-4f1c9e-not-in-logs"
FAST = "session_timeout=2&connection_timeout=5"
CLI_TIMEOUT = 60


@pytest.fixture
def backend() -> str:
    """The ZooKeeper tests use the conftest's single-node ZooKeeper."""
    return "zookeeper"


@pytest.fixture
def raw(zk_server: ZooKeeperCluster) -> Iterator[KazooClient]:
    """A plain kazoo client without chroot or credentials: the attacker."""
    client = KazooClient(hosts=zk_server.hosts_string, timeout=5)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def zk_url(server: ZooKeeperCluster, namespace: str, *, user: str | None = "alice") -> str:
    auth = f"{user}:{PASSWORD}@" if user else ""
    return f"zk://{auth}{server.hosts_string}/{namespace}?{FAST}"


class _Started:
    """Stores started by a test, closed at its end."""

    def __init__(self) -> None:
        self.stores: list[CoordinationStore] = []

    def __call__(self, url: str) -> CoordinationStore:
        store = open_store(url)
        self.stores.append(store)
        store.start()
        return store


@pytest.fixture
def started() -> Iterator[_Started]:
    """``started(url)``: a started store, closed at teardown."""
    s = _Started()
    yield s
    for store in s.stores:
        store.close()


def cli(*args: str, registry: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m shardkeeper.cli ARGS`` with the registry in the environment."""
    env = {**os.environ, "COLUMNS": "250"}
    env.pop("SHARDKEEPER_REGISTRY", None)
    if registry is not None:
        env["SHARDKEEPER_REGISTRY"] = registry
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT,
        check=False,
    )


def open_namespace(server: ZooKeeperCluster, namespace: str, started: _Started) -> None:
    """Create ``namespace`` the unsafe way: without credentials, with a few nodes."""
    plain = started(zk_url(server, namespace, user=None))
    plain.put("/jobs/j1/config", b"{}")
    plain.put("/control/shutdown/old", b"")
    plain.close()


def all_acls(store: CoordinationStore, namespace: str) -> dict[str, list[tuple[str, str]]]:
    """``path -> [(scheme, user)]`` of every node of the namespace (read with rights)."""
    assert isinstance(store, ZooKeeperStore)
    zk = store.kazoo_client
    out: dict[str, list[tuple[str, str]]] = {}
    todo = ["/"]
    while todo:
        path = todo.pop()
        acls, _ = zk.get_acls(path)
        out[path] = [(a.id.scheme, a.id.id.split(":")[0]) for a in acls]
        todo.extend(f"{path.rstrip('/')}/{k}" for k in zk.get_children(path))
    return out


# -- finding 9: ACLs of an existing namespace -------------------------------------------


def test_open_namespace_is_refused_with_a_message_naming_node_acl_and_fix(
    zk_server: ZooKeeperCluster, namespace: str, started: _Started
) -> None:
    """A namespace first created without credentials: a store with credentials refuses
    to start, naming the namespace, the node, the ACL found and both fixes."""
    open_namespace(zk_server, namespace, started)
    store = open_store(zk_url(zk_server, namespace))
    with pytest.raises(StoreAuthError) as caught:
        store.start()
    store.close()
    message = str(caught.value)
    assert f"namespace {namespace!r}" in message
    assert f"node /{namespace} has ACL world:anyone=ALL" in message
    assert "2 more of the 3 nodes checked" in message  # /jobs and /control
    assert "shardkeeper registry fix-acl" in message and "acl_repair=true" in message
    assert "'alice'" in message and PASSWORD not in message


def test_acl_repair_locks_out_clients_without_credentials(
    zk_server: ZooKeeperCluster,
    namespace: str,
    started: _Started,
    raw: KazooClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``acl_repair=true``: every node gets alice's digest ACL; an unauthenticated
    client can then neither delete a live instance's node nor create a shutdown
    request nor any node; a later start without the option is accepted."""
    open_namespace(zk_server, namespace, started)
    # before: the attack of the finding works
    raw.create(f"/{namespace}/control/shutdown/victim")
    raw.delete(f"/{namespace}/control/shutdown/victim")
    with caplog.at_level(logging.WARNING, logger="shardkeeper.registry.zookeeper"):
        alice = started(zk_url(zk_server, namespace) + "&acl_repair=true")
    assert isinstance(alice, ZooKeeperStore)
    # the namespace node, /jobs, /jobs/j1, /jobs/j1/config, /control, /control/shutdown,
    # /control/shutdown/old
    assert alice.acl_repaired == 7
    assert any("acl_repair set user 'alice'" in r.getMessage() for r in caplog.records)
    acls = all_acls(alice, namespace)
    assert len(acls) == 7
    assert all(entries == [("digest", "alice")] for entries in acls.values()), acls
    alice.put("/instances/alice-1", b"{}", ephemeral=True)
    with pytest.raises(NoAuthError):
        raw.delete(f"/{namespace}/instances/alice-1")
    with pytest.raises(NoAuthError):
        raw.create(f"/{namespace}/control/shutdown/alice-1")
    with pytest.raises(NoAuthError):
        raw.create(f"/{namespace}/intruder")
    with pytest.raises(NoAuthError):
        raw.set(f"/{namespace}/jobs/j1/config", b"evil")
    assert alice.get("/instances/alice-1") is not None
    assert alice.children("/control/shutdown") == ["old"]
    # a secured namespace starts without the option (the check passes)
    again = started(zk_url(zk_server, namespace))
    assert isinstance(again, ZooKeeperStore) and again.acl_repaired == 0
    assert again.get("/jobs/j1/config") is not None


def test_repair_stops_at_a_node_of_another_user(
    zk_server: ZooKeeperCluster, namespace: str, started: _Started
) -> None:
    """A node the user may not administer (bob's) stops the repair with an error
    naming it; bob's node keeps bob's ACL."""
    open_namespace(zk_server, namespace, started)
    bob = KazooClient(hosts=zk_server.hosts_string, timeout=5, auth_data=[("digest", "bob:b")])
    bob.start(timeout=10)
    try:
        bob.create(f"/{namespace}/bobs", b"", acl=[make_digest_acl("bob", "b", all=True)])
        store = open_store(zk_url(zk_server, namespace) + "&acl_repair=true")
        with pytest.raises(
            StoreAuthError, match=f"cannot repair the ACL of node /{namespace}/bobs"
        ):
            store.start()
        store.close()
        acls, _ = bob.get_acls(f"/{namespace}/bobs")
        assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [("digest", "bob")]
    finally:
        bob.stop()
        bob.close()


def test_store_without_credentials_is_not_checked(
    zk_server: ZooKeeperCluster, namespace: str, started: _Started
) -> None:
    """Without credentials a namespace is open by choice: no check, no refusal."""
    open_namespace(zk_server, namespace, started)
    plain = started(zk_url(zk_server, namespace, user=None))
    assert plain.children("/") == ["control", "jobs"]


def test_fix_acl_command_sets_the_acl_recursively(
    zk_server: ZooKeeperCluster,
    namespace: str,
    started: _Started,
    raw: KazooClient,
) -> None:
    """``shardkeeper registry fix-acl`` repairs the whole tree, also a deep node left
    open under a protected top level (which the start check does not look at)."""
    open_namespace(zk_server, namespace, started)
    url = zk_url(zk_server, namespace)
    result = cli("registry", "fix-acl", registry=url)
    assert result.returncode == 0, result.stderr
    assert f"namespace {namespace!r}: ACL of 7 node(s) set to digest:alice" in result.stdout
    alice = started(url)
    # a deep node opened again behind the check's back: fix-acl still finds it
    assert isinstance(alice, ZooKeeperStore)
    alice.kazoo_client.set_acls("/jobs/j1/config", OPEN_ACL_UNSAFE)
    raw.set(f"/{namespace}/jobs/j1/config", b"reachable")
    result = cli("registry", "fix-acl", registry=url)
    assert result.returncode == 0, result.stderr
    # the 7 of before, and the first run's audit entry with its two parents
    assert "ACL of 10 node(s)" in result.stdout
    trail = Operations(alice).audit()
    assert [(e.action, e.via, e.job, e.details) for e in trail] == [
        ("fix-acl", "cli", None, {"nodes": 10, "user": "alice"}),
        ("fix-acl", "cli", None, {"nodes": 7, "user": "alice"}),
    ]
    with pytest.raises(NoAuthError):
        raw.set(f"/{namespace}/jobs/j1/config", b"evil")
    assert all(e == [("digest", "alice")] for e in all_acls(alice, namespace).values())


def test_fix_acl_command_refuses_etcd_and_missing_credentials(zk_server: ZooKeeperCluster) -> None:
    """fix-acl is for ZooKeeper with credentials: anything else is a usage error."""
    for registry, words in (
        ("etcd://127.0.0.1:2379/app", "ZooKeeper only"),
        (f"zk://{zk_server.hosts_string}/app", "needs the credentials"),
    ):
        result = cli("registry", "fix-acl", registry=registry)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]


def test_acl_repair_url_option() -> None:
    """acl_repair is a switch for ZooKeeper URLs with credentials; bad uses are errors."""
    on = parse_registry_url("zk://a:b@h:2181/ns?acl_repair=true")
    assert on.acl_repair is True
    assert parse_registry_url("zk://a:b@h:2181/ns?acl_repair=no").acl_repair is False
    assert parse_registry_url("zk://a:b@h:2181/ns").acl_repair is False
    assert "acl_repair=true" in on.url(with_credentials=True)
    assert "acl_repair" not in on.url()  # without credentials it would be refused
    assert parse_registry_url(on.url(with_credentials=True)).acl_repair is True
    for url, words in (
        ("zk://a:b@h:2181/ns?acl_repair=maybe", "acl_repair='maybe' is not a switch"),
        ("zk://h:2181/ns?acl_repair=true", "needs credentials"),
        ("etcd://a:b@h:2379/ns?acl_repair=true", "ZooKeeper only"),
    ):
        with pytest.raises(InvalidRegistryURLError, match=words):
            parse_registry_url(url)


# -- finding 10: no password in logs ----------------------------------------------------


def test_password_never_reaches_the_logs(
    zk_server: ZooKeeperCluster,
    namespace: str,
    started: _Started,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every kazoo record down to its BLATHER level, while an authenticated store
    starts, writes and repairs: the password appears in none; records are kept (the
    auth request is logged, redacted)."""
    caplog.set_level(1)
    for name in KAZOO_LOGGERS:
        caplog.set_level(1, logger=name)
    open_namespace(zk_server, namespace, started)
    alice = started(zk_url(zk_server, namespace) + "&acl_repair=true")
    alice.put("/k", b"v")
    assert isinstance(alice, ZooKeeperStore)
    alice.repair_acl()
    alice.close()
    messages = [r.getMessage() for r in caplog.records]
    kazoo_records = [r for r in caplog.records if r.name.startswith("kazoo")]
    assert len(kazoo_records) > 20, "kazoo's debug records were dropped"
    assert PASSWORD not in caplog.text
    assert not any(PASSWORD in m for m in messages)
    auth = [m for m in messages if "Auth(" in m]
    assert auth and all("auth='alice:***'" in m for m in auth), auth
    assert any("id='alice:***'" in m for m in messages), "digest ACL ids not redacted"
    assert any("Sending request" in m and "SetACL" in m for m in messages)


def test_credential_filter_rewrites_and_never_drops() -> None:
    """The filter rewrites a record carrying the password (also in its args) and
    passes every record on, the untouched ones unchanged."""
    f = CredentialFilter()
    plain = logging.LogRecord("kazoo.client", logging.DEBUG, "x", 1, "Sending %s", ("Ping",), None)
    assert f.filter(plain) and plain.getMessage() == "Sending Ping"
    secret = logging.LogRecord(
        "kazoo.client",
        logging.DEBUG,
        "x",
        1,
        "Sending request(xid=%s): %s",
        (-4, f"Auth(auth_type=0, scheme='digest', auth='bob:{PASSWORD}')"),
        None,
    )
    assert f.filter(secret)
    assert secret.getMessage() == (
        "Sending request(xid=-4): Auth(auth_type=0, scheme='digest', auth='bob:***')"
    )


def test_cli_debug_log_level_hides_the_password(
    zk_server: ZooKeeperCluster, namespace: str, started: _Started
) -> None:
    """``shardkeeper --log-level debug``: kazoo's debug lines are shown, the password not."""
    url = zk_url(zk_server, namespace)
    started(url)  # creates the namespace with alice's ACL
    result = cli("--log-level", "debug", "jobs", registry=url)
    assert result.returncode == 0, result.stderr
    assert "kazoo" in result.stderr and "Auth(" in result.stderr
    assert PASSWORD not in result.stderr + result.stdout


# -- finding 11: etcd prefix grants ---------------------------------------------------


def grant(server: EtcdCluster, user: str, prefix: str) -> None:
    """The documented recipe: a user and a role with readwrite on ``prefix``."""
    server.etcdctl("user", "add", f"{user}:{PASSWORD}", "--interactive=false")
    server.etcdctl("role", "add", f"{user}-role")
    server.etcdctl("role", "grant-permission", f"{user}-role", "--prefix=true", "readwrite", prefix)
    server.etcdctl("user", "grant-role", user, f"{user}-role")


def test_etcd_tight_prefix_grant_runs_everything_and_isolates_tenants(tmp_path: Path) -> None:
    """A user granted ``/tenantA/`` only: start, put, commit (ephemeral and checks),
    watches on the root and a subtree, tree reads, delete and close all work on
    namespace tenantA, a runtime runs a job there; namespace tenantAB is refused."""
    with EtcdCluster(size=1, base_dir=tmp_path, auth=True) as server:
        grant(server, "alice", "/tenantA/")
        grant(server, "bob", "/tenantAB/")
        base = f"{server.hosts_string}/tenantA?{FAST}"
        store = open_store(f"etcd://alice:{PASSWORD}@{base}")
        store.start()
        try:
            events: list[WatchEvent] = []
            store.watch("/", events.append)
            jobs: list[WatchEvent] = []
            store.watch("/jobs", jobs.append)
            store.put("/jobs/a/config", b"1")
            store.put("/", b"root value")
            result = store.commit(
                [
                    Create("/jobs/a/running/0", b"m"),
                    Check("/jobs/a/config", value=b"1"),
                    Check("/", exists=True),
                    Check("/jobs/b", exists=False),
                    Put("/instances/i1", b"{}", ephemeral=True),
                ]
            )
            assert result.succeeded
            assert store.children("/") == ["instances", "jobs"]
            assert set(store.get_tree("/")) >= {"/", "/jobs/a/config", "/instances/i1"}
            assert store.get("/").value == b"root value"  # type: ignore[union-attr]
            wanted = {"/jobs/a/config", "/", "/jobs/a/running/0", "/instances/i1"}
            wait_until(
                lambda: {e.path for e in events if e.kind is EventKind.CREATED} >= wanted,
                timeout=10,
                message=lambda: f"root watch saw {events}",
            )
            wait_until(
                lambda: {e.path for e in jobs} == {"/jobs/a/config", "/jobs/a/running/0"},
                timeout=10,
                message=lambda: f"subtree watch saw {jobs}",
            )
            store.delete("/jobs", recursive=True)
            assert store.children("/") == ["instances"]
        finally:
            store.close()
        # what is kept under the tight grant: only keys below /tenantA/
        keys = server.etcdctl("get", "--prefix", "/tenantA", "--keys-only").split()
        assert keys == ["/tenantA/"], keys  # the root value; the ephemeral died with the lease

        job = RecordingJob()
        rt = Runtime(f"etcd://alice:{PASSWORD}@{base}", worker_threads=2, shutdown_grace=1.0)
        rt.add_job(job, JobConfig.parse(name="tiny", interval=0.5, sharding_total_count=2))
        rt.start()
        try:
            job.wait_for(
                lambda runs: {r.item for r in runs} == {0, 1}, 20, "items 0 and 1 did not run"
            )
        finally:
            rt.stop_now()

        bob = open_store(f"etcd://bob:{PASSWORD}@{server.hosts_string}/tenantAB?{FAST}")
        bob.start()
        bob.put("/jobs/b/config", b"bob's")
        bob.close()
        for namespace in ("tenantAB", "tenantA-2"):
            intruder = open_store(f"etcd://alice:{PASSWORD}@{server.hosts_string}/{namespace}")
            with pytest.raises(StoreAuthError, match="permission denied"):
                intruder.start()
            intruder.close()
        owner = open_store(f"etcd://bob:{PASSWORD}@{server.hosts_string}/tenantAB?{FAST}")
        owner.start()
        assert owner.get("/jobs/b/config").value == b"bob's"  # type: ignore[union-attr]
        owner.close()
