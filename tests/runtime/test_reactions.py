"""The reactions (runtime/job/reactions.py) as tables: each connection state and each
kind of watch event, with what the runner knows, gives a list of commands. The
function returns data only, so no store can be called from the event thread."""

from __future__ import annotations

import pytest

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import ConnectionState, EventKind, WatchEvent
from shardkeeper.runtime.job import reactions as rx

P = JobPaths("billing")
ME = "host@1@me"
CS = ConnectionState
CREATED, DELETED, RESYNC = EventKind.CREATED, EventKind.DELETED, EventKind.RESYNC


def _seen(*, registered: bool = True, leader: bool = False, failover: bool = True) -> rx.Seen:
    return rx.Seen(paths=P, me=ME, registered=registered, is_leader=leader, failover=failover)


@pytest.mark.parametrize(
    ("state", "commands"),
    [
        (CS.SUSPENDED, [rx.ElectionSees(CS.SUSPENDED), rx.Connection(CS.SUSPENDED)]),
        (
            CS.RECONNECTED,
            [
                rx.ElectionSees(CS.RECONNECTED),
                rx.ForgetAssignment(),
                rx.Connection(CS.RECONNECTED),
                rx.RequestRepair(),
            ],
        ),
        (
            CS.LOST,
            [
                rx.ElectionSees(CS.LOST),
                rx.ForgetAssignment(),
                rx.Connection(CS.LOST),
                rx.LoseMembership("session lost"),
                rx.SuspectMarks(),
                rx.Fence("session lost"),
            ],
        ),
        (
            CS.CONNECTED,
            [rx.ElectionSees(CS.CONNECTED), rx.ForgetAssignment(), rx.Connection(CS.CONNECTED)],
        ),
    ],
    ids=lambda v: v.value if isinstance(v, ConnectionState) else "",
)
def test_connection_states(state: ConnectionState, commands: list[rx.Command]) -> None:
    assert rx.on_state(state) == commands


@pytest.mark.parametrize(
    ("event", "seen", "commands"),
    [
        # caches of the assignment and of the reshard flag
        (
            WatchEvent(CREATED, P.sharding, b"x"),
            _seen(),
            [rx.ForgetAssignment(), rx.Work(rx.Task.REQUESTS)],
        ),
        (WatchEvent(DELETED, P.necessary), _seen(), [rx.NoteReshardFlag(deleted=True)]),
        (WatchEvent(CREATED, P.necessary, b"x"), _seen(), [rx.NoteReshardFlag(deleted=False)]),
        # the watch could not resume, or the whole job went
        (WatchEvent(RESYNC, P.root), _seen(), [rx.ForgetAssignment(), rx.RequestRepair()]),
        (WatchEvent(DELETED, P.root), _seen(), [rx.ForgetAssignment(), rx.RequestRepair()]),
        # a member left: only the leader acts
        (
            WatchEvent(DELETED, P.instance("host@2@other")),
            _seen(leader=True),
            [rx.Work(rx.Task.MEMBER_LEFT, "host@2@other")],
        ),
        (WatchEvent(DELETED, P.instance("host@2@other")), _seen(), []),
        (WatchEvent(DELETED, P.instance(ME)), _seen(leader=True), []),
        # the leader went: a member runs for it
        (WatchEvent(DELETED, P.leader), _seen(), [rx.Work(rx.Task.ELECT)]),
        (WatchEvent(DELETED, P.leader), _seen(registered=False), []),
        # the failover queue
        (
            WatchEvent(CREATED, P.failover_item(3), b"{}"),
            _seen(),
            [rx.QueueHint(3, queued=True), rx.Work(rx.Task.CLAIM)],
        ),
        (
            WatchEvent(CREATED, P.failover_item(3), b"{}"),
            _seen(failover=False),
            [rx.QueueHint(3, queued=True)],
        ),
        (WatchEvent(DELETED, P.failover_item(3)), _seen(), [rx.QueueHint(3, queued=False)]),
        # switches
        (WatchEvent(CREATED, P.disabled_job, b""), _seen(), [rx.SwitchJob(on=False)]),
        (WatchEvent(DELETED, P.disabled_job), _seen(), [rx.SwitchJob(on=True)]),
        (WatchEvent(CREATED, P.disabled_item(4), b""), _seen(), [rx.SwitchItem(4, on=False)]),
        (WatchEvent(DELETED, P.disabled_item(4)), _seen(), [rx.SwitchItem(4, on=True)]),
        (
            WatchEvent(CREATED, P.disabled_instance("host@2@other"), b""),
            _seen(leader=True),
            [rx.Work(rx.Task.RESHARD, "instance switched")],
        ),
        (WatchEvent(CREATED, P.disabled_instance("host@2@other"), b""), _seen(), []),
        # an operator's run-now, for this instance only
        (WatchEvent(CREATED, P.trigger(ME), b"{}"), _seen(), [rx.Work(rx.Task.RUN_NOW)]),
        (WatchEvent(CREATED, P.trigger("host@2@other"), b"{}"), _seen(), []),
        (WatchEvent(DELETED, P.trigger(ME)), _seen(), []),
        (WatchEvent(CREATED, P.runnow("r1"), b"{}"), _seen(), [rx.Work(rx.Task.REQUESTS)]),
        (WatchEvent(CREATED, P.runnow_item("r1", 3), b"{}"), _seen(), []),
        (WatchEvent(DELETED, P.runnow("r1")), _seen(), []),
        # the stored config
        (WatchEvent(CREATED, P.config, b"{}"), _seen(), [rx.Work(rx.Task.RELOAD_CONFIG)]),
        # a deleted config: the job was removed (the reload retires it)
        (WatchEvent(DELETED, P.config), _seen(), [rx.Work(rx.Task.RELOAD_CONFIG)]),
        # nodes of no interest here
        (WatchEvent(CREATED, P.running(1), b"{}"), _seen(), []),
        (WatchEvent(CREATED, "/elsewhere/entirely", b""), _seen(), []),
    ],
)
def test_watch_events(event: WatchEvent, seen: rx.Seen, commands: list[rx.Command]) -> None:
    assert rx.on_event(seen, event) == commands


def test_the_lane_keys_merge_as_before() -> None:
    """Two member-left tasks for different instances do not merge; the rest merge by
    task (a burst of queued failover items is one claim on the lane)."""
    assert rx.Work(rx.Task.MEMBER_LEFT, "a").key != rx.Work(rx.Task.MEMBER_LEFT, "b").key
    assert rx.Work(rx.Task.CLAIM).key == "claim"
    assert {t.value for t in rx.Task} == {
        "elect",
        "left",
        "claim",
        "switched",
        "run-now",
        "requests",
        "config",
    }
