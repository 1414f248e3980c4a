"""The behavioural contract of CoordinationStore (registry/base.py), on real servers.

Every test runs against both backends and the reference in-memory store (the
``backend`` fixture is parametrized over zookeeper, etcd and memory). Nothing is
mocked: the shared single-node servers come from the conftest fixtures; tests that
restart, pause or need auth start a dedicated server. A test that needs a real server
process by nature (a killed child process, a server restart, member loss, auth, an
unreachable address, several processes) is parametrized over ``REAL_BACKENDS`` only
(``@real_backends``); where the in-memory store has the same fault through its hooks
(a connection drop, an owner that never comes back) the test runs on it too.
No sleeps as synchronisation: every wait is on a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.errors import (
    ConfigError,
    InvalidRegistryURLError,
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
    Put,
    WatchEvent,
    batching,
    open_store,
    parse_registry_url,
)
from shardkeeper.registry.counting import request_count
from shardkeeper.registry.faults import SessionFaults
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.registry.packing import pack_groups
from shardkeeper.registry.zookeeper import ZooKeeperStore
from shardkeeper.testing.faults import expire_session, wait_until
from shardkeeper.testing.servers import EtcdCluster, ZooKeeperCluster, free_ports

CHILD = Path(__file__).with_name("child_store.py")

StoreFactory = Callable[..., CoordinationStore]

#: the backends with a real server process
REAL_BACKENDS = [pytest.param("zookeeper", id="zk"), pytest.param("etcd", id="etcd")]
#: a test that needs a real server process by nature runs on these only
real_backends = pytest.mark.parametrize("backend", REAL_BACKENDS)


@pytest.fixture(params=["zookeeper", "etcd", "memory"], ids=["zk", "etcd", "mem"])
def backend(request: pytest.FixtureRequest) -> str:
    """The store under test: both real backends and the in-memory reference store."""
    return str(request.param)


# ---- helpers --------------------------------------------------------------------------


class Recorder:
    """Collects watch events (or states) with the thread each one arrived on."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, item: Any) -> None:
        with self.lock:
            self.items.append(item)
            self.threads.add(threading.get_ident())

    def snapshot(self) -> list[Any]:
        with self.lock:
            return list(self.items)

    def paths(self, kind: EventKind | None = None) -> list[str]:
        return [e.path for e in self.snapshot() if kind is None or e.kind is kind]


def view_from_events(events: list[WatchEvent], prefix: str) -> dict[str, bytes]:
    """Replay watch events into path -> value below ``prefix`` (RESYNC forgets everything
    under it; the prefix node itself is left out)."""
    view: dict[str, bytes] = {}
    for e in events:
        if e.kind is EventKind.RESYNC:
            view = {p: v for p, v in view.items() if not _under(p, e.path)}
        elif e.kind is EventKind.DELETED:
            view.pop(e.path, None)
        else:
            assert e.value is not None, f"{e.kind} event without a value: {e}"
            view[e.path] = e.value
    view.pop(prefix, None)
    return view


