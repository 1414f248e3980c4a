"""What the runtime tells observers: one record per item execution, one per skip.

Observers are how history, metrics and alerting see executions without sitting on
the trigger path. The runtime calls them on the worker thread that ran the item (for
an execution) or on the job's coordination lane (for a skip), so an observer must
return at once: hand the record to a queue of its own and do slow work elsewhere.
Whatever an observer does, including raising, the item's outcome and the store are
unaffected (:class:`Observers` catches and logs).
"""

from __future__ import annotations

import enum
import logging
import threading
import traceback as tb
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

__all__ = [
    "ExecutionObserver",
    "ExecutionRecord",
    "Observers",
    "Outcome",
    "SkipRecord",
    "format_traceback",
]

log = logging.getLogger(__name__)

#: Longest traceback text kept in a record (the tail is kept: it names the raise site).
TRACEBACK_LIMIT = 8_000
#: Longest error message kept in a record.
MESSAGE_LIMIT = 1_000


class Outcome(enum.StrEnum):
    """How one item execution ended."""

    OK = "ok"
    """``execute`` returned."""
    FAILED = "failed"
    """``execute`` raised."""
    FENCED = "fenced"
    """The execution was fenced off (session lost, membership removed) before or
    while it ran; the item is handed to failover and runs again elsewhere."""
    SKIPPED = "skipped"
    """The item was not run for this fire (its trigger was skipped)."""
    TIMED_OUT = "timed_out"
    """``execute`` ran longer than the job's execution timeout."""
    INTERRUPTED = "interrupted"
    """``execute`` returned after ``ctx.should_stop()`` told it to stop (the instance
    was stopping): its work may be unfinished, so the item runs again (failover on:
    elsewhere at once; off: at its owner's next fire)."""
    CRASHED = "crashed"
    """The process running ``execute`` died under it. A worker process
    (``executor="process"``: a signal, ``os._exit``, an out-of-memory kill): the error
    names the exit status, and the item is retried per its ``retries``, then handed
    to failover once (failover on, and this run was not a failover run itself). Or
    the whole instance (``kill -9``, a lost machine, a freeze past its session): the
    job's leader records that run when it finds its running mark orphaned
    (:attr:`ExecutionRecord.reported_by`), ended at that moment, and queues the item
    for failover (failover on)."""


@dataclass(frozen=True)
class ExecutionRecord:
    """The outcome of one execution of one item (times are epoch seconds, UTC)."""

    job: str
    item: int
    fire_time: float
    execution_id: str
    instance: str
    started: float
    ended: float
    outcome: Outcome
    failover: bool = False
    misfire: bool = False
    fencing_token: int = 0
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    #: which run of the item for this fire (1, or more with ``retries``)
    attempt: int = 1
    #: fire times this run stood for (``ctx.covers``: no run started them)
    covers: tuple[float, ...] = ()
    #: how many more, older fires it stood for without listing them
    #: (``ctx.covered_before``: a gap longer than ``covers`` lists)
    covered_before: int = 0
    #: the run's last ``ctx.progress`` report as JSON (done, total, note, at), for a
    #: run that did not end ok (failed, timed out, fenced, interrupted); "" otherwise
    progress: str = ""
    #: which registry and namespace the run happened in (``CoordinationStore.identity``;
    #: the runtime's :class:`Observers` fills it in, "" when not known)
    scope: str = ""
    #: a failover run: the instance whose cut-off run of the item it took over
    #: ("" otherwise)
    taken_over_from: str = ""
    #: the checkpoint a re-run resumed from, when it read one (``ctx.resume_state``):
    #: its number, writer and time, and the state's start ("" when none)
    resumed_from: str = ""
    #: "" when :attr:`instance` itself reports the run; else the instance that
    #: recorded a run it did not run (the leader that found a dead instance's run
    #: cut off: outcome ``crashed``, ended when it was found)
    reported_by: str = ""

    @property
    def duration(self) -> float:
        """Seconds the execution took (0 when it never started)."""
        return max(0.0, self.ended - self.started)


@dataclass(frozen=True)
class SkipRecord:
    """A trigger that did not run here (APScheduler missed it, the job or instance
    was disabled, the store could not be reached in time, ...)."""

    job: str
    fire_time: float
    instance: str
    reason: str
    items: tuple[int, ...] = ()
    #: as :attr:`ExecutionRecord.scope`
    scope: str = ""
    #: the reason in words when ``reason`` (a :class:`SkipReason` value, kept for
    #: machines) says less than what happened: ``"item disabled by an operator"``
    #: for the items an operator disabled, whose ``reason`` is the job's
    #: ``"job disabled"``; empty otherwise. The history's ``error_message``.
    message: str = ""


@runtime_checkable
class ExecutionObserver(Protocol):
    """Receives execution and skip records. Both methods must return at once."""

    def on_execution(self, record: ExecutionRecord) -> None:
        """One item execution ended (any outcome)."""

    def on_skip(self, record: SkipRecord) -> None:
        """A trigger was skipped on this instance."""


def format_traceback(exc: BaseException) -> tuple[str, str, str]:
    """(type name, message, traceback text) of ``exc``, each bounded in size."""
    text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    if len(text) > TRACEBACK_LIMIT:
        text = "...\n" + text[-TRACEBACK_LIMIT:]
    message = str(exc)
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "..."
    return type(exc).__qualname__, message, text


class Observers:
    """A fan-out over observers that never raises: a failing observer is logged
    (once per observer and kind of failure, so a broken one cannot flood the log).

    ``scope`` (the runtime's registry and namespace) is written into every record
    that has none, so that an observer shared by deployments (one history database)
    can tell their records apart without being told where it runs."""

    def __init__(self, observers: Iterable[ExecutionObserver] = (), *, scope: str = "") -> None:
        self._observers = list(observers)
        self.scope = scope
        self._lock = threading.Lock()
        self._warned: set[tuple[int, str]] = set()

    def add(self, observer: ExecutionObserver) -> None:
        """Add ``observer`` (it sees records from now on)."""
        with self._lock:
            self._observers = [*self._observers, observer]

    def __bool__(self) -> bool:
        return bool(self._observers)

    def on_execution(self, record: ExecutionRecord) -> None:
        """Pass ``record`` (with the scope filled in) to every observer."""
        if self.scope and not record.scope:
            record = replace(record, scope=self.scope)
        for obs in self._observers:
            try:
                obs.on_execution(record)
            except Exception as exc:
                self._warn(obs, exc)

    def on_skip(self, record: SkipRecord) -> None:
        """Pass ``record`` (with the scope filled in) to every observer."""
        if self.scope and not record.scope:
            record = replace(record, scope=self.scope)
        for obs in self._observers:
            try:
                obs.on_skip(record)
            except Exception as exc:
                self._warn(obs, exc)

    def _warn(self, obs: ExecutionObserver, exc: Exception) -> None:
        key = (id(obs), type(exc).__name__)
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.error("observer %r failed (further failures of this kind not logged): %r", obs, exc)
