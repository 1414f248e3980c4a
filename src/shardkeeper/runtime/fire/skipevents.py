"""Delivers skipped triggers to the jobs' listeners (:meth:`JobListener.on_skipped`).

An execution observer (:mod:`shardkeeper.observe`) that the runtime registers when a
listener of one of its jobs overrides ``on_skipped``: the runner reports every skip
to its observers, and this one hands it to the listeners of that job.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from shardkeeper.job import JobListener
from shardkeeper.observe import ExecutionRecord, SkipRecord

__all__ = ["ListenerSkips", "wants_skips"]

log = logging.getLogger(__name__)


def wants_skips(listener: JobListener) -> bool:
    """Whether ``listener`` overrides :meth:`JobListener.on_skipped`."""
    return type(listener).on_skipped is not JobListener.on_skipped


class ListenerSkips:
    """Passes each skip record to the listeners of its job that want skips."""

    def __init__(self, listeners: Mapping[str, Sequence[JobListener]]) -> None:
        self._listeners = {
            job: [x for x in found if wants_skips(x)] for job, found in listeners.items()
        }

    def on_execution(self, record: ExecutionRecord) -> None:
        """Executions are not a listener's business here (before/after_job are)."""

    def on_skip(self, record: SkipRecord) -> None:
        """Call ``on_skipped`` of the job's listeners; a listener that raises is logged."""
        for listener in self._listeners.get(record.job, ()):
            try:
                listener.on_skipped(record)
            except Exception:
                log.exception("%s: listener %r failed on a skipped trigger", record.job, listener)
