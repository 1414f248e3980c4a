"""etcd-specific behaviour of EtcdStore, on real etcd servers (the cross-backend contract
lives in test_contract.py).

What is checked here is how the contract maps onto etcd: the key layout, one lease for
all ephemerals, revisions as node numbers, the transaction limits, auth, and watch
recovery (resume from the last revision after a restart or a cut connection; RESYNC
after compaction). Servers come from ``shardkeeper.testing``; tests that restart,
pause or cut a server use their own. No sleeps as synchronisation: every wait is on a
condition with a deadline.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import etcd3
import etcd3.etcdrpc as rpc
import pytest

from shardkeeper.errors import (
    OperationTimeoutError,
    StoreAuthError,
    StoreError,
    StoreLimitError,
    StoreUnavailableError,
)
from shardkeeper.registry import (
    Check,
    ConnectionState,
    CoordinationStore,
    Create,
    Delete,
    EventKind,
    Op,
    Put,
    RegistrySettings,
    WatchEvent,
    open_store,
)
from shardkeeper.registry.counting import request_count
from shardkeeper.registry.etcd import EtcdStore, messages, nesting
from shardkeeper.registry.packing import pack_groups
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import EtcdCluster, free_ports


@pytest.fixture
def backend() -> str:
    """Every store fixture of this module (store, store_factory, ...) is an etcd one."""
    return "etcd"


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A single-member etcd for the tests that restart, pause or compact it."""
    cluster = EtcdCluster(size=1, base_dir=tmp_path_factory.mktemp("etcd-own"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def faulty(own_server: EtcdCluster) -> Iterator[EtcdCluster]:
    """``own_server``, serving again after the test whatever the test did to it."""
    yield own_server
    own_server.ensure_all_up()


@contextlib.contextmanager
def raw_client(server: EtcdCluster) -> Iterator[Any]:
    """A plain etcd3 client on ``server``, to look at keys and leases behind the store."""
    host, port = server.hosts[0]
    client = etcd3.MultiEndpointEtcd3Client(
        endpoints=[etcd3.Endpoint(host, port, secure=False, time_retry=0.5)],
        timeout=5,
        failover=True,
    )
    try:
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def started(url: str) -> Iterator[EtcdStore]:
    """A started EtcdStore on ``url``, closed on exit."""
    store = open_store(url)
    assert isinstance(store, EtcdStore)
    store.start()
    try:
        yield store
    finally:
        store.close()


class Recorder:
    """Collects what a listener receives."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)

    def snapshot(self) -> list[Any]:
        with self.lock:
            return list(self.items)


class CuttableProxy:
    """A TCP forwarder to one etcd member that a test can cut and restore.

    ``cut()`` closes every forwarded connection and refuses new ones (the client sees
    its connection drop while the server stays up and writable by others);
    ``restore()`` forwards again. One selector thread, stopped by ``close()``.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.peers: dict[socket.socket, socket.socket] = {}
        self.is_cut = False
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="cuttable-proxy", daemon=True)
        self.thread.start()

    def cut(self) -> None:
        self.is_cut = True
        wait_until(lambda: not self.peers, timeout=5, message="proxy connections not closed")

    def restore(self) -> None:
        self.is_cut = False

    def close(self) -> None:
        self.stopping = True
        self.thread.join(5)
        self.listener.close()

    def _drop(self, sock: socket.socket) -> None:
        for s in (sock, self.peers.get(sock)):
            if s is not None and s in self.peers:
                self.peers.pop(s, None)
                self.selector.unregister(s)
                s.close()

    def _run(self) -> None:
        while not self.stopping:
            if self.is_cut:
                for s in list(self.peers):
                    self._drop(s)
            for key, _ in self.selector.select(0.02):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    with contextlib.suppress(OSError):
                        conn, _ = self.listener.accept()
                        if self.is_cut:
                            conn.close()
                            continue
                        upstream = socket.create_connection(self.target, timeout=2)
                        for a, b in ((conn, upstream), (upstream, conn)):
                            a.setblocking(True)
                            self.peers[a] = b
                            self.selector.register(a, selectors.EVENT_READ)
                    continue
                if sock not in self.peers:
                    continue
                try:
                    data = sock.recv(65536)
                    if data:
                        self.peers[sock].sendall(data)
                except OSError:
                    data = b""
                if not data:
                    self._drop(sock)
        for s in list(self.peers):
            self._drop(s)


@pytest.fixture
def proxy(own_server: EtcdCluster) -> Iterator[CuttableProxy]:
    """A cuttable TCP path to ``own_server``."""
    p = CuttableProxy(own_server.hosts[0])
    try:
        yield p
    finally:
        p.close()


def events_of(rec: Recorder) -> list[tuple[EventKind, str, bytes | None]]:
    return [(e.kind, e.path, e.value) for e in rec.snapshot()]


# ---- key layout and node numbers ---------------------------------------------------------


def test_node_path_is_key_under_namespace_prefix(etcd_server: EtcdCluster, namespace: str) -> None:
    """Node /a/b of namespace ns is the key /ns/a/b; a nested namespace escapes its '/'."""
    with (
        started(etcd_server.url(namespace)) as flat,
        started(etcd_server.url(f"{namespace}/sub")) as nested,
        raw_client(etcd_server) as raw,
    ):
        flat.put("/a/b", b"flat")
        nested.put("/k", b"nested")
        assert raw.get(f"/{namespace}/a/b")[0] == b"flat"
        assert raw.get(f"/{namespace}%2Fsub/k")[0] == b"nested"
        keys = sorted(m.key for _v, m in raw.get_prefix(f"/{namespace}"))
        assert keys == [f"/{namespace}%2Fsub/k".encode(), f"/{namespace}/a/b".encode()]


def test_node_numbers_are_etcd_revisions(
    store: CoordinationStore, etcd_server: EtcdCluster
) -> None:
    """version and revision are the key's mod_revision, created_revision its
    create_revision; a pure parent is a synthetic node with zeros."""
    assert isinstance(store, EtcdStore)
    store.put("/n/leaf", b"1")
    node = store.put("/n/leaf", b"2")
    with raw_client(etcd_server) as raw:
        value, meta = raw.get(f"/{store.namespace}/n/leaf")
    assert value == b"2"
    assert node.version == node.revision == meta.mod_revision
    assert node.created_revision == meta.create_revision < meta.mod_revision
    assert store.get("/n/leaf") == node
    parent = store.get("/n")
    assert parent is not None
    assert (parent.value, parent.version, parent.revision, parent.created_revision) == (
        b"",
        0,
        0,
        0,
    )
    tree = store.get_tree("/n")
    assert tree == {"/n": parent, "/n/leaf": node}


def test_checks_on_a_pure_parent_see_its_subtree(store: CoordinationStore) -> None:
    """A pure parent (no key, keys below) exists for checks and create, as for exists();
    version and value checks still look at its own key, which it does not have."""
    store.put("/pp/child", b"1")
    assert store.exists("/pp")
    before = request_count(store)
    assert store.commit([Check("/pp", exists=True), Put("/x", b"1")])
    assert request_count(store) == before + 2, "own-key form first, then the subtree form"
    failed = store.commit([Check("/pp", exists=False), Put("/y", b"1")])
    assert not failed and failed.failed_path == "/pp"
    assert not store.commit([Check("/pp", version=0)])
    assert not store.commit([Check("/pp", value=b"")])
    assert store.create("/pp", b"now-real") is None
    assert store.get("/y") is None and store.get("/pp").value == b""  # type: ignore[union-attr]
    # with a key of its own and nothing below, the own-key form holds at once
    store.delete("/pp/child")
    real = store.put("/pp", b"real")
    before = request_count(store)
    assert store.commit([Check("/pp", exists=True), Put("/z", b"1")])
    assert request_count(store) == before + 1
    assert store.get("/pp") == real


def test_absence_ranges_do_not_reach_prefix_siblings(store: CoordinationStore) -> None:
    """Keys like /s-x, /s.x, /s+x and /s-x/deep sort inside [/s, /s0) but are not below /s:
    they never make /s exist for checks or create."""
    for sibling in ("/s-x", "/s.x", "/s+x", "/s-x/deep"):
        store.put(sibling, b"1")
    assert not store.exists("/s")
    assert store.commit([Check("/s", exists=False), Put("/s-marker", b"1")])
    failed = store.commit([Check("/s", exists=True), Put("/s-never", b"1")])
    assert not failed and failed.failed_path == "/s"
    assert store.create("/s", b"mine") is not None


def test_a_full_commit_of_creates_still_sees_pure_parents(store: CoordinationStore) -> None:
    """128 Creates need 256 exact absence compares: those that do not fit take the
    compact form (pre-read + one compare over [K, K0)), which still finds a pure parent
    and tolerates siblings that already existed."""
    store.put("/full/c127/below", b"x")  # the last create targets a pure parent
    store.put("/full/c126-sibling", b"x")
    creates = [Create(f"/full/c{i:03d}", b"") for i in range(128)]
    failed = store.commit(creates)
    assert not failed and failed.failed_path == "/full/c127"
    assert store.get("/full/c000") is None
    store.delete("/full/c127", recursive=True)
    assert store.commit(creates)
    assert len([n for n in store.children("/full") if not n.endswith("-sibling")]) == 128


def test_failed_path_names_the_first_false_check(store: CoordinationStore) -> None:
    """failed_path comes from the same transaction: the first check that was false."""
    a = store.put("/fp/a", b"a")
    store.put("/fp/b", b"b")
    result = store.commit(
        [
            Check("/fp/a", version=a.version),
            Check("/fp/b", value=b"not-b"),
            Check("/fp/missing", exists=True),
            Put("/fp/c", b"c"),
        ]
    )
    assert not result
    assert result.failed_path == "/fp/b"
    assert store.get("/fp/c") is None


# ---- one lease per store -----------------------------------------------------------------


def test_one_lease_carries_every_ephemeral(
    store: CoordinationStore, etcd_server: EtcdCluster
) -> None:
    """50 ephemerals made by put, create and commit all hang off the store's one lease;
    a put without ephemeral=True detaches a key from it."""
    assert isinstance(store, EtcdStore)
    lease = store.lease_id
    assert store.session_id == f"{lease:x}"
    for i in range(20):
        store.put(f"/eph/p{i:02d}", b"", ephemeral=True)
    for i in range(20):
        assert store.create(f"/eph/c{i:02d}", b"", ephemeral=True) is not None
    assert store.commit([Create(f"/eph/t{i:02d}", b"", ephemeral=True) for i in range(10)])
    store.put("/eph/p00", b"now persistent")
    prefix = f"/{store.namespace}/eph/"
    with raw_client(etcd_server) as raw:
        info = raw.get_lease_info(lease)
        attached = sorted(k.decode() for k in info.keys)
        leases = {m.key.decode(): m.lease_id for _v, m in raw.get_prefix(prefix)}
    assert len(attached) == 49 and all(k.startswith(prefix) for k in attached)
    assert leases[prefix + "p00"] == 0
    assert {lid for k, lid in leases.items() if k != prefix + "p00"} == {lease}
    assert store.lease_id == lease, "a lease per key would have changed nothing here"


def test_close_revokes_the_lease(etcd_server: EtcdCluster, namespace: str) -> None:
    """close() revokes the lease: its ephemerals are gone when close() returns."""
    with raw_client(etcd_server) as raw:
        with started(etcd_server.url(namespace, session_timeout=30)) as store:
            store.put("/gone", b"", ephemeral=True)
            lease = store.lease_id
        assert raw.get(f"/{namespace}/gone") == (None, None)
        assert raw.get_lease_info(lease).TTL == -1  # etcd: the lease does not exist


def test_session_timeout_is_the_granted_ttl(etcd_server: EtcdCluster, namespace: str) -> None:
    """A session timeout of 1.2 s asks for a 2 s lease (whole seconds, rounded up)."""
    with started(etcd_server.url(namespace, session_timeout=1.2)) as store:
        assert store.session_timeout == 2.0


# ---- limits and costs ----------------------------------------------------------------------


def test_commit_over_the_limit_is_refused_before_sending(store: CoordinationStore) -> None:
    """129 ops raise StoreLimitError without a request; the store stays usable."""
    before = request_count(store)
    with pytest.raises(StoreLimitError, match="129 operations"):
        store.commit([Put(f"/lim/k{i}", b"") for i in range(129)])
    assert request_count(store) == before
    assert store.commit([Create(f"/lim/d{i}/k", b"") for i in range(128)])


def test_max_txn_ops_raises_the_client_limit_with_the_servers(tmp_path: Path) -> None:
    """With the server's --max-txn-ops raised to 512 and ``max_txn_ops=512`` in the
    URL, a commit of 250 creates (250 compares and 250 puts) is one transaction (one
    request) and applies; 513 operations are refused before sending. A client left at
    the default still stops at 128."""
    cluster = EtcdCluster(size=1, base_dir=tmp_path / "etcd", max_txn_ops=512)
    cluster.start()
    try:
        wide = open_store(cluster.url("wide", max_txn_ops=512))
        narrow = open_store(cluster.url("wide"))
        wide.start()
        narrow.start()
        try:
            assert isinstance(wide, EtcdStore)
            assert wide.max_ops_per_commit == 512
            before = request_count(wide)
            assert wide.commit([Create(f"/many/k{i}", b"v") for i in range(250)])
            assert request_count(wide) - before == 1
            assert len(wide.children("/many")) == 250
            with pytest.raises(StoreLimitError, match="513 operations"):
                wide.commit([Put(f"/many/k{i}", b"") for i in range(513)])
            with pytest.raises(StoreLimitError, match="129 operations"):
                narrow.commit([Put(f"/many/k{i}", b"") for i in range(129)])
        finally:
            wide.close()
            narrow.close()
    finally:
        cluster.stop()


def test_commits_packed_by_bytes_fit_etcds_request_limit(tmp_path: Path) -> None:
    """With 4,096 operations a transaction allowed, the operation count no longer
    bounds a commit's size: 4,000 creates of 700 bytes packed by ``pack_groups`` go in
    commits under the server's default request limit (1.5 MiB), each accepted."""
    cluster = EtcdCluster(size=1, base_dir=tmp_path / "etcd", max_txn_ops=4096)
    cluster.start()
    try:
        store = open_store(cluster.url("bytes", max_txn_ops=4096))
        store.start()
        try:
            groups: list[list[Op]] = [
                [Create(f"/big/n{i:04d}/config", b"x" * 700)] for i in range(4000)
            ]
            chunks = pack_groups(store, groups)
            assert len(chunks) > 1  # by size: the count alone would allow one
            for _, ops in chunks:
                assert store.commit(ops)
            assert len(store.children("/big")) == 4000
        finally:
            store.close()
    finally:
        cluster.stop()


def test_group_bytes_bounds_the_nested_transaction_of_each_group(store: EtcdStore) -> None:
    """``group_bytes`` packs groups for nested transactions: for every shape the
    runtime sends (a start's marks and fences, a completion's fenced deletion and
    result), with long paths and values, it is at least the encoded size."""
    long = "/jobs/" + "j" * 120 + "/running/1234"
    shapes: list[list[Op]] = [
        [Create(long, b"m" * 300, ephemeral=True)],
        [Create(long, b"m" * 40), Create(f"{long}/fence-0123456789abcdef")],
        [Check(f"{long}/fence-0123456789abcdef", exists=True), Delete(f"{long}/f"), Delete(long)],
        [Check(long, created_revision=77), Delete(long), Put("/jobs/j/results/1", b"r" * 500)],
        [Check(long, value=b"v" * 90), Put(long, b"w" * 90), Delete("/jobs/j/misfire/1")],
        [Check(long, version=5), Check(long + "x", exists=False), Put(long, b"")],
        [],
    ]
    for group in shapes:
        plan = nesting.plan_group(group, {}, store._commits.ctx)
        encoded = messages.request_op(plan.request).ByteSize() if not isinstance(plan, str) else 0
        assert encoded <= store.group_bytes(group), group


def test_a_thousand_item_completion_is_one_request(store: EtcdStore) -> None:
    """Packed by ``group_bytes``, the completion of 1,000 persistent marks with a
    result each (four operations an item) goes in one request at etcd's defaults."""
    token_groups: list[list[Op]] = []
    for i in range(1000):
        mark = f"/jobs/some-job/running/{i}"
        store.put(f"{mark}/fence-0123456789abcdef", b"")
        token_groups.append(
            [
                Check(f"{mark}/fence-0123456789abcdef", exists=True),
                Delete(f"{mark}/fence-0123456789abcdef"),
                Delete(mark),
                Put(f"/jobs/some-job/results/{i}", b'{"ok": true, "at": 1764000000.0}'),
            ]
        )
    chunks = pack_groups(store, token_groups, apart=True)
    assert len(chunks) == 1
    before = request_count(store)
    result = store.commit_groups([], token_groups)
    assert request_count(store) - before == 1
    assert len(result.applied) == 1000
    assert store.children("/jobs/some-job/running") == []


def test_round_trips_count_one_per_request(store: CoordinationStore) -> None:
    """get, exists, children, get_tree, put, create, delete and commit cost one request."""
    store.put("/rt/a", b"")
    calls: list[Callable[[], object]] = [
        lambda: store.get("/rt/a"),
        lambda: store.exists("/rt"),
        lambda: store.children("/rt"),
        lambda: store.get_tree("/rt"),
        lambda: store.put("/rt/b", b""),
        lambda: store.create("/rt/c", b""),
        lambda: store.commit([Check("/rt/a", exists=True), Put("/rt/d", b""), Create("/rt/e")]),
        lambda: store.delete("/rt", recursive=True),
    ]
    for call in calls:
        before = request_count(store)
        call()
        assert request_count(store) == before + 1


def test_thread_count_does_not_grow_with_watches(store: CoordinationStore) -> None:
    """Watches share one stream: 40 watches run on as many threads as 1."""
    first = Recorder()
    store.watch("/tw/0", first)
    # Threads that existed before, by identity: a count would also move when a thread of an
    # earlier test ends meanwhile, which says nothing about this store.
    before = set(threading.enumerate())
    recorders = [Recorder() for _ in range(40)]
    for i, rec in enumerate(recorders):
        store.watch(f"/tw/{i + 1}", rec)
    assert _threads_started_since(before) == []
    for i in range(41):
        store.put(f"/tw/{i}/k", b"x")
    wait_until(
        lambda: all(len(r.snapshot()) == 1 for r in [first, *recorders]),
        timeout=15,
        message="some watch missed its event",
    )
    assert _threads_started_since(before) == []


def _threads_started_since(before: set[threading.Thread]) -> list[str]:
    """Names of live threads that were not alive in ``before``."""
    return sorted(t.name for t in threading.enumerate() if t not in before)


# ---- errors -----------------------------------------------------------------------------------


def test_unreachable_error_names_hosts_and_the_refusal() -> None:
    """start() against nobody: StoreUnavailableError naming the hosts and that each
    refused the connection, at once (not after the connection timeout: reach.py)."""
    ports = free_ports(2)
    url = f"etcd://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/ns?connection_timeout=5"
    store = open_store(url)
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        store.start()
    assert time.monotonic() - began < 2.5
    assert f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}" in str(info.value)
    assert str(info.value).count("connection refused") == 2
    store.close()


