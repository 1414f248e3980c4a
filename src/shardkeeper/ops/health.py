"""How healthy a job is, from one snapshot of its registry subtree.

Per item, from its last result (``/jobs/{job}/results/{item}``):

``failing``
    its last execution raised.
``stale``
    it has not run for longer than its schedule allows: two fires came and went
    (plus a grace of the session timeout) since the fire of its last result, and it
    is not running now. For an interval that is more than two intervals; for a cron
    expression, the gaps between its actual fires (a weekday-only job is not stale on
    a Monday morning). An item without a result counts from when the assignment that
    gave it an owner was made.
``ok``
    neither.

Items only have results when ``monitor_execution`` is on (the completion commit
that writes them clears the running marks); otherwise every item is ``ok`` here.
Disabled items are ``ok`` (an operator switched them off); a disabled job is never
stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from shardkeeper.coordination.snapshot import JobSnapshot
from shardkeeper.errors import ShardkeeperError
from shardkeeper.scheduling.triggers import build_trigger

__all__ = ["FAILING", "OK", "STALE", "JobHealth", "assess"]

OK, FAILING, STALE = "ok", "failing", "stale"


@dataclass(frozen=True)
class JobHealth:
    """The items of a job that are failing or stale (see module docstring)."""

    items: dict[int, str]

    @property
    def failing(self) -> list[int]:
        """Items whose last execution failed."""
        return sorted(i for i, h in self.items.items() if h == FAILING)

    @property
    def stale(self) -> list[int]:
        """Items that have not run for longer than the schedule allows."""
        return sorted(i for i, h in self.items.items() if h == STALE)


def _fires_after(trigger: Any, since: float, count: int) -> list[float]:
    """The first ``count`` fire times of ``trigger`` after ``since``."""
    out: list[float] = []
    at = datetime.fromtimestamp(since, UTC) + timedelta(milliseconds=1)
    for _ in range(count):
        nxt = trigger.get_next_fire_time(None, at)
        if not isinstance(nxt, datetime):
            break
        out.append(nxt.timestamp())
        at = nxt + timedelta(milliseconds=1)
    return out


def assess(state: JobSnapshot, *, now: float, grace: float) -> JobHealth:
    """The health of each item of ``state`` at ``now`` (epoch seconds); ``grace``
    is how late a fire may still start and finish its bookkeeping (the session
    timeout is a good value: a fire may wait that long for a reshard or a store)."""
    items: dict[int, str] = {}
    cfg = state.config
    if cfg is None:
        return JobHealth(items)
    owners = state.assignment.owners if state.assignment else {}
    assigned_at = state.assignment.at if state.assignment else 0.0
    try:
        trigger = build_trigger(cfg)
    except (ShardkeeperError, ValueError):
        trigger = None
    # items of one batch share a fire time: each fire time is looked up once
    overdue_since: dict[float, bool] = {}
    for item in range(state.total):
        result = state.results.get(item)
        if item in state.disabled_items:
            items[item] = OK  # switched off: neither its old failure nor its age matter
            continue
        if result is not None and result.failed:
            items[item] = FAILING
            continue
        if (
            not cfg.monitor_execution
            or not state.enabled
            or item in state.running
            or item not in owners
        ):
            items[item] = OK
            continue
        since = result.fire_time if result is not None else assigned_at
        if since <= 0 or trigger is None:
            items[item] = OK
            continue
        if since not in overdue_since:
            fires = _fires_after(trigger, since, 2)
            overdue_since[since] = len(fires) == 2 and fires[1] + grace < now
        items[item] = STALE if overdue_since[since] else OK
    return JobHealth(items)
