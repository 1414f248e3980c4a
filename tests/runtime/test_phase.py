"""The job's phase (runtime/job/phase.py): the drawing in the runner's docstring is the
transition table, illegal moves are refused by name, each move is logged, and the
facts the other parts read derive from the phase."""

from __future__ import annotations

import logging
import re
import threading

import pytest

import shardkeeper.runtime.runner.runner as runner_module
from shardkeeper.config import JobConfig
from shardkeeper.registry.base import ConnectionState
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.phase import (
    DEMOTED,
    HARD_STOP,
    JOINED,
    REGISTER_FAILED,
    STOP,
    TRANSITIONS,
    IllegalTransition,
    JobPhase,
    Phase,
    diagram,
)

P = JobPhase
EDGE = re.compile(r"^\s{4}(\w+) --(.+)--> (\w+)$")


def test_the_runner_docstring_draws_the_transition_table() -> None:
    """Every move the docstring draws is in the table and every move of the table is
    drawn, with its label: the drawing cannot go stale."""
    doc = runner_module.__doc__ or ""
    drawn = [m.group(0).strip() for line in doc.splitlines() if (m := EDGE.match(line))]
    assert drawn == diagram()
    # and the drawing names every phase
    assert {p.value for p in JobPhase} <= {w for line in drawn for w in line.split()}


def test_every_phase_is_reachable_and_stopped_is_the_end() -> None:
    seen, todo = {P.UNREGISTERED}, [P.UNREGISTERED]
    while todo:
        for to in TRANSITIONS[todo.pop()]:
            if to not in seen:
                seen.add(to)
                todo.append(to)
    assert seen == set(JobPhase)
    assert TRANSITIONS[P.STOPPED] == {}


@pytest.mark.parametrize(
    "moves", [DEMOTED, JOINED, REGISTER_FAILED, STOP, HARD_STOP], ids=lambda m: str(len(m))
)
def test_the_named_moves_are_legal_moves(moves: dict[JobPhase, JobPhase]) -> None:
    for frm, to in moves.items():
        assert to in TRANSITIONS[frm], (frm, to)


def test_an_illegal_move_is_refused_by_name_and_changes_nothing() -> None:
    phase = Phase("billing", threading.RLock())
    with pytest.raises(IllegalTransition) as err:
        phase.transition(P.REGISTERED, "skipping the registration")
    text = str(err.value)
    assert "billing" in text and "unregistered" in text and "registered" in text
    assert "registering" in text  # what would be valid from there
    assert (err.value.frm, err.value.to) == (P.UNREGISTERED, P.REGISTERED)
    assert phase.current is P.UNREGISTERED
    phase.transition(P.REGISTERING, "register")
    phase.transition(P.REGISTERED, "register ok")
    phase.transition(P.STOPPED, "hard stop")
    with pytest.raises(IllegalTransition):
        phase.transition(P.REGISTERING, "register")  # nothing leaves stopped


def test_each_move_is_logged_with_job_from_to_and_why(caplog: pytest.LogCaptureFixture) -> None:
    phase = Phase("billing", threading.RLock())
    with caplog.at_level(logging.DEBUG, logger="shardkeeper.runtime.runner.runner"):
        phase.transition(P.REGISTERING, "register")
        assert phase.move(JOINED, "register ok") is P.REGISTERED
        assert phase.move(JOINED, "register ok") is None  # nothing to do: not logged
    assert [r.getMessage() for r in caplog.records] == [
        "billing: unregistered -> registering (register)",
        "billing: registering -> registered (register ok)",
    ]


def test_a_lost_membership_moves_only_a_member() -> None:
    phase = Phase("billing", threading.RLock())
    assert phase.lose_membership("session lost") is None
    phase.transition(P.REGISTERING, "register")
    assert phase.lose_membership("session lost") is None  # the registration decides
    phase.transition(P.REGISTERED, "register ok")
    assert phase.lose_membership("session lost") is P.UNREGISTERED
    phase.transition(P.REGISTERING, "register")
    phase.transition(P.REGISTERED, "register ok")
    phase.transition(P.STOPPING, "begin_stop")
    assert phase.lose_membership("session lost") is P.LEAVING


def _state_in(phase: JobPhase) -> JobState:
    state = JobState(JobConfig(name="billing", interval=1, sharding_total_count=2))
    path = {
        P.UNREGISTERED: [],
        P.REGISTERING: [P.REGISTERING],
        P.REGISTERED: [P.REGISTERING, P.REGISTERED],
        P.STOPPING: [P.REGISTERING, P.REGISTERED, P.STOPPING],
        P.LEAVING: [P.LEAVING],
        P.STOPPED: [P.STOPPED],
    }[phase]
    for to in path:
        state.phase.transition(to, "the test")
    state.stop_at = 100.0
    return state


@pytest.mark.parametrize(
    ("phase", "registered", "registering", "stopping", "hard", "before_stop", "after_stop"),
    [
        (P.UNREGISTERED, False, False, False, False, SkipReason.NOT_REGISTERED, None),
        (P.REGISTERING, False, True, False, False, SkipReason.NOT_REGISTERED, None),
        (P.REGISTERED, True, False, False, False, None, None),
        (P.STOPPING, True, False, True, False, None, SkipReason.STOPPING),
        (P.LEAVING, False, False, True, False, SkipReason.NOT_REGISTERED, SkipReason.STOPPING),
        (P.STOPPED, False, False, True, True, SkipReason.STOPPING, SkipReason.STOPPING),
    ],
)
def test_the_flags_and_skip_reasons_derive_from_the_phase(
    phase: JobPhase,
    registered: bool,
    registering: bool,
    stopping: bool,
    hard: bool,
    before_stop: SkipReason | None,
    after_stop: SkipReason | None,
) -> None:
    """A fire from before the stop (t=50) and one after it (t=150) in each phase;
    outside a stop the second is simply a fire (only the running phases allow it)."""
    state = _state_in(phase)
    assert (state.registered, state.registering, state.stopping, state.hard_stop) == (
        registered,
        registering,
        stopping,
        hard,
    )
    assert state.skip_reason(50.0) is before_stop
    if stopping:
        assert state.skip_reason(150.0) is after_stop
        assert state.skip_reason() is SkipReason.STOPPING
    else:
        assert state.skip_reason(150.0) is before_stop


def test_a_suspended_connection_is_orthogonal_to_the_phase() -> None:
    """SUSPENDED in any phase that could start items makes fires wait (its skip
    reason), and the phase is unchanged by it."""
    for phase in (P.UNREGISTERED, P.REGISTERING, P.REGISTERED, P.STOPPING):
        state = _state_in(phase)
        state.connection = ConnectionState.SUSPENDED
        assert state.suspended and state.phase.current is phase
        assert state.skip_reason(50.0) is SkipReason.SUSPENDED
        state.connection = ConnectionState.RECONNECTED
        assert not state.suspended