def test_a_paused_server_gives_operation_timeout(faulty: EtcdCluster, namespace: str) -> None:
    """A server that answers nothing: OperationTimeoutError after operation_timeout."""
    url = faulty.url(namespace, session_timeout=10, operation_timeout=1)
    with started(url) as store:
        store.put("/t", b"1")
        faulty.pause(0)
        try:
            began = time.monotonic()
            with pytest.raises(OperationTimeoutError, match="outcome is unknown"):
                store.put("/t", b"2")
            assert time.monotonic() - began < 3
        finally:
            faulty.resume(0)

        def readable() -> bool:
            try:
                return store.get("/t") is not None
            except StoreError:
                return False

        wait_until(readable, timeout=10, message="store unusable after the pause")


def test_auth_right_wrong_and_missing_credentials(tmp_path: Path) -> None:
    """With etcd auth on: the right user works (also after a restart makes the server
    forget its token); a wrong password or no credentials raise StoreAuthError naming
    the problem."""
    with EtcdCluster(size=1, base_dir=tmp_path, auth=True) as server:
        assert isinstance(server, EtcdCluster)
        with started(server.url("auth", session_timeout=10)) as store:
            store.put("/k", b"v")
            server.restart(0)

            def works() -> bool:
                try:
                    return store.get("/k") is not None
                except StoreError:
                    return False

            wait_until(works, timeout=20, message="no read after the restart")
        hosts = server.hosts_string
        with pytest.raises(StoreAuthError, match=r"user 'root'.*authentication failed"):
            open_store(f"etcd://root:wrong@{hosts}/auth?connection_timeout=3").start()
        with pytest.raises(StoreAuthError, match="no credentials"):
            open_store(f"etcd://{hosts}/auth?connection_timeout=3").start()


