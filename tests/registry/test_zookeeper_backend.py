"""ZooKeeper-specific behaviour of ZooKeeperStore, beyond the cross-backend contract.

Real servers only (the shared ``zk_server``, or a dedicated one where a test restarts
it); every wait is a condition with a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from shardkeeper.coordination.paths import is_high_churn
from shardkeeper.errors import StoreAuthError, StoreError, StoreLimitError
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
from shardkeeper.registry.zookeeper import ZooKeeperStore, kazoo_private
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import ZooKeeperCluster

StoreFactory = Callable[..., CoordinationStore]
FAST: dict[str, float] = {"session_timeout": 2.0, "connection_timeout": 5.0}


@pytest.fixture
def backend() -> str:
    """Every test here is about ZooKeeper: pin the conftest's backend parameter."""
    return "zookeeper"


@pytest.fixture
def raw(zk_server: ZooKeeperCluster) -> Iterator[KazooClient]:
    """A plain kazoo client without chroot or credentials, to look behind the store."""
    client = KazooClient(hosts=zk_server.hosts_string, timeout=5)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


class Events:
    """A thread-safe recording watch/state listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[Any] = []

    def __call__(self, item: Any) -> None:
        with self._lock:
            self.items.append(item)

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self.items)


def test_namespace_is_a_chroot_node_created_on_start(
    store_factory: StoreFactory, zk_server: ZooKeeperCluster, namespace: str, raw: KazooClient
) -> None:
    """start() creates /<namespace>; a '/' inside a namespace is escaped, never nested."""
    outer = store_factory(zk_server.url(namespace, **FAST))
    inner = store_factory(zk_server.url(f"{namespace}/sub", **FAST))
    assert raw.exists(f"/{namespace}") is not None
    assert raw.exists(f"/{namespace}%2Fsub") is not None
    inner.put("/jobs/a", b"1")
    outer.put("/jobs/a", b"2")
    assert raw.get(f"/{namespace}%2Fsub/jobs/a")[0] == b"1"
    assert raw.get(f"/{namespace}/jobs/a")[0] == b"2"
    assert outer.children("/") == ["jobs"]


def test_digest_acl_guards_every_node(
    store_factory: StoreFactory, zk_server: ZooKeeperCluster, namespace: str, raw: KazooClient
) -> None:
    """With credentials every node gets a digest ACL: others get StoreAuthError."""
    alice = store_factory(zk_server.url(namespace, **FAST, username="alice", password="a-pw"))
    alice.put("/secret/k", b"v")
    assert isinstance(alice, ZooKeeperStore)
    acls, _ = alice.kazoo_client.get_acls("/secret/k")  # (reading ACLs needs rights too)
    assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [("digest", "alice")]
    with pytest.raises(NoAuthError):
        raw.get(f"/{namespace}/secret/k")
    # wrong credentials fail at start (the namespace node is probed), not later
    mallory = ZooKeeperStore(
        RegistrySettings.from_url(
            zk_server.url(namespace, **FAST, username="alice", password="wrong")
        )
    )
    with pytest.raises(StoreAuthError):
        mallory.start()
    mallory.close()
    # the same credentials in another store read fine
    again = store_factory(zk_server.url(namespace, **FAST, username="alice", password="a-pw"))
    assert again.get("/secret/k").value == b"v"  # type: ignore[union-attr]


def test_commit_revision_is_the_czxid_and_failed_commits_leave_no_parents(
    store: CoordinationStore, raw: KazooClient
) -> None:
    """A commit's revision is its zxid; missing parents are made inside the multi."""
    result = store.commit([Create("/a/b/c", b"1"), Put("/x/y", b"2")])
    assert result
    assert store.get("/a/b/c").created_revision == result.revision  # type: ignore[union-attr]
    assert store.get("/a").created_revision == result.revision  # type: ignore[union-attr]
    failed = store.commit([Check("/nope", exists=True), Create("/p/q/r", b"1")])
    assert not failed and failed.failed_path == "/nope"
    store.put("/taken", b"")
    failed = store.commit([Create("/m/n", b"1"), Create("/taken", b"")])
    assert not failed and failed.failed_path == "/taken"
    assert not store.exists("/m")
    assert not store.exists("/p")


