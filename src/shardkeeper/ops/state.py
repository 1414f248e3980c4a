"""Reading a job's registry subtree into one in-memory snapshot.

The views are built from ONE ``get_tree`` read per request (one range read on
etcd, one pipelined walk on ZooKeeper) rather than a read per node, so that a
listing of many jobs stays cheap and shows one consistent-enough moment. Malformed
documents never make a view fail: an operator tool must keep working exactly when
something is wrong, so a bad value is shown as unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import (
    Assignment,
    DocumentError,
    FailoverEntry,
    InstanceInfo,
    RunningMark,
)
from shardkeeper.coordination.paths import JOBS
from shardkeeper.coordination.results import ItemResult
from shardkeeper.coordination.sharding import necessary_parts
from shardkeeper.errors import ShardkeeperError
from shardkeeper.registry.base import Node
from shardkeeper.scheduling.scheduler import build_trigger

__all__ = ["JobState", "instance_info", "next_fire", "read_jobs"]


@dataclass
class JobState:
    """What the registry holds for one job at the time of the read."""

    name: str
    config: JobConfig | None = None
    config_data: dict[str, Any] = field(default_factory=dict)
    config_error: str | None = None
    has_config: bool = False
    leader: str | None = None
    instances: list[str] = field(default_factory=list)
    assignment: Assignment | None = None
    necessary: str | None = None
    running: dict[int, RunningMark | None] = field(default_factory=dict)
    failover: dict[int, FailoverEntry | None] = field(default_factory=dict)
    misfire: dict[int, float | None] = field(default_factory=dict)
    #: last result of each item that has one (None: malformed document)
    results: dict[int, ItemResult | None] = field(default_factory=dict)
    disabled_job: bool = False
    disabled_items: set[int] = field(default_factory=set)
    disabled_instances: set[str] = field(default_factory=set)

    @property
    def total(self) -> int:
        """The configured item count (0 when the config is unreadable)."""
        return self.config.sharding_total_count if self.config else 0

    @property
    def enabled(self) -> bool:
        """Neither the operator switch nor the config disables the job."""
        return not self.disabled_job and not (self.config is not None and self.config.disabled)

    @property
    def trigger(self) -> str:
        """Human description of the trigger ("?" when the config is unreadable)."""
        return self.config.describe_trigger() if self.config else "?"


def next_fire(config: JobConfig | None, now: datetime | None = None) -> datetime | None:
    """When ``config``'s trigger fires next after ``now`` (UTC), or None."""
    if config is None:
        return None
    try:
        trigger = build_trigger(config)
        nxt = trigger.get_next_fire_time(None, now or datetime.now(UTC))
    except (ShardkeeperError, ValueError):
        return None
    return nxt.astimezone(UTC) if isinstance(nxt, datetime) else None


def _item(seg: str) -> int | None:
    return int(seg) if seg.isdigit() else None


def _text(node: Node) -> str:
    return node.value.decode("utf-8", errors="replace")


def _apply(state: JobState, rest: list[str], node: Node) -> None:
    head, n = rest[0], len(rest)
    if head == "config" and n == 1:
        _read_config(state, node)
    elif head == "leader" and n == 1:
        state.leader = _text(node) or None
    elif head == "instances" and n == 2:
        state.instances.append(rest[1])
    elif head == "sharding" and n == 1 and node.value:
        try:
            state.assignment = Assignment.from_bytes(node.value, node.path)
        except DocumentError:
            state.assignment = None
    elif head == "necessary" and n == 1:
        state.necessary = necessary_parts(node.value or b"")[0] or "(no reason given)"
    elif head == "running" and n == 2 and (item := _item(rest[1])) is not None:
        try:
            state.running[item] = RunningMark.from_bytes(node.value, node.path)
        except DocumentError:
            state.running[item] = None
    elif head == "failover" and n == 3 and rest[1] == "queue":
        if (item := _item(rest[2])) is not None:
            try:
                state.failover[item] = FailoverEntry.from_bytes(node.value, node.path)
            except DocumentError:
                state.failover[item] = None
    elif head == "misfire" and n == 2 and (item := _item(rest[1])) is not None:
        try:
            state.misfire[item] = float(_text(node))
        except ValueError:
            state.misfire[item] = None
    elif head == "results" and n == 2 and (item := _item(rest[1])) is not None:
        try:
            state.results[item] = ItemResult.from_bytes(node.value, node.path)
        except DocumentError:
            state.results[item] = None
    elif head == "disabled" and n >= 2:
        if rest[1] == "job" and n == 2:
            state.disabled_job = True
        elif rest[1] == "items" and n == 3 and (item := _item(rest[2])) is not None:
            state.disabled_items.add(item)
        elif rest[1] == "instances" and n == 3:
            state.disabled_instances.add(rest[2])


def _read_config(state: JobState, node: Node) -> None:
    if not node.value:
        # a pure parent (ZooKeeper) or an emptied node: no config here
        return
    state.has_config = True
    try:
        state.config = JobConfig.from_json(node.value)
        state.config_data = json.loads(state.config.to_json())
    except ShardkeeperError as exc:
        state.config_error = str(exc)
        try:
            raw = json.loads(node.value)
            state.config_data = raw if isinstance(raw, dict) else {}
        except ValueError:
            state.config_data = {}


def read_jobs(tree: dict[str, Node], only: str | None = None) -> dict[str, JobState]:
    """Group the nodes of a ``/jobs`` (or ``/jobs/{job}``) subtree into JobStates,
    keeping only jobs with a stored config (the mark of a registered job)."""
    states: dict[str, JobState] = {}
    prefix = JOBS + "/"
    for path in sorted(tree):
        if not path.startswith(prefix):
            continue
        segs = path[len(prefix) :].split("/")
        name, rest = segs[0], segs[1:]
        if only is not None and name != only:
            continue
        state = states.setdefault(name, JobState(name))
        if rest:
            _apply(state, rest, tree[path])
    for state in states.values():
        state.instances.sort()
    return {name: s for name, s in sorted(states.items()) if s.has_config}


def instance_info(instance_id: str, node: Node) -> InstanceInfo:
    """The metadata of a live instance; placeholders when its document is malformed
    (the instance is alive all the same)."""
    try:
        return InstanceInfo.from_bytes(node.value, node.path)
    except DocumentError:
        return InstanceInfo(instance_id=instance_id, host="?", pid=0, version="?", started_at=0.0)
