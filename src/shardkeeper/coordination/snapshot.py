"""One reader of the registry: a job's subtree read once into a typed snapshot.

Every tool that shows what the registry holds (the operations API and so the CLI,
the demo, the benchmarks) reads it here, through :func:`paths.parse
<shardkeeper.coordination.paths.parse>`: one place knows the layout both ways, and
no tool splits paths by hand.

A snapshot comes from ONE ``get_tree`` read (one range read on etcd, one pipelined
walk on ZooKeeper) rather than a read per node, so that a listing of many jobs stays
cheap and shows one consistent-enough moment. A malformed document never makes a
read fail: a tool must keep working exactly when something is wrong, so a bad value
is kept as None ("unknown") and a node outside the layout is left out.

* :func:`read_snapshot` / :func:`read_snapshots`: one job, or every registered job;
* :func:`snapshots_from_tree`: the same from nodes already read (any part of
  ``/jobs``);
* :func:`read_instances`: the live instances' metadata (``/instances``);
* :func:`read_clocks`: the clock sample each instance published (``/control/clock``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import ProgressDoc
from shardkeeper.coordination.model import (
    Assignment,
    DocumentError,
    FailoverEntry,
    InstanceInfo,
    RunningMark,
)
from shardkeeper.coordination.oneoff import DoneRecord
from shardkeeper.coordination.paths import (
    INSTANCES,
    JOBS,
    InstanceNode,
    JobNode,
    clock_path,
    job_paths,
    parse,
)
from shardkeeper.coordination.results import ItemResult
from shardkeeper.coordination.sharding import necessary_parts
from shardkeeper.errors import ShardkeeperError
from shardkeeper.registry.base import CoordinationStore, Node

__all__ = [
    "JobSnapshot",
    "instance_info",
    "read_clocks",
    "read_instances",
    "read_snapshot",
    "read_snapshots",
    "snapshots_from_tree",
]


@dataclass
class JobSnapshot:
    """What the registry held for one job at the time of the read.

    Per-item documents that could not be decoded are present with the value None
    (the item has a mark, a queue entry, ... whose content is unknown).
    """

    name: str
    #: the stored config (None when absent or invalid: ``config_error`` says why)
    config: JobConfig | None = None
    #: the stored config as JSON data (its readable fields when it is invalid)
    config_data: dict[str, Any] = field(default_factory=dict)
    config_error: str | None = None
    #: a config document is stored: the mark of a registered job
    has_config: bool = False
    leader: str | None = None
    #: member instances of the job (sorted)
    instances: list[str] = field(default_factory=list)
    assignment: Assignment | None = None
    #: the reason of the reshard flag, None when it is not set
    necessary: str | None = None
    running: dict[int, RunningMark | None] = field(default_factory=dict)
    #: the node of each running mark (its revisions fence the commits that move it)
    running_nodes: dict[int, Node] = field(default_factory=dict)
    #: the fence child of each persistent running mark
    fences: dict[int, str] = field(default_factory=dict)
    failover: dict[int, FailoverEntry | None] = field(default_factory=dict)
    #: the missed fire time of each misfired item
    misfire: dict[int, float | None] = field(default_factory=dict)
    #: last result of each item that has one
    results: dict[int, ItemResult | None] = field(default_factory=dict)
    #: the last progress report of each item's execution that gave one (``ctx.progress``)
    progress: dict[int, ProgressDoc | None] = field(default_factory=dict)
    disabled_job: bool = False
    disabled_items: set[int] = field(default_factory=set)
    disabled_instances: set[str] = field(default_factory=set)
    #: instances whose clock check keeps them out of the assignment (their marks)
    skewed_instances: set[str] = field(default_factory=set)
    #: instances with a pending run-now request
    triggers: set[str] = field(default_factory=set)
    #: the last fire time each instance started items for
    fired: dict[str, float | None] = field(default_factory=dict)
    #: the done marker of a one-off job (any ``at``; see :attr:`one_off_done`)
    done: DoneRecord | None = None

    @property
    def total(self) -> int:
        """The configured item count (0 when the config is unreadable)."""
        return self.config.sharding_total_count if self.config else 0

    @property
    def enabled(self) -> bool:
        """Neither the operator switch nor the config disables the job."""
        return not self.disabled_job and not (self.config is not None and self.config.disabled)

    @property
    def one_off_done(self) -> DoneRecord | None:
        """The done record of a one-off job for its current ``at`` (None otherwise)."""
        at = self.config.at if self.config is not None else None
        if at is None or self.done is None or not self.done.is_for(at.timestamp()):
            return None
        return self.done

    @property
    def trigger(self) -> str:
        """Human description of the trigger ("?" when the config is unreadable), with
        ``(done)`` for a one-off job that is done."""
        if self.config is None:
            return "?"
        done = " (done)" if self.one_off_done is not None else ""
        return self.config.describe_trigger() + done


def _float(node: Node) -> float | None:
    try:
        return float(node.value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _doc(decode: Any, node: Node) -> Any:
    try:
        return decode(node.value, node.path)
    except DocumentError:
        return None


def _read_config(snap: JobSnapshot, node: Node) -> None:
    if not node.value:
        return  # a pure parent (ZooKeeper) or an emptied node: no config here
    snap.has_config = True
    try:
        snap.config = JobConfig.from_json(node.value)
        snap.config_data = json.loads(snap.config.to_json())
    except ShardkeeperError as exc:
        snap.config_error = str(exc)
        try:
            raw = json.loads(node.value)
            snap.config_data = raw if isinstance(raw, dict) else {}
        except ValueError:
            snap.config_data = {}


def _apply(snap: JobSnapshot, parsed: JobNode, node: Node) -> None:
    kind, item, inst = parsed.kind, parsed.item, parsed.instance
    if kind == "config":
        _read_config(snap, node)
    elif kind == "leader":
        snap.leader = node.value.decode("utf-8", errors="replace") or None
    elif kind == "member" and inst is not None:
        snap.instances.append(inst)
    elif kind == "sharding" and node.value:
        snap.assignment = _doc(Assignment.from_bytes, node)
    elif kind == "necessary":
        snap.necessary = necessary_parts(node.value or b"")[0] or "(no reason given)"
    elif kind == "running" and item is not None:
        snap.running[item] = _doc(RunningMark.from_bytes, node)
        snap.running_nodes[item] = node
    elif kind == "fence" and item is not None and parsed.name:
        snap.fences[item] = parsed.name
    elif kind == "failover" and item is not None:
        snap.failover[item] = _doc(FailoverEntry.from_bytes, node)
    elif kind == "misfire" and item is not None:
        snap.misfire[item] = _float(node)
    elif kind == "result" and item is not None:
        snap.results[item] = _doc(ItemResult.from_bytes, node)
    elif kind == "progress" and item is not None:
        snap.progress[item] = _doc(ProgressDoc.from_bytes, node)
    elif kind == "disabled_job":
        snap.disabled_job = True
    elif kind == "disabled_item" and item is not None:
        snap.disabled_items.add(item)
    elif kind == "disabled_instance" and inst is not None:
        snap.disabled_instances.add(inst)
    elif kind == "skewed" and inst is not None:
        snap.skewed_instances.add(inst)
    elif kind == "trigger" and inst is not None:
        snap.triggers.add(inst)
    elif kind == "fired" and inst is not None:
        snap.fired[inst] = _float(node)
    elif kind == "done":
        snap.done = _doc(DoneRecord.from_bytes, node)


def snapshots_from_tree(
    tree: Mapping[str, Node], only: str | None = None, *, registered: bool = True
) -> dict[str, JobSnapshot]:
    """Group the nodes of a ``/jobs`` subtree (or any part of it) into snapshots by
    job name, sorted by name; ``only`` keeps one job. With ``registered`` (the
    default) only jobs with a stored config are kept; without it, every job seen
    (for a tree that is only a part of a job's subtree)."""
    snaps: dict[str, JobSnapshot] = {}
    for path, node in tree.items():
        parsed = parse(path)
        if not isinstance(parsed, JobNode) or (only is not None and parsed.job != only):
            continue
        snap = snaps.get(parsed.job)
        if snap is None:
            snap = snaps[parsed.job] = JobSnapshot(parsed.job)
        _apply(snap, parsed, node)
    for snap in snaps.values():
        snap.instances.sort()
    return {n: s for n, s in sorted(snaps.items()) if s.has_config or not registered}


def read_snapshot(store: CoordinationStore, job: str) -> JobSnapshot | None:
    """The snapshot of ``job`` (one read of its subtree); None when it is not
    registered (no stored config)."""
    return snapshots_from_tree(store.get_tree(job_paths(job).root), only=job).get(job)


def read_snapshots(store: CoordinationStore) -> dict[str, JobSnapshot]:
    """The snapshot of every registered job, by name (one read of ``/jobs``)."""
    return snapshots_from_tree(store.get_tree(JOBS))


def instance_info(instance_id: str, node: Node) -> InstanceInfo:
    """The metadata of a live instance; placeholders when its document is malformed
    (the instance is alive all the same)."""
    try:
        return InstanceInfo.from_bytes(node.value, node.path)
    except DocumentError:
        return InstanceInfo(instance_id=instance_id, host="?", pid=0, version="?", started_at=0.0)


def read_clocks(store: CoordinationStore) -> dict[str, dict[str, Any]]:
    """The latest clock sample each instance published (``/control/clock/{id}``, one
    read), by instance id; an unreadable node is left out."""
    out: dict[str, dict[str, Any]] = {}
    root = clock_path("x").rsplit("/", 1)[0]
    for path, node in store.get_tree(root).items():
        if path == root:
            continue
        try:
            doc = json.loads(node.value)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out[path.rsplit("/", 1)[-1]] = doc
    return out


def read_instances(store: CoordinationStore) -> dict[str, InstanceInfo]:
    """Every live instance of the namespace with its metadata, sorted by id (one
    read of ``/instances``)."""
    out: dict[str, InstanceInfo] = {}
    tree = store.get_tree(INSTANCES)
    for path in sorted(tree):
        parsed = parse(path)
        if isinstance(parsed, InstanceNode):
            out[parsed.instance] = instance_info(parsed.instance, tree[path])
    return out
