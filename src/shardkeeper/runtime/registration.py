"""Start-up: the jobs' runners, and the registration of the instance and all its
jobs in a few batched commits.

Registering a job one by one costs a dozen requests (config create-if-absent, the
membership node, the switches, the reshard flag, the running marks, the election and
the new leader's reads): 5,000 jobs took most of a minute. At start-up most of an
instance's jobs are usually either all new (a fresh namespace, a new deployment) or
all known, so the registrar asks the store once which jobs exist (one listing of
``/jobs``) and then:

* a job that is **not stored yet** joins in a batched commit of
  ``max_ops_per_commit // 6`` jobs (21 on etcd, 682 on ZooKeeper; fewer when their
  config documents would pass the store's ``max_commit_bytes``), 5 operations each::

      Check(/jobs/{job}, exists=False)        nothing of the job exists (no config,
                                              switch, mark, assignment or member)
      Create(/jobs/{job}/config, doc)         this instance's config, as sync() writes it
      Put(/jobs/{job}/instances/{me}, E)      the membership
      Put(/jobs/{job}/necessary, reason)      reshard at the first trigger
      Create(/jobs/{job}/leader, me, E)       leader election: create-if-absent

  Three conditions a job (an absence each): the batch size lets each take its exact
  form on etcd (two compares of at most 128), so a batch is one request there; the
  two Puts add none (the absence check covers them).

  The absence check makes the commit decide exactly what a one-by-one registration
  would have found: no stored config (so no drift and no class conflict), no switch,
  no stray running mark, no leader. Nothing needs reading afterwards: the commit's
  revision is the membership's created_revision (the fencing of start commits), and
  the leader node created is ours.
* a job that **is stored** (or any job when the listing fails) registers one by one
  as before (``JobRunner.register``): its stored config wins over the code's, with the
  drift warning; a different job class or an invalid stored config refuses the start.
  These come first, so a start that is refused has written nothing for the new jobs.

A batch commit that fails (another instance registered one of its jobs meanwhile, an
operator created a switch) lists ``/jobs`` again and retries without the jobs that now
exist, which register one by one. A batch whose commit raises a store error has an
unknown outcome: its jobs stay unregistered and the housekeeping pass registers each
one (``register`` is idempotent against a commit that did apply: the config is ours,
the membership is re-put, the leader node already names us). After a few failed
batches in a row the rest is left to housekeeping too: the store is not answering.

The config document a batch wrote comes back as a CREATED watch event; the runtime
asks :meth:`Registrar.own_write` and does not re-read a config it wrote itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from shardkeeper._imports import import_object, is_import_path
from shardkeeper._version import __version__
from shardkeeper.config import JobConfig
from shardkeeper.config.timing import check_fire_deadline, request_bound
from shardkeeper.coordination.config_service import ConfigService, instance_writer
from shardkeeper.coordination.model import InstanceInfo, encode
from shardkeeper.coordination.paths import JOBS, instance_path
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.errors import ConfigError, JobConfigError, JobConflictError, StoreError
from shardkeeper.job import DataflowJob, JobListener, ScriptJob, ShardedJob
from shardkeeper.observe import Observers
from shardkeeper.registry import batching
from shardkeeper.registry.base import (
    Check,
    ConnectionState,
    CoordinationStore,
    Create,
    EventKind,
    Op,
    Put,
    WatchEvent,
)
from shardkeeper.registry.packing import pack_groups
from shardkeeper.runtime.execute.pool import Lanes, WorkerPool
from shardkeeper.runtime.fire.fires import SkipSink
from shardkeeper.runtime.fire.skipevents import ListenerSkips, wants_skips
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.runtime.runner.runner import JobRunner

if TYPE_CHECKING:
    from shardkeeper.runtime.execute.procpool import RunOnce

__all__ = ["OPS_PER_JOB", "JobSpec", "Registrar", "build_runners", "instance_info", "job_spec"]

log = logging.getLogger(__name__)

#: operations a new job adds to a batch commit (module docstring)
OPS_PER_JOB = 5
#: commit conditions a new job adds (each an absence: two compares on etcd)
_CONDITIONS_PER_JOB = 3
#: commits of one batch (each after a failed one lists ``/jobs`` again)
_BATCH_ATTEMPTS = 4
#: batches in a row whose commit raised before the rest is left to housekeeping
_FAILED_BATCHES = 3


def instance_info(instance_id: str, labels: dict[str, str], jobs: Sequence[str]) -> InstanceInfo:
    """The metadata of this process as ``/instances/{id}`` holds it."""
    return InstanceInfo(
        instance_id=instance_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        version=__version__,
        started_at=time.time(),
        labels=labels,
        jobs=sorted(jobs),
    )


class Registrar:
    """Registers this instance and its jobs (see module docstring)."""

    def __init__(self, store: CoordinationStore, info: InstanceInfo) -> None:
        self._store = store
        self.info = info
        self._me = info.instance_id
        self._by = instance_writer()  # asked once: gethostname() is slow on some hosts
        #: config path -> hash of the document a batch created there (until its event)
        self._own_docs: dict[str, int] = {}
        #: job -> the config document its batch writes (during register_all only)
        self._docs: dict[str, bytes] = {}
        #: commits and jobs of :meth:`register_all` (logs, tests, benchmarks)
        self.stats: dict[str, int] = {"batch_commits": 0, "batched": 0, "one_by_one": 0}
        #: seconds :meth:`register_all` took
        self.seconds = 0.0

    # -- the instance node ----------------------------------------------------------

    def put_instance(self) -> None:
        """Write ``/instances/{id}`` (ephemeral)."""
        self._store.put(instance_path(self._me), encode(self.info), ephemeral=True)

    def reput_instance(self) -> None:
        """Write the instance node again if the store is connected (it went away)."""
        if self._store.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            self.put_instance()

    # -- jobs -----------------------------------------------------------------------

    def register_all(self, runners: Sequence[JobRunner]) -> None:
        """Register the instance and every job at start-up. Raises JobConflictError or
        JobConfigError for a stored job this instance can never run; a store failure
        leaves the jobs concerned to the housekeeping pass."""
        # Triggers are armed before this runs, and a fire is delivered ahead of its
        # time: a fire of a job whose turn has not come yet waits for its registration
        # (bounded by the fire's deadline) instead of being skipped as not registered.
        for runner in runners:
            runner.registration_pending()
        try:
            self._register_all(runners)
        finally:
            # none is left waiting (each was registered, failed or left by now)
            for runner in runners:
                runner.registration_left("start-up registration ended without it")

    def _register_all(self, runners: Sequence[JobRunner]) -> None:
        began = time.monotonic()
        with contextlib.suppress(StoreError):
            self.put_instance()
        listed = self._listed()
        if listed is None:
            known, new = list(runners), []
        else:
            known = [r for r in runners if r.name in listed]
            new = [r for r in runners if r.name not in listed]
        for runner in known:
            self._register_one(runner)
        # In an empty namespace even /jobs is missing: a first batch of one job makes
        # it (a commit finds the parents of its new subtrees in one read, and /jobs
        # would otherwise be the missing parent of every absence check of the batch)
        limit = batching.max_ops_per_commit(self._store)
        size = max(1, min(limit // OPS_PER_JOB, limit // (2 * _CONDITIONS_PER_JOB)))
        first = 1 if not listed else size
        failed_in_row = 0
        at = 0
        while at < len(new):
            # as many as the count allows, fewer when their documents are large
            batch = self._fitting(new[at : at + (first if at == 0 else size)])
            chunk = batch.runners
            at += len(chunk)
            if failed_in_row >= _FAILED_BATCHES:
                self._leave(chunk, "the store did not answer the earlier batches")
                continue
            try:
                aside = self._register_batch(batch)
            except StoreError as exc:
                failed_in_row += 1
                self._leave(chunk, str(exc))
                continue
            failed_in_row = 0
            for runner in aside:
                self._register_one(runner)
        self._docs.clear()
        self.seconds = time.monotonic() - began
        log.info(
            "%s registered %d jobs in %.1fs: %d in %d batch commits, %d one by one",
            self._me,
            len(runners),
            self.seconds,
            self.stats["batched"],
            self.stats["batch_commits"],
            self.stats["one_by_one"],
        )

    def _listed(self) -> set[str] | None:
        try:
            return set(self._store.children(JOBS))
        except StoreError as exc:
            log.warning("could not list the stored jobs (registering one by one): %s", exc)
            return None

    def _register_one(self, runner: JobRunner) -> None:
        self.stats["one_by_one"] += 1
        try:
            runner.register()
        except (JobConflictError, JobConfigError):
            raise
        except StoreError as exc:
            log.warning("%s: registration failed (retried by housekeeping): %s", runner.name, exc)

    def _leave(self, runners: Sequence[JobRunner], why: str) -> None:
        """Leave ``runners`` unregistered: the housekeeping pass registers each."""
        log.warning(
            "batch registration of %d jobs (%s ... %s) failed (retried by housekeeping): %s",
            len(runners),
            runners[0].name,
            runners[-1].name,
            why,
        )
        for runner in runners:
            runner.registration_left(why)

    def _doc(self, runner: JobRunner) -> bytes:
        """The config document a batch writes for ``runner`` (made once: a batch that
        is cut to fit, or retried, reuses it)."""
        doc = self._docs.get(runner.name)
        if doc is None:
            doc = self._docs[runner.name] = ConfigService.initial_document(runner.config, self._by)
        return doc

    def _fitting(self, runners: Sequence[JobRunner]) -> _Batch:
        """The leading ``runners`` whose registration fits in one commit by the store's
        byte limit as well (large config documents: item parameters, descriptions),
        with the operations that register them (built once: the commit uses them)."""
        groups, joined_at = self._groups(runners)
        if batching.max_commit_bytes(self._store) is not None and len(runners) > 1:
            groups = groups[: len(pack_groups(self._store, groups)[0][0])]
        return _Batch(list(runners[: len(groups)]), [op for g in groups for op in g], joined_at)

    def _groups(self, runners: Sequence[JobRunner]) -> tuple[list[list[Op]], float]:
        """The operations registering each of ``runners``, and the join time their
        membership nodes carry (now)."""
        joined_at = time.time()
        member = encode(dataclasses.replace(self.info, jobs=[], started_at=joined_at))
        return [self._ops(r, self._doc(r), member) for r in runners], joined_at

    def _register_batch(self, batch: _Batch) -> list[JobRunner]:
        """Register new jobs in one commit; returns the jobs that turned out to exist
        (to register one by one). Raises StoreError when a commit's outcome is unknown."""
        pending = batch.runners
        aside: list[JobRunner] = []
        for attempt in range(_BATCH_ATTEMPTS):
            if not pending:
                return aside
            if attempt == 0:
                ops, joined_at = batch.ops, batch.joined_at
            else:  # fewer jobs than the batch that fitted, and a join time of now
                groups, joined_at = self._groups(pending)
                ops = [op for g in groups for op in g]
            for r in pending:
                # known before the commit: its events may arrive before it returns
                # (each still registering since register_all: a fire waits meanwhile)
                self._own_docs[r.paths.config] = hash(self._doc(r))
            result = None
            try:
                result = self._store.commit(ops)
                self.stats["batch_commits"] += 1
                if result:
                    for r in pending:
                        r.adopt_batch_registration(result.revision, joined_at)
            finally:
                for r in pending:
                    if result is None or not result:
                        # nothing written (or unknown: then a re-read is right)
                        self._own_docs.pop(r.paths.config, None)
            if result:
                self.stats["batched"] += len(pending)
                return aside
            # someone else wrote into one of these jobs meanwhile: which ones now exist?
            listed = self._store.children(JOBS)
            failed = next((r for r in pending if _inside(result.failed_path, r)), None)
            taken = [r for r in pending if r.name in listed or r is failed]
            if not taken:
                break  # nothing explains the failure: one by one is always right
            aside += taken
            pending = [r for r in pending if r not in taken]
        return aside + pending

    def _ops(self, runner: JobRunner, doc: bytes, member: bytes) -> list[Op]:
        p = runner.paths
        return [
            Check(p.root, exists=False),
            Create(p.config, doc),
            Put(p.instance(self._me), member, ephemeral=True),
            Put(p.necessary, necessary_value(f"instance joined: {self._me}")),
            Create(p.leader, self._me.encode(), ephemeral=True),
        ]

    def own_write(self, event: WatchEvent) -> bool:
        """Whether ``event`` reports a config document a batch of this registrar
        created (then nothing changed for the job: no re-read). Each is recognised
        once; a later write of the config is a change like any other."""
        if event.kind is not EventKind.CREATED or event.value is None:
            return False
        expected = self._own_docs.get(event.path)
        if expected is None or expected != hash(event.value):
            return False
        del self._own_docs[event.path]
        return True


