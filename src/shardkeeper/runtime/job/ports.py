"""What a job's parts ask of their runner: one small Protocol per part, named for
what that part needs. The runner (:class:`~shardkeeper.runtime.runner.runner.JobRunner`)
composes the parts and implements every one of them; each part's constructor takes
its own, so what a part may call back is read off its signature.

* :class:`JobLane` (``fire.fires.Fires``): the job's lane, a repair pass or a
  claim on it, and how many items run here;
* :class:`JobLifecycle` (``runner.settings.JobSettings``): retire the job, or tell
  the runtime its stored config changed;
* :class:`MembershipAndClaims` (``runner.repair.RepairPass``): register again,
  re-read, fence, and the failover claim loop.

None of the parts imports the runner. Calls from a part into a sibling part go
through these too, so the wiring of one job is all in ``runner.py``. (The
trigger's and the batches' back-edges are callables their constructors name.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from shardkeeper.config import JobConfig

__all__ = ["ClaimLoop", "JobLane", "JobLifecycle", "MembershipAndClaims"]


class ClaimLoop(Protocol):
    """The failover claim loop, which both the fire queue and the repair pass start."""

    def try_claim(self) -> None:
        """Claim and run orphaned items while worker slots are free (lane task)."""
        ...


class JobLane(ClaimLoop, Protocol):
    """What the fire queue asks of its runner: work on the job's lane (its own pump,
    a repair pass, a failover claim) and the count of items running here."""

    def submit(self, key: str | None, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the job's lane (merged with a queued task of the same key)."""
        ...

    def request_repair(self) -> None:
        """Run a housekeeping pass on the lane soon."""
        ...

    def running_count(self) -> int:
        """Items executing or starting here."""
        ...


class JobLifecycle(Protocol):
    """What the stored settings ask of their runner: the job's end here, and the
    runtime told of a new config."""

    def retire(self, why: str) -> None:
        """Stop running the job on this instance (it was removed)."""
        ...

    def config_changed(self, old: JobConfig) -> None:
        """The stored config replaced ``old`` (the runtime reschedules the trigger)."""
        ...


class MembershipAndClaims(ClaimLoop, Protocol):
    """What the repair pass asks of its runner: the job's membership set right (join
    again, re-read, fence) and the failover claim loop fed and started."""

    def register_logged(self) -> None:
        """Register the job, logging a failure (the next pass retries it)."""
        ...

    def reload(self) -> None:
        """Re-read the job's switches and stored config (lane task)."""
        ...

    def fence(self, why: str) -> None:
        """Fence every execution in progress, logging ``why`` if any was."""
        ...

    def batch_done(self) -> None:
        """Marks were settled: a misfire re-run or a failover claim may be due."""
        ...

    def mark_in_hand(self, fire_time: float) -> bool:
        """Whether a mark of ours for ``fire_time`` may belong to work in hand here
        (a fire being decided, a claim between commit and launch)."""
        ...

    def queued_seen(self, items: Iterable[int]) -> None:
        """The failover queue holds ``items`` now (a listing replaces the hint)."""
        ...