# ---- watch recovery ---------------------------------------------------------------------------


def test_watch_resumes_from_last_revision_after_restart(faulty: EtcdCluster) -> None:
    """Across a server restart, with writes right after it: every event exactly once, in
    order, no RESYNC; the lease survives (RECONNECTED, same session)."""
    url = faulty.url("resume", session_timeout=10)
    with started(url) as watcher, started(url) as writer:
        rec, states = Recorder(), Recorder()
        watcher.add_state_listener(states)
        watcher.watch("/r", rec)
        expected: list[tuple[EventKind, str, bytes | None]] = []
        for i in range(5):
            writer.put(f"/r/k{i}", b"before")
            expected.append((EventKind.CREATED, f"/r/k{i}", b"before"))
        wait_until(
            lambda: len(rec.snapshot()) == 5, timeout=10, message="events before the restart"
        )
        session = watcher.session_id
        faulty.restart(0)

        def write_after() -> bool:
            try:
                writer.put("/r/k0", b"after")
                return True
            except StoreError:
                return False

        wait_until(write_after, timeout=20, message="writer never got through")
        expected.append((EventKind.CHANGED, "/r/k0", b"after"))
        writer.delete("/r/k1")
        expected.append((EventKind.DELETED, "/r/k1", None))
        writer.put("/r/k9", b"new")
        expected.append((EventKind.CREATED, "/r/k9", b"new"))
        wait_until(
            lambda: events_of(rec) == expected,
            timeout=20,
            message=lambda: f"events {events_of(rec)}",
        )
        revisions = [e.revision for e in rec.snapshot()]
        assert revisions == sorted(set(revisions))
        wait_until(lambda: ConnectionState.RECONNECTED in states.snapshot(), timeout=10)
        assert ConnectionState.LOST not in states.snapshot()
        assert watcher.session_id == session


