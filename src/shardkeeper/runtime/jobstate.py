"""What one job's runner knows locally, shared by its parts (trigger, batches, leader,
repair). Only flags and counters: every part re-reads the store for the truth."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from shardkeeper.config import JobConfig
from shardkeeper.coordination.strategies import ShardingStrategy, resolve_strategy

# defined below the runtime so that its observers (metrics) need not import it
from shardkeeper.counters import STAT_KEYS, SkipReason
from shardkeeper.errorhandlers import ErrorHandler, resolve_error_handler
from shardkeeper.registry.base import Check

__all__ = ["STAT_KEYS", "JobState", "SkipReason"]


@dataclass
class JobState:
    """Local flags of one job on this instance (guarded by ``lock`` where noted)."""

    config: JobConfig
    lock: threading.RLock = field(default_factory=threading.RLock)
    registered: bool = False
    #: a registration is under way (a fire meanwhile waits for it: the membership it
    #: writes says it joined before that fire, so the leader may give it items)
    registering: bool = False
    joined: bool = False
    #: wall time of the last registration (the membership's started_at): the leader
    #: gives no items of an earlier fire to this instance
    joined_at: float = 0.0
    #: why the last registration failed (None when it did not)
    register_error: str | None = None
    suspended: bool = False
    stopping: bool = False
    #: wall time the graceful stop began: fires before it are still decided and run
    #: in the grace period (their items are this instance's; nobody else runs them)
    stop_at: float = 0.0
    hard_stop: bool = False
    disabled_job: bool = False
    disabled_items: set[int] = field(default_factory=set)
    queue_hint: set[int] = field(default_factory=set)
    #: created_revision of our membership node: start and claim commits check it
    member_revision: int = 0
    #: marks may name us without a local execution (new session, unknown outcome):
    #: the next repair pass checks them
    marks_suspect: bool = True
    #: earliest fire missed while items ran here (under ``lock``)
    misfire_at: float | None = None
    #: items whose misfire marks this instance wrote and has not deleted yet (under
    #: ``lock``): a later missed fire of the same run needs no commit of its own
    misfire_marked: set[int] = field(default_factory=set)
    #: triggers and claims between their check of ``stopping`` and their batch
    starting: int = 0
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAT_KEYS, 0))

    def __post_init__(self) -> None:
        self.strategy: ShardingStrategy = resolve_strategy(self.config.sharding_strategy)
        self.on_error: ErrorHandler = resolve_error_handler(self.config.error_handler, self.config)

    def set_config(self, config: JobConfig) -> None:
        """Adopt ``config`` (strategy and error handler follow it)."""
        self.config = config
        self.strategy = resolve_strategy(config.sharding_strategy)
        self.on_error = resolve_error_handler(config.error_handler, config)

    def skip_reason(self, fire_time: float | None = None) -> SkipReason | None:
        """Why a trigger (of the fire at ``fire_time``, if given) cannot start items
        now, or None when it can. During a graceful stop only fires from before the
        stop may still start items."""
        if self.stopping and (
            self.hard_stop or fire_time is None or fire_time >= self.stop_at - 1e-6
        ):
            return SkipReason.STOPPING
        if self.suspended:
            return SkipReason.SUSPENDED
        if not self.registered:
            return SkipReason.NOT_REGISTERED
        if self.disabled_job or self.config.disabled:
            return SkipReason.DISABLED
        return None

    def membership_check(self, path: str) -> Check | None:
        """The commit condition "still the member we registered as" (None before the
        first registration)."""
        if not self.member_revision:
            return None
        return Check(path, created_revision=self.member_revision)

    def count(self, key: str, n: int = 1) -> None:
        """Bump a counter (tests and benchmarks read ``stats``)."""
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n
