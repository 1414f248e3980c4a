"""Helpers of the should_stop / graceful-stop tests: a job whose executions are held
by an Event and poll ``ctx.should_stop()`` meanwhile, and an observer that keeps the
execution records.

Executions are held by :attr:`Holding.release` (with a deadline, so nothing can
hang), never by sleeps; the tests wait on conditions of what is recorded here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord

#: how often a held execution polls should_stop() (the user's pattern in the docs)
POLL = 0.02
#: a held execution returns by itself after this long (no test can hang on it)
HOLD_LIMIT = 30.0


@dataclass
class Execution:
    """One execution the job started, and what it saw while held."""

    instance: str
    item: int
    fire_time: float
    execution_id: str
    failover: bool
    misfire: bool
    held: bool
    #: ctx.params (an operator's run-now parameters)
    params: dict[str, str]
    #: should_stop() calls answered false so far
    polls: int = 0
    #: ctx.stop_reason() (or "stop" when the context has none) once should_stop()
    #: answered true; None while it never did
    stopped: str | None = None
    #: the probe (e.g. "the reshard flag exists") was true at some poll
    probe_seen: bool = False
    returned: bool = False


class Holding(ShardedJob):
    """Records each execution; the ones ``hold(ctx)`` selects wait for ``release``
    while polling ``ctx.should_stop()``, and return early when it answers true."""

    def __init__(
        self,
        hold: Callable[[ShardingContext], bool],
        probe: Callable[[], bool] | None = None,
    ) -> None:
        self.hold = hold
        self.probe = probe
        self.release = threading.Event()
        self._lock = threading.Condition()
        self._runs: list[Execution] = []

    def execute(self, ctx: ShardingContext) -> None:
        """Record, then hold (polling) when selected."""
        run = Execution(
            instance=ctx.instance_id,
            item=ctx.item,
            fire_time=ctx.fire_time.timestamp(),
            execution_id=ctx.execution_id,
            failover=ctx.is_failover,
            misfire=ctx.is_misfire,
            held=self.hold(ctx) and not self.release.is_set(),
            params=dict(ctx.params),
        )
        with self._lock:
            self._runs.append(run)
            self._lock.notify_all()
        deadline = time.monotonic() + HOLD_LIMIT
        try:
            while run.held and not self.release.is_set() and time.monotonic() < deadline:
                if self.probe is not None and self.probe():
                    run.probe_seen = True
                if ctx.should_stop():
                    reason = getattr(ctx, "stop_reason", None)  # absent on older code
                    run.stopped = str(reason()) if reason is not None else "stop"
                    return
                run.polls += 1
                self.release.wait(POLL)
        finally:
            run.returned = True

    @property
    def runs(self) -> list[Execution]:
        """Every execution so far, in start order (a copy of the list)."""
        with self._lock:
            return list(self._runs)


class Records:
    """An observer that keeps every execution record (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._executions: list[ExecutionRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        """Keep the record."""
        with self._lock:
            self._executions.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        """Skips are not needed here."""

    @property
    def executions(self) -> list[ExecutionRecord]:
        """The records so far (a copy)."""
        with self._lock:
            return list(self._executions)

    def outcome_of(self, execution_id: str, *, failover: bool | None = None) -> Outcome | None:
        """The outcome of the last record of ``execution_id`` (None: none yet)."""
        found = [
            r.outcome
            for r in self.executions
            if r.execution_id == execution_id and (failover is None or r.failover == failover)
        ]
        return found[-1] if found else None