def test_watch_resumes_after_a_cut_connection(faulty: EtcdCluster, proxy: CuttableProxy) -> None:
    """Changes made while the watcher is cut off arrive after it reconnects, exactly once."""
    direct = faulty.url("cut", session_timeout=10)
    via_proxy = f"etcd://127.0.0.1:{proxy.port}/cut?session_timeout=10"
    with started(via_proxy) as watcher, started(direct) as writer:
        rec, states = Recorder(), Recorder()
        watcher.add_state_listener(states)
        watcher.watch("/c", rec)
        writer.put("/c/a", b"1")
        wait_until(lambda: len(rec.snapshot()) == 1, timeout=10, message="first event")
        proxy.cut()
        wait_until(
            lambda: ConnectionState.SUSPENDED in states.snapshot(),
            timeout=10,
            message="no SUSPENDED",
        )
        writer.put("/c/a", b"2")
        writer.put("/c/b", b"3")
        writer.delete("/c/a")
        proxy.restore()
        wait_until(
            lambda: (
                events_of(rec)
                == [
                    (EventKind.CREATED, "/c/a", b"1"),
                    (EventKind.CHANGED, "/c/a", b"2"),
                    (EventKind.CREATED, "/c/b", b"3"),
                    (EventKind.DELETED, "/c/a", None),
                ]
            ),
            timeout=15,
            message=lambda: f"events {events_of(rec)}",
        )
        wait_until(lambda: ConnectionState.RECONNECTED in states.snapshot(), timeout=10)


