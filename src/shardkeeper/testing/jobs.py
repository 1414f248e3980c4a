"""Jobs for tests: :class:`RecordingJob` records every execution it ran.

::

    job = RecordingJob()
    runtime.add_job(job, JobConfig(name="sync", interval=1, sharding_total_count=4))
    with runtime:
        job.wait_for(lambda runs: {r.item for r in runs} == {0, 1, 2, 3}, timeout=10)

The job is thread-safe (items run on the runtime's worker threads) and waits on a
condition with a deadline rather than sleeping: :meth:`RecordingJob.wait_for` wakes
up at each new execution and fails with a message that shows what was recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from shardkeeper.job import ShardedJob, ShardingContext

__all__ = ["RecordingJob", "Run"]

T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    """One execution a :class:`RecordingJob` ran, as its context described it."""

    job: str
    item: int
    #: the scheduled fire time (epoch seconds)
    fire_time: float
    #: one-off parameters of an operator's run-now request (``ctx.params``)
    params: dict[str, str]
    instance: str
    execution_id: str
    fencing_token: int
    is_failover: bool
    is_misfire: bool
    #: ``ctx.is_valid()`` when the execution started
    valid: bool
    #: when the execution started (epoch seconds, this process's clock)
    at: float = field(default_factory=time.time)


class RecordingJob(ShardedJob):
    """A job that records each context it ran (see the module docstring).

    ``work`` seconds of simulated work per item keep an execution in progress (the
    item is recorded when it starts, before the work).
    """

    def __init__(self, work: float = 0.0) -> None:
        self.work = work
        self._runs: list[Run] = []
        self._changed = threading.Condition()

    def execute(self, ctx: ShardingContext) -> None:
        """Record ``ctx``, then do the simulated work."""
        run = Run(
            job=ctx.job_name,
            item=ctx.item,
            fire_time=ctx.fire_time.timestamp(),
            params=dict(ctx.params),
            instance=ctx.instance_id,
            execution_id=ctx.execution_id,
            fencing_token=ctx.fencing_token,
            is_failover=ctx.is_failover,
            is_misfire=ctx.is_misfire,
            valid=ctx.is_valid(),
        )
        with self._changed:
            self._runs.append(run)
            self._changed.notify_all()
        if self.work:
            time.sleep(self.work)  # the item's own work, not synchronisation

    @property
    def runs(self) -> list[Run]:
        """Every execution so far, in the order they started (a copy)."""
        with self._changed:
            return list(self._runs)

    def items(self) -> list[int]:
        """The items run so far, sorted, with repeats."""
        return sorted(r.item for r in self.runs)

    def items_after(self, fire_time: float) -> set[int]:
        """The items run for fires later than ``fire_time`` (epoch seconds)."""
        return {r.item for r in self.runs if r.fire_time > fire_time}

    def count(self, item: int | None = None) -> int:
        """How many executions ran (of ``item`` only, when given)."""
        return sum(1 for r in self.runs if item is None or r.item == item)

    def clear(self) -> None:
        """Forget every execution recorded so far."""
        with self._changed:
            self._runs.clear()

    def wait_for(
        self,
        condition: Callable[[list[Run]], T | Literal[False] | None],
        timeout: float = 10.0,
        message: str = "the recorded executions never met the condition",
    ) -> T:
        """Wait until ``condition(runs)`` returns a truthy value and return it (typed
        without ``None`` and ``False``, which are not truthy: ``lambda runs:
        len(runs) >= 2 and runs`` gives the list); re-checked at each new execution.
        On the deadline raise AssertionError with ``message``, the timeout and the
        executions recorded."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                result = condition(list(self._runs))
                if result:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(r.fire_time, r.item, r.instance) for r in self._runs[-20:]]
                    raise AssertionError(
                        f"{message} (waited {timeout:g} s; {len(self._runs)} execution(s), "
                        f"the last (fire time, item, instance): {seen})"
                    )
                self._changed.wait(left)