@dataclass
class _Batch:
    """New jobs registered in one commit: the runners, the commit's operations and
    the join time their membership nodes carry."""

    runners: list[JobRunner]
    ops: list[Op]
    joined_at: float


def _inside(path: str | None, runner: JobRunner) -> bool:
    root = runner.paths.root
    return path is not None and (path == root or path.startswith(root + "/"))


class JobSpec(NamedTuple):
    """A job as :meth:`Runtime.add_job` records it (the job class filled in)."""

    config: JobConfig
    job: ShardedJob
    listeners: list[JobListener]


def job_spec(
    job: ShardedJob | type[ShardedJob],
    config: JobConfig | None,
    listeners: Iterable[JobListener] = (),
) -> JobSpec:
    """Validate what :meth:`Runtime.add_job` was given: the config comes from the
    argument or the class attribute ``config``; the job class is recorded in it; the
    config's listeners (import paths) are loaded."""
    instance = job() if isinstance(job, type) else job
    if not isinstance(instance, ShardedJob):
        raise ConfigError(f"{instance!r} is not a ShardedJob; subclass shardkeeper.ShardedJob")
    cfg = config or type(instance).config
    if cfg is None:
        raise JobConfigError(
            f"{type(instance).__qualname__} has no config: pass config=JobConfig(...) "
            "or set the class attribute config"
        )
    _check_implemented(instance)
    job_class = cfg.job_class or _import_path(type(instance))
    # model_copy does not validate: the path is checked here, as every other instance
    # checks it when it reads the stored config (JobConfig's job_class validator)
    cfg = cfg.model_copy(update={"job_class": job_class})
    loaded = list(listeners) + [_load_listener(path) for path in cfg.listeners]
    return JobSpec(cfg, instance, loaded)