def _under(path: str, prefix: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def leaves(tree: dict[str, Any]) -> dict[str, Any]:
    """Nodes of a get_tree() result with a non-empty value (pure parents left out)."""
    return {p: n for p, n in tree.items() if n.value}


def server_of(request: pytest.FixtureRequest, backend: str) -> Any:
    """The shared single-node server of ``backend`` (this test's MemoryServer for memory)."""
    name = {"zookeeper": "zk_server", "etcd": "etcd_server", "memory": "memory_server"}[backend]
    return request.getfixturevalue(name)


def base_namespace(registry_url: str) -> str:
    """The unique namespace the registry_url fixture gave this test."""
    return parse_registry_url(registry_url).namespace


@contextlib.contextmanager
def dedicated_server(backend: str, tmp_path: Path, **kwargs: Any) -> Iterator[Any]:
    """A single-node server of our own (for restarts/pauses/auth), always stopped."""
    cls = ZooKeeperCluster if backend == "zookeeper" else EtcdCluster
    server = cls(size=1, base_dir=tmp_path / f"{backend}-dedicated", **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def started(url: str) -> Iterator[CoordinationStore]:
    """A store started on ``url`` and closed at the end (even if the test failed)."""
    store = open_store(url)
    try:
        store.start()
        yield store
    finally:
        store.close()


class Child:
    """A child process running child_store.py; stdout lines arrive on a queue."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def readline(self, timeout: float) -> str:
        """The next stdout line, or AssertionError (with stderr) after ``timeout``."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child printed nothing within {timeout} s") from None
        assert not line.startswith("ERROR"), f"child failed: {line}"
        return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# ---- namespaces -------------------------------------------------------------------------


def test_namespaces_never_see_each_others_keys(
    request: pytest.FixtureRequest,
    backend: str,
    registry_url: str,
    store_factory: StoreFactory,
) -> None:
    """Stores on namespaces 'X-a' and 'X-ab' (one a prefix of the other) are isolated."""
    server = server_of(request, backend)
    base = base_namespace(registry_url)
    a = store_factory(server.url(f"{base}-a", session_timeout=2))
    ab = store_factory(server.url(f"{base}-ab", session_timeout=2))

    a.put("/jobs/x", b"from-a")
    ab.put("/jobs/x", b"from-ab")
    ab.put("/only-ab", b"1")
    a.put("/only-a", b"1")

    assert a.get("/jobs/x").value == b"from-a"  # type: ignore[union-attr]
    assert ab.get("/jobs/x").value == b"from-ab"  # type: ignore[union-attr]
    assert a.children("/") == ["jobs", "only-a"]
    assert ab.children("/") == ["jobs", "only-ab"]
    assert not a.exists("/only-ab")
    assert a.get("/only-ab") is None
    assert set(leaves(a.get_tree("/"))) == {"/jobs/x", "/only-a"}
    assert set(leaves(ab.get_tree("/"))) == {"/jobs/x", "/only-ab"}

    a.delete("/", recursive=True)
    assert ab.get("/jobs/x").value == b"from-ab"  # type: ignore[union-attr]
    assert ab.exists("/only-ab")


def test_nested_namespaces_are_isolated(
    request: pytest.FixtureRequest,
    backend: str,
    registry_url: str,
    store_factory: StoreFactory,
) -> None:
    """A store on 'X' never sees keys of namespace 'X/sub' and vice versa."""
    server = server_of(request, backend)
    base = base_namespace(registry_url)
    outer = store_factory(server.url(base, session_timeout=2))
    inner = store_factory(server.url(f"{base}/sub", session_timeout=2))

    inner.put("/k", b"inner")
    assert outer.get_tree("/") == {} or not leaves(outer.get_tree("/")), (
        f"namespace {base!r} sees keys of {base + '/sub'!r}: {sorted(outer.get_tree('/'))}"
    )
    assert outer.children("/") == []
    outer.put("/sub/k", b"outer")
    assert inner.get("/k").value == b"inner"  # type: ignore[union-attr]


def test_prefix_siblings_are_separate_subtrees(store: CoordinationStore) -> None:
    """'/ab' is not under '/a': children, get_tree, exists and delete respect segments."""
    store.put("/a/x", b"1")
    store.put("/ab/y", b"2")
    store.put("/abc", b"3")
    assert set(leaves(store.get_tree("/a"))) == {"/a/x"}
    assert store.children("/a") == ["x"]
    store.delete("/a", recursive=True)
    assert not store.exists("/a")
    assert store.get("/ab/y").value == b"2"  # type: ignore[union-attr]
    assert store.get("/abc").value == b"3"  # type: ignore[union-attr]


# ---- reads and writes -------------------------------------------------------------------


def test_values_are_bytes_round_trip(store: CoordinationStore) -> None:
    """Any bytes (NUL, 0xff, empty, 100 kB) are stored and read back exactly."""
    payloads = {
        "/bin/zero": b"\x00\x01\xff\xfe",
        "/bin/empty": b"",
        "/bin/utf8": "héllo ✓".encode(),
        "/bin/big": bytes(random.Random(1).randrange(256) for _ in range(100_000)),
    }
    for path, value in payloads.items():
        written = store.put(path, value)
        assert written.path == path
        assert written.value == value
    for path, value in payloads.items():
        node = store.get(path)
        assert node is not None
        assert isinstance(node.value, bytes)
        assert node.value == value


def test_missing_nodes(store: CoordinationStore) -> None:
    """get -> None, exists -> False, children/get_tree -> empty, delete -> no error."""
    assert store.get("/nope") is None
    assert store.exists("/nope") is False
    assert store.children("/nope") == []
    assert store.get_tree("/nope") == {}
    store.delete("/nope")
    store.delete("/nope/deeper", recursive=False)


def test_implicit_parents(store: CoordinationStore) -> None:
    """Writing /a/b/c makes /a and /a/b exist and visible as children, with empty values."""
    store.put("/a/b/c", b"leaf")
    assert store.exists("/a")
    assert store.exists("/a/b")
    assert store.children("/") == ["a"]
    assert store.children("/a") == ["b"]
    assert store.children("/a/b") == ["c"]
    parent = store.get("/a/b")
    assert parent is not None
    assert parent.value == b""
    assert parent.path == "/a/b"
    tree = store.get_tree("/a")
    assert tree["/a/b/c"].value == b"leaf"
    assert all(_under(p, "/a") for p in tree)


def test_one_commit_creates_many_new_subtrees(store: CoordinationStore) -> None:
    """A commit may write into many subtrees that do not exist yet (an instance
    registering its jobs in one batch): every missing parent is made in it, and
    a condition on each subtree's absence holds against the state before it."""
    store.put("/reg/seed", b"")
    ops: list[Check | Create | Put] = []
    for n in range(20):
        ops += [
            Check(f"/reg/j{n}", exists=False),
            Create(f"/reg/j{n}/config", f"c{n}".encode()),
            Put(f"/reg/j{n}/members/me", b"m", ephemeral=True),
        ]
    result = store.commit(ops)
    assert result.succeeded
    assert store.children("/reg") == sorted(["seed", *(f"j{n}" for n in range(20))])
    node = store.get("/reg/j7/members/me")
    assert node is not None and node.ephemeral
    assert node.created_revision == result.revision
    config = store.get("/reg/j19/config")
    assert config is not None and config.value == b"c19"
    # the same batch again: an absence check fails, nothing is applied
    before = {p: (n.value, n.version) for p, n in store.get_tree("/reg").items()}
    again = store.commit(ops)
    assert not again.succeeded
    assert again.failed_path in {op.path for op in ops}
    assert {p: (n.value, n.version) for p, n in store.get_tree("/reg").items()} == before


def test_children_are_sorted_names(store: CoordinationStore) -> None:
    """children() returns the last segments of direct children only, sorted."""
    for name in ["zeta", "alpha", "Mid", "0", "beta"]:
        store.put(f"/c/{name}", b"x")
    store.put("/c/alpha/deep/er", b"y")
    assert store.children("/c") == sorted(["zeta", "alpha", "Mid", "0", "beta"])


def test_get_tree_returns_every_node_below(store: CoordinationStore) -> None:
    """get_tree(p) holds p and every descendant with its value, and nothing else."""
    store.put("/t", b"root")
    store.put("/t/a", b"1")
    store.put("/t/a/b", b"2")
    store.put("/t/c", b"3")
    store.put("/other", b"no")
    tree = store.get_tree("/t")
    assert {p: n.value for p, n in tree.items()} == {
        "/t": b"root",
        "/t/a": b"1",
        "/t/a/b": b"2",
        "/t/c": b"3",
    }
    assert all(tree[p].path == p for p in tree)


def test_put_overwrites_and_node_fields_move(store: CoordinationStore) -> None:
    """Overwrite: version and revision change, created_revision stays; revisions grow."""
    first = store.put("/n", b"1")
    second = store.put("/n", b"2")
    assert second.value == b"2"
    assert second.version != first.version
    assert second.revision > first.revision
    assert second.created_revision == first.created_revision
    assert first.created_revision <= first.revision
    read = store.get("/n")
    assert read is not None
    assert (read.version, read.revision, read.created_revision) == (
        second.version,
        second.revision,
        second.created_revision,
    )
    assert read.ephemeral is False


def test_created_revision_grows_across_delete_and_recreate(store: CoordinationStore) -> None:
    """Delete + re-create gives a strictly larger created_revision (a fencing token)."""
    first = store.put("/fence", b"a")
    store.delete("/fence")
    assert store.get("/fence") is None
    second = store.create("/fence", b"b")
    assert second is not None
    assert second.created_revision > first.created_revision
    assert store.get("/fence").created_revision == second.created_revision  # type: ignore[union-attr]


def test_delete_is_recursive_by_default(store: CoordinationStore) -> None:
    """delete(p) removes p and everything below; siblings stay."""
    store.put("/d/x/y/z", b"1")
    store.put("/d/x/w", b"2")
    store.put("/d/keep", b"3")
    store.delete("/d/x")
    assert not store.exists("/d/x")
    assert not store.exists("/d/x/y/z")
    assert store.get_tree("/d/x") == {}
    assert store.children("/d") == ["keep"]


def test_delete_of_a_leaf_non_recursive(store: CoordinationStore) -> None:
    """delete(p, recursive=False) of a leaf deletes it and keeps its parent's other children."""
    store.put("/l/a", b"1")
    store.put("/l/b", b"2")
    store.delete("/l/a", recursive=False)
    assert store.get("/l/a") is None
    assert store.children("/l") == ["b"]


def test_create_if_absent(store: CoordinationStore) -> None:
    """create() returns the node once; a second create returns None and changes nothing."""
    node = store.create("/once", b"first")
    assert node is not None
    assert node.value == b"first"
    assert store.create("/once", b"second") is None
    assert store.get("/once").value == b"first"  # type: ignore[union-attr]
    assert store.get("/once").version == node.version  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["", "no-slash", "/trailing/", "/a//b", "/a/../b", "/sp ace"])
def test_invalid_paths_raise_config_error(store: CoordinationStore, bad: str) -> None:
    """Every operation rejects an invalid path with ConfigError naming it."""
    with pytest.raises(ConfigError, match="invalid node path"):
        store.put(bad, b"x")
    with pytest.raises(ConfigError):
        store.get(bad)


def test_oversized_value_raises_store_limit_error(store: CoordinationStore) -> None:
    """A 2 MiB value is refused with StoreLimitError and the store stays usable."""
    with pytest.raises(StoreLimitError):
        store.put("/huge", b"x" * (2 * 1024 * 1024))
    assert store.get("/huge") is None
    assert store.put("/after", b"ok").value == b"ok"


# ---- races ------------------------------------------------------------------------------


def test_create_raced_by_eight_threads_has_one_winner(store_factory: StoreFactory) -> None:
    """8 threads on 2 clients race create(): exactly one gets a node, the value is its."""
    stores = [store_factory(), store_factory()]
    barrier = threading.Barrier(8, timeout=20)
    results: list[Any] = [None] * 8
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            barrier.wait()
            results[i] = stores[i % 2].create("/race/leader", f"t{i}".encode())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a create() call hung"
    assert errors == []
    winners = [i for i, r in enumerate(results) if r is not None]
    assert len(winners) == 1, f"winners: {winners}"
    final = stores[0].get("/race/leader")
    assert final is not None
    assert final.value == f"t{winners[0]}".encode()
    assert final.created_revision == results[winners[0]].created_revision