def test_resync_after_compaction(faulty: EtcdCluster, proxy: CuttableProxy) -> None:
    """If the history since the last revision was compacted meanwhile: RESYNC (path =
    prefix), CREATED for the current state, then live events again."""
    direct = faulty.url("compact", session_timeout=10)
    via_proxy = f"etcd://127.0.0.1:{proxy.port}/compact?session_timeout=10"
    with started(via_proxy) as watcher, started(direct) as writer:
        rec, states = Recorder(), Recorder()
        watcher.add_state_listener(states)
        writer.put("/w/gone", b"0")
        watcher.watch("/w", rec)
        writer.put("/w/a", b"1")
        wait_until(lambda: len(rec.snapshot()) == 1, timeout=10, message="first event")
        proxy.cut()
        wait_until(
            lambda: ConnectionState.SUSPENDED in states.snapshot(),
            timeout=10,
            message="no SUSPENDED",
        )
        writer.put("/w/a", b"2")
        writer.delete("/w/gone")
        last = writer.put("/w/b", b"3")
        with raw_client(faulty) as raw:
            raw.compact(last.revision, physical=True)
        proxy.restore()
        wait_until(
            lambda: len(rec.snapshot()) >= 4, timeout=15, message=lambda: f"events {events_of(rec)}"
        )
        events: list[WatchEvent] = rec.snapshot()
        assert events[0].kind is EventKind.CREATED
        assert events[1] == WatchEvent(EventKind.RESYNC, "/w", None, events[1].revision)
        assert sorted(events_of(rec)[2:]) == [
            (EventKind.CREATED, "/w/a", b"2"),
            (EventKind.CREATED, "/w/b", b"3"),
        ]
        writer.put("/w/c", b"4")
        wait_until(
            lambda: events_of(rec)[-1:] == [(EventKind.CREATED, "/w/c", b"4")],
            timeout=10,
            message=lambda: f"no live event after the resync: {events_of(rec)}",
        )