def _import_path(cls: type[ShardedJob]) -> str:
    """``module:Class``, the job class as the stored config records it; JobConfigError
    when no other process could import the class by it."""
    path = f"{cls.__module__}:{cls.__qualname__}"
    if "<locals>" in cls.__qualname__:
        outer = cls.__qualname__.partition(".<locals>")[0]
        raise JobConfigError(
            f"job class {path!r} is defined inside the function {outer!r}: no other "
            "instance can import it, and each would refuse the stored job; define the "
            f"class at the top level of module {cls.__module__!r}, or give its import "
            "path in the config (job_class='package.module:Class')"
        )
    if not is_import_path(path):
        raise JobConfigError(
            f"job class {path!r} is not importable by that path; define it at the top "
            "level of a module, or give its import path in the config "
            "(job_class='package.module:Class')"
        )
    return path


def _check_implemented(job: ShardedJob) -> None:
    """Refuse a job that would fail every item of every fire: a ShardedJob that does
    not define execute(ctx) (nor run_item), a DataflowJob without fetch_data and
    process_data, a ScriptJob without a command. JobConfigError naming the class and
    the method to write."""
    cls = type(job)
    name = f"{cls.__module__}:{cls.__qualname__}"
    if {"execute", "run_item"} & set(getattr(job, "__dict__", {})):
        return  # given to the instance itself (job.execute = ...)
    if isinstance(job, ScriptJob):
        if not job.command:
            raise JobConfigError(
                f"job class {name!r} has no command: set the class attribute command "
                "(an argv list, or a string split by the shell's rules)"
            )
        return
    if isinstance(job, DataflowJob):
        if cls.run_item is DataflowJob.run_item:
            missing = [
                f"{m}(self, ctx{', data' if m == 'process_data' else ''})"
                for m in ("fetch_data", "process_data")
                if getattr(cls, m) is getattr(DataflowJob, m)
            ]
            if missing:
                raise JobConfigError(
                    f"job class {name!r} does not define {' and '.join(missing)}: a "
                    "DataflowJob subclass must define both (they would fail every item)"
                )
        return
    if cls.execute is ShardedJob.execute and cls.run_item is ShardedJob.run_item:
        raise JobConfigError(
            f"job class {name!r} does not define execute(self, ctx): a ShardedJob "
            "subclass must (it handles one item; it may be async def); without it "
            "every item would fail at every fire"
        )


