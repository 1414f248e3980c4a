"""What a job's parts ask of their runner: every back-edge from a part to the
:class:`~shardkeeper.runtime.runner.runner.JobRunner` that composes it, named in one
Protocol.

The parts (fires, settings, repair, trigger, batches) are built by the runner and
get the runner as a ``RunnerPort``; none of them imports the runner. Calls from a
part into a sibling part go through these too, so the wiring of one job is all in
``runner.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from shardkeeper.config import JobConfig
from shardkeeper.runtime.execute.batch import Batch

__all__ = ["RunnerPort"]


class RunnerPort(Protocol):
    """The runner's side of its parts (module docstring)."""

    # -- the lane ---------------------------------------------------------------------

    def submit(self, key: str | None, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the job's lane (merged with a queued task of the same key)."""
        ...

    def defer(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay`` seconds on the job's start lane (batches: the
        items of a fire decided ahead of its due time)."""
        ...

    def request_repair(self) -> None:
        """Run a housekeeping pass on the lane soon."""
        ...

    # -- membership and the job's lifecycle -----------------------------------------

    def register_logged(self) -> None:
        """Register the job, logging a failure (the next pass retries it)."""
        ...

    def reload(self) -> None:
        """Re-read the job's switches and stored config (lane task)."""
        ...

    def retire(self, why: str) -> None:
        """Stop running the job on this instance (it was removed)."""
        ...

    def config_changed(self, old: JobConfig) -> None:
        """The stored config replaced ``old`` (the runtime reschedules the trigger)."""
        ...

    # -- executions -----------------------------------------------------------------

    def session(self) -> str:
        """The store session id now (a batch remembers the one it started in)."""
        ...

    def valid(self, batch: Batch) -> bool:
        """Whether ``batch``'s items may still run (not fenced, session fresh)."""
        ...

    def fence(self, why: str) -> None:
        """Fence every execution in progress, logging ``why`` if any was."""
        ...

    def fence_all(self) -> None:
        """Fence every execution in progress."""
        ...

    def running_count(self) -> int:
        """Items executing or starting here."""
        ...

    def local_items(self) -> set[int]:
        """Items of normal batches running here (not failover ones)."""
        ...

    def launch(self, batch: Batch) -> None:
        """Hand ``batch`` to the workers."""
        ...

    def after_batch(self) -> None:
        """A batch ended (worker thread): a misfire re-run, a claim or the one-off
        check may be due."""
        ...

    def batch_done(self) -> None:
        """Marks were settled: a misfire re-run or a failover claim may be due."""
        ...

    def record_missed(self, fire_time: float, items: tuple[int, ...]) -> None:
        """Fires of ``items`` no instance ran (their owner gone): recorded as skips."""
        ...

    def mark_in_hand(self, fire_time: float) -> bool:
        """Whether a mark of ours for ``fire_time`` may belong to work in hand here
        (a fire being decided, a claim between commit and launch)."""
        ...

    # -- failover -------------------------------------------------------------------

    def try_claim(self) -> None:
        """Claim and run orphaned items while worker slots are free (lane task)."""
        ...

    def queued_seen(self, items: Iterable[int]) -> None:
        """The failover queue holds ``items`` now (a listing replaces the hint)."""
        ...
