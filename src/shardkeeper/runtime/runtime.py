"""The runtime: one instance that runs any number of jobs on a fixed thread budget.

Threads, whatever the number of jobs: the store's own (one session, one event
thread, one watch on the whole namespace), the trigger scheduler's, a small
coordinator pool on which every job has its own serial *lane* (runtime/execute/pool.py),
a lanes timer, a bounded worker pool for the items, one housekeeping thread and
one gray-link guard (runtime/health/graylink.py: an instance whose requests go unanswered
for a session timeout while its session lives fences itself, gives up its session
so that the others take over, and rejoins once a probe commit is answered).
Start it inside a service (``rt.add_job(...)`` then ``with rt: ...`` or
``rt.start()`` / ``rt.stop()``) or as a process (``shardkeeper run`` /
:meth:`Runtime.run_forever`).

Start-up registers the instance and every job in a few batched commits
(runtime/registration.py); housekeeping then probes the store every T/3 and queues
the repair passes of the jobs due (runtime/housekeeping.py).

Graceful stop: triggers stop, running items get ``shutdown_grace`` seconds to
finish, then the instance leaves every job (the others reshard at their next
trigger) and closes its session. Running items are not told to stop when the stop
begins: ``ctx.should_stop()`` turns true only ``shutdown_notice`` seconds before the
grace period ends (reason ``StopReason.SHUTDOWN``, "shutdown grace ending"), so that
an item that polls it finishes if it can, and checkpoints and returns in time if it
cannot. A second SIGTERM/SIGINT stops at once and ends the process even while an
``execute()`` hangs (worker threads are daemons): its running mark stays
(persistent with failover on) and, the instance's membership being gone, the leader
hands the item to failover.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from types import FrameType
from typing import TYPE_CHECKING

from shardkeeper._imports import needs_extra
from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import new_instance_id
from shardkeeper.coordination.paths import (
    INSTANCES,
    instance_path,
    is_high_churn,
    parse_job_path,
    shutdown_path,
)
from shardkeeper.errors import (
    ConfigError,
    JobLookupError,
    StoreError,
)
from shardkeeper.job import JobListener, ShardedJob, StopReason
from shardkeeper.observe import ExecutionObserver, Observers, SkipRecord
from shardkeeper.registry import open_store
from shardkeeper.registry.base import (
    ConnectionState,
    CoordinationStore,
    Subscription,
    WatchEvent,
)
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.runtime.clockskew import ClockMonitor
from shardkeeper.runtime.execute.batch import FIRE_LEAD
from shardkeeper.runtime.execute.pool import Lanes, WorkerPool, guarded
from shardkeeper.runtime.execute.procpool import Executors
from shardkeeper.runtime.fire.skiplog import SkipLog
from shardkeeper.runtime.gcpause import collection_paused
from shardkeeper.runtime.health.commithealth import CommitHealth
from shardkeeper.runtime.health.commitwatch import CommitWatch
from shardkeeper.runtime.health.graylink import GrayLinkGuard
from shardkeeper.runtime.health.liveness import Liveness, check_session_timeout
from shardkeeper.runtime.housekeeping import Housekeeper
from shardkeeper.runtime.job.jobstate import SkipReason
from shardkeeper.runtime.registration import (
    JobSpec,
    Registrar,
    build_runners,
    instance_info,
    job_spec,
)
from shardkeeper.runtime.runner.runner import JobRunner
from shardkeeper.scheduling.scheduler import TriggerScheduler

if TYPE_CHECKING:  # prometheus_client is the optional 'metrics' extra: see __init__
    from shardkeeper.metrics import RuntimeMetrics
    from shardkeeper.metrics_http import MetricsServer

__all__ = ["Runtime", "shutdown_notice_for"]

log = logging.getLogger(__name__)

#: the default ``shutdown_notice``: this share of the grace period, at most
#: NOTICE_MAX seconds (30 s of grace: items told to stop 5 s before its end)
NOTICE_SHARE = 0.2
NOTICE_MAX = 5.0


def shutdown_notice_for(grace: float, notice: float | None) -> float:
    """Seconds before the end of a ``grace`` period at which running items are told
    to stop: ``notice`` (None: NOTICE_SHARE of the grace, at most NOTICE_MAX), never
    more than the grace itself."""
    if notice is None:
        notice = min(NOTICE_MAX, grace * NOTICE_SHARE)
    return max(0.0, min(notice, grace))


class Runtime:
    """Runs sharded jobs for one instance (see module docstring).

    ``registry``: a registry URL, settings, an unstarted store, or None for the
    ``SHARDKEEPER_REGISTRY`` environment variable. ``observers`` receive a record of
    every item execution and skipped trigger (:mod:`shardkeeper.observe`).
    ``metrics_port`` (0 = any free port) serves ``/metrics``, ``/healthz`` and
    ``/readyz`` on ``metrics_host`` while the runtime runs (:mod:`shardkeeper.metrics`;
    needs the ``metrics`` extra, a one-line ConfigError naming it otherwise).
    ``shutdown_grace`` is how long a graceful stop lets running items finish;
    ``shutdown_notice`` how many seconds before its end they are told to stop
    (``ctx.should_stop()``, reason ``StopReason.SHUTDOWN``) so that they can
    checkpoint and return in time (None: a fifth of the grace, at most 5 s).
    ``wall_clock`` is this instance's clock as the ``max_time_diff_seconds`` check
    compares it with the store's (:mod:`shardkeeper.runtime.clockskew`; tests shift
    it; the triggers keep the system clock).
    ``executor`` is where the items of jobs whose config names none run: ``thread``
    (the default) or ``process`` (worker processes, runtime/execute/procpool.py, which
    ``max_items_per_child``, ``max_memory_per_child`` in KiB and
    ``process_start_method``, forkserver or spawn, tune).
    """

    def __init__(
        self,
        registry: str | RegistrySettings | CoordinationStore | None = None,
        *,
        worker_threads: int = 8,
        coordinator_threads: int = 4,
        shutdown_grace: float = 30.0,
        shutdown_notice: float | None = None,
        labels: dict[str, str] | None = None,
        instance_id: str | None = None,
        observers: Iterable[ExecutionObserver] = (),
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        wall_clock: Callable[[], float] = time.time,
        executor: str = "thread",
        max_items_per_child: int = 0,
        max_memory_per_child: int = 0,
        process_start_method: str | None = None,
    ) -> None:
        if worker_threads < 1:
            raise ConfigError(f"worker_threads={worker_threads!r} must be >= 1")
        if coordinator_threads < 1:
            raise ConfigError(f"coordinator_threads={coordinator_threads!r} must be >= 1")
        if not shutdown_grace >= 0:  # NaN too
            raise ConfigError(f"shutdown_grace={shutdown_grace!r} must be >= 0 seconds")
        if shutdown_notice is not None and not shutdown_notice >= 0:
            raise ConfigError(
                f"shutdown_notice={shutdown_notice!r} must be >= 0 seconds (or None: a "
                "fifth of the grace period, at most 5 s)"
            )
        self.store = registry if isinstance(registry, CoordinationStore) else open_store(registry)
        self.instance_id = instance_id or new_instance_id()
        self.shutdown_grace = shutdown_grace
        self.shutdown_notice = shutdown_notice
        self._labels = dict(labels or {})
        self._worker_threads = worker_threads
        self._coordinator_threads = coordinator_threads
        self._specs: dict[str, JobSpec] = {}
        #: thread or worker processes, per job (runtime/execute/procpool.py)
        self.executors = Executors(
            executor,
            idle=worker_threads,
            max_items_per_child=max_items_per_child,
            max_memory_per_child=max_memory_per_child,
            start_method=process_start_method,
        )
        self._runners: dict[str, JobRunner] = {}
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._subs: list[Subscription] = []
        self._sessions = 0
        self._workers: WorkerPool | None = None
        self._coordinator: WorkerPool | None = None
        self._lanes: Lanes | None = None
        self._scheduler: TriggerScheduler | None = None
        self._housekeeper: Housekeeper | None = None
        self._signals = 0
        #: registers the instance and its jobs (built at start)
        self.registrar: Registrar | None = None
        self.liveness = Liveness(self.store)
        #: whether this instance's commits are answered (runtime/health/graylink.py); the
        #: runners and the registrar write through ``_coord``, which reports to it
        self.commit_health = CommitHealth(lambda: self.store.session_timeout)
        self._coord = CommitWatch(self.store, self.commit_health)
        self._graylink: GrayLinkGuard | None = None
        self.skips = SkipLog()
        #: execution and skip observers (history, metrics, alerts): add before start;
        #: every record carries this instance's registry and namespace (its scope)
        self.observers = Observers(observers, scope=self.store.identity())
        self._hard = False
        #: this instance's clock as the clock-skew check reads it (tests shift it)
        self._wall_clock = wall_clock
        #: max_time_diff_seconds enforced (runtime/clockskew.py; built at start)
        self.clock: ClockMonitor | None = None
        #: Prometheus metrics and their HTTP server (None without ``metrics_port``)
        self.metrics: RuntimeMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        if metrics_port is not None:
            # imported here: prometheus_client is the optional 'metrics' extra
            with needs_extra("metrics", "metrics_port (the /metrics endpoint)"):
                from shardkeeper.metrics import RuntimeMetrics
                from shardkeeper.metrics_http import MetricsServer, readiness
            self.metrics = RuntimeMetrics(self)
            self.observers.add(self.metrics)
            self.metrics_server = MetricsServer(
                self.metrics.registry,
                lambda: readiness(self),
                port=metrics_port,
                host=metrics_host,
            )

    # -- jobs ---------------------------------------------------------------------

    def add_job(
        self,
        job: ShardedJob | type[ShardedJob],
        config: JobConfig | None = None,
        *,
        listeners: Iterable[JobListener] = (),
    ) -> JobConfig:
        """Add a job (before :meth:`start`). The config comes from the argument or the
        class attribute ``config``; the job class is recorded in it."""
        if self._started.is_set():
            raise ConfigError("add jobs before Runtime.start()")
        spec = job_spec(job, config, listeners)
        if spec.config.name in self._specs:
            raise ConfigError(f"job {spec.config.name!r} is added twice to this runtime")
        self.executors.add(spec.config.name, job, spec.config)
        self._specs[spec.config.name] = spec
        return spec.config

    @property
    def runners(self) -> dict[str, JobRunner]:
        """The job runners by job name (after start)."""
        return dict(self._runners)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> Runtime:
        """Connect, register every job, arm triggers. Raises on a bad config, a job
        conflict, a session timeout too short, or an unreachable store (nothing is
        left running then). A job whose registration fails on a store error is
        retried by housekeeping instead."""
        if self._started.is_set():
            return self
        if not self._specs:
            raise ConfigError("no job to run: add at least one job before start()")
        self._workers = workers = WorkerPool(self._worker_threads, "sk-worker")
        self._coordinator = WorkerPool(self._coordinator_threads, "sk-coord")
        self._lanes = lanes = Lanes(self._coordinator, on_store_error=self._lane_store_error)
        self._scheduler = scheduler = TriggerScheduler(
            self._on_fire, on_missed=self._on_missed, lead=FIRE_LEAD
        )
        with collection_paused():  # thousands of long-lived objects a job: gcpause.py
            self._start(workers, lanes, scheduler)
        self._started.set()
        names = sorted(self._specs)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        log.info("instance %s started with %d jobs: %s", self.instance_id, len(names), shown)
        return self

    def _start(self, workers: WorkerPool, lanes: Lanes, scheduler: TriggerScheduler) -> None:
        """The body of :meth:`start`: connect, register, arm (torn down on failure)."""
        try:
            if self.metrics_server is not None:
                self.metrics_server.start()  # /healthz answers during start-up
            self.store.start()
            check_session_timeout(self.store.session_timeout)
            self.liveness.contact()
            self._sessions = 1
            self.registrar = Registrar(
                self._coord, instance_info(self.instance_id, self._labels, list(self._specs))
            )
            self._runners = build_runners(
                self._specs,
                self._coord,
                self.registrar.info,
                workers=workers,
                lanes=lanes,
                fresh=self.liveness.fresh,
                session=self._session_id,
                on_skip=self.skips.record,
                observers=self.observers,
                executors=self.executors.select,
            )
            for runner in self._runners.values():
                runner.on_config_change = self._config_changed
                runner.on_retire = self._retired
            self.clock = ClockMonitor(
                self.store,
                self.instance_id,
                runners=lambda: list(self._runners.values()),
                session_id=self._session_id,
                wall=self._wall_clock,
            )
            # One watch for the whole namespace, established before we register so
            # that no change made after our registration can be missed. The
            # high-churn subtrees are left out (see paths.is_high_churn).
            self._subs.append(self.store.watch("/", self._on_event, exclude=is_high_churn))
            self._subs.append(self.store.add_state_listener(self._on_state))
            # Housekeeping probes from now on: registering many jobs can take longer
            # than the session timeout, and without probes meanwhile the freshness
            # clock would fence every execution started during start-up. (It repairs
            # nothing before start() returns: the registrar registers every job.)
            self._housekeeper = Housekeeper(
                self.store,
                self.liveness,
                self.instance_id,
                runners=self._housekept,
                started=self._started,
                stopped=self._stopped,
                stopping=lambda: self._stopping,
                reput_instance=lambda: self._spawn(self._reput_instance),
                session_id=self._session_id,
                skips=self.skips,
                clock=self.clock.tick,
                stalls=lanes.report_stalls,
            )
            self._housekeeper.start()
            self._graylink = GrayLinkGuard(
                self.store,
                self.commit_health,
                self.instance_id,
                cadence=lambda: self.liveness.cadence,
                stopped=self._stopped,
                active=lambda: self._started.is_set() and not self._stopping,
                fence=self._fence_all,
                rejoin=self._rejoin,
            )
            self._subs.append(self.store.add_state_listener(self._graylink.on_state))
            self._graylink.start()
            # Triggers are armed BEFORE we join: every fire after our membership's
            # join time is one we fire (the leader relies on it when resharding).
            # Added before the scheduler starts, they are armed together as it starts
            # (one wake-up of its thread, not one a job: 0.6-0.9 s of CPU for 5,000).
            for runner in self.runners.values():
                scheduler.add_job(runner.config.name, runner.config)
            scheduler.start()
            # measured before joining: a skewed instance is never given items
            self.clock.tick(force=True)
            self.registrar.register_all(list(self._runners.values()))
        except BaseException:
            self._teardown()
            raise

    def _housekept(self) -> list[JobRunner]:
        """The runners housekeeping probes and repairs: none while the session is
        given up for unanswered commits (their writes are held; all is fenced)."""
        if not self.commit_health.writes_allowed:
            return []
        return list(self._runners.values())

    def _fence_all(self) -> None:
        for runner in self.runners.values():
            runner.fence_all()

    def _rejoin(self) -> None:
        """After a relinquished session: what a new session does (see _on_state)."""
        if self._stopping:
            return
        self._spawn(self._reput_instance)
        for runner in self.runners.values():
            runner.request_repair()

    def _session_id(self) -> str:
        try:
            return self.store.session_id
        except Exception:  # between sessions: no identity
            return ""

    def heartbeat_lateness(self) -> tuple[float, float] | None:
        """(last, largest) seconds the housekeeping thread woke late, or None before
        start (see :meth:`Housekeeper.note_wake`)."""
        hk = self._housekeeper
        return None if hk is None else (hk.lateness, hk.max_lateness)

    def stop(self, grace: float | None = None) -> None:
        """Stop gracefully (idempotent; blocks up to the grace period + a few seconds)."""
        with self._lock:
            if self._stopping:
                self._stopped.wait(timeout=(grace or self.shutdown_grace) + 15)
                return
            self._stopping = True
        grace = self.shutdown_grace if grace is None else grace
        if not self._started.is_set():
            self._teardown()
            return
        notice = shutdown_notice_for(grace, self.shutdown_notice)
        log.info(
            "instance %s stopping (grace %.1fs; running items told to stop %.1fs before its end)",
            self.instance_id,
            grace,
            notice,
        )
        if self._scheduler:
            self._scheduler.shutdown()
        began = time.monotonic()
        deadline = began + grace
        # Running items go on: they are told to stop (ctx.should_stop()) only as the
        # grace runs out, in time to checkpoint and return. Told at once, every item
        # that polls should_stop() as the docs teach was interrupted and failed over
        # on every deploy although it could have finished (newcomer review N8).
        told_at = deadline - notice
        for runner in self.runners.values():
            runner.begin_stop(notice_at=told_at)
        told = False
        # Fires from before the stop are still decided (bounded by their deadline)
        # and their items run: they are this instance's, nobody else runs them.
        while time.monotonic() < deadline and any(r.stop_pending() for r in self.runners.values()):
            if not told and time.monotonic() >= told_at:
                told = True
                self._log_told(deadline - time.monotonic())
            if self._stopped.wait(0.05):  # bounded by the grace period
                return
        hard = any(r.running_count() for r in self.runners.values())
        if hard:
            log.warning(
                "grace period over: stopping with items still running (failover covers them)"
            )
            for runner in self.runners.values():
                runner.begin_stop(hard=True)
        self._leave()

    def _log_told(self, left: float) -> None:
        """The grace period is running out: say which jobs' items are told to stop."""
        busy = sorted(r.name for r in self.runners.values() if r.running_count())
        if busy:
            log.info(
                "instance %s: grace period ends in %.1fs: running items of %s told to stop (%s)",
                self.instance_id,
                max(0.0, left),
                ", ".join(busy),
                StopReason.SHUTDOWN.value,
            )

    def stop_now(self) -> None:
        """Stop at once: running items are abandoned and failover covers them."""
        self.stop(grace=0)

    def _lane_store_error(self, lane: str) -> None:
        runner = self._runners.get(lane)
        if runner is not None:
            runner.state.count("store_errors")

    def _teardown(self) -> None:
        for sub in self._subs:
            sub.cancel()
        self._subs.clear()
        if self._scheduler:
            self._scheduler.shutdown()
        if self._lanes:
            self._lanes.close()
        if self._coordinator:
            self._coordinator.shutdown()
        if self._workers:
            self._workers.shutdown()
        self.executors.shutdown()
        self.skips.flush(force=True)
        if self._housekeeper is not None:
            # a probe in flight must return before the client closes its channel
            self._housekeeper.halt(self.store.session_timeout + 1.0)
        self.store.close()
        self._stopped.set()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        log.info("instance %s stopped", self.instance_id)

    @property
    def running(self) -> bool:
        """Started and not yet stopped."""
        return self._started.is_set() and not self._stopped.is_set()

    @property
    def stopping(self) -> bool:
        """A stop has begun (graceful or not)."""
        return self._stopping

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the runtime has stopped (e.g. by a remote shutdown)."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_forever(self, *, install_signal_handlers: bool = True) -> None:
        """Start (if needed) and block until stopped. SIGTERM/SIGINT stop gracefully;
        a second signal stops at once (the process can then exit even while an item
        hangs: worker threads are daemons)."""
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        while not self._stopped.wait(0.5):
            pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        hard = self._signals > 1
        log.info("signal %d: %s stop", signum, "immediate" if hard else "graceful")
        if hard:
            self._hard = True
            for runner in self.runners.values():
                runner.begin_stop(hard=True)
            self.shutdown_grace = 0
            if self._stopping:
                # the graceful stop is under way (maybe waiting on a hung item):
                # finish it now from here; nothing else will
                threading.Thread(target=self._leave, name="sk-stop", daemon=True).start()
                return
        target: Callable[[], None] = self.stop_now if hard else self.stop
        threading.Thread(target=target, name="sk-stop", daemon=True).start()

    def _leave(self) -> None:
        """Leave every job and the instance list (when connected), then tear down."""
        if self.store.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            for runner in self.runners.values():
                runner.unregister()
            with contextlib.suppress(StoreError):
                self.store.delete(instance_path(self.instance_id), recursive=False)
        self._teardown()

    # -- plumbing -----------------------------------------------------------------

    def _on_fire(self, job_name: str, fire_time: datetime) -> None:
        runner = self._runners.get(job_name)
        if runner is not None:
            runner.on_trigger(fire_time)

    def _on_missed(self, job_name: str, fire_time: datetime) -> None:
        """The scheduler dropped a late fire (misfire off): a skip like any other."""
        runner = self._runners.get(job_name)
        if runner is None:
            return
        runner.state.count("skipped")
        self.observers.on_skip(
            SkipRecord(
                job=job_name,
                fire_time=fire_time.timestamp(),
                instance=self.instance_id,
                reason=SkipReason.MISSED.value,
            )
        )

    def _on_event(self, event: WatchEvent) -> None:
        if self.registrar is not None and self.registrar.own_write(event):
            return  # a config this instance created at start-up: nothing changed
        parsed = parse_job_path(event.path)
        if parsed is not None:
            runner = self._runners.get(parsed[0])
            if runner is not None:
                runner.on_event(event)
            return
        if event.path == shutdown_path(self.instance_id) and event.value is not None:
            log.info("remote shutdown requested for %s", self.instance_id)
            self._spawn(lambda: self.store.delete(shutdown_path(self.instance_id)))
            threading.Thread(target=self.stop, name="sk-stop", daemon=True).start()
        elif event.path == instance_path(self.instance_id) and event.value is None:
            if self.running and not self._stopping:
                self._spawn(self._reput_instance)
        elif event.path == "/" or event.path == INSTANCES:
            for runner in self.runners.values():
                runner.request_repair()

    def _spawn(self, fn: Callable[[], None]) -> None:
        """Process-level work (not of one job) on the coordinator pool."""
        if self._coordinator is not None and not self._stopped.is_set():
            self._coordinator.submit(lambda: guarded(fn, "instance"))

    def _reput_instance(self) -> None:
        if self.registrar is not None and self.commit_health.writes_allowed:
            self.registrar.reput_instance()

    def _on_state(self, state: ConnectionState) -> None:
        log.info("store connection: %s", state.value)
        if state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            # A live session again: probe at once rather than count this as contact.
            # The event may be delivered long after the store saw the reconnection
            # (the event thread delivers in order, behind slow drains and listeners),
            # and the link may have dropped again meanwhile: "now" would stretch the
            # freshness clock past the session's end. The probe's send time cannot.
            # (On etcd the clock follows the lease keep-alives: the probe only checks
            # the instance node.) Executions of a lost session stay fenced (LOST
            # fenced them, fencing is sticky; a batch remembers its session).
            housekeeper = self._housekeeper
            if housekeeper is not None:
                self._spawn(housekeeper.probe)
        for runner in self.runners.values():
            runner.on_state(state)
        if state is ConnectionState.CONNECTED:
            self._sessions += 1
            if self._sessions > 1 and not self._stopping:
                # ElasticJob shuts down here; we re-register and resume. Each job
                # registers on its own lane and is retried until it succeeds.
                log.warning("new store session: re-registering %s", self.instance_id)
                self._spawn(self._reput_instance)
                for runner in self.runners.values():
                    runner.request_repair()

    def _retired(self, runner: JobRunner) -> None:
        if self._scheduler:
            with contextlib.suppress(JobLookupError):
                self._scheduler.remove_job(runner.name)

    def _config_changed(self, runner: JobRunner, old: JobConfig) -> None:
        new = runner.config
        if self._scheduler and (
            new.cron != old.cron
            or new.interval != old.interval
            or new.at != old.at
            or new.time_zone != old.time_zone
        ):
            self._scheduler.remove_job(new.name)
            self._scheduler.add_job(new.name, new)

    def next_fire_time(self, job_name: str) -> datetime | None:
        """When the job fires next on this instance (None when unknown)."""
        return self._scheduler.next_fire_time(job_name) if self._scheduler else None