def _load_listener(path: str) -> JobListener:
    obj = import_object(path, "listener")
    listener = obj() if isinstance(obj, type) else obj
    if not isinstance(listener, JobListener):
        raise JobConfigError(f"listener {path!r} is not a shardkeeper.JobListener")
    return listener


def build_runners(
    specs: Mapping[str, JobSpec],
    store: CoordinationStore,
    info: InstanceInfo,
    *,
    workers: WorkerPool,
    lanes: Lanes,
    fresh: Callable[[], bool],
    session: Callable[[], str],
    on_skip: SkipSink,
    observers: Observers,
    executors: Callable[[str], Callable[[JobConfig], RunOnce]] | None = None,
) -> dict[str, JobRunner]:
    """One runner per job, sharing the runtime's pools, clocks and observers. Jobs
    whose listeners want skipped triggers get them through one more observer, added
    first (the runners keep the observers they are given). Raises JobConfigError
    for a job whose fire deadline cannot hold a timed-out start commit and its retry
    on this store (``config/timing.py``)."""
    for name, spec in specs.items():
        check_fire_deadline(name, spec.config.sharding_wait_timeout, request_bound(store))
    skip_listeners = {name: spec.listeners for name, spec in specs.items()}
    if any(wants_skips(x) for found in skip_listeners.values() for x in found):
        observers.add(ListenerSkips(skip_listeners))
    return {
        name: JobRunner(
            services=JobServices.build(store, name, info.instance_id),
            job=spec.job,
            config=spec.config,
            instance=info,
            workers=workers,
            lanes=lanes,
            listeners=spec.listeners,
            fresh=fresh,
            session=session,
            on_skip=on_skip,
            observers=observers,
            executor=executors(name) if executors is not None else None,
        )
        for name, spec in specs.items()
    }
