"""The one snapshot reader (coordination/snapshot.py), on the in-process reference
store: every node kind of the layout lands in its field, malformed documents become
None instead of an error, nodes outside the layout are left out, and only
registered jobs (with a stored config) are listed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import (
    Assignment,
    FailoverEntry,
    InstanceInfo,
    RunningMark,
    encode,
)
from shardkeeper.coordination.paths import JobNode, Unknown, instance_path, job_paths, parse
from shardkeeper.coordination.results import ItemResult
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.coordination.snapshot import (
    read_instances,
    read_snapshot,
    read_snapshots,
    snapshots_from_tree,
)
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.memory import MemoryServer

P = job_paths("sync")


@pytest.fixture
def store() -> Iterator[CoordinationStore]:
    server = MemoryServer()
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        s.close()
        server.shutdown()


def _fill(store: CoordinationStore) -> None:
    cfg = JobConfig(name="sync", interval=5, sharding_total_count=4, failover=True)
    store.put(P.config, cfg.to_json())
    store.put(P.instance("a@1@x"), b"{}")
    store.put(P.instance("b@2@y"), b"{}")
    store.put(P.leader, b"a@1@x")
    store.put(P.sharding, Assignment(total=4, owners={0: "a@1@x", 1: "b@2@y"}).to_bytes())
    store.put(P.necessary, necessary_value("member joined", at=12.0))
    store.put(P.running(0), RunningMark("a@1@x", 10.0, "sync@10#0").to_bytes())
    store.put(P.running(1), b"not json")  # malformed: present, content unknown
    store.put(P.running(1) + "/fence-1", b"")  # a mark's fence child: not a mark
    store.put(P.failover_item(2), FailoverEntry(10.0, "sync@10#2", "c@3@z").to_bytes())
    store.put(P.misfire(3), b"9.5")
    store.put(
        P.result(0),
        ItemResult(outcome="ok", fire_time=5.0, started=5.1, ended=5.2, instance="a").to_bytes(),
    )
    store.put(P.disabled_item(3), b"{}")
    store.put(P.disabled_instance("b@2@y"), b"{}")
    store.put(P.trigger("a@1@x"), b"{}")
    store.put(P.fired("a@1@x"), b"10.0")
    store.put(P.root + "/stray/node", b"x")  # outside the layout: ignored
    store.put(P.running_root + "/not-an-item", b"x")


def test_every_node_kind_lands_in_its_field(store: CoordinationStore) -> None:
    _fill(store)
    snap = read_snapshot(store, "sync")
    assert snap is not None
    assert snap.config is not None and snap.total == 4 and snap.config_error is None
    assert snap.config_data["name"] == "sync"
    assert snap.instances == ["a@1@x", "b@2@y"]
    assert snap.leader == "a@1@x"
    assert snap.assignment is not None and snap.assignment.owners == {0: "a@1@x", 1: "b@2@y"}
    assert snap.necessary == "member joined"
    assert set(snap.running) == {0, 1}
    assert snap.running[0] is not None and snap.running[0].execution_id == "sync@10#0"
    assert snap.running[1] is None
    assert set(snap.running_nodes) == {0, 1} and snap.running_nodes[0].path == P.running(0)
    assert snap.fences == {1: "fence-1"}
    entry = snap.failover[2]
    assert entry is not None and entry.from_instance == "c@3@z"
    assert snap.misfire == {3: 9.5}
    result = snap.results[0]
    assert result is not None and result.outcome == "ok"
    assert snap.disabled_items == {3} and snap.disabled_instances == {"b@2@y"}
    assert not snap.disabled_job and snap.enabled
    assert snap.triggers == {"a@1@x"} and snap.fired == {"a@1@x": 10.0}


def test_a_corrupt_config_is_reported_not_raised(store: CoordinationStore) -> None:
    store.put(P.config, b'{"name": "sync", "sharding_total_count": -1}')
    store.put(P.disabled_job, b"{}")
    snap = read_snapshot(store, "sync")
    assert snap is not None and snap.has_config
    assert snap.config is None and snap.config_error
    assert snap.config_data == {"name": "sync", "sharding_total_count": -1}
    assert snap.total == 0 and snap.trigger == "?" and not snap.enabled


def test_only_registered_jobs_are_listed(store: CoordinationStore) -> None:
    _fill(store)
    other = job_paths("leftover")
    store.put(other.instance("a@1@x"), b"{}")  # members but no config: not registered
    assert list(read_snapshots(store)) == ["sync"]
    assert read_snapshot(store, "leftover") is None
    # a part of a subtree can still be grouped, without the registration filter
    part = snapshots_from_tree(store.get_tree(other.root), registered=False)
    assert part["leftover"].instances == ["a@1@x"]


def test_live_instances_with_placeholders_for_malformed_metadata(
    store: CoordinationStore,
) -> None:
    info = InstanceInfo(instance_id="a@1@x", host="h1", pid=7, version="1", started_at=3.0)
    store.put(instance_path("a@1@x"), encode(info))
    store.put(instance_path("b@2@y"), b"[not an object]")
    live = read_instances(store)
    assert list(live) == ["a@1@x", "b@2@y"]
    assert live["a@1@x"].host == "h1" and live["a@1@x"].pid == 7
    assert live["b@2@y"].host == "?"


def test_a_fence_child_parses_and_other_children_of_a_mark_do_not() -> None:
    assert parse(P.running(3) + "/fence-ab12") == JobNode(
        "sync", "fence", item=3, name="fence-ab12"
    )
    assert isinstance(parse(P.running(3) + "/other"), Unknown)
    assert isinstance(parse(P.running_root + "/x/fence-ab12"), Unknown)