def test_cancelled_watch_is_not_resumed(faulty: EtcdCluster, proxy: CuttableProxy) -> None:
    """A watch cancelled while the connection is cut gets nothing after it comes back."""
    via_proxy = f"etcd://127.0.0.1:{proxy.port}/cancel?session_timeout=10"
    with started(via_proxy) as watcher, started(faulty.url("cancel")) as writer:
        cancelled, kept, states = Recorder(), Recorder(), Recorder()
        watcher.add_state_listener(states)
        sub = watcher.watch("/x", cancelled)
        watcher.watch("/y", kept)
        proxy.cut()
        wait_until(
            lambda: ConnectionState.SUSPENDED in states.snapshot(),
            timeout=10,
            message="no SUSPENDED",
        )
        sub.cancel()
        writer.put("/x/1", b"")
        writer.put("/y/1", b"")
        proxy.restore()
        wait_until(lambda: len(kept.snapshot()) == 1, timeout=15, message="kept watch got nothing")
        writer.put("/y/2", b"")
        wait_until(lambda: len(kept.snapshot()) == 2, timeout=15, message="kept watch stopped")
        assert cancelled.snapshot() == []


def test_settings_must_be_etcd() -> None:
    """EtcdStore refuses ZooKeeper settings (ConfigError naming the backend)."""
    with pytest.raises(ValueError, match="zookeeper"):
        EtcdStore(RegistrySettings.from_url("zk://127.0.0.1:2181/ns"))


