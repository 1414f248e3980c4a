"""What one job's runner knows locally, shared by its parts (trigger, batches, leader,
repair). Only flags and counters: every part re-reads the store for the truth."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardkeeper.config import JobConfig
from shardkeeper.coordination.strategies import ShardingStrategy, resolve_strategy

# defined below the runtime so that its observers (metrics) need not import it
from shardkeeper.counters import STAT_KEYS, SkipReason
from shardkeeper.errorhandlers import ErrorHandler, resolve_error_handler
from shardkeeper.registry.base import Check, ConnectionState
from shardkeeper.runtime.job.phase import JobPhase, Phase

__all__ = ["OWNERS", "STAT_KEYS", "JobState", "SkipReason", "switch_time"]

#: the one module (of ``shardkeeper.runtime``) that writes each field; a part that
#: needs a field changed asks its owner. "jobstate" means: written only by the
#: methods of JobState below, which any part may call (named verbs, under ``lock``).
#: tests/runtime/test_state_owners.py checks this against the code.
OWNERS: dict[str, str] = {
    "config": "jobstate",  # set_config, called by settings (the stored config)
    "strategy": "jobstate",  # follows config
    "on_error": "jobstate",  # follows config
    "lock": "jobstate",  # never rebound
    "phase": "jobstate",  # bound once; Phase.transition alone changes the phase
    "connection": "runner",  # the reactions' commands, executed by the runner
    "joined_at": "runner",  # registration ok (one by one or batched)
    "member_revision": "runner",  # registration ok
    "register_error": "runner",  # registration failed or left to housekeeping
    "stop_at": "runner",  # begin_stop
    "stop_notice_at": "runner",  # begin_stop
    "queue_hint": "runner",  # watch events, claims, the repair pass's listing
    "disabled_job": "settings",  # switches: events, re-reads, a batched registration
    "disabled_items": "settings",
    "disabled_job_at": "settings",
    "disabled_items_at": "settings",
    "marks_suspect": "jobstate",  # suspect_marks (anyone), marks_checked (repair)
    "misfire_at": "fires",
    "misfire_last": "fires",
    "misfire_marked": "jobstate",  # misfire_marks_written (fires), _cleared (trigger)
    "starting": "fires",
    "stats": "jobstate",  # count
    "clock_skew": "clockskew",  # the clock monitor
}


@dataclass
class JobState:
    """Local facts of one job on this instance (guarded by ``lock`` where noted).

    Each field has one owning module (:data:`OWNERS`): only that module writes it.
    The phase (``phase.current``) replaces the flags registered, registering,
    stopping and hard stop: the properties of the same names derive from it."""

    config: JobConfig
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: the job's phase here (runtime/job/phase.py); never rebound
    phase: Phase = field(init=False)
    #: the store connection's state as this job's reactions last saw it (orthogonal
    #: to the phase: SUSPENDED makes fires wait and repair passes pause in any phase)
    connection: ConnectionState = ConnectionState.CONNECTED
    #: wall time of the last registration (the membership's started_at): the leader
    #: gives no items of an earlier fire to this instance
    joined_at: float = 0.0
    #: why the last registration failed (None when it did not)
    register_error: str | None = None
    #: wall time the graceful stop began: fires before it are still decided and run
    #: in the grace period (their items are this instance's; nobody else runs them)
    stop_at: float = 0.0
    #: monotonic time from which a graceful stop tells running items to stop
    #: (``ctx.should_stop()``): as its grace period runs out, not as it begins
    stop_notice_at: float = 0.0
    disabled_job: bool = False
    disabled_items: set[int] = field(default_factory=set)
    #: when the operator's job switch was set (the time stored with it; 0.0 when the
    #: switch carries none, a document of an older version): fires due before it are
    #: decided as usual, fires due at or after it are ``disabled`` skips
    disabled_job_at: float = 0.0
    #: the same for each disabled item (an item missing here: no time known)
    disabled_items_at: dict[int, float] = field(default_factory=dict)
    queue_hint: set[int] = field(default_factory=set)
    #: created_revision of our membership node: start and claim commits check it
    member_revision: int = 0
    #: marks may name us without a local execution (new session, unknown outcome):
    #: the next repair pass checks them
    marks_suspect: bool = True
    #: earliest fire missed while items ran here (under ``lock``)
    misfire_at: float | None = None
    #: latest fire missed since ``misfire_at`` (under ``lock``): the re-run of
    #: ``misfire_at`` is the fold of every fire up to it and says so (``ctx.covers``)
    misfire_last: float | None = None
    #: items whose misfire marks this instance wrote and has not deleted yet (under
    #: ``lock``): a later missed fire of the same run needs no commit of its own
    misfire_marked: set[int] = field(default_factory=set)
    #: triggers and claims between their check of ``stopping`` and their batch
    starting: int = 0
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAT_KEYS, 0))
    #: why this instance's clock is too far off the store's for this job (None when
    #: it is not, or the check is off): no item of the job starts here meanwhile
    clock_skew: str | None = None

    def __post_init__(self) -> None:
        self.phase = Phase(self.config.name, self.lock)
        self.strategy: ShardingStrategy = resolve_strategy(self.config.sharding_strategy)
        self.on_error: ErrorHandler = resolve_error_handler(self.config.error_handler, self.config)

    # -- facts derived from the phase ------------------------------------------------

    @property
    def registered(self) -> bool:
        """A member of the job (also during a graceful stop, until it leaves)."""
        return self.phase.current in (JobPhase.REGISTERED, JobPhase.STOPPING)

    @property
    def registering(self) -> bool:
        """A registration is under way (a fire meanwhile waits for it)."""
        return self.phase.current is JobPhase.REGISTERING

    @property
    def stopping(self) -> bool:
        """The job's stop here has begun (graceful or hard)."""
        return self.phase.current in (JobPhase.STOPPING, JobPhase.LEAVING, JobPhase.STOPPED)

    @property
    def hard_stop(self) -> bool:
        """The grace period is over: running items are fenced."""
        return self.phase.current is JobPhase.STOPPED

    @property
    def suspended(self) -> bool:
        """The store connection is suspended (as this job last heard)."""
        return self.connection is ConnectionState.SUSPENDED

    # -- verbs of the fields several parts change ----------------------------------

    def set_config(self, config: JobConfig) -> None:
        """Adopt ``config`` (strategy and error handler follow it)."""
        self.config = config
        self.strategy = resolve_strategy(config.sharding_strategy)
        self.on_error = resolve_error_handler(config.error_handler, config)

    def suspect_marks(self) -> None:
        """Marks may name us without a local execution: the next repair pass checks."""
        self.marks_suspect = True

    def marks_checked(self, suspect: bool = False) -> None:
        """The marks were checked (or nothing can name us): none is suspect."""
        self.marks_suspect = suspect

    def misfire_marks_written(self, items: Iterable[int]) -> None:
        """Misfire marks of ``items`` were (or may have been) written by us."""
        with self.lock:
            self.misfire_marked.update(items)

    def misfire_marks_cleared(self, items: Iterable[int]) -> None:
        """The misfire marks of ``items`` went (with a start commit)."""
        with self.lock:
            self.misfire_marked.difference_update(items)

    def count(self, key: str, n: int = 1) -> None:
        """Bump a counter (tests and benchmarks read ``stats``)."""
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n

    # -- questions ------------------------------------------------------------------

    def skip_reason(self, fire_time: float | None = None) -> SkipReason | None:
        """Why a trigger (of the fire at ``fire_time``, if given) cannot start items
        now, or None when it can. During a graceful stop only fires from before the
        stop may still start items."""
        with self.lock:
            phase = self.phase.current
            stop_at = self.stop_at
        if phase is JobPhase.STOPPED or (
            phase in (JobPhase.STOPPING, JobPhase.LEAVING)
            and (fire_time is None or fire_time >= stop_at - 1e-6)
        ):
            return SkipReason.STOPPING
        if self.suspended:
            return SkipReason.SUSPENDED
        if phase not in (JobPhase.REGISTERED, JobPhase.STOPPING):
            return SkipReason.NOT_REGISTERED
        if self.clock_skew is not None:
            return SkipReason.CLOCK_SKEW
        if self.job_disabled(fire_time):
            return SkipReason.DISABLED
        return None

    def job_disabled(self, fire_time: float | None = None) -> bool:
        """Whether the job is switched off for the fire at ``fire_time`` (any fire from
        now on when None): its config says ``disabled`` (no time: every fire), or an
        operator disabled it at or before the fire. A fire due before the operator's
        disable, decided late, is decided as usual (:meth:`item_disabled`)."""
        return self.config.disabled or (
            self.disabled_job and _from_switch(fire_time, self.disabled_job_at)
        )

    def item_disabled(self, item: int, fire_time: float | None = None) -> bool:
        """Whether an operator's switch leaves ``item`` out of the fire at
        ``fire_time`` (any fire from now on when None): it is disabled and the fire
        was due at or after the disable. A fire due before the disable, decided late
        (a reshard wait, a busy item), is decided as usual: run, or folded into the
        item's next run."""
        if item not in self.disabled_items:
            return False
        return _from_switch(fire_time, self.disabled_items_at.get(item, 0.0))

    def membership_check(self, path: str) -> Check | None:
        """The commit condition "still the member we registered as" (None before the
        first registration)."""
        if not self.member_revision:
            return None
        return Check(path, created_revision=self.member_revision)


def _from_switch(fire_time: float | None, switched_at: float) -> bool:
    """A switch set at ``switched_at`` (0.0: time unknown, every fire) covers the fire
    at ``fire_time`` (None: a fire from now on)."""
    return fire_time is None or switched_at <= 0.0 or fire_time >= switched_at


def switch_time(value: bytes | None) -> float:
    """The time stored in an operator's switch node (``"at"``: the store's time where
    it gives one, else the writer's clock; ops/writes.py), 0.0 when the node holds
    none (empty, or written by an older version: every fire from now on is off)."""
    if not value:
        return 0.0
    try:
        doc = json.loads(value)
        at = float(doc["at"]) if isinstance(doc, dict) else 0.0
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return 0.0
    return at if math.isfinite(at) and at > 0.0 else 0.0
