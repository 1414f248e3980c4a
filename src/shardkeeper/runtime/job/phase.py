"""The phase of one job on this instance: an enum, its transition table, and the one
object that holds the phase and alone changes it.

Two facts make the phase: is this instance a member of the job (its membership node
written by this session), and has the job's stop here begun (graceful, then hard).
A trigger starts items only in ``REGISTERED`` (and, during a graceful stop, in
``STOPPING`` for fires from before the stop).

The store connection being suspended is not a phase: it is the store's state, seen
by every job of the instance alike and orthogonal to all of the phases (a job may be
suspended while registering, registered or stopping); ``JobState.connection`` holds
it.

:func:`diagram` draws the table; the runner's module docstring shows that drawing
and a test checks the two agree.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Mapping

__all__ = [
    "DEMOTED",
    "HARD_STOP",
    "JOINED",
    "REGISTER_FAILED",
    "STOP",
    "TRANSITIONS",
    "IllegalTransition",
    "JobPhase",
    "Phase",
    "diagram",
]

log = logging.getLogger("shardkeeper.runtime.runner.runner")


class JobPhase(enum.Enum):
    """Where one job stands on this instance (module docstring)."""

    #: not a member: never registered, registration failed, session lost, membership
    #: gone or given up; housekeeping registers it again
    UNREGISTERED = "unregistered"
    #: a registration is under way: a fire meanwhile waits for it (the membership it
    #: writes says it joined before that fire, so the leader may give it items)
    REGISTERING = "registering"
    #: a member: triggers start items
    REGISTERED = "registered"
    #: graceful stop, still a member: fires from before the stop are still decided
    STOPPING = "stopping"
    #: graceful stop, not a member (or no longer: lost, retired, left): nothing starts
    LEAVING = "leaving"
    #: grace over: running items are fenced, nothing starts
    STOPPED = "stopped"


P = JobPhase

#: every legal move: from -> {to: what makes it}
TRANSITIONS: Mapping[JobPhase, Mapping[JobPhase, str]] = {
    P.UNREGISTERED: {
        P.REGISTERING: "register",
        P.LEAVING: "begin_stop",
        P.STOPPED: "hard stop",
    },
    P.REGISTERING: {
        P.REGISTERED: "register ok",
        P.UNREGISTERED: "register failed",
        P.LEAVING: "begin_stop",
        P.STOPPED: "hard stop",
    },
    P.REGISTERED: {
        P.UNREGISTERED: "LOST / membership gone / register failed / unregister",
        P.STOPPING: "begin_stop",
        P.STOPPED: "hard stop",
    },
    P.STOPPING: {
        P.LEAVING: "LOST / membership gone / retire / unregister",
        P.STOPPED: "grace over",
    },
    P.LEAVING: {
        # a registration begun before the stop that then succeeded
        P.STOPPING: "register ok",
        P.STOPPED: "grace over",
    },
    P.STOPPED: {},
}

#: where a lost membership leads from each phase (absent: nothing to lose)
DEMOTED: Mapping[JobPhase, JobPhase] = {
    P.REGISTERED: P.UNREGISTERED,
    P.STOPPING: P.LEAVING,
}

#: where a successful registration leads from each phase (absent: not registering)
JOINED: Mapping[JobPhase, JobPhase] = {
    P.REGISTERING: P.REGISTERED,
    P.LEAVING: P.STOPPING,
}

#: where a registration that failed leads from each phase
REGISTER_FAILED: Mapping[JobPhase, JobPhase] = {P.REGISTERING: P.UNREGISTERED, **DEMOTED}

#: where a graceful stop leads from each phase (absent: stopping already)
STOP: Mapping[JobPhase, JobPhase] = {
    P.UNREGISTERED: P.LEAVING,
    P.REGISTERING: P.LEAVING,
    P.REGISTERED: P.STOPPING,
}

#: where the end of the grace period (or a stop without one) leads from each phase
HARD_STOP: Mapping[JobPhase, JobPhase] = {p: P.STOPPED for p in JobPhase if p is not P.STOPPED}


class IllegalTransition(RuntimeError):
    """A move the transition table does not allow (a bug in the runtime, never a
    condition of the store: not a ShardkeeperError, so nothing retries it away)."""

    def __init__(self, job: str, frm: JobPhase, to: JobPhase, why: str) -> None:
        allowed = ", ".join(p.value for p in TRANSITIONS[frm]) or "none"
        super().__init__(
            f"{job}: no move from {frm.value} to {to.value} ({why}); "
            f"from {frm.value} the moves are to: {allowed}"
        )
        self.job = job
        self.frm = frm
        self.to = to


class Phase:
    """The phase of one job (module docstring): read by any part, changed only by
    :meth:`transition` (and :meth:`move`, which picks the target under the same
    lock). Shares the job state's lock, so a reader holding that lock sees the phase
    and the fields written with it (``stop_at``) together."""

    def __init__(self, job: str, lock: threading.RLock) -> None:
        self._job = job
        self._lock = lock
        self._phase = JobPhase.UNREGISTERED

    @property
    def current(self) -> JobPhase:
        """The phase now."""
        return self._phase

    def transition(self, to: JobPhase, why: str) -> JobPhase:
        """Move to ``to`` for reason ``why``; returns the phase left. Raises
        IllegalTransition for a move the table does not list."""
        with self._lock:
            frm = self._phase
            if to not in TRANSITIONS[frm]:
                raise IllegalTransition(self._job, frm, to, why)
            self._phase = to
        log.debug("%s: %s -> %s (%s)", self._job, frm.value, to.value, why)
        return frm

    def move(self, moves: Mapping[JobPhase, JobPhase], why: str) -> JobPhase | None:
        """Take the move ``moves`` lists for the current phase (atomically); None
        when it lists none (nothing to do in this phase), else the phase reached."""
        with self._lock:
            to = moves.get(self._phase)
            if to is None:
                return None
            self.transition(to, why)
            return to

    def lose_membership(self, why: str) -> JobPhase | None:
        """Our membership is gone (session lost, node gone or replaced, a commit's
        membership check failed, left): REGISTERED -> UNREGISTERED, STOPPING ->
        LEAVING; nothing in the other phases."""
        return self.move(DEMOTED, why)

    def __repr__(self) -> str:
        return f"Phase({self._job!r}, {self._phase.value})"


def diagram() -> list[str]:
    """The transition table drawn one move a line (``from --what--> to``), as the
    runner's module docstring shows it."""
    return [
        f"{frm.value} --{what}--> {to.value}"
        for frm, moves in TRANSITIONS.items()
        for to, what in moves.items()
    ]