@real_backends
def test_create_raced_by_three_processes_has_one_winner(registry_url: str) -> None:
    """3 OS processes released together race create(): exactly one prints WON."""
    children = [Child(registry_url, "create", "/race/proc", f"p{i}") for i in range(3)]
    try:
        for c in children:
            assert c.readline(timeout=30) == "READY"
        for c in children:
            c.send("GO")
        outcomes = [c.readline(timeout=30) for c in children]
    finally:
        for c in children:
            c.kill()
    winners = [i for i, o in enumerate(outcomes) if o.startswith("WON")]
    assert len(winners) == 1, f"outcomes: {outcomes}"
    assert sorted(o.split()[0] for o in outcomes) == ["LOST", "LOST", "WON"]
    with started(registry_url) as observer:
        node = observer.get("/race/proc")
        assert node is not None
        assert node.value == f"p{winners[0]}".encode()
        assert str(node.created_revision) == outcomes[winners[0]].split()[1]


# ---- ephemeral nodes --------------------------------------------------------------------


class _Owner:
    """The owner of an ephemeral node that dies without a goodbye: a child process
    killed with SIGKILL (real backends), or a MemoryStore whose connection drops and
    never comes back (memory: the server expires its session like a real one)."""

    def __init__(self, registry_url: str, path: str, backend: str) -> None:
        self.child: Child | None = None
        self.store: CoordinationStore | None = None
        if backend == "memory":
            self.store = open_store(registry_url)
            self.store.start()
            self.store.create(path, b"alive", ephemeral=True)
        else:
            self.child = Child(registry_url, "ephemeral", path)

    def ready(self) -> list[str]:
        """``["READY", session_timeout, session_id]`` once the node exists."""
        if self.child is not None:
            return self.child.readline(timeout=30).split()
        assert self.store is not None
        return ["READY", str(self.store.session_timeout), self.store.session_id]

    def kill(self) -> None:
        """Vanish without closing the session (idempotent)."""
        if self.child is not None:
            self.child.kill()
        elif isinstance(self.store, MemoryStore):
            self.store.suspend()  # idempotent: a second kill changes nothing

    def cleanup(self) -> None:
        self.kill()
        if self.store is not None:
            self.store.close()


def test_ephemeral_node_deleted_after_owner_is_killed(
    store: CoordinationStore, registry_url: str, backend: str
) -> None:
    """kill -9 of the owning process (memory: its connection drops for good): the
    ephemeral node goes within session timeout + 1 s."""
    gone = threading.Event()
    gone_at: list[float] = []

    def on_event(e: WatchEvent) -> None:
        if e.kind is EventKind.DELETED and e.path == "/live/me":
            gone_at.append(time.monotonic())
            gone.set()

    store.watch("/live", on_event)
    owner = _Owner(registry_url, "/live/me", backend)
    try:
        ready = owner.ready()
        assert ready[0] == "READY"
        timeout = float(ready[1])
        assert 0 < timeout <= 2.5, f"negotiated session timeout {timeout} s (asked for 2)"
        node = store.get("/live/me")
        assert node is not None
        assert node.ephemeral is True
        killed_at = time.monotonic()
        owner.kill()
    finally:
        owner.kill()
    assert gone.wait(timeout + 5), f"ephemeral still there {timeout + 5} s after kill -9"
    elapsed = gone_at[0] - killed_at
    print(f"\n[{backend}] ephemeral deleted {elapsed:.2f} s after kill -9 (timeout {timeout} s)")
    assert elapsed <= timeout + 1.0, f"took {elapsed:.2f} s, session timeout {timeout} s"
    assert store.get("/live/me") is None
    owner.cleanup()


