"""A batch: the items one trigger (or one failover claim) runs on this instance, and
what is kept of it until its completion commit (runtime/fire/batches.py runs them)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shardkeeper.job import ShardingContext
from shardkeeper.registry.base import Op

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "CRASHED",
    "EARLY_RESULTS_DELAY",
    "EARLY_RESULTS_EVERY",
    "FAILED",
    "FENCED",
    "FIRE_LEAD",
    "INTERRUPTED",
    "MAX_BACKOFF",
    "OK",
    "RAN_FIRES",
    "RAN_MEMORY",
    "TIMED_OUT",
    "ZOMBIE",
    "Batch",
    "execution_id",
]

OK, FAILED, FENCED, ZOMBIE, TIMED_OUT = "ok", "failed", "fenced", "zombie", "timed_out"
#: returned without raising after ``ctx.should_stop()`` told it to stop: its work may
#: be unfinished, so its item runs again (handed off like a fenced item)
INTERRUPTED = "interrupted"
#: its worker process died under it (executor="process", runtime/execute/procpool.py)
CRASHED = "crashed"
#: longest wait between two attempts of a failed item, seconds
MAX_BACKOFF = 300.0
#: the least seconds between two completion commits of a batch's items that ended
#: while others of it still run (runtime/fire/batches.py)
EARLY_RESULTS_EVERY = 1.0
#: how long after an item's end its own completion waits: a batch that completes
#: meanwhile (the common case: items of a few milliseconds) settles it in its
#: completion commit, as always, and costs no commit more
EARLY_RESULTS_DELAY = 0.5
#: how many recent execution ids an instance remembers as run here, beyond the
#: latest RAN_FIRES fires (those are remembered whole, whatever their size)
RAN_MEMORY = 4096
#: the latest fires whose executions here are all remembered, however many items
#: they had (a late-applied start commit concerns a fire just run: a batch larger
#: than RAN_MEMORY must not forget its own first items)
RAN_FIRES = 3
#: seconds ahead of its due time that a scheduled fire is delivered and decided: the
#: assignment read and the start commit (a few milliseconds, more under load) happen
#: before the fire is due, and the items start at the due time itself, not a commit
#: round trip after it. Items never start before their fire's time (batches.py).
FIRE_LEAD = 0.025


def execution_id(job: str, fire_time: float, item: int) -> str:
    """Stable id of (job, fire time, item): the same for every re-run of it."""
    return f"{job}@{round(fire_time * 1000)}#{item}"


@dataclass
class Batch:
    """The items this instance runs for one trigger (or one failover claim)."""

    fire_time: float
    items: list[int]
    #: fencing token of each item (one per commit: a large batch spans several)
    tokens: dict[int, int]
    execution_ids: dict[int, str]
    #: fence child of each persistent mark (ExecutionService.finish)
    fences: dict[int, str] = field(default_factory=dict)
    contexts: dict[int, ShardingContext] = field(default_factory=dict)
    #: one-off parameters of the run-now request this batch serves (a failover
    #: claim's: those of the request the replaced run served)
    params: dict[str, str] = field(default_factory=dict)
    #: the id of that run-now request ("" for none): with ``params``, in a hand-off's
    #: queue entry, so that the item's re-run has them
    request: str = ""
    #: earlier fire times each item's run stands for (runtime/job/coverage.py)
    covers: dict[int, tuple[float, ...]] = field(default_factory=dict)
    #: how many fires, older than those listed in ``covers``, each item's run stands
    #: for too (a gap longer than MAX_COVERS fires: counted, not listed)
    covered_before: dict[int, int] = field(default_factory=dict)
    #: items whose earlier fires could not be counted (the results read failed):
    #: their completion writes no result, so that the next run counts them
    uncounted: frozenset[int] = frozenset()
    failover: bool = False
    #: a failover claim's: the instance whose cut-off run of each item it replaces
    #: (the queue entry's ``from_instance``), for the history
    taken_from: dict[int, str] = field(default_factory=dict)
    misfire: bool = False
    fenced: bool = False
    #: why it was fenced (Batches.fence_all): said again when its items are handed off
    fenced_why: str = ""
    #: when it was fenced (wall time, as an attempt's end is taken): an item that
    #: had returned before is done, one still running then ran fenced
    fenced_at: float | None = None
    #: the store session the batch started in: another session means it is fenced
    session: str = ""
    pending: deque[int] = field(default_factory=deque)
    running: int = 0
    outcomes: dict[int, str] = field(default_factory=dict)
    #: items that ran past the execution timeout (told to stop, no longer valid)
    timed_out: set[int] = field(default_factory=set)
    #: crashed items handed to failover (recorded crashed, run again elsewhere)
    crash_handoff: set[int] = field(default_factory=set)
    #: items whose ``ctx.should_stop()`` answered true (the grace period of a graceful
    #: stop running out, or a hard stop): one that then returns is interrupted, not
    #: done
    told_to_stop: set[int] = field(default_factory=set)
    #: when it was launched here (monotonic seconds)
    launched_at: float = field(default_factory=time.monotonic)
    #: attempts each item took (retries)
    attempts: dict[int, int] = field(default_factory=dict)
    #: encoded last result of each item that ran to an end (written by its
    #: completion commit: the batch's, or its own when it ended before its siblings)
    results: dict[int, bytes] = field(default_factory=dict)
    #: items that ended while others of the batch still ran, waiting for their own
    #: completion commit (Batches._early_result)
    early: set[int] = field(default_factory=set)
    #: items completed on their own (Batches._flush_early): no longer this batch's
    #: to fence, hand off or complete, and free for their next fire
    settled: set[int] = field(default_factory=set)
    #: the last item ended: the batch's completion settles what is left
    completing: bool = False
    #: an early write is due (on the runner's timer)
    early_armed: bool = False
    #: when the last early write was sent (monotonic seconds)
    early_at: float = float("-inf")
    #: each item's execution span (shardkeeper/tracing.py; none without OpenTelemetry),
    #: opened before the start commit and ended with the item's outcome
    spans: dict[int, Span] = field(default_factory=dict)


@dataclass
class _Unfinished:
    """Marks a failed commit left behind: cleared (ran) or handed off (never started)."""

    fire_time: float
    ran: dict[int, int]  # item -> token
    handoff: dict[int, int]  # item -> token
    execution_ids: dict[int, str]
    fences: dict[int, str]
    results: dict[int, bytes] = field(default_factory=dict)
    #: the earlier fires each item's run stood for: a run handed off did not do
    #: them either, so its queue entry carries them on (FailoverEntry.folds)
    covers: dict[int, tuple[float, ...]] = field(default_factory=dict)
    #: each handed-off item's execution span, for the run that replaces it to link to
    traceparents: dict[int, str] = field(default_factory=dict)
    #: further ops of each item's completion or hand-off commit: its last checkpoint
    #: and progress (runtime/fire/checkpoints.py), so they are retried with it
    extra: dict[int, list[Op]] = field(default_factory=dict)
    #: why each handed-off item is handed off (interrupted as the grace ran out,
    #: fenced and why, crashed): the hand-off's log line says it
    why: dict[int, str] = field(default_factory=dict)
    #: the run-now params and request id of the batch (Batch.params, request): a
    #: handed-off item's queue entry carries them, for its re-run's ctx.params
    params: dict[str, str] = field(default_factory=dict)
    request: str = ""