def test_threads_do_not_grow_with_watches(store: CoordinationStore) -> None:
    """Watches share the store's one event thread: the thread count stays fixed."""
    before = threading.active_count()
    subs = [store.watch(f"/t{i}", Events()) for i in range(20)]
    assert threading.active_count() == before
    for s in subs:
        s.cancel()


def test_an_excluded_subtree_notification_is_dropped_on_the_connection_thread(
    store: CoordinationStore, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper notifies every change under a recursive watch, excluded subtrees
    included (a fire of 10,000 items: 20,000 running-mark notifications to every
    instance). The connection thread drops those of an excluded subtree before
    anything is queued: 400 changes there post no drain to the event thread, while
    one change elsewhere does."""
    assert isinstance(store, ZooKeeperStore)
    writer = store_factory()
    writer.put("/jobs/j/config", b"c")
    writer.put("/jobs/j/running/start", b"")
    seen = Events()
    store.watch("/", seen, exclude=is_high_churn)
    drains: list[str] = []
    real_drain = store._watches._drain

    def counting_drain(w: Any) -> None:
        drains.append(w.prefix)
        real_drain(w)

    monkeypatch.setattr(store._watches, "_drain", counting_drain)
    writer.commit([Put(f"/jobs/j/running/{i}", b"x") for i in range(200)])
    writer.commit([Delete(f"/jobs/j/running/{i}") for i in range(200)])
    writer.put("/jobs/j/config", b"sentinel")
    wait_until(
        lambda: any(e.value == b"sentinel" for e in seen.snapshot()),
        timeout=30,
        message="sentinel not delivered",
    )
    assert [e.path for e in seen.snapshot()] == ["/jobs/j/config"]
    # the sentinel's own drain only (one, or two when its notification split a burst)
    assert 1 <= len(drains) <= 2, drains


def test_an_excluded_subtree_costs_the_watcher_no_requests(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """200 nodes written and deleted under an excluded node cost the watching store no
    request (no watch is set there, nothing is read or listed); a watch without the
    exclusion pays for each of them, which shows the writes were visible to one."""

    def running(path: str) -> bool:
        return path == "/jobs/j/running"

    writer, plain = store_factory(), store_factory()
    writer.put("/jobs/j/config", b"c")
    # the excluded node exists before counting: its own creation fires its parent's
    # child watch (one re-listing of /jobs/j), which is not what is measured here
    writer.put("/jobs/j/running/start", b"")
    excluded, everything = Events(), Events()
    store.watch("/", excluded, exclude=running)
    plain.watch("/", everything)
    before, plain_before = request_count(store), request_count(plain)
    for i in range(200):
        writer.put(f"/jobs/j/running/{i}", b"x")
    for i in range(200):
        writer.delete(f"/jobs/j/running/{i}")
    writer.put("/jobs/j/config", b"sentinel")  # a data change: one get to re-read

    def sentinel_in(events: Events) -> Callable[[], bool]:
        return lambda: any(e.value == b"sentinel" for e in events.snapshot())

    for events in (excluded, everything):
        wait_until(sentinel_in(events), timeout=30, message="sentinel not delivered")
    cost = request_count(store) - before
    assert cost <= 1, f"the excluded subtree cost the watcher {cost} requests"
    assert [e.path for e in excluded.snapshot()] == ["/jobs/j/config"]
    # the same writes were visible to a watch without the exclusion, and cost it reads
    created = {e.path for e in everything.snapshot() if e.kind == EventKind.CREATED}
    assert {f"/jobs/j/running/{i}" for i in range(200)} <= created
    assert request_count(plain) - plain_before >= 1


def test_a_burst_of_new_nodes_costs_the_watcher_a_few_requests(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """600 nodes created in 5 commits reach the watcher as 600 CREATED events in a few
    requests: the recursive watch notes the paths and the event thread reads them in
    batches. A watch re-armed node by node pays two requests per node (1,200 here)."""
    writer = store_factory()
    events = Events()
    store.watch("/", events)
    before = request_count(store)
    for c in range(5):
        assert writer.commit([Create(f"/burst/c{c}/n{i:03d}", b"v") for i in range(120)])

    def created() -> set[str]:
        return {e.path for e in events.snapshot() if e.kind == EventKind.CREATED}

    want = {f"/burst/c{c}/n{i:03d}" for c in range(5) for i in range(120)}
    wait_until(lambda: want <= created(), timeout=30, message="the burst was not reported")
    cost = request_count(store) - before
    assert cost < 120, f"600 new nodes cost the watcher {cost} requests"
    # the implicit parents made by the commits are not reported (as on etcd)
    assert not any(e.path in ("/burst", "/burst/c0") for e in events.snapshot())


def test_nodes_our_own_commits_create_reach_our_watch_without_a_read(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """The watch learns the nodes its own store's commits create from the multi's
    reply (value and zxid), not from re-reads: 600 nodes in 5 commits cost the 5
    commits alone, each CREATED event carries the value and the commit's revision, the
    nodes made before the watch give none, and later changes by another client are reported as
    usual (CHANGED with the new value, DELETED)."""
    other = store_factory()
    for c in range(5):  # the parents exist: each commit below is one multi
        other.put(f"/own/c{c}/first", b"")
    events = Events()
    store.watch("/", events)
    before = request_count(store)
    revisions: dict[str, int] = {}
    for c in range(5):
        done = store.commit(
            [Create(f"/own/c{c}/n{i:03d}", f"v{c}.{i}".encode()) for i in range(120)]
        )
        assert done
        revisions.update({f"/own/c{c}/n{i:03d}": done.revision for i in range(120)})

    def created() -> dict[str, WatchEvent]:
        return {e.path: e for e in events.snapshot() if e.kind == EventKind.CREATED}

    wait_until(lambda: set(revisions) <= set(created()), 30, message="creates not reported")
    assert request_count(store) - before == 5, "the watch re-read nodes its store created"
    for path, event in created().items():
        commit_no, node_no = path.split("/")[2][1:], path.split("/")[3][1:]
        assert event.value == f"v{commit_no}.{int(node_no)}".encode()
        assert event.revision == revisions[path]
    assert not any(e.path.endswith("/first") for e in events.snapshot())
    other.put("/own/c1/n007", b"changed")
    other.delete("/own/c2/n003")
    wait_until(
        lambda: (
            any(e.path == "/own/c2/n003" and e.kind == EventKind.DELETED for e in events.snapshot())
            and any(e.value == b"changed" for e in events.snapshot() if e.kind == EventKind.CHANGED)
        ),
        15,
        message="a later change was not reported",
    )


def test_tree_watch_resyncs_changes_made_while_its_watches_were_gone(tmp_path: Path) -> None:
    """After a server restart the watcher re-reads its subtree and emits what changed
    while it was blind (kazoo forgets every watch when the connection drops)."""
    server = ZooKeeperCluster(size=1, base_dir=tmp_path / "zk")
    server.start()
    stores: list[ZooKeeperStore] = []
    gate = threading.Event()
    try:
        url = server.url("resync", session_timeout=10, operation_timeout=5)
        watcher = ZooKeeperStore(RegistrySettings.from_url(url))
        writer = ZooKeeperStore(RegistrySettings.from_url(url))
        stores += [watcher, writer]
        watcher.start()
        writer.start()
        for path, value in [("/r/a", b"1"), ("/r/b", b"2"), ("/r/c/d", b"3")]:
            writer.put(path, value)
        events, states = Events(), Events()
        watcher.watch("/r", events)

        def hold_on_suspend(state: ConnectionState) -> None:
            states(state)
            if state is ConnectionState.SUSPENDED:
                # keep the event thread busy so nothing re-arms the watches
                gate.wait(20)

        watcher.add_state_listener(hold_on_suspend)
        server.restart(0)
        wait_until(lambda: ConnectionState.SUSPENDED in states.snapshot(), timeout=15)

        def write_while_blind() -> bool:
            try:
                writer.put("/r/a", b"1-after")
                writer.delete("/r/b")
                writer.put("/r/c/e", b"new")
                return True
            except StoreError:
                return False

        wait_until(write_while_blind, timeout=30, message="writer never got through")
        assert events.snapshot() == []
        gate.set()
        expected = {"/r/a": b"1-after", "/r/c/d": b"3", "/r/c/e": b"new"}
        wait_until(
            lambda: _applied(events, expected),
            timeout=20,
            message=lambda: f"events after resync: {events.snapshot()}",
        )
        kinds = {(e.kind, e.path) for e in events.snapshot()}
        assert kinds == {
            (EventKind.CHANGED, "/r/a"),
            (EventKind.DELETED, "/r/b"),
            (EventKind.CREATED, "/r/c/e"),
        }
        # the session usually survives (RECONNECTED); a restarted standalone server may
        # also refuse it (LOST, then CONNECTED): both must end in the same re-sync
        assert {ConnectionState.RECONNECTED, ConnectionState.CONNECTED} & set(states.snapshot())
    finally:
        gate.set()
        for s in stores:
            s.close()
        server.stop()


def _applied(events: Events, expected: dict[str, bytes]) -> bool:
    """Whether replaying ``events`` over the state before the restart gives ``expected``."""
    state = {"/r/a": b"1", "/r/b": b"2", "/r/c/d": b"3"}
    for e in events.snapshot():
        if e.kind is EventKind.DELETED:
            state.pop(e.path, None)
        elif e.value is not None:
            state[e.path] = e.value
    return state == expected


@pytest.mark.cluster
def test_a_read_cut_off_by_a_frozen_member_is_sent_again(
    zk_ensemble: ZooKeeperCluster, namespace: str
) -> None:
    """A read in flight when its member freezes fails with ConnectionLoss once kazoo
    gives up on the connection; kazoo moves to another member and the store sends the
    read again, within the one operation timeout."""
    # kazoo gives up on a silent member after 2/3 of the session timeout: the
    # operation timeout (at most the session timeout) leaves a third for the re-send
    store = open_store(zk_ensemble.url(namespace, session_timeout=6, operation_timeout=6))
    assert isinstance(store, ZooKeeperStore)
    with store:
        store.put("/r/k", b"1")
        port = store.kazoo_client._connection._socket.getpeername()[1]
        victim = [p for _h, p in zk_ensemble.hosts].index(port)
        zk_ensemble.pause(victim)
        try:
            node = store.get("/r/k")
        finally:
            zk_ensemble.resume(victim)
        assert node is not None and node.value == b"1"


def test_a_completion_shaped_commit_is_one_request(store: CoordinationStore) -> None:
    """Existence checks are native (check version -1), and the deletion of a node
    whose existence (or a descendant's) the same commit checks needs no pre-read: the
    fenced clearing of a running mark is ONE multi, and it still refuses to delete a
    mark whose fence child is gone (somebody else's mark now)."""
    for item in (0, 1):
        store.put(f"/jobs/j/running/{item}", b"mark")
        store.put(f"/jobs/j/running/{item}/fence-{item}", b"")

    def clear(item: int, fence: str) -> list[Delete | Check]:
        mark = f"/jobs/j/running/{item}"
        return [
            Check(f"{mark}/{fence}", exists=True),
            Delete(f"{mark}/{fence}"),
            Delete(mark),
        ]

    before = request_count(store)
    assert store.commit(clear(0, "fence-0"))
    assert request_count(store) - before == 1
    assert not store.exists("/jobs/j/running/0")
    refused = store.commit(clear(1, "fence-other"))
    assert not refused
    assert refused.failed_path == "/jobs/j/running/1/fence-other"
    assert store.exists("/jobs/j/running/1/fence-1")


def test_an_absence_check_is_a_guard_without_a_pre_read(store: CoordinationStore) -> None:
    """``Check(exists=False)`` costs the multi alone, passes on a missing node (also
    under a missing parent) and fails, naming the path, on an existing one."""
    store.put("/jobs/j/x", b"0")
    before = request_count(store)
    assert store.commit([Check("/jobs/j/necessary", exists=False), Create("/jobs/j/w")])
    assert request_count(store) - before == 1
    store.put("/jobs/j/necessary", b"reshard")
    before = request_count(store)
    refused = store.commit([Check("/jobs/j/necessary", exists=False), Create("/jobs/j/y")])
    assert not refused and refused.failed_path == "/jobs/j/necessary"
    assert request_count(store) - before == 1
    assert not store.exists("/jobs/j/y")
    assert store.commit([Check("/jobs/nothing/here", exists=False), Create("/jobs/j/z")])


def test_parents_below_an_absence_check_are_made_without_a_failed_multi(
    store: CoordinationStore,
) -> None:
    """A registration-shaped commit (the job's node checked absent, nodes created two
    levels below it) creates the job's node and its ``instances`` node in its one
    multi, and its Put of the membership needs no pre-read (nothing can exist below
    an absent node): one request, not a pre-read, a multi that fails on the missing
    parents, a read and the multi again. A job node that exists still fails the
    check, and writes nothing."""
    store.put("/jobs/other/config", b"x")  # /jobs exists; /jobs/j does not

    def register(job: str) -> list[Check | Create | Put]:
        return [
            Check(f"/jobs/{job}", exists=False),
            Create(f"/jobs/{job}/config", b"doc"),
            Put(f"/jobs/{job}/instances/me", b"member", ephemeral=True),
            Create(f"/jobs/{job}/leader", b"me", ephemeral=True),
        ]

    before = request_count(store)
    assert store.commit(register("j"))
    assert request_count(store) - before == 1
    assert store.get("/jobs/j/instances/me") is not None
    assert store.children("/jobs/j") == ["config", "instances", "leader"]
    refused = store.commit(register("other"))
    assert not refused and refused.failed_path == "/jobs/other"
    assert store.children("/jobs/other") == ["config"]


def test_an_absence_check_of_a_parent_the_multi_creates_is_that_create(
    store: ZooKeeperStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job node a registration checks absent is created in the same multi as the
    parent of its nodes: that create is the check (it fails on an existing node), so
    the multi has no guard create+delete of it (two operations and two notifications
    to every watcher, per job). An existing job node still fails the commit, naming it."""
    sent: list[list[Any]] = []
    real = store._transport.multi

    def spy(deadline: float, ops: list[Any]) -> Any:
        sent.append(list(ops))
        return real(deadline, ops)

    monkeypatch.setattr(store._transport, "multi", spy)
    store.put("/jobs/other/config", b"x")
    sent.clear()
    ok = store.commit([Check("/jobs/j", exists=False), Create("/jobs/j/config", b"doc")])
    assert ok
    assert len(sent) == 1
    assert not any(kazoo_private.is_delete(z) for z in sent[0]), "a guard create+delete"
    assert store.get("/jobs/j/config").created_revision == ok.revision  # type: ignore[union-attr]
    refused = store.commit([Check("/jobs/other", exists=False), Create("/jobs/other/leader")])
    assert not refused and refused.failed_path == "/jobs/other"
    assert store.children("/jobs/other") == ["config"]
    # a commit that also deletes the checked path keeps its guard (state before)
    sent.clear()
    assert not store.commit(
        [Check("/jobs/other", exists=False), Delete("/jobs/other"), Create("/jobs/other/x")]
    )
    assert any(kazoo_private.is_delete(z) for z in sent[0])
    assert store.children("/jobs/other") == ["config"]


def test_a_subtree_is_read_one_level_per_request(store: CoordinationStore) -> None:
    """``get_tree`` reads each level of a subtree with one read-only multi: a parent
    with 150 children (one of them with a child) costs 3 requests, not one or two per
    node, and returns every node with its value; past the per-request chunk (512
    operations) a level still comes back whole."""
    for i in range(150):
        store.put(f"/jobs/j/members/m{i:03d}", f"v{i}".encode())
    store.put("/jobs/j/members/m007/sub", b"deep")
    before = request_count(store)
    tree = store.get_tree("/jobs/j/members")
    assert request_count(store) - before == 3
    assert len(tree) == 152
    assert tree["/jobs/j/members/m042"].value == b"v42"
    assert tree["/jobs/j/members/m007/sub"].value == b"deep"
    for i in range(150, 400):
        store.put(f"/jobs/j/members/m{i:03d}", f"v{i}".encode())
    tree = store.get_tree("/jobs/j/members")
    assert len(tree) == 402  # 800 operations at the leaf level: two chunks
    assert tree["/jobs/j/members/m399"].value == b"v399"


def test_a_commits_pre_reads_are_one_request(store: CoordinationStore) -> None:
    """The pre-reads of a commit (value and creation-revision checks, puts of nodes
    whose kind is unknown) go in one read-only multi whatever their number; a missing
    node among them is read as absent and fails its check, naming it."""
    tokens = {}
    for i in range(20):
        tokens[i] = store.put(f"/jobs/j/running/{i}", b"mark", ephemeral=True).created_revision
    ops: list[Op] = [Check(f"/jobs/j/running/{i}", created_revision=tokens[i]) for i in range(20)]
    ops += [Delete(f"/jobs/j/running/{i}") for i in range(20)]
    before = request_count(store)
    assert store.commit(ops)
    assert request_count(store) - before == 2  # the pre-reads, then the multi
    assert store.children("/jobs/j/running") == []
    refused = store.commit([Check("/jobs/j/running/3", value=b"mark"), Put("/jobs/j/x", b"1")])
    assert not refused and refused.failed_path == "/jobs/j/running/3"
    assert not store.exists("/jobs/j/x")


def test_a_multi_grown_past_the_request_limit_by_its_parents_is_refused_unsent(
    store: CoordinationStore,
) -> None:
    """A commit within ``max_commit_bytes`` whose multi, once the missing parents of
    its nodes are added, would pass ZooKeeper's request limit is refused with
    StoreLimitError before it is sent (the server would drop the connection): nothing
    is written and the session carries on."""
    assert isinstance(store, ZooKeeperStore)
    mid = "/".join(c * 40 for c in "stuv")
    ops = [Create(f"/deep/{i:04d}/{mid}/leaf", b"x" * 450) for i in range(1000)]
    assert store.max_commit_bytes is not None
    assert store.commit_bytes(ops) <= store.max_commit_bytes
    states = Events()
    store.add_state_listener(states)
    with pytest.raises(StoreLimitError, match="request limit"):
        store.commit(ops)
    assert store.get("/deep") is None
    store.put("/after", b"ok")
    assert store.get("/after") is not None
    assert ConnectionState.SUSPENDED not in states.snapshot()


def test_our_ephemeral_nodes_are_checked_without_a_pre_read_while_a_watch_covers_them(
    store: CoordinationStore, store_factory: StoreFactory
) -> None:
    """A created-revision check of an ephemeral node this store created (or read as
    its own) is an existence check in the multi, no pre-read, while a watch covers the
    node; a delete of the node by anyone, or a connection change, voids that
    knowledge, so a node deleted and re-created by another client still fails the
    check."""
    assert isinstance(store, ZooKeeperStore)
    # no watch yet: the check needs its pre-read
    t0 = store.put("/jobs/j/instances/me", b"m", ephemeral=True).created_revision
    before = store.round_trips
    assert store.commit([Check("/jobs/j/instances/me", created_revision=t0), Put("/jobs/j/a", b"")])
    assert store.round_trips - before == 2
    store.put("/jobs/j/running", b"")  # made now: its creation would be re-read below
    seen = Events()
    # the watch reads only the way to running/1 (below): its re-reads of our own
    # writes elsewhere would count in round_trips (it still gets every notification)
    store.watch("/jobs", seen, exclude=lambda p: not "/jobs/j/running/1".startswith(p))
    # created by a commit of ours: a start commit, then the completion that clears it
    made = store.commit([Create("/jobs/j/running/0", b"mark", ephemeral=True)])
    assert made
    before = store.round_trips
    assert store.commit([Check("/jobs/j/running/0", created_revision=made.revision)])
    assert store.commit(
        [Check("/jobs/j/running/0", created_revision=made.revision), Delete("/jobs/j/running/0")]
    )
    assert store.round_trips - before == 2
    assert not store.exists("/jobs/j/running/0")
    # learned from one pre-read (created before the watch): the next check is native
    assert store.commit([Check("/jobs/j/instances/me", created_revision=t0), Create("/jobs/j/b")])
    before = store.round_trips
    assert store.commit([Check("/jobs/j/instances/me", created_revision=t0), Create("/jobs/j/c")])
    assert store.round_trips - before == 1
    # another client replaces our node: the check fails, as with a pre-read
    t1 = store.put("/jobs/j/running/1", b"ours", ephemeral=True).created_revision
    other = store_factory()
    other.delete("/jobs/j/running/1")
    theirs = other.put("/jobs/j/running/1", b"theirs", ephemeral=True)
    wait_until(
        lambda: any(
            isinstance(e, WatchEvent)
            and e.path == "/jobs/j/running/1"
            and e.revision >= theirs.created_revision
            for e in seen.snapshot()
        ),
        10.0,
    )
    refused = store.commit(
        [Check("/jobs/j/running/1", created_revision=t1), Put("/jobs/j/after", b"")]
    )
    assert not refused and refused.failed_path == "/jobs/j/running/1"
    assert not store.exists("/jobs/j/after")
    # a connection change voids every record (white-box: the watch's re-sync after
    # the reconnect makes the request count of the next commit racy)
    t2 = store.put("/jobs/j/running/2", b"ours", ephemeral=True).created_revision
    assert store._owned.knows("/jobs/j/running/2", t2)
    store.add_state_listener(seen)
    store.drop_connection()
    wait_until(lambda: ConnectionState.RECONNECTED in seen.snapshot(), 15.0)
    assert not store._owned.knows("/jobs/j/running/2", t2)
    assert store.commit([Check("/jobs/j/running/2", created_revision=t2)])


def test_a_commit_of_4096_operations_is_one_multi_and_its_framing_counts(
    store: CoordinationStore,
) -> None:
    """ZooKeeper's commit limit is 4,096 operations (its multi has none; its request
    size does): 4,096 small creates are one multi (three requests with their missing
    parent: the multi, the read that finds it missing, the multi again); 1,024 creates
    of 900 bytes, under the limit by their values alone (921,600 bytes), are refused
    before anything is sent once their paths and framing are counted, and
    ``commit_bytes`` says so beforehand."""
    assert isinstance(store, ZooKeeperStore)
    assert store.max_ops_per_commit == 4096
    before = request_count(store)
    assert store.commit([Create(f"/wide/n{i:04d}", b"v") for i in range(4096)])
    assert request_count(store) - before <= 3
    assert len(store.children("/wide")) == 4096
    fat = [Create(f"/fat/n{i:04d}", b"x" * 900) for i in range(1024)]
    assert store.max_commit_bytes is not None
    assert store.commit_bytes(fat) > store.max_commit_bytes
    with pytest.raises(StoreLimitError, match="request limit"):
        store.commit(fat)
    assert store.get("/fat") is None