def test_close_deletes_ephemerals_at_once(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """close() ends the session: our ephemerals are gone when close() returns."""
    owner = store_factory(session_timeout=10)
    owner.put("/eph/a", b"1", ephemeral=True)
    owner.create("/eph/b", b"2", ephemeral=True)
    owner.put("/eph/persistent", b"3")
    assert store.get("/eph/a").ephemeral is True  # type: ignore[union-attr]
    assert store.get("/eph/b").ephemeral is True  # type: ignore[union-attr]
    started_at = time.monotonic()
    owner.close()
    assert time.monotonic() - started_at < 5
    assert store.get("/eph/a") is None
    assert store.get("/eph/b") is None
    assert store.get("/eph/persistent").value == b"3"  # type: ignore[union-attr]
    owner.close()  # idempotent


def test_put_sets_ephemerality_both_ways(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """put(ephemeral=...) leaves the node ephemeral iff asked, in both directions."""
    owner = store_factory(session_timeout=10)
    owner.put("/p/was-ephemeral", b"1", ephemeral=True)
    owner.put("/p/was-persistent", b"1")
    made_persistent = owner.put("/p/was-ephemeral", b"2")
    made_ephemeral = owner.put("/p/was-persistent", b"2", ephemeral=True)
    assert made_persistent.ephemeral is False
    assert made_ephemeral.ephemeral is True
    assert store.get("/p/was-ephemeral").ephemeral is False  # type: ignore[union-attr]
    assert store.get("/p/was-persistent").ephemeral is True  # type: ignore[union-attr]
    owner.close()
    assert store.get("/p/was-ephemeral").value == b"2"  # type: ignore[union-attr]
    assert store.get("/p/was-persistent") is None


def test_ephemeral_node_cannot_have_children(store: CoordinationStore) -> None:
    """Writing below an ephemeral node fails with a StoreError and writes nothing."""
    store.put("/e", b"", ephemeral=True)
    with pytest.raises(StoreError):
        store.put("/e/child", b"x")
    assert store.children("/e") == []


# ---- commits ----------------------------------------------------------------------------


def test_commit_applies_everything_atomically(store: CoordinationStore) -> None:
    """A passing commit applies every op; created nodes carry the commit's revision."""
    store.put("/c/old", b"old")
    store.put("/c/gone", b"x")
    result = store.commit(
        [
            Check("/c/old", exists=True),
            Create("/c/new", b"new"),
            Put("/c/old", b"updated"),
            Delete("/c/gone"),
            Delete("/c/never-existed"),
        ]
    )
    assert result
    assert result.succeeded is True
    assert result.revision > 0
    assert store.get("/c/new").value == b"new"  # type: ignore[union-attr]
    assert store.get("/c/new").created_revision == result.revision  # type: ignore[union-attr]
    assert store.get("/c/old").value == b"updated"  # type: ignore[union-attr]
    assert store.get("/c/gone") is None


def _failing_checks(store: CoordinationStore) -> dict[str, Check]:
    node = store.put("/f/target", b"v1")
    return {
        "exists": Check("/f/missing", exists=True),
        "absent": Check("/f/target", exists=False),
        "version": Check("/f/target", version=node.version + 1000),
        "value": Check("/f/target", value=b"other"),
        "created_revision": Check("/f/target", created_revision=node.created_revision + 1),
    }


@pytest.mark.parametrize("kind", ["exists", "absent", "version", "value", "created_revision"])
def test_commit_with_a_failing_check_changes_nothing(store: CoordinationStore, kind: str) -> None:
    """A failed check of each kind makes the commit falsy and applies none of its ops."""
    check = _failing_checks(store)[kind]
    before = store.get("/f/target")
    result = store.commit(
        [
            Put("/f/target", b"changed"),
            Create("/f/created", b"x"),
            Delete("/f/target"),
            check,
        ]
    )
    assert not result
    assert result.succeeded is False
    assert result.revision == 0
    assert result.failed_path in (None, check.path)
    after = store.get("/f/target")
    assert after == before
    assert store.get("/f/created") is None


@pytest.mark.parametrize("kind", ["exists", "absent", "version", "value", "created_revision"])
def test_commit_with_a_passing_check_applies(store: CoordinationStore, kind: str) -> None:
    """Each check kind, when true, lets the commit through."""
    node = store.put("/f/target", b"v1")
    check = {
        "exists": Check("/f/target", exists=True),
        "absent": Check("/f/missing", exists=False),
        "version": Check("/f/target", version=node.version),
        "value": Check("/f/target", value=b"v1"),
        "created_revision": Check("/f/target", created_revision=node.created_revision),
    }[kind]
    assert store.commit([check, Put("/f/marker", b"m")])
    assert store.get("/f/marker").value == b"m"  # type: ignore[union-attr]


def test_version_check_detects_a_concurrent_write(store: CoordinationStore) -> None:
    """Optimistic update: a Check(version) taken before another write fails after it."""
    seen = store.put("/opt", b"1")
    store.put("/opt", b"2")
    assert not store.commit([Check("/opt", version=seen.version), Put("/opt", b"3")])
    assert store.get("/opt").value == b"2"  # type: ignore[union-attr]


def test_checks_on_an_implicit_parent(store: CoordinationStore) -> None:
    """Check(exists=...) on a pure parent agrees with exists(): something lives below it."""
    store.put("/pp/x/y", b"1")
    assert store.exists("/pp/x")
    assert store.commit([Check("/pp/x", exists=True), Put("/pp/m1", b"1")])
    assert not store.commit([Check("/pp/x", exists=False), Put("/pp/m2", b"1")])
    assert store.get("/pp/m2") is None


def test_create_on_an_implicit_parent_finds_it_existing(store: CoordinationStore) -> None:
    """create() of a pure parent returns None: exists() already says it is there."""
    store.put("/ip/x/y", b"1")
    assert store.exists("/ip/x")
    assert store.create("/ip/x", b"new") is None
    assert store.get("/ip/x").value == b""  # type: ignore[union-attr]


def test_commit_create_of_existing_node_fails(store: CoordinationStore) -> None:
    """Create of a node that exists fails the whole commit; nothing is applied."""
    store.put("/x/exists", b"orig")
    result = store.commit([Put("/x/other", b"o"), Create("/x/exists", b"new")])
    assert not result
    assert result.failed_path in (None, "/x/exists")
    assert store.get("/x/exists").value == b"orig"  # type: ignore[union-attr]
    assert store.get("/x/other") is None


def test_commit_of_max_ops_works_and_one_more_raises(store: CoordinationStore) -> None:
    """The backend's limit of ops commits fine (128 on etcd and memory, etcd's default,
    4,096 on ZooKeeper); one more raises StoreLimitError and writes nothing."""
    limit = batching.max_ops_per_commit(store)
    assert limit == (4096 if isinstance(store, ZooKeeperStore) else 128)
    assert store.commit([Put(f"/many/k{i:03d}", b"1") for i in range(limit)])
    assert len(store.children("/many")) == limit
    with pytest.raises(StoreLimitError):
        store.commit([Put(f"/more/k{i:03d}", b"1") for i in range(limit + 1)])
    assert store.children("/more") == []


# ---- commits of groups ----------------------------------------------------------------


def test_commit_groups_applies_the_fixed_ops_and_every_group(store: CoordinationStore) -> None:
    """Fixed ops and groups whose checks hold are applied in one revision: every node
    they create carries it."""
    store.put("/g/gate", b"open")
    result = batching.commit_groups(
        store,
        [Check("/g/gate", value=b"open"), Put("/g/fired", b"1")],
        [[Create(f"/g/run/{i}", b"m"), Delete(f"/g/miss/{i}")] for i in range(5)],
    )
    assert result.succeeded
    assert result.applied == dict.fromkeys(range(5), result.revision)
    assert result.refused == {}
    for i in range(5):
        assert store.get(f"/g/run/{i}").created_revision == result.revision  # type: ignore[union-attr]
    assert store.get("/g/fired").value == b"1"  # type: ignore[union-attr]


def test_commit_groups_with_a_failing_fixed_check_applies_nothing(
    store: CoordinationStore,
) -> None:
    """A fixed check that fails refuses everything and names its path."""
    store.put("/g/gate", b"closed")
    result = batching.commit_groups(
        store,
        [Check("/g/gate", value=b"open"), Put("/g/fired", b"1")],
        [[Create(f"/g/run/{i}", b"m")] for i in range(3)],
    )
    assert not result.succeeded
    assert result.applied == {}
    assert result.failed_path in (None, "/g/gate")
    assert store.get("/g/fired") is None
    assert store.children("/g/run") == []


def test_commit_groups_with_a_refused_group(store: CoordinationStore) -> None:
    """A group whose check fails is refused with its path. A store that checks groups
    apart (``max_groups_per_commit``) applies the others; any other store applies
    nothing, as one plain commit would."""
    store.put("/g/run/1", b"theirs")
    result = batching.commit_groups(
        store, [Put("/g/fired", b"1")], [[Create(f"/g/run/{i}", b"mine")] for i in range(3)]
    )
    assert store.get("/g/run/1").value == b"theirs"  # type: ignore[union-attr]
    if batching.max_groups_per_commit(store) is None:
        assert not result.succeeded
        assert result.failed_path in (None, "/g/run/1")
        assert store.get("/g/fired") is None
        assert store.children("/g/run") == ["1"]
        return
    assert result.succeeded
    assert result.refused == {1: "/g/run/1"}
    assert sorted(result.applied) == [0, 2]
    assert store.children("/g/run") == ["0", "1", "2"]
    assert store.get("/g/fired").value == b"1"  # type: ignore[union-attr]


def test_the_reference_store_can_check_groups_apart() -> None:
    """``MemoryServer(groups_apart=True)`` behaves as etcd does: a refused group leaves
    the others applied, all in one revision."""
    server = MemoryServer(groups_apart=True)
    try:
        store = server.store()
        store.start()
        store.put("/g/run/1", b"theirs")
        result = batching.commit_groups(
            store, [Put("/g/fired", b"1")], [[Create(f"/g/run/{i}", b"mine")] for i in range(3)]
        )
        assert result.succeeded and result.refused == {1: "/g/run/1"}
        assert result.applied == {0: result.revision, 2: result.revision}
        assert store.get("/g/run/2").created_revision == result.revision  # type: ignore[union-attr]
        assert store.get("/g/run/1").value == b"theirs"  # type: ignore[union-attr]
    finally:
        server.shutdown()


def test_commit_groups_of_an_existence_check_on_a_pure_parent(store: CoordinationStore) -> None:
    """A group's existence check holds for a pure parent (something lives below it),
    as it does in a plain commit, and fails for a missing node."""
    store.put("/pp/x/y", b"1")
    result = batching.commit_groups(
        store, [], [[Check("/pp/x", exists=True), Put("/pp/m1", b"1")], [Put("/pp/m2", b"2")]]
    )
    assert result.succeeded
    assert sorted(result.applied) == [0, 1]
    assert store.get("/pp/m1") is not None
    refused = batching.commit_groups(
        store, [], [[Check("/pp/missing", exists=True), Put("/pp/m3", b"1")], [Put("/pp/m4", b"4")]]
    )
    assert store.get("/pp/m3") is None
    if batching.max_groups_per_commit(store) is not None:
        assert refused.refused == {0: "/pp/missing"}
        assert store.get("/pp/m4") is not None


def test_commit_groups_of_a_thousand_items(store: CoordinationStore) -> None:
    """A thousand groups, each an absence check and a write, packed for the store
    (``pack_groups(apart=True)``): every one is applied. On etcd that is one request
    at its default of 128 operations per transaction (nested transactions)."""
    fixed: list[Check | Put] = [Check("/big/flag", exists=False), Put("/big/fired", b"1")]
    groups = [[Create(f"/big/run/{i}", b"mark")] for i in range(1000)]
    chunks = pack_groups(store, groups, fixed, apart=True)
    before = request_count(store)
    applied = 0
    for members, _ops in chunks:
        result = batching.commit_groups(store, fixed, [groups[m] for m in members])
        assert result.succeeded
        applied += len(result.applied)
    sent = request_count(store) - before
    assert applied == 1000
    assert len(store.children("/big/run")) == 1000
    if batching.max_groups_per_commit(store) is not None:
        assert len(chunks) == 1
        assert sent == 1
    cleared = (
        batching.commit_groups(
            store,
            [],
            [[Check(f"/big/run/{i}", exists=True), Delete(f"/big/run/{i}")] for i in range(600)],
        )
        if batching.max_groups_per_commit(store) is not None
        else None
    )
    if cleared is not None:
        assert len(cleared.applied) == 600
        assert len(store.children("/big/run")) == 400


def test_commit_groups_below_an_ephemeral_node_raises(store: CoordinationStore) -> None:
    """A group may not write below an ephemeral node either: StoreError, nothing written."""
    store.put("/e", b"", ephemeral=True)
    with pytest.raises(StoreError):
        batching.commit_groups(
            store, [Put("/ok", b"1")], [[Put("/e/child", b"x")], [Put("/ok2", b"1")]]
        )
    assert store.children("/e") == []
    assert store.get("/ok") is None


def test_commit_can_create_ephemeral_nodes(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """Create(ephemeral=True) in a commit ties the node to the session."""
    owner = store_factory(session_timeout=10)
    assert owner.commit([Create("/ce/e", b"1", ephemeral=True), Put("/ce/p", b"2")])
    assert store.get("/ce/e").ephemeral is True  # type: ignore[union-attr]
    owner.close()
    assert store.get("/ce/e") is None
    assert store.get("/ce/p") is not None


# ---- watches ----------------------------------------------------------------------------


def _plan(count: int, keys: int, seed: int = 7) -> list[tuple[str, str, bytes | None, EventKind]]:
    """A deterministic mix of creates, overwrites and deletes over ``keys`` keys."""
    rng = random.Random(seed)
    present: set[str] = set()
    plan: list[tuple[str, str, bytes | None, EventKind]] = []
    for i in range(count):
        path = f"/w/k{rng.randrange(keys):02d}"
        if path in present and rng.random() < 0.2:
            plan.append(("delete", path, None, EventKind.DELETED))
            present.discard(path)
        else:
            kind = EventKind.CHANGED if path in present else EventKind.CREATED
            plan.append(("put", path, f"v{i}".encode(), kind))
            present.add(path)
    return plan


def _per_path(events: list[WatchEvent]) -> dict[str, list[WatchEvent]]:
    by_path: dict[str, list[WatchEvent]] = {}
    for e in events:
        by_path.setdefault(e.path, []).append(e)
    return by_path


def _is_subsequence(short: list[Any], long: list[Any]) -> bool:
    rest = iter(long)
    return all(any(x == y for y in rest) for x in short)


def test_watch_of_1000_rapid_writes_converges_in_per_path_order(
    store: CoordinationStore, store_factory: StoreFactory, backend: str
) -> None:
    """1,000 rapid writes by another client (base.py, Watches): replaying the events
    gives the store's state; each path's events follow its store order and end on its
    final value. etcd delivers every write, in store order; ZooKeeper may coalesce
    rapid changes of a node into one event carrying the latest value."""
    writer = store_factory()
    writer.put("/w", b"")
    rec = Recorder()
    store.watch("/w", rec)
    plan = _plan(1000, keys=40)
    began = time.monotonic()
    for op, path, value, _kind in plan:
        if op == "put":
            assert value is not None
            writer.put(path, value)
        else:
            writer.delete(path)
    writer.put("/w/zz-end", b"end")
    final = {p: n.value for p, n in writer.get_tree("/w").items() if p not in ("/w", "/w/zz-end")}

    def replayed() -> dict[str, bytes]:
        return view_from_events([e for e in rec.snapshot() if e.path != "/w/zz-end"], "/w")

    def differences() -> str:
        view = replayed()
        wrong = sorted(p for p in set(view) | set(final) if view.get(p) != final.get(p))
        return f"replayed events differ from the store at {len(wrong)} paths: {wrong[:5]}"

    # (a) replaying the events converges to the store's state. The sentinel alone is
    # not enough on ZooKeeper: a re-read may report it before earlier changes of
    # other nodes whose events are still queued.
    wait_until(
        lambda: "/w/zz-end" in rec.paths() and replayed() == final,
        timeout=30,
        message=differences,
    )
    events = [e for e in rec.snapshot() if e.path != "/w/zz-end"]
    print(
        f"\n[{backend}] 1000 writes + delivery in {time.monotonic() - began:.2f} s, "
        f"{len(events)} events"
    )
    # (b) per path: revisions strictly increase, values are the path's own values in
    # the order it had them, and the last event carries the final value
    history: dict[str, list[bytes | None]] = {}
    for _op, path, value, _kind in plan:
        history.setdefault(path, []).append(value)
    by_path = _per_path(events)
    assert set(by_path) <= set(history), (
        f"events for unwritten paths: {set(by_path) - set(history)}"
    )
    assert set(final) <= set(by_path), f"no event for {set(final) - set(by_path)}"
    disordered = {
        p: [e.revision for e in evs]
        for p, evs in by_path.items()
        if any(b.revision <= a.revision for a, b in itertools.pairwise(evs))
    }
    assert disordered == {}, f"per-path revisions not increasing: {disordered}"
    foreign = {
        p: [e.value for e in evs]
        for p, evs in by_path.items()
        if not _is_subsequence([e.value for e in evs], history[p])
    }
    assert foreign == {}, f"values out of each path's history order: {foreign}"
    assert {p: evs[-1].value for p, evs in by_path.items()} == {p: history[p][-1] for p in by_path}
    if backend == "zookeeper":
        return  # one-shot watches: no more is promised (see base.py, Watches)
    # (c) etcd: every write is one event, exactly, in global store order
    got = [(e.kind, e.path) for e in events]
    want = [(kind, path) for _op, path, _v, kind in plan]
    first_diff = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), None)
    assert got == want, (
        f"{len(got)} events for {len(want)} writes; first difference at #{first_diff}: "
        f"got {got[first_diff] if first_diff is not None and first_diff < len(got) else None}, "
        f"want {want[first_diff] if first_diff is not None else None}"
    )
    wrong_values = [
        (i, e.path, e.value, value)
        for i, (e, (_op, _p, value, _k)) in enumerate(zip(events, plan, strict=True))
        if e.value != value
    ]
    assert wrong_values == [], f"{len(wrong_values)} events carry another value: {wrong_values[:5]}"
    revisions = [e.revision for e in events]
    assert all(a < b for a, b in itertools.pairwise(revisions))


def test_watch_reports_deletes_of_a_subtree(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """A recursive delete produces a DELETED event (value None) for every node removed."""
    writer = store_factory()
    writer.put("/del", b"")
    writer.put("/del/a/x", b"1")
    writer.put("/del/a/y", b"2")
    writer.put("/del/b", b"3")
    rec = Recorder()
    store.watch("/del", rec)
    writer.delete("/del/a")
    writer.delete("/del/b")
    writer.put("/del/end", b"")
    wait_until(lambda: "/del/end" in rec.paths(), timeout=15, message="no sentinel event")
    deleted = rec.paths(EventKind.DELETED)
    assert {"/del/a/x", "/del/a/y", "/del/b"} <= set(deleted)
    assert set(deleted) <= {"/del/a", "/del/a/x", "/del/a/y", "/del/b"}
    assert all(e.value is None for e in rec.snapshot() if e.kind is EventKind.DELETED)
    assert deleted.index("/del/b") > max(deleted.index("/del/a/x"), deleted.index("/del/a/y"))


def test_watch_covers_the_prefix_node_and_only_its_subtree(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """watch('/p') reports /p and /p/..., never /pq or /other."""
    writer = store_factory()
    rec = Recorder()
    store.watch("/p", rec)
    writer.put("/pq/x", b"no")
    writer.put("/other", b"no")
    writer.put("/p", b"self")
    writer.put("/p/child", b"yes")
    wait_until(lambda: "/p/child" in rec.paths(), timeout=15, message="no event for /p/child")
    assert rec.paths() == ["/p", "/p/child"]
    assert [e.kind for e in rec.snapshot()] == [EventKind.CREATED, EventKind.CREATED]
    assert rec.snapshot()[0].value == b"self"


def test_watch_on_the_namespace_root_sees_everything(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """watch('/') reports changes anywhere in the namespace."""
    writer = store_factory()
    writer.put("/top", b"")
    rec = Recorder()
    store.watch("/", rec)
    # One change at a time, each waited for: ZooKeeper may coalesce rapid changes and
    # report changes of different nodes out of store order (base.py, Watches), and
    # this test is about the scope of a root watch, not about that.

    def delivered(count: int) -> None:
        wait_until(
            lambda: len(rec.snapshot()) >= count,
            timeout=15,
            message=lambda: f"events: {rec.snapshot()}",
        )

    writer.put("/top/a", b"1")
    delivered(1)
    writer.put("/top", b"2")
    delivered(2)
    writer.delete("/top/a")
    delivered(3)
    # nothing is pending now, so a last change shows that no extra event came
    writer.put("/zz-end", b"")
    delivered(4)
    assert [(e.kind, e.path, e.value) for e in rec.snapshot()] == [
        (EventKind.CREATED, "/top/a", b"1"),
        (EventKind.CHANGED, "/top", b"2"),
        (EventKind.DELETED, "/top/a", None),
        (EventKind.CREATED, "/zz-end", b""),
    ]


def test_cancel_stops_deliveries(store: CoordinationStore, store_factory: StoreFactory) -> None:
    """After cancel() a listener gets nothing more, while other watches keep working."""
    writer = store_factory()
    writer.put("/cx", b"")  # so that no backend reports an implicit parent being created
    cancelled, control = Recorder(), Recorder()
    sub = store.watch("/cx", cancelled)
    store.watch("/cx", control)
    writer.put("/cx/1", b"1")
    wait_until(lambda: cancelled.paths() == ["/cx/1"], timeout=15, message="first event missing")
    sub.cancel()
    sub.cancel()  # idempotent
    writer.put("/cx/2", b"2")
    writer.put("/cx/3", b"3")
    wait_until(lambda: "/cx/3" in control.paths(), timeout=15, message="control watch stalled")
    assert cancelled.paths() == ["/cx/1"]
    assert control.paths() == ["/cx/1", "/cx/2", "/cx/3"]


def running_node(path: str) -> bool:
    """Exactly ``/jobs/{job}/running`` (segment-exact: not ``running-x``, not deeper
    ``running`` segments); the store must leave out its subtree by itself."""
    segs = path.split("/")
    return len(segs) == 4 and segs[1] == "jobs" and segs[3] == "running"


def test_watch_exclude_leaves_out_whole_subtrees(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """A watch on '/' excluding /jobs/{job}/running reports every other change, nothing
    at or below an excluded node, still converges, and keeps delivering afterwards."""
    writer = store_factory()
    rec = Recorder()
    gate, release = "/gate", threading.Event()

    def listener(e: WatchEvent) -> None:
        rec(e)
        if e.path == gate:
            # hold the event thread so that the writes below land before the store
            # looks at them (ZooKeeper then finds /jobs/late with a changed child set)
            release.wait(15)

    store.watch("/", listener, exclude=running_node)
    # /jobs and /jobs/a are born as implicit parents of an excluded node: no event for
    # them on either backend (etcd has no such keys)
    writer.put("/jobs/a/running/0", b"r")
    writer.put("/jobs/a/config", b"c")
    wait_until(lambda: "/jobs/a/config" in rec.paths(), timeout=15, message="no config event")
    for i in range(20):
        writer.put(f"/jobs/a/running/{i}", b"x")
        writer.commit([Put(f"/jobs/a/running/{i}", b"y"), Put("/jobs/a/sharding", b"%d" % i)])
        writer.delete(f"/jobs/a/running/{i}")
    writer.put("/jobs/a/running", b"a value on the excluded node itself")
    writer.put("/jobs/a/running-x/0", b"look-alike sibling")
    writer.put("/jobs/a/instances/running", b"deeper running segment")
    writer.put("/jobs/b/running/1", b"another job")
    writer.delete("/jobs/a/running")

    writer.put(gate, b"g")
    wait_until(lambda: gate in rec.paths(), timeout=15, message="no gate event")
    writer.put("/jobs/late/running/0", b"r")  # /jobs/late born with an excluded child
    writer.put("/jobs/late/config", b"c")  # then a visible one: its child set changed
    release.set()

    writer.put("/zz-end", b"end")
    wait_until(lambda: "/zz-end" in rec.paths(), timeout=15, message="no sentinel event")
    expected = {p: n.value for p, n in leaves(writer.get_tree("/")).items()}
    expected = {p: v for p, v in expected.items() if "/running/" not in p and p != gate}
    assert "/jobs/late/config" in expected and "/jobs/a/running-x/0" in expected

    def view() -> dict[str, bytes]:
        return {p: v for p, v in view_from_events(rec.snapshot(), "/").items() if p != gate}

    # ZooKeeper may report paths out of store order: converge, then check
    wait_until(
        lambda: view() == expected,
        timeout=15,
        message=lambda: f"view {view()} != store {expected}",
    )
    leaked = [e for e in rec.snapshot() if running_node("/".join(e.path.split("/")[:4]))]
    assert leaked == [], f"events from excluded subtrees: {leaked}"
    parents = {"/jobs", "/jobs/a", "/jobs/b", "/jobs/late"} & set(rec.paths())
    assert not parents, f"implicit parents of excluded nodes reported: {parents}"
    assert [e.value for e in rec.snapshot() if e.path == "/jobs/a/sharding"][-1] == b"19"


def test_events_arrive_on_one_event_thread(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """Watch events of all watches and state events come on one thread, not the caller's."""
    writer = store_factory()
    writer.put("/ta", b"")
    writer.put("/tb", b"")
    rec_a, rec_b, states = Recorder(), Recorder(), Recorder()
    store.watch("/ta", rec_a)
    store.watch("/tb", rec_b)
    store.add_state_listener(states)
    for i in range(20):
        writer.put(f"/ta/{i}", b"a")
        writer.put(f"/tb/{i}", b"b")
    wait_until(
        lambda: len(rec_a.snapshot()) == 20 and len(rec_b.snapshot()) == 20,
        timeout=15,
        message="events missing",
    )
    threads = rec_a.threads | rec_b.threads
    assert len(threads) == 1, f"events came on {len(threads)} threads"
    assert threading.get_ident() not in threads
    expire_session(store)
    wait_until(lambda: ConnectionState.CONNECTED in states.snapshot(), timeout=20, message="")
    assert states.threads <= threads, "state events on another thread than watch events"


def test_listener_may_call_the_store(store: CoordinationStore, store_factory: StoreFactory) -> None:
    """A watch listener can call the store's synchronous methods without deadlocking."""
    writer = store_factory()
    reads: list[bytes | None] = []

    def listener(e: WatchEvent) -> None:
        node = store.get(e.path)
        reads.append(node.value if node else None)

    writer.put("/lc", b"")
    store.watch("/lc", listener)
    writer.put("/lc/a", b"1")
    wait_until(lambda: reads == [b"1"], timeout=15, message=lambda: f"listener reads: {reads}")


# ---- lifecycle --------------------------------------------------------------------------


def test_lifecycle_context_manager_and_threads(registry_url: str) -> None:
    """open_store() does no I/O; `with` starts (CONNECTED) and closes; every thread the
    store started has ended shortly after close()."""
    before = set(threading.enumerate())
    store = open_store(registry_url)
    assert set(threading.enumerate()) == before, "open_store() started threads"
    with store as s:
        assert s is store
        assert s.state is ConnectionState.CONNECTED
        assert s.session_id
        assert 0 < s.session_timeout <= 2.5
        trips = request_count(s)
        s.put("/life", b"1")
        assert s.get("/life").value == b"1"  # type: ignore[union-attr]
        assert request_count(s) > trips
        assert set(threading.enumerate()) - before, "a started store runs no thread"
    store.close()  # idempotent
    wait_until(
        lambda: not [t for t in set(threading.enumerate()) - before if t.is_alive()],
        timeout=10,
        message=lambda: f"threads left after close(): {set(threading.enumerate()) - before}",
    )


# ---- faults: restart, expiry, pause, member loss ---------------------------------------


@real_backends
def test_watch_sees_every_change_across_a_server_restart(backend: str, tmp_path: Path) -> None:
    """Writes before and after a server restart all reach a watcher (events or RESYNC)."""
    with dedicated_server(backend, tmp_path) as server:
        url = server.url("restart", session_timeout=2)
        with started(url) as watcher, started(url) as writer:
            writer.put("/r", b"")
            rec = Recorder()
            watcher.watch("/r", rec)
            for i in range(10):
                writer.put(f"/r/k{i}", f"before-{i}".encode())
            wait_until(
                lambda: len(view_from_events(rec.snapshot(), "/r")) == 10,
                timeout=15,
                message="events before the restart missing",
            )
            server.restart(0)

            def write_after() -> bool:
                try:
                    for i in range(5, 15):
                        writer.put(f"/r/k{i}", f"after-{i}".encode())
                    writer.delete("/r/k0")
                    writer.delete("/r/k1")
                    return True
                except StoreError:
                    return False

            wait_until(write_after, timeout=30, message="writer never got through after restart")
            expected = {p: n.value for p, n in writer.get_tree("/r").items() if p != "/r"}
            assert len(expected) == 13
            wait_until(
                lambda: view_from_events(rec.snapshot(), "/r") == expected,
                timeout=30,
                message="watcher's view never matched the store after the restart",
            )


def test_session_expiry_gives_lost_then_connected_with_new_session(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """A real server-side expiry: LOST, then CONNECTED with a new session; ephemerals gone."""
    observer = store_factory()
    states = Recorder()
    store.add_state_listener(states)
    store.put("/exp/mine", b"1", ephemeral=True)
    rec = Recorder()
    store.watch("/exp", rec)
    old_session = store.session_id
    expire_session(store)
    wait_until(
        lambda: ConnectionState.CONNECTED in states.snapshot(),
        timeout=20,
        message=lambda: f"no CONNECTED after expiry; states: {states.snapshot()}",
    )
    seen = states.snapshot()
    assert ConnectionState.LOST in seen
    assert seen.index(ConnectionState.LOST) < seen.index(ConnectionState.CONNECTED)
    assert store.session_id != old_session
    assert store.state is ConnectionState.CONNECTED
    assert observer.get("/exp/mine") is None
    assert store.get("/exp/mine") is None
    store.put("/exp/again", b"2", ephemeral=True)
    assert observer.get("/exp/again").ephemeral is True  # type: ignore[union-attr]
    observer.put("/exp/from-observer", b"3")
    wait_until(
        lambda: "/exp/from-observer" in rec.paths(),
        timeout=15,
        message=lambda: f"watch dead after session expiry; events: {rec.paths()}",
    )


class _Freezer:
    """Freezes the connection of a store for a while: SIGSTOP of a dedicated server
    (real backends), or the store's connection suspended (memory)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def url(self, namespace: str, **options: float) -> str:
        return str(self.server.url(namespace, **options))

    def freeze(self, store: CoordinationStore) -> None:
        if isinstance(self.server, MemoryServer):
            assert isinstance(store, MemoryStore)
            store.suspend()
        else:
            self.server.pause(0)

    def thaw(self, store: CoordinationStore) -> None:
        if isinstance(self.server, MemoryServer):
            assert isinstance(store, MemoryStore)
            store.resume()
        else:
            self.server.resume(0)


@contextlib.contextmanager
def freezable(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[_Freezer]:
    """A server whose connection to a store can be frozen (see _Freezer)."""
    if backend == "memory":
        yield _Freezer(request.getfixturevalue("memory_server"))
        return
    with dedicated_server(backend, tmp_path) as server:
        yield _Freezer(server)


def test_brief_pause_gives_suspended_then_reconnected(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """SIGSTOP of the server shorter than the session timeout (memory: a suspended
    connection): SUSPENDED, RECONNECTED, same session, ephemerals kept."""
    with freezable(backend, tmp_path, request) as server:
        url = server.url("pause", session_timeout=6, operation_timeout=1)
        with started(url) as store:
            states = Recorder()
            store.add_state_listener(states)
            store.put("/pz/eph", b"1", ephemeral=True)
            session = store.session_id
            timeout = store.session_timeout
            paused_at = time.monotonic()
            server.freeze(store)
            try:
                with pytest.raises((OperationTimeoutError, StoreUnavailableError)):
                    store.get("/pz/eph")
                blocked = time.monotonic() - paused_at
                assert blocked <= 1 + 1.0, f"get() blocked {blocked:.2f} s (operation_timeout 1)"
                wait_until(
                    lambda: ConnectionState.SUSPENDED in states.snapshot(),
                    timeout=timeout * 0.9,
                    message=f"no SUSPENDED within {timeout * 0.9:.1f} s of the pause",
                )
                suspended_after = time.monotonic() - paused_at
            finally:
                server.thaw(store)
            wait_until(
                lambda: ConnectionState.RECONNECTED in states.snapshot(),
                timeout=timeout + 5,
                message=lambda: f"no RECONNECTED after resume; states: {states.snapshot()}",
            )
            print(f"\n[{backend}] SUSPENDED {suspended_after:.2f} s after SIGSTOP")
            seen = states.snapshot()
            assert ConnectionState.LOST not in seen, f"session lost: {seen}"
            assert seen.index(ConnectionState.SUSPENDED) < seen.index(ConnectionState.RECONNECTED)
            assert store.session_id == session
            assert store.get("/pz/eph").ephemeral is True  # type: ignore[union-attr]


def test_drop_connection_keeps_the_session(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """SessionFaults.drop_connection() cuts the client's connection: SUSPENDED, then
    RECONNECTED with the same session; ephemerals kept; the watch keeps delivering."""
    observer = store_factory()
    assert isinstance(store, SessionFaults)
    states = Recorder()
    store.add_state_listener(states)
    store.put("/dc/eph", b"1", ephemeral=True)
    rec = Recorder()
    store.watch("/dc", rec)
    session = store.session_id
    store.drop_connection()
    wait_until(
        lambda: ConnectionState.RECONNECTED in states.snapshot(),
        timeout=15,
        message=lambda: f"no RECONNECTED after the drop; states: {states.snapshot()}",
    )
    seen = states.snapshot()
    assert ConnectionState.LOST not in seen, f"session lost: {seen}"
    assert seen.index(ConnectionState.SUSPENDED) < seen.index(ConnectionState.RECONNECTED)
    assert store.session_id == session
    assert observer.get("/dc/eph").ephemeral is True  # type: ignore[union-attr]
    observer.put("/dc/after", b"2")
    wait_until(
        lambda: "/dc/after" in rec.paths(),
        timeout=15,
        message=lambda: f"watch dead after the drop; events: {rec.paths()}",
    )


def _connected_member(store: CoordinationStore, cluster: Any) -> int | None:
    """Index of the member the store talks to, when the backend lets us tell."""
    ports = [p for _h, p in cluster.hosts]
    port: int | None = None
    with contextlib.suppress(Exception):
        sock = store.kazoo_client._connection._socket  # type: ignore[attr-defined]
        port = sock.getpeername()[1]
    if port is None:
        for attr in ("client", "_client", "etcd_client", "_etcd"):
            client = getattr(store, attr, None)
            endpoint = getattr(client, "endpoint_in_use", None)
            if endpoint is not None:
                with contextlib.suppress(Exception):
                    port = int(str(endpoint.netloc).rsplit(":", 1)[1])
                break
    return ports.index(port) if port in ports else None


@pytest.mark.cluster
@real_backends
def test_client_survives_loss_of_one_member(
    request: pytest.FixtureRequest, backend: str, registry_url: str
) -> None:
    """Killing the member a client uses: writes resume within a bound, session survives."""
    cluster = request.getfixturevalue("zk_ensemble" if backend == "zookeeper" else "etcd_cluster")
    url = cluster.url(base_namespace(registry_url), session_timeout=4)
    with started(url) as store, started(url) as observer:
        states = Recorder()
        store.add_state_listener(states)
        store.put("/m/eph", b"1", ephemeral=True)
        session = store.session_id
        member = _connected_member(store, cluster)
        was_leader: bool | None = None
        victim = member if member is not None else 0
        with contextlib.suppress(Exception):
            was_leader = cluster.leader() == victim
        killed_at = time.monotonic()
        cluster.kill(victim)

        write_failures: list[str] = []

        def write_works() -> bool:
            began = time.monotonic()
            try:
                store.put("/m/after", b"ok")
                return True
            except StoreError as exc:
                write_failures.append(f"{type(exc).__name__} after {time.monotonic() - began:.2f}s")
                return False

        wait_until(write_works, timeout=15, message="no write succeeded after member loss")
        resumed = time.monotonic() - killed_at
        observer_failures: list[str] = []

        def observer_reads() -> tuple[Any, Any] | None:
            # the observer may have used the dead member too: it must get through in time
            try:
                return observer.get("/m/eph"), observer.get("/m/after")
            except StoreError as exc:
                observer_failures.append(type(exc).__name__)
                return None

        reads = wait_until(observer_reads, timeout=15, message="observer never got through")
        assert reads is not None
        eph, after = reads
        print(
            f"\n[{backend}] killed member {victim} (client's: {member}, leader: {was_leader}); "
            f"writes resumed after {resumed:.2f} s (failed writes first: {write_failures}); "
            f"observer's failed reads first: {observer_failures}"
        )
        assert store.session_id == session
        assert ConnectionState.LOST not in states.snapshot()
        assert eph is not None and eph.ephemeral is True
        assert after is not None and after.value == b"ok"


# ---- errors -----------------------------------------------------------------------------


@real_backends
def test_bad_url_is_rejected_before_connecting(backend: str) -> None:
    """A malformed URL raises InvalidRegistryURLError from open_store()."""
    scheme = "zk" if backend == "zookeeper" else "etcd"
    with pytest.raises(InvalidRegistryURLError, match="invalid port 'x'"):
        open_store(f"{scheme}://127.0.0.1:x/ns")
    with pytest.raises(InvalidRegistryURLError, match="empty namespace"):
        open_store(f"{scheme}://127.0.0.1:2181/")


def test_unknown_scheme_is_rejected() -> None:
    """An unknown scheme is named in the error."""
    with pytest.raises(InvalidRegistryURLError, match="unknown scheme 'consul'"):
        open_store("consul://127.0.0.1:8500/ns")


@real_backends
def test_unreachable_store_fails_within_connection_timeout(backend: str) -> None:
    """start() on a port nobody listens on raises StoreUnavailableError naming the address
    within connection_timeout + 2 s."""
    port = free_ports(1)[0]
    scheme = "zk" if backend == "zookeeper" else "etcd"
    store = open_store(f"{scheme}://127.0.0.1:{port}/ns?connection_timeout=1")
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            store.start()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    elapsed = time.monotonic() - began
    try:
        assert not thread.is_alive(), "start() hung on an unreachable store"
        assert isinstance(outcome[0], StoreUnavailableError), f"got {outcome[0]!r}"
        assert f"127.0.0.1:{port}" in str(outcome[0])
        assert elapsed <= 1 + 2.0, f"start() took {elapsed:.2f} s with connection_timeout=1"
    finally:
        closer = threading.Thread(target=store.close, daemon=True)
        closer.start()
        closer.join(timeout=10)
    assert not closer.is_alive(), "close() hung after a failed start()"


def test_zookeeper_acl_refuses_other_credentials(zk_server: Any, namespace: str) -> None:
    """ZooKeeper digest ACL: a node written with credentials is unreadable with other or
    no credentials (StoreAuthError)."""
    with started(
        zk_server.url(namespace, session_timeout=2, username="alice", password="a-pw")
    ) as alice:
        alice.put("/secret", b"s3")
        assert alice.get("/secret").value == b"s3"  # type: ignore[union-attr]
        for url in (
            zk_server.url(namespace, session_timeout=2, username="mallory", password="x"),
            zk_server.url(namespace, session_timeout=2),
        ):
            with pytest.raises(StoreAuthError), started(url) as other:
                other.get("/secret")
        assert alice.get("/secret").value == b"s3"  # type: ignore[union-attr]


def test_etcd_auth_refuses_wrong_credentials(tmp_path: Path) -> None:
    """etcd with auth: the right user works; a wrong password or none is StoreAuthError."""
    with dedicated_server("etcd", tmp_path, auth=True) as server:
        with started(server.url("auth", session_timeout=2)) as store:
            store.put("/k", b"v")
            assert store.get("/k").value == b"v"  # type: ignore[union-attr]
        hosts = server.hosts_string
        for url in (
            f"etcd://root:wrong@{hosts}/auth?session_timeout=2&connection_timeout=3",
            f"etcd://{hosts}/auth?session_timeout=2&connection_timeout=3",
        ):
            with pytest.raises(StoreAuthError), started(url) as bad:
                bad.get("/k")
