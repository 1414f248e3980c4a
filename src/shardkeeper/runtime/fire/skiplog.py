"""Skipped triggers, logged as state changes and summaries instead of one line each.

While the store is down every job skips every fire: one WARNING per job per fire
was about 105 lines/s at 500 jobs. Here the first skip for a reason is logged with
its job, and later ones are counted and summarised once per ``window`` seconds
until a window passes without that reason (then the next one is logged again).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from shardkeeper.runtime.fire.trigger import fmt_fire
from shardkeeper.runtime.job.jobstate import SkipReason

__all__ = ["SkipLog"]

log = logging.getLogger("shardkeeper.runtime")


class SkipLog:
    """Aggregates skipped triggers (module docstring)."""

    def __init__(self, window: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._active: set[SkipReason] = set()
        self._counts: Counter[SkipReason] = Counter()
        self._jobs: dict[SkipReason, set[str]] = {}
        self._since = clock()
        self.logged = 0

    def record(self, job: str, reason: SkipReason, fire: float, detail: str) -> None:
        """A trigger of ``job`` at ``fire`` was skipped for ``reason``."""
        with self._lock:
            first = reason not in self._active
            self._active.add(reason)
            self._counts[reason] += 1
            self._jobs.setdefault(reason, set()).add(job)
        if first:
            self.logged += 1
            log.warning(
                "%s: trigger at %s skipped: %s%s (further skips for this reason are "
                "summarised every %.0fs)",
                job,
                fmt_fire(fire),
                reason.value,
                detail,
                self._window,
            )
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Log the summary if the window is over (called by housekeeping too)."""
        with self._lock:
            now = self._clock()
            if not force and now - self._since < self._window:
                return
            counts, jobs = self._counts, self._jobs
            self._counts, self._jobs = Counter(), {}
            self._since = now
            # a reason with no skip in the window is over: its next skip is news
            self._active = {r for r in self._active if counts.get(r)}
        for reason, n in sorted(counts.items(), key=lambda kv: kv[0].name):
            if n <= 1:
                continue
            self.logged += 1
            log.warning(
                "%d triggers of %d jobs skipped in the last %.0fs: %s",
                n,
                len(jobs.get(reason, ())),
                self._window,
                reason.value,
            )
