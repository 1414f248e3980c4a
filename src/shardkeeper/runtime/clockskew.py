"""``max_time_diff_seconds`` enforced: the clock monitor of one runtime.

Fire times come from each instance's own clock; an instance whose clock is far off
the others' fires its triggers at other moments under the same fire times. The
monitor measures this instance's offset against the store (registry/clock.py) when
the runtime starts (before it joins its jobs) and then on the housekeeping cadence,
every :data:`CLOCK_EVERY` seconds at most, never on the fire path. Only while some
job has the check on (``max_time_diff_seconds`` >= 1; ``-1``, the default, is off as
in ElasticJob): otherwise it sends nothing and changes nothing.

The rule, per job with the check on (docs/failover.md, "Clock skew"):

* **Skewed** once the offset is certainly past the limit: ``|offset| - error >
  limit``. The instance then starts none of the job's items (triggers, run-now
  requests, failover claims and misfire re-runs are skipped with the reason
  ``clock_skew``; items already running go on), gives up the job's leadership and
  runs for it no more, and writes the ephemeral mark ``/jobs/{job}/skewed/{id}``
  with the reshard flag in one commit: the leader leaves it out of the next
  assignment as it does a disabled instance, so its items run on the others.
  Until that commit succeeded the leader does not know: a failed one is made again
  at every housekeeping tick (and in every new session, which took the mark).
  A :class:`~shardkeeper.errors.ClockSkewError` naming the offset and the limit is
  logged as an ERROR.
* **Back** once the offset is certainly within it: ``|offset| + error <= limit``.
  The mark goes with the reshard flag in one commit; the next assignment includes
  the instance again. Between the two (a measurement too coarse to tell), the
  state stays as it is: a slow answer neither refuses nor restores an instance.

The monitor owns the offset, the skewed set and the clock node
``/control/clock/{id}`` (ephemeral: the latest sample, the limit and the skewed
jobs, which ``shardkeeper instances`` and the console show); each job's
``JobState.clock_skew`` is the flag it sets for the trigger to read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from shardkeeper.coordination.paths import clock_path
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.errors import ClockSkewError, StoreError
from shardkeeper.registry.base import CoordinationStore, Delete, Put
from shardkeeper.registry.clock import ClockSample, Sampler, clock_sampler

if TYPE_CHECKING:
    from shardkeeper.runtime.runner.runner import JobRunner

__all__ = ["CLOCK_EVERY", "ClockMonitor", "skew_verdict"]

log = logging.getLogger(__name__)

#: seconds between two measurements (at most one a housekeeping tick)
CLOCK_EVERY = 10.0


def skew_verdict(sample: ClockSample, limit: int, skewed: bool) -> bool:
    """Whether a job with ``max_time_diff_seconds=limit`` counts this instance as
    skewed after ``sample``, given whether it did before (``skewed``). A negative
    limit is off (never skewed). Entering needs the offset certainly past the limit,
    leaving needs it certainly within; an uncertain sample keeps the state."""
    if limit < 0:
        return False
    size = abs(sample.offset)
    if size - sample.error > limit:
        return True
    if size + sample.error <= limit:
        return False
    return skewed


class ClockMonitor:
    """Measures the offset and applies the rule to every job (module docstring).

    ``runners`` are the runtime's job runners; ``wall`` is this instance's clock (the
    seam tests shift); ``sampler`` overrides the store's (registry/clock.py)."""

    def __init__(
        self,
        store: CoordinationStore,
        instance_id: str,
        *,
        runners: Callable[[], list[JobRunner]],
        session_id: Callable[[], str],
        wall: Callable[[], float] = time.time,
        every: float = CLOCK_EVERY,
        sampler: Sampler | None = None,
    ) -> None:
        if every <= 0:
            raise ValueError(f"every={every!r} must be > 0 seconds")
        self._store = store
        self._me = instance_id
        self._runners = runners
        self._session_id = session_id
        #: seconds between two measurements (tests lower it)
        self.every = every
        self._sampler = sampler if sampler is not None else clock_sampler(store, wall)
        self._path = clock_path(instance_id)
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()
        self._due = 0.0  # monotonic time of the next measurement
        self._published = b""
        #: job name -> the session its skew mark was committed in: a skewed job
        #: without an entry for the current session is marked again at every pass
        #: until the commit succeeds (level-triggered: a failed commit is retried,
        #: and a new session, which took the ephemeral marks, gets them again)
        self._marked: dict[str, str] = {}
        self._published_session = ""
        self._warned_no_clock = False
        #: the latest sample (None before the first answered one)
        self.sample: ClockSample | None = None
        #: job name -> the error that keeps this instance from running its items
        self.skewed: dict[str, ClockSkewError] = {}

    # -- reading ----------------------------------------------------------------------

    def limits(self) -> dict[str, int]:
        """``max_time_diff_seconds`` of each job that has the check on."""
        return {
            r.name: r.config.max_time_diff_seconds
            for r in self._runners()
            if r.config.max_time_diff_seconds >= 0
        }

    def problems(self) -> list[str]:
        """One line per skewed job (readiness and health say why)."""
        with self._lock:
            return [str(err) for _job, err in sorted(self.skewed.items())]

    # -- the cadence ------------------------------------------------------------------

    def tick(self, *, force: bool = False) -> None:
        """Measure when due (``force``: now) and apply the rule. Called by the
        housekeeping thread every tick, and once at start before the jobs join (a
        tick while another runs is skipped; a forced one waits for it)."""
        if not self._tick_lock.acquire(blocking=force):
            return
        try:
            self._tick(force)
        finally:
            self._tick_lock.release()

    def _tick(self, force: bool) -> None:
        limits = self.limits()
        if not limits and not self.skewed:
            return  # the check is off everywhere: nothing is sent
        now = time.monotonic()
        if not force and now < self._due and self._marks_current():
            return
        self._due = now + self.every
        if self._sampler is None:
            if not self._warned_no_clock:
                self._warned_no_clock = True
                log.warning(
                    "%s: max_time_diff_seconds is set (jobs %s) but the store %s offers no "
                    "clock to compare with: the check is not enforced",
                    self._me,
                    ", ".join(sorted(limits)),
                    type(self._store).__name__,
                )
            return
        try:
            sample = self._sampler(self._path, self._published or b"{}")
        except StoreError as exc:
            # unknown, not skewed: the state stays as the last answer left it
            log.info("%s: clock sample failed: %s", self._me, exc)
            return
        self.apply(sample, limits)

    def apply(self, sample: ClockSample, limits: dict[str, int] | None = None) -> None:
        """Apply the rule to every job for ``sample`` (public for tests)."""
        if limits is None:
            limits = self.limits()
        self.sample = sample
        runners = {r.name: r for r in self._runners()}
        session = self._session_id()
        for name, runner in sorted(runners.items()):
            limit = limits.get(name, -1)
            was = name in self.skewed
            now = skew_verdict(sample, limit, was)
            if now and not was:
                self._enter(runner, sample, limit)
            elif was and not now:
                self._leave(runner, sample, limit)
            elif now and self._marked.get(name) != session:
                # not in the store for this session: a new session took the marks,
                # or the last commit of it failed
                self._mark(runner, sample, limit)
        for name in [n for n in self.skewed if n not in runners]:
            with self._lock:
                self.skewed.pop(name, None)
            self._marked.pop(name, None)
        self._publish(sample, limits)

    def _marks_current(self) -> bool:
        """Whether every skewed job's mark is committed in the current session (if
        not, the next tick measures and marks again without waiting for ``every``)."""
        session = self._session_id()
        with self._lock:
            skewed = list(self.skewed)
        return all(self._marked.get(name) == session for name in skewed)

    # -- transitions ------------------------------------------------------------------

    def _enter(self, runner: JobRunner, sample: ClockSample, limit: int) -> None:
        err = ClockSkewError(runner.name, sample.offset, sample.error, limit, sample.source)
        with self._lock:
            self.skewed[runner.name] = err
        runner.state.clock_skew = str(err)  # refused from now on, before any write
        log.error("%s", err)
        runner.submit("clock-resign", runner.election.resign)
        self._mark(runner, sample, limit)

    def _mark(self, runner: JobRunner, sample: ClockSample, limit: int) -> bool:
        """Commit the job's skew mark with the reshard flag; True once it is in the
        store (remembered for this session), False when the commit failed (the next
        tick tries again)."""
        session = self._session_id()
        doc = json.dumps({**sample.to_dict(), "limit": limit}, separators=(",", ":"))
        reason = f"instance clock skewed: {self._me} ({sample.offset:+.3f} s)"
        try:
            self._store.commit(
                [
                    Put(runner.paths.skewed(self._me), doc.encode(), ephemeral=True),
                    Put(runner.paths.necessary, necessary_value(reason)),
                ]
            )
        except StoreError as exc:
            self._marked.pop(runner.name, None)  # the next tick tries again
            log.warning(
                "%s: could not write the clock-skew mark (tried again at the next tick): %s",
                runner.name,
                exc,
            )
            return False
        self._marked[runner.name] = session
        return True

    def _leave(self, runner: JobRunner, sample: ClockSample, limit: int) -> None:
        reason = f"instance clock back in sync: {self._me} ({sample.offset:+.3f} s)"
        try:
            self._store.commit(
                [
                    Delete(runner.paths.skewed(self._me)),
                    Put(runner.paths.necessary, necessary_value(reason)),
                ]
            )
        except StoreError as exc:
            log.warning("%s: could not clear the clock-skew mark: %s", runner.name, exc)
            return  # still skewed for the leader: keep refusing, retry next tick
        with self._lock:
            self.skewed.pop(runner.name, None)
        self._marked.pop(runner.name, None)
        runner.state.clock_skew = None
        runner.request_repair()  # runs for leadership again, claims, etc.
        log.warning(
            "%s: clock back within max_time_diff_seconds=%d (offset %+.3f s ± %.3f s): "
            "running items again from the next assignment",
            runner.name,
            limit,
            sample.offset,
            sample.error,
        )

    def _publish(self, sample: ClockSample, limits: dict[str, int]) -> None:
        """Write the clock node when what it says changed (the skewed jobs, the limit,
        or the offset by more than its error); the ZooKeeper sampler rewrites it
        unchanged at each sample anyway."""
        with self._lock:
            skewed = sorted(self.skewed)
        doc = {
            **sample.to_dict(),
            "limit": min(limits.values()) if limits else -1,
            "skewed": skewed,
        }
        old = _parse(self._published) or {}
        offset = old.get("offset")
        if (
            old.get("skewed") == skewed
            and old.get("limit") == doc["limit"]
            and isinstance(offset, int | float)
            and abs(offset - sample.offset) <= max(sample.error, 0.05)
            and self._published_session == self._session_id()
        ):
            return
        value = json.dumps(doc, separators=(",", ":")).encode()
        try:
            self._store.put(self._path, value, ephemeral=True)
        except StoreError as exc:
            log.info("%s: could not publish the clock sample: %s", self._me, exc)
            return
        self._published = value
        self._published_session = self._session_id()


def _parse(value: bytes) -> dict[str, object] | None:
    try:
        doc = json.loads(value) if value else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
