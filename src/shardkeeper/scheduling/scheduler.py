"""When jobs fire: the one adapter around APScheduler 3 in shardkeeper.

:class:`TriggerScheduler` owns exactly one APScheduler ``BackgroundScheduler`` (one
thread that sleeps until the next due trigger) and a fixed pool of ``threads`` daemon
threads that deliver fires to a single callback. The number of threads is fixed when
the scheduler starts and never depends on the number of jobs: 10,000 jobs cost
10,000 trigger objects in memory and nothing else.

Delivery rules, the contract the runtime relies on:

* ``on_fire(job_name, scheduled_fire_time)`` is called once per fire, with the time the
  trigger was due (not the time it ran), timezone-aware, in the job's time zone.
* With a ``lead`` (the runtime's ``FIRE_LEAD``), the regular fires of cron and interval
  jobs are delivered that many seconds *before* they are due, still with their due
  time, so that the caller can prepare the fire (the runtime commits its start) and
  begin the work exactly at the due time. One-off jobs and :meth:`fire_now` are
  delivered on time. Lateness (the misfire rule below) is measured from the due time.
* Fires are coalesced: when the scheduler falls behind (the process was suspended, the
  machine slept, the pool was busy), the missed fires of a job collapse into ONE call
  with the latest missed time.
* Late fires: a job whose config has ``misfire`` on gets that one coalesced call however
  late it is (as ElasticJob makes up a missed trigger). A job with ``misfire`` off gets
  it only when it is at most :data:`MISFIRE_GRACE_SECONDS` late, and otherwise a
  WARNING, a call of ``on_missed(job_name, scheduled_fire_time)`` when given (what
  APScheduler reports as EVENT_JOB_MISSED), and nothing until its next regular fire.
* ``on_fire`` runs on the pool threads, never on the caller's thread, and at most
  ``threads`` calls run at once. It must return quickly (hand the work to an
  executor): while it runs it holds one of the few delivery threads, and the next
  fires of the same job are not held back for it, so a slow ``on_fire`` can be
  called again for the same job before the previous call has returned.
* An exception raised by ``on_fire`` is logged and does not stop later fires.
* A one-off job (``at``) is delivered once, at its time, only when that time is still
  ahead when the job is added (see ``triggers.OnceTrigger``); a time that has passed
  is the runtime's to catch up, not the scheduler's.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from apscheduler.executors.base import BaseExecutor
from apscheduler.jobstores.base import JobLookupError as _APJobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.base import BaseTrigger

from shardkeeper.errors import JobLookupError
from shardkeeper.scheduling.triggers import build_trigger, parse_cron, resolve_time_zone

if TYPE_CHECKING:
    from shardkeeper.config import JobConfig

__all__ = [
    "MISFIRE_GRACE_SECONDS",
    "FireCallback",
    "TriggerScheduler",
    "build_trigger",
    "parse_cron",
    "resolve_time_zone",
]

logger = logging.getLogger("shardkeeper.scheduling")

FireCallback = Callable[[str, datetime], None]
"""``on_fire(job_name, scheduled_fire_time)``: the one entry point called at each fire."""

MISFIRE_GRACE_SECONDS = 60  # APScheduler 3 wants an int here
"""How late a fire of a job with ``misfire`` off may be delivered (Quartz's default
misfire threshold); later ones are skipped until the next regular fire."""

# Fires of one job may overlap only when on_fire is slow; the cap exists because
# APScheduler needs one, and is high so that a fire is never silently dropped for it.
_MAX_INSTANCES = 10_000

_EXECUTOR_ALIAS = "default"


def _never_called() -> None:
    """APScheduler requires a callable per job; delivery goes through on_fire instead."""


# APScheduler checks the callable's arguments at every add_job with
# inspect.signature, which is slow; a ready __signature__ is what it finds first
_never_called.__signature__ = inspect.signature(_never_called)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _Fire:
    job_name: str
    run_times: list[datetime]
    grace: float | None
    counted: bool  # submitted through the executor, which counts running instances
    #: what the run times are early by (the scheduler's lead, for regular fires)
    early: timedelta = timedelta(0)


class _Ahead(BaseTrigger):  # type: ignore[misc]
    """``inner``'s fire times, each ``lead`` earlier (see ``TriggerScheduler``'s lead).

    APScheduler asks for the next fire after a previous one and at or after now; the
    answer is the inner trigger's next time after the previous one's due time and at or
    after ``now + lead``, moved back by ``lead``, so the inner trigger's own times are
    kept exactly. The first fire (no previous one: a job added, started or resumed) is
    the inner trigger's next time at or after now, even when it is due in less than
    ``lead``: it is then delivered at once, not skipped."""

    __slots__ = ("inner", "lead", "timezone")

    def __init__(self, inner: Any, lead: timedelta) -> None:
        self.inner = inner
        self.lead = lead
        self.timezone = inner.timezone

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        """The next due time (see the class docstring), minus ``lead``."""
        if previous_fire_time is None:
            due: datetime | None = self.inner.get_next_fire_time(None, now)
        else:
            due = self.inner.get_next_fire_time(previous_fire_time + self.lead, now + self.lead)
        return None if due is None else due - self.lead

    def __str__(self) -> str:
        return f"{self.inner} (delivered {self.lead.total_seconds():g}s ahead)"


class _FireExecutor(BaseExecutor):  # type: ignore[misc]
    """Hands due fires to the TriggerScheduler's fixed pool instead of a thread per job."""

    def __init__(self, enqueue: Callable[[_Fire], None]) -> None:
        super().__init__()
        self._enqueue = enqueue

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        # Called under APScheduler's job store lock: must not block.
        early = job.trigger.lead if isinstance(job.trigger, _Ahead) else timedelta(0)
        self._enqueue(_Fire(job.id, list(run_times), job.misfire_grace_time, True, early))

    def done(self, job_id: str) -> None:
        """Record that a counted fire of ``job_id`` has been delivered."""
        self._run_job_success(job_id, [])