def test_raw_protocol_limit_is_what_we_guard(etcd_server: EtcdCluster) -> None:
    """The server itself refuses 129 writes in one txn: the 128 limit is etcd's."""
    with raw_client(etcd_server) as raw:
        ops = [rpc.RequestOp(request_put=rpc.PutRequest(key=b"/lim/%d" % i)) for i in range(129)]
        with pytest.raises(Exception, match="too many operations"):
            raw.kvstub.Txn(rpc.TxnRequest(success=ops), 5)


@pytest.mark.cluster
@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_a_read_through_a_dead_member_is_sent_again_to_another(
    etcd_cluster: EtcdCluster, namespace: str, victim: str
) -> None:
    """The first request through a member killed a moment ago fails at once
    (UNAVAILABLE); a read is then sent again, to another member, and while a new leader
    is elected, so the caller sees no error. (Writes are never re-sent.)"""
    leader = etcd_cluster.leader()
    dead = leader if victim == "leader" else (leader + 1) % len(etcd_cluster.hosts)
    host, port = etcd_cluster.hosts[dead]
    url = etcd_cluster.url(namespace, session_timeout=4, operation_timeout=4)
    with started(url) as store:
        # the etcd3 client starts on a random endpoint: steer it onto the one to kill
        store._transport.use(f"{host}:{port}")
        store.put("/r/k", b"1")
        assert store._transport.endpoint_in_use().netloc == f"{host}:{port}"
        etcd_cluster.kill(dead)
        node = store.get("/r/k")  # no retry here: the store re-sends the read
        assert node is not None and node.value == b"1"
        assert store.exists("/r")
        assert store.children("/r") == ["k"]
        assert set(store.get_tree("/r")) == {"/r", "/r/k"}


