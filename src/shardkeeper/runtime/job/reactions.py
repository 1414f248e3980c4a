"""How one job reacts to its registry: connection states and watch events, as a pure
function from (what the runner knows, what happened) to commands.

Both arrive on the store's event thread, so nothing there may call the store. Here
that holds by construction: :func:`on_state` and :func:`on_event` only return data
(the commands below); :class:`~shardkeeper.runtime.runner.runner.JobRunner` executes them
(a flag, a forgotten cache, a task queued on the job's lane). Events are hints
(``events.classify``); every decision they lead to reads the store again on the lane.
tests/runtime/test_reactions.py tables every input.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import ConnectionState, EventKind, WatchEvent
from shardkeeper.runtime.job import events as ev

__all__ = [
    "Command",
    "Connection",
    "ElectionSees",
    "Fence",
    "ForgetAssignment",
    "LoseMembership",
    "NoteReshardFlag",
    "QueueHint",
    "RequestRepair",
    "Seen",
    "SuspectMarks",
    "SwitchItem",
    "SwitchJob",
    "Task",
    "Work",
    "on_event",
    "on_state",
]


@dataclass(frozen=True)
class Seen:
    """What the reactions may know of the runner (a snapshot taken per event)."""

    paths: JobPaths
    me: str
    registered: bool
    is_leader: bool
    failover: bool


class Task(enum.Enum):
    """A lane task a reaction asks for (the runner knows how to run each)."""

    ELECT = "elect"
    MEMBER_LEFT = "left"  # arg: the instance that left
    CLAIM = "claim"
    RESHARD = "switched"  # arg: why
    RUN_NOW = "run-now"
    REQUESTS = "requests"
    RELOAD_CONFIG = "config"


@dataclass(frozen=True)
class Work:
    """Queue ``task`` on the job's lane (merged with a queued task of the same key)."""

    task: Task
    arg: str = ""

    @property
    def key(self) -> str:
        """The lane's merge key."""
        return f"{self.task.value}:{self.arg}" if self.task is Task.MEMBER_LEFT else self.task.value


@dataclass(frozen=True)
class ElectionSees:
    """Tell the election the connection's state."""

    state: ConnectionState


@dataclass(frozen=True)
class ForgetAssignment:
    """Events may have been missed: the next fire reads the assignment again."""


@dataclass(frozen=True)
class NoteReshardFlag:
    """The reshard flag was written (or deleted): the sharding service's cache."""

    deleted: bool


@dataclass(frozen=True)
class Connection:
    """Record the connection's state (``JobState.connection``)."""

    state: ConnectionState


@dataclass(frozen=True)
class LoseMembership:
    """Our membership is gone: the phase moves (``Phase.lose_membership``)."""

    why: str


@dataclass(frozen=True)
class SuspectMarks:
    """Marks may name us without a local execution: the next repair pass checks."""


@dataclass(frozen=True)
class Fence:
    """Fence every execution in progress (others may take the items), saying why."""

    why: str


@dataclass(frozen=True)
class RequestRepair:
    """Run a housekeeping pass soon."""


@dataclass(frozen=True)
class QueueHint:
    """The failover queue gained (or lost) ``item``."""

    item: int
    queued: bool


@dataclass(frozen=True)
class SwitchJob:
    """The job's switch: on or off (``at``: when it was switched off, 0.0 unknown)."""

    on: bool
    at: float = 0.0


@dataclass(frozen=True)
class SwitchItem:
    """One item's switch: on or off (``at`` as for :class:`SwitchJob`)."""

    item: int
    on: bool
    at: float = 0.0


Command = (
    ElectionSees
    | ForgetAssignment
    | NoteReshardFlag
    | Connection
    | LoseMembership
    | SuspectMarks
    | Fence
    | RequestRepair
    | QueueHint
    | SwitchJob
    | SwitchItem
    | Work
)


def on_state(state: ConnectionState) -> list[Command]:
    """What a connection-state change makes the job do, in order."""
    done: list[Command] = [ElectionSees(state)]
    if state is not ConnectionState.SUSPENDED:
        # events may have been missed meanwhile: the next fire reads the assignment
        # (and the reshard flag)
        done.append(ForgetAssignment())
    done.append(Connection(state))
    if state is ConnectionState.RECONNECTED:
        done.append(RequestRepair())
    elif state is ConnectionState.LOST:
        # Our ephemeral nodes are gone; others may take our items: fence them off.
        done += [
            LoseMembership("session lost"),
            SuspectMarks(),
            Fence("session lost"),
        ]
    return done


def on_event(seen: Seen, event: WatchEvent) -> list[Command]:
    """What a change of one of this job's nodes makes the job do, in order."""
    done: list[Command] = []
    if event.path == seen.paths.sharding:
        # a new assignment may give us parts of pending run-now requests
        done += [ForgetAssignment(), Work(Task.REQUESTS)]
    elif event.path == seen.paths.necessary:
        done.append(NoteReshardFlag(event.kind is EventKind.DELETED))
    match ev.classify(event, seen.me):
        case ev.Resync():
            done += [ForgetAssignment(), RequestRepair()]
        case ev.MemberLeft(instance=inst):
            if seen.is_leader:
                done.append(Work(Task.MEMBER_LEFT, inst))
        case ev.LeaderGone():
            if seen.registered:
                done.append(Work(Task.ELECT))
        case ev.FailoverQueued(item=item):
            done.append(QueueHint(item, queued=True))
            if seen.failover:
                done.append(Work(Task.CLAIM))
        case ev.FailoverTaken(item=item):
            done.append(QueueHint(item, queued=False))
        case ev.JobSwitched(on=on, at=at):
            done.append(SwitchJob(on, at))
        case ev.ItemSwitched(item=item, on=on, at=at):
            done.append(SwitchItem(item, on, at))
        case ev.InstanceSwitched():
            if seen.is_leader:
                done.append(Work(Task.RESHARD, "instance switched"))
        case ev.RunNow():
            done.append(Work(Task.RUN_NOW))
        case ev.RunNowRequested():
            done.append(Work(Task.REQUESTS))
        case ev.ConfigChanged():
            done.append(Work(Task.RELOAD_CONFIG))
        case _:
            pass
    return done