_NEW, _STARTED, _STOPPED = "new", "started", "stopped"


def quiet_apscheduler() -> None:
    """Set APScheduler's logger to WARNING, unless the application configured it.

    Its INFO lines ("Adding job tentatively -- it will be properly scheduled when the
    scheduler starts", "Added job ...", "Scheduler started") describe this adapter's
    inner workings, not the user's jobs, and read like problems in ``run``'s output;
    its warnings and errors still show. A level or a handler set on the
    ``apscheduler`` logger (or a level on one of its children) is left alone.
    """
    quiet = logging.getLogger("apscheduler")
    if quiet.level == logging.NOTSET and not quiet.handlers:
        quiet.setLevel(logging.WARNING)


class TriggerScheduler:
    """Fires jobs on their cron, interval or one-off triggers with a fixed number of
    threads.

    Lifecycle: new -> :meth:`start` -> :meth:`shutdown` (final). Jobs may be added
    before start; they begin to fire when it starts. After shutdown the scheduler
    holds no jobs: :meth:`add_job` and :meth:`fire_now` raise RuntimeError,
    :meth:`remove_job` does nothing. All methods are thread-safe.
    See the module docstring for the delivery contract of ``on_fire``.
    """

    def __init__(
        self,
        on_fire: FireCallback,
        *,
        threads: int = 2,
        on_missed: FireCallback | None = None,
        lead: float = 0.0,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads={threads!r}: need at least 1 delivery thread")
        if not 0 <= lead <= 1:
            raise ValueError(f"lead={lead!r}: expected seconds from 0 to 1")
        #: regular fires of cron and interval jobs are delivered this much before
        #: they are due, with their due time (one-off jobs and fire_now: on time)
        self._lead = timedelta(seconds=lead)
        self._on_fire = on_fire
        self._on_missed = on_missed
        self._threads = threads
        self._queue: queue.SimpleQueue[_Fire | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._state = _NEW
        self._executor = _FireExecutor(self._queue.put)
        # The scheduler's own time zone only matters for its internal "now"; every
        # trigger carries the job's zone.
        #: one-off jobs: APScheduler forgets them after their one fire (or at once when
        #: their time has passed), which is not "unknown" to our callers
        self._one_off: set[str] = set()
        quiet_apscheduler()
        self._scheduler = BackgroundScheduler(
            executors={_EXECUTOR_ALIAS: self._executor},
            timezone=ZoneInfo("UTC"),
            daemon=True,
        )

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`shutdown`."""
        return self._state == _STARTED

    def start(self) -> None:
        """Start the scheduler thread and the delivery threads. Raises if shut down."""
        with self._lock:
            if self._state == _STARTED:
                return
            if self._state == _STOPPED:
                raise RuntimeError("TriggerScheduler was shut down; create a new one")
            for n in range(self._threads):
                worker = threading.Thread(
                    target=self._work, name=f"shardkeeper-fire-{n}", daemon=True
                )
                worker.start()
                self._workers.append(worker)
            self._scheduler.start()
            self._state = _STARTED

    def shutdown(self, timeout: float = 5.0) -> bool:
        """Stop firing; wait up to ``timeout`` seconds for the delivery threads to end.

        Fires not yet delivered are dropped; a call to ``on_fire`` in progress is not
        interrupted. Idempotent. Returns True when every thread has ended in time
        (they are daemon threads, so one stuck in ``on_fire`` cannot block exit).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            if self._state != _STARTED:
                self._state = _STOPPED
                self._closed.set()
                return all(not w.is_alive() for w in self._workers)
            self._state = _STOPPED
            self._closed.set()
        # wait=False: our executor holds no threads of APScheduler's; this only stops
        # and joins the one scheduler thread, which never runs user code.
        self._scheduler.shutdown(wait=False)
        for _ in self._workers:
            self._queue.put(None)
        current = threading.current_thread()
        for worker in self._workers:
            if worker is not current:
                worker.join(max(0.0, deadline - time.monotonic()))
        return all(not w.is_alive() for w in self._workers if w is not current)

    def add_job(self, name: str, config: JobConfig) -> None:
        """Schedule ``config``'s trigger under ``name``, replacing a job of that name.

        Raises :class:`~shardkeeper.errors.JobConfigError` for an invalid trigger.
        """
        trigger = build_trigger(config)
        if self._lead and config.at is None:
            trigger = _Ahead(trigger, self._lead)
        with self._lock:
            if self._state == _STOPPED:
                raise RuntimeError("TriggerScheduler was shut down; cannot add jobs")
            self._scheduler.add_job(
                _never_called,
                trigger=trigger,
                id=name,
                name=name,
                executor=_EXECUTOR_ALIAS,
                coalesce=True,
                max_instances=_MAX_INSTANCES,
                misfire_grace_time=None if config.misfire else MISFIRE_GRACE_SECONDS,
                replace_existing=True,
            )
            if config.at is not None:
                self._one_off.add(name)
            else:
                self._one_off.discard(name)

    def remove_job(self, name: str) -> None:
        """Stop firing ``name`` and forget it. Raises JobLookupError when unknown.

        After :meth:`shutdown` it does nothing, so teardown may run in any order.
        """
        if self._state == _STOPPED:
            return
        try:
            self._scheduler.remove_job(name)
        except _APJobLookupError:
            if name not in self._one_off:
                raise JobLookupError(name) from None
        finally:
            self._one_off.discard(name)

    def pause_job(self, name: str) -> None:
        """Stop firing ``name`` until :meth:`resume_job` (fires in between are skipped)."""
        try:
            self._scheduler.pause_job(name)
        except _APJobLookupError:
            raise JobLookupError(name) from None

    def resume_job(self, name: str) -> None:
        """Fire ``name`` again from its next due time after now (no catch-up)."""
        try:
            self._scheduler.resume_job(name)
        except _APJobLookupError:
            raise JobLookupError(name) from None

    def has_job(self, name: str) -> bool:
        """True when a job called ``name`` is scheduled (paused or not; a one-off job
        also after its one fire)."""
        return self._scheduler.get_job(name) is not None or name in self._one_off

    def job_names(self) -> list[str]:
        """The names of every scheduled job, sorted."""
        return sorted(job.id for job in self._scheduler.get_jobs())

    def next_fire_time(self, name: str) -> datetime | None:
        """When ``name`` fires next (aware), or None while paused or when it never will.

        Raises :class:`~shardkeeper.errors.JobLookupError` when unknown.
        """
        job = self._scheduler.get_job(name)
        if job is None:
            if name in self._one_off:
                return None  # a one-off job that fired (or whose time passed)
            raise JobLookupError(name)
        if not hasattr(job, "next_run_time"):
            # Added before start: APScheduler computes it only when it starts.
            now = datetime.now(job.trigger.timezone)
            next_run: datetime | None = job.trigger.get_next_fire_time(None, now)
        else:
            next_run = job.next_run_time
        if next_run is not None and isinstance(job.trigger, _Ahead):
            next_run += job.trigger.lead  # when it is due, not when it is delivered
        return next_run

    def fire_now(self, name: str) -> None:
        """Call ``on_fire(name, now)`` once, soon, on a delivery thread (not this one).

        Does not change the job's regular fires. Raises JobLookupError when unknown and
        RuntimeError when the scheduler is not running.
        """
        with self._lock:
            if self._state != _STARTED:
                raise RuntimeError(f"TriggerScheduler is {self._state}; cannot fire {name!r}")
            job = self._scheduler.get_job(name)
            if job is None and name not in self._one_off:
                raise JobLookupError(name)
            now = datetime.now(job.trigger.timezone if job is not None else ZoneInfo("UTC"))
            self._queue.put(_Fire(name, [now], None, False))

    def _work(self) -> None:
        while True:
            fire = self._queue.get()
            if fire is None:
                return
            try:
                if not self._closed.is_set():
                    self._deliver(fire)
            finally:
                if fire.counted:
                    self._executor.done(fire.job_name)

    def _missed(self, job_name: str, run_time: datetime) -> None:
        if self._on_missed is None:
            return
        try:
            self._on_missed(job_name, run_time)
        except Exception:
            logger.exception("job %r: on_missed raised for the fire due at %s", job_name, run_time)

    def _deliver(self, fire: _Fire) -> None:
        for early_time in fire.run_times:
            run_time = early_time + fire.early  # the time the fire is due
            if fire.grace is not None:
                late = datetime.now(run_time.tzinfo) - run_time
                if late > timedelta(seconds=fire.grace):
                    logger.warning(
                        "job %r: skipped the fire due at %s, %.1f s late "
                        "(misfire is off and the grace time is %g s)",
                        fire.job_name,
                        run_time.isoformat(),
                        late.total_seconds(),
                        fire.grace,
                    )
                    self._missed(fire.job_name, run_time)
                    continue
            try:
                self._on_fire(fire.job_name, run_time)
            except Exception:
                logger.exception(
                    "job %r: on_fire raised for the fire due at %s",
                    fire.job_name,
                    run_time.isoformat(),
                )
