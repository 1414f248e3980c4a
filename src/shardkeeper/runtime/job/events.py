"""Registry events of one job, typed: what a change under ``/jobs/{job}`` asks for.

Events are hints (the store contract): each one only says which repair or re-read
should come sooner; the housekeeping pass finds the same work if an event is lost.
A node name outside the layout is ignored (``paths.parse`` gives ``Unknown``), never
a crash of the event thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkeeper.coordination.paths import JobNode, Unknown, parse
from shardkeeper.registry.base import EventKind, WatchEvent
from shardkeeper.runtime.job.jobstate import switch_time

__all__ = [
    "ConfigChanged",
    "FailoverQueued",
    "FailoverTaken",
    "Ignored",
    "InstanceSwitched",
    "ItemSwitched",
    "JobEvent",
    "JobSwitched",
    "LeaderGone",
    "MemberLeft",
    "Resync",
    "RunNow",
    "RunNowRequested",
    "classify",
]


@dataclass(frozen=True)
class MemberLeft:
    """A member's node of the job was deleted."""

    instance: str


@dataclass(frozen=True)
class LeaderGone:
    """The leader node was deleted: elect."""


@dataclass(frozen=True)
class FailoverQueued:
    """An orphaned item was queued for failover."""

    item: int


@dataclass(frozen=True)
class FailoverTaken:
    """A queued item was claimed (its queue entry deleted)."""

    item: int


@dataclass(frozen=True)
class JobSwitched:
    """The whole job was disabled (``on`` False) or enabled; ``at``: the time stored
    with a disable (0.0 when it holds none)."""

    on: bool
    at: float = 0.0


@dataclass(frozen=True)
class ItemSwitched:
    """One item was disabled (``on`` False) or enabled; ``at`` as for
    :class:`JobSwitched`."""

    item: int
    on: bool
    at: float = 0.0


@dataclass(frozen=True)
class InstanceSwitched:
    """An instance was disabled or enabled for the job (the leader reshards)."""

    instance: str


@dataclass(frozen=True)
class RunNow:
    """An operator asked this instance to run the job now."""


@dataclass(frozen=True)
class RunNowRequested:
    """An operator's run-now request of the job was made (coordination/runnow.py)."""


@dataclass(frozen=True)
class ConfigChanged:
    """The stored config was written or deleted (a deleted one means the job was
    removed: the reload retires it)."""


@dataclass(frozen=True)
class Resync:
    """The watch could not resume: re-read everything."""


@dataclass(frozen=True)
class Ignored:
    """Nothing to do for this instance."""


JobEvent = (
    MemberLeft
    | LeaderGone
    | FailoverQueued
    | FailoverTaken
    | JobSwitched
    | ItemSwitched
    | InstanceSwitched
    | RunNow
    | RunNowRequested
    | ConfigChanged
    | Resync
    | Ignored
)


def classify(event: WatchEvent, me: str) -> JobEvent:
    """What ``event`` (a change of a job's node) asks of instance ``me``."""
    if event.kind is EventKind.RESYNC:
        return Resync()
    node = parse(event.path)
    if isinstance(node, Unknown) or not isinstance(node, JobNode):
        return Ignored()
    deleted = event.kind is EventKind.DELETED
    kind = node.kind
    if kind == "root" and deleted:
        return Resync()
    if kind == "member" and deleted and node.instance and node.instance != me:
        return MemberLeft(node.instance)
    if kind == "leader" and deleted:
        return LeaderGone()
    if kind == "failover" and node.item is not None:
        return FailoverTaken(node.item) if deleted else FailoverQueued(node.item)
    if kind == "disabled_job":
        return JobSwitched(on=deleted, at=0.0 if deleted else switch_time(event.value))
    if kind == "disabled_item" and node.item is not None:
        return ItemSwitched(node.item, on=deleted, at=0.0 if deleted else switch_time(event.value))
    if kind == "disabled_instance" and node.instance:
        return InstanceSwitched(node.instance)
    if kind == "trigger" and node.instance == me and not deleted:
        return RunNow()
    if kind == "runnow" and not deleted:
        return RunNowRequested()
    if kind == "config":
        return ConfigChanged()
    return Ignored()