@pytest.mark.cluster
def test_watch_recovery_without_a_leader_is_paced(
    etcd_cluster: EtcdCluster, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two of three members die: the one left has no leader, so a re-created watch
    fails or breaks at once. The recovery tries again every retry delay (0.2 s), not in
    a loop: before, it switched members and logged twice every few ms for as long as
    the store had no leader (hundreds of lines a second, chaos runs on etcd)."""
    url = etcd_cluster.url(namespace, session_timeout=30, operation_timeout=2)
    leader = etcd_cluster.leader()
    host, port = etcd_cluster.hosts[leader]
    events: list[WatchEvent] = []
    with started(url) as store:
        store._transport.use(f"{host}:{port}")
        store.watch("/w", events.append)
        store.put("/w/k", b"1")
        wait_until(lambda: any(e.path == "/w/k" for e in events), 10, message="no event")
        # DEBUG: the attempts after the first are logged there (one INFO per 30 s)
        caplog.set_level("DEBUG", logger="shardkeeper.registry.etcd.watch")
        etcd_cluster.kill(leader)
        etcd_cluster.kill((leader + 1) % 3)
        began = time.monotonic()
        # a measuring window (the rate of attempts), not a synchronisation
        wait_until(lambda: time.monotonic() - began >= 3.0, 10, message="clock")
        tries = sum("not resumed yet" in r.getMessage() for r in caplog.records)
    # one attempt per 0.2 s at most, with slack for a pass of several members
    assert 1 <= tries <= 3.0 / 0.2 + 5, f"{tries} watch recovery attempts in 3 s"


def test_a_tree_over_grpcs_default_answer_limit_is_read(store: CoordinationStore) -> None:
    """gRPC refuses answers over 4 MiB by default: a namespace holding a job of
    10,000 items made every read of /jobs fail with "Received message larger than
    max" (the CLI's enable --instance, 600 s chaos on etcd). Six values of 900 KB
    (each under etcd's 1.5 MiB request limit) are read back in one tree."""
    value = b"x" * 900_000
    for i in range(6):
        store.put(f"/big/{i}", value)
    tree = store.get_tree("/big")
    assert sorted(p for p in tree if p != "/big") == [f"/big/{i}" for i in range(6)]
    assert all(tree[f"/big/{i}"].value == value for i in range(6))
