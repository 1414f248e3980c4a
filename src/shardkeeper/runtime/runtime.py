"""The runtime: one instance that runs any number of jobs on a fixed thread budget.

Threads, whatever the number of jobs: the store's own (one session, one event
thread, one watch on the whole namespace), the trigger scheduler's, a small
coordinator pool for registry work at triggers and events, a bounded worker pool
for the items, and one housekeeping thread (reconcile, failover retries). Start it
inside a service (``with Runtime(url) as rt: ...`` or ``rt.start()`` /
``rt.stop()``) or as a process (``shardkeeper run`` / :meth:`Runtime.run_forever`).

Graceful stop: triggers stop, running items get ``shutdown_grace`` seconds to
finish, then the instance leaves every job (the others reshard at their next
trigger) and closes its session. A second SIGTERM/SIGINT stops at once; the
items still running are then covered by failover.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from types import FrameType
from typing import Any

from shardkeeper._imports import import_object
from shardkeeper._version import __version__
from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import InstanceInfo, encode, new_instance_id
from shardkeeper.coordination.paths import (
    INSTANCES,
    instance_path,
    is_high_churn,
    parse_job_path,
    shutdown_path,
)
from shardkeeper.errors import ConfigError, JobConfigError, StoreError
from shardkeeper.job import JobListener, ShardedJob
from shardkeeper.registry import open_store
from shardkeeper.registry.base import (
    ConnectionState,
    CoordinationStore,
    Subscription,
    WatchEvent,
)
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.runtime.runner import JobRunner
from shardkeeper.scheduling.scheduler import TriggerScheduler

__all__ = ["Runtime"]

log = logging.getLogger(__name__)


class Runtime:
    """Runs sharded jobs for one instance (see module docstring).

    ``registry``: a registry URL, settings, an unstarted store, or None for the
    ``SHARDKEEPER_REGISTRY`` environment variable.
    """

    def __init__(
        self,
        registry: str | RegistrySettings | CoordinationStore | None = None,
        *,
        worker_threads: int = 8,
        coordinator_threads: int = 4,
        shutdown_grace: float = 30.0,
        labels: dict[str, str] | None = None,
        instance_id: str | None = None,
    ) -> None:
        if worker_threads < 1:
            raise ConfigError(f"worker_threads={worker_threads!r} must be >= 1")
        if coordinator_threads < 1:
            raise ConfigError(f"coordinator_threads={coordinator_threads!r} must be >= 1")
        if shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace={shutdown_grace!r} must be >= 0 seconds")
        self.store = registry if isinstance(registry, CoordinationStore) else open_store(registry)
        self.instance_id = instance_id or new_instance_id()
        self.shutdown_grace = shutdown_grace
        self._labels = dict(labels or {})
        self._worker_threads = worker_threads
        self._coordinator_threads = coordinator_threads
        self._specs: dict[str, tuple[JobConfig, ShardedJob, list[JobListener]]] = {}
        self._runners: dict[str, JobRunner] = {}
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._stopped = threading.Event()
        self._stopping = False
        self._subs: list[Subscription] = []
        self._sessions = 0
        self._workers: ThreadPoolExecutor | None = None
        self._coordinator: ThreadPoolExecutor | None = None
        self._scheduler: TriggerScheduler | None = None
        self._housekeeper: threading.Thread | None = None
        self._signals = 0
        self._last_contact = time.monotonic()

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
        instance = job() if isinstance(job, type) else job
        if not isinstance(instance, ShardedJob):
            raise ConfigError(f"{instance!r} is not a ShardedJob; subclass shardkeeper.ShardedJob")
        cfg = config or type(instance).config
        if cfg is None:
            raise JobConfigError(
                f"{type(instance).__qualname__} has no config: pass config=JobConfig(...) "
                "or set the class attribute config"
            )
        job_class = f"{type(instance).__module__}:{type(instance).__qualname__}"
        cfg = cfg.model_copy(update={"job_class": cfg.job_class or job_class})
        if cfg.name in self._specs:
            raise ConfigError(f"job {cfg.name!r} is added twice to this runtime")
        all_listeners = list(listeners) + [_load_listener(path) for path in cfg.listeners]
        self._specs[cfg.name] = (cfg, instance, all_listeners)
        return cfg

    @property
    def runners(self) -> dict[str, JobRunner]:
        """The job runners by job name (after start)."""
        return dict(self._runners)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> Runtime:
        """Connect, register every job, arm triggers. Raises on a bad config, a job
        conflict or an unreachable store (nothing is left running then)."""
        if self._started.is_set():
            return self
        if not self._specs:
            raise ConfigError("no job to run: add at least one job before start()")
        self._workers = ThreadPoolExecutor(self._worker_threads, thread_name_prefix="sk-worker")
        self._coordinator = ThreadPoolExecutor(
            self._coordinator_threads, thread_name_prefix="sk-coord"
        )
        self._scheduler = TriggerScheduler(self._on_fire)
        try:
            self.store.start()
            self._sessions = 1
            info = self._info()
            for name, (cfg, job, listeners) in self._specs.items():
                self._runners[name] = JobRunner(
                    store=self.store,
                    job=job,
                    config=cfg,
                    instance=info,
                    workers=self._workers,
                    submit=self._submit,
                    listeners=listeners,
                    liveness=self._session_fresh,
                )
                self._runners[name].on_config_change = self._config_changed
            # One watch for the whole namespace, established before we register so
            # that no change made after our registration can be missed. The
            # high-churn subtrees are left out (see paths.is_high_churn).
            self._subs.append(self.store.watch("/", self._on_event, exclude=is_high_churn))
            self._subs.append(self.store.add_state_listener(self._on_state))
            # Triggers are armed BEFORE we join: every fire after our membership's
            # join time is one we fire (the leader relies on it when resharding).
            self._scheduler.start()
            for runner in self.runners.values():
                self._scheduler.add_job(runner.config.name, runner.config)
            self._register_all()
        except BaseException:
            self._teardown()
            raise
        self._started.set()
        self._housekeeper = threading.Thread(
            target=self._housekeeping, name="sk-housekeeping", daemon=True
        )
        self._housekeeper.start()
        log.info("instance %s started with jobs %s", self.instance_id, sorted(self._specs))
        return self

    def _info(self) -> InstanceInfo:
        return InstanceInfo(
            instance_id=self.instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            started_at=time.time(),
            labels=self._labels,
            jobs=sorted(self._specs),
        )

    def _register_all(self) -> None:
        self.store.put(instance_path(self.instance_id), encode(self._info()), ephemeral=True)
        for runner in self.runners.values():
            runner.register()

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
        log.info("instance %s stopping (grace %.1fs)", self.instance_id, grace)
        if self._scheduler:
            self._scheduler.shutdown()
        for runner in self.runners.values():
            runner.begin_stop()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(r.running_count() for r in self.runners.values()):
            time.sleep(0.05)  # bounded by the grace period; items report through counters
        hard = any(r.running_count() for r in self.runners.values())
        if hard:
            log.warning(
                "grace period over: stopping with items still running (failover covers them)"
            )
            for runner in self.runners.values():
                runner.begin_stop(hard=True)
        if self.store.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            for runner in self.runners.values():
                runner.unregister()
            with contextlib.suppress(StoreError):
                self.store.delete(instance_path(self.instance_id), recursive=False)
        self._teardown()

    def stop_now(self) -> None:
        """Stop at once: running items are abandoned and failover covers them."""
        self.stop(grace=0)

    def _teardown(self) -> None:
        for sub in self._subs:
            sub.cancel()
        self._subs.clear()
        if self._scheduler:
            self._scheduler.shutdown()
        if self._coordinator:
            self._coordinator.shutdown(wait=False, cancel_futures=True)
        if self._workers:
            self._workers.shutdown(wait=False, cancel_futures=True)
        self.store.close()
        self._stopped.set()
        log.info("instance %s stopped", self.instance_id)

    @property
    def running(self) -> bool:
        """Started and not yet stopped."""
        return self._started.is_set() and not self._stopped.is_set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until the runtime has stopped (e.g. by a remote shutdown)."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_forever(self, *, install_signal_handlers: bool = True) -> None:
        """Start (if needed) and block until stopped. SIGTERM/SIGINT stop gracefully;
        a second signal stops at once."""
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
        target: Callable[[], None] = self.stop_now if hard else self.stop
        if hard:
            for runner in self.runners.values():
                runner.begin_stop(hard=True)
            self.shutdown_grace = 0
        threading.Thread(target=target, name="sk-stop", daemon=True).start()

    # -- plumbing -----------------------------------------------------------------

    def _submit(self, fn: Callable[[], None]) -> None:
        if self._coordinator is None or self._stopped.is_set():
            return
        # the pool may be shutting down while we stop: the task is then moot
        with contextlib.suppress(RuntimeError):
            self._coordinator.submit(self._guard, fn)

    @staticmethod
    def _guard(fn: Callable[[], Any]) -> None:
        # A store failure or a bug in one task must never kill the instance.
        try:
            fn()
        except StoreError as exc:
            log.warning("registry operation failed (will be retried later): %s", exc)
        except Exception:
            log.exception("coordination task failed")

    def _on_fire(self, job_name: str, fire_time: datetime) -> None:
        runner = self.runners.get(job_name)
        if runner is not None:
            self._submit(lambda: runner.on_trigger(fire_time))

    def _on_event(self, event: WatchEvent) -> None:
        parsed = parse_job_path(event.path)
        if parsed is not None:
            runner = self.runners.get(parsed[0])
            if runner is not None:
                runner.on_event(parsed[1], event)
            return
        if event.path == shutdown_path(self.instance_id) and event.value is not None:
            log.info("remote shutdown requested for %s", self.instance_id)
            self._submit(lambda: self.store.delete(shutdown_path(self.instance_id)))
            threading.Thread(target=self.stop, name="sk-stop", daemon=True).start()
        elif event.path == instance_path(self.instance_id) and event.value is None:
            if self.running and not self._stopping:
                self._submit(self._reput_instance)
        elif event.path == "/" or event.path == INSTANCES:
            for runner in self.runners.values():
                runner.on_event([], event)

    def _reput_instance(self) -> None:
        if self.store.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            self.store.put(instance_path(self.instance_id), encode(self._info()), ephemeral=True)

    def _on_state(self, state: ConnectionState) -> None:
        log.info("store connection: %s", state.value)
        for runner in self.runners.values():
            runner.on_state(state)
        if state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            # The server just answered with a live session. Without this, executions
            # started under a new session (after a freeze) were fenced until the next
            # probe: the last contact still dated from before the freeze. Executions
            # of the lost session stay fenced (LOST fenced them, and fencing is sticky).
            self._last_contact = time.monotonic()
        if state is ConnectionState.CONNECTED:
            self._sessions += 1
            if self._sessions > 1 and not self._stopping:
                # ElasticJob shuts down here; we re-register and resume.
                log.warning("new store session: re-registering %s", self.instance_id)
                self._submit(self._register_all)

    def _config_changed(self, runner: JobRunner, old: JobConfig) -> None:
        new = runner.config
        if self._scheduler and (
            new.cron != old.cron or new.interval != old.interval or new.time_zone != old.time_zone
        ):
            self._scheduler.remove_job(new.name)
            self._scheduler.add_job(new.name, new)

    def _session_fresh(self) -> bool:
        """False when the store has not answered for a whole session timeout: the
        session may have expired without us knowing yet (a frozen process, a long GC
        pause), so executions must assume they are fenced off."""
        return time.monotonic() - self._last_contact < self.store.session_timeout

    def _probe(self) -> None:
        before = time.monotonic()
        if self.store.state not in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            return
        session = self.store.session_id
        try:
            self.store.exists(instance_path(self.instance_id))
        except StoreError:
            return
        if self.store.session_id == session:
            self._last_contact = before

    def _housekeeping(self) -> None:
        tick = 0
        prev = time.monotonic()
        while not self._stopped.wait(1.0):
            tick += 1
            now = time.monotonic()
            if now - prev >= self.store.session_timeout:
                # We were frozen for a session timeout: assume the worst first.
                for runner in self.runners.values():
                    runner.fence_all()
                self._last_contact = min(self._last_contact, prev)
            prev = now
            self._probe()
            for runner in self.runners.values():
                if runner.reconcile_due():
                    self._submit(runner.reconcile)
                if runner.finish_pending():
                    self._submit(runner.retry_finish)
                if runner.claim_wanted():
                    self._submit(runner.try_claim)
                if tick % 600 == 0 and runner.election.is_leader:
                    self._submit(runner.prune_once_markers)

    def next_fire_time(self, job_name: str) -> datetime | None:
        """When the job fires next on this instance (None when unknown)."""
        return self._scheduler.next_fire_time(job_name) if self._scheduler else None


def _load_listener(path: str) -> JobListener:
    obj = import_object(path, "listener")
    listener = obj() if isinstance(obj, type) else obj
    if not isinstance(listener, JobListener):
        raise JobConfigError(f"listener {path!r} is not a shardkeeper.JobListener")
    return listener
