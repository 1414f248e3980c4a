"""The names a job's runner counts by: its counters (:data:`STAT_KEYS`, the keys of
``JobRunner.stats``) and why a fire started no item here (:class:`SkipReason`).

The runtime writes them and its observers read them (the Prometheus metrics label by
them): they live below the runtime so that an observer imports them without
importing the runtime, which imports the observers.
"""

from __future__ import annotations

import enum

__all__ = ["STAT_KEYS", "SkipReason"]

STAT_KEYS = (
    "triggers",
    "executed",
    "failed",
    "skipped",
    "misfires",
    "failovers",
    "fenced",
    "reshards",
    "repairs",
    "retries",
    "timed_out",
    "interrupted",
    "store_errors",
    "checkpoints",
    "checkpoints_refused",
    "checkpoint_errors",
)


class SkipReason(enum.Enum):
    """Why a trigger started no item here."""

    NOT_REGISTERED = "not registered in the job (registration is retried)"
    SUSPENDED = "connection to the store suspended"
    STOPPING = "instance stopping"
    DISABLED = "job disabled"
    NO_ITEMS = "no items assigned to this instance"
    RESHARD_TIMEOUT = "resharding did not finish in time"
    RUNNING_ELSEWHERE = "items still run elsewhere"
    BUSY = "previous items still running here (misfire off)"
    QUEUED = "fires queued up behind one still waiting (misfire off)"
    BEFORE_JOIN = "fired before this instance (re-)joined the job"
    DUPLICATE = "the same fire was delivered twice"
    CHANGING = "assignment kept changing"
    MEMBERSHIP = "membership changed since registration (re-registering)"
    STORE = "store did not answer"
    STORE_LIMIT = "the store refuses the start commit as too large (raise its request limits)"
    OWNER_GONE = "no instance ran it: its owner was gone before it started (misfire off)"
    MISSED = "missed by the scheduler (later than the grace time, misfire off)"
    DONE = "one-off job done already"
    COMPLETED = "a misfire re-run whose fire every item of it completed meanwhile"
    REMOVED = "items an operator's cut of sharding_total_count removed before they started"
    CLOCK_SKEW = "this instance's clock is off the store's by more than max_time_diff_seconds"
    INVALID_REQUEST = "run-now request not valid"
