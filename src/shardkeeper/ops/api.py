"""The operations API: inspect and steer running jobs through the registry.

Everything here works by reading and writing the nodes described in
:mod:`shardkeeper.coordination.paths`; the running instances watch those nodes and
react (run now, switches, remote shutdown, config changes). Nothing needs the jobs'
code, so it runs anywhere the registry is reachable::

    with Operations.connect("zk://zk1:2181/my-app") as ops:
        for job in ops.jobs():
            print(job.name, job.instances, job.next_fire)
        ops.disable_item("order-sync", 3)
        ops.trigger("order-sync")

Errors: an unknown job raises :class:`~shardkeeper.errors.JobLookupError`, an
unknown instance :class:`~shardkeeper.errors.InstanceLookupError`, an item out of
range :class:`~shardkeeper.errors.ConfigError` (naming the valid range), and a
request the current state forbids :class:`~shardkeeper.errors.OperationRefusedError`.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from collections.abc import Mapping
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import ConfigService, StoredConfig
from shardkeeper.coordination.model import encode
from shardkeeper.coordination.paths import (
    INSTANCES,
    JOBS,
    JobPaths,
    instance_path,
    shutdown_path,
)
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.errors import (
    ConfigError,
    InstanceLookupError,
    JobLookupError,
    OperationRefusedError,
)
from shardkeeper.ops.health import JobHealth, assess
from shardkeeper.ops.state import JobState, instance_info, next_fire, read_jobs
from shardkeeper.ops.views import (
    DumpEntry,
    InstanceView,
    ItemView,
    JobDetail,
    JobStatus,
    JobSummary,
    Overview,
)
from shardkeeper.registry import open_store
from shardkeeper.registry.base import (
    Check,
    CoordinationStore,
    Delete,
    Op,
    Put,
    check_path,
)
from shardkeeper.registry.url import RegistrySettings

__all__ = ["Operations", "config_to_dict"]

# Same rules as JobConfig names / instance ids: anything else cannot be a node name,
# so it is reported as unknown instead of as an invalid path.
_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}\Z")
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9._@:=+\-]+\Z")


def _operator() -> str:
    return f"shardkeeper-ops@{socket.gethostname().split('.')[0] or 'host'}"


def _stamp(action: str, **extra: Any) -> bytes:
    # Who and when, for a person reading the node with zkCli/etcdctl (a trigger
    # request's "at" and "params" are also read by the instances).
    return encode({"by": _operator(), "at": time.time(), "action": action, **extra})


#: a one-off trigger parameter's name
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
#: the most bytes a trigger request's parameters may take
MAX_TRIGGER_PARAMS_BYTES = 8192


def check_trigger_params(params: Mapping[str, str]) -> dict[str, str]:
    """``params`` as a plain dict, or ConfigError naming the bad name or size."""
    out: dict[str, str] = {}
    for name, value in params.items():
        if not isinstance(name, str) or not _PARAM_NAME.match(name):
            raise ConfigError(
                f"trigger parameter name {name!r} is not valid: use letters, digits, "
                "'_', '.' or '-' (starting with a letter or '_', at most 64)"
            )
        if not isinstance(value, str):
            raise ConfigError(f"trigger parameter {name!r}: value {value!r} is not a string")
        out[name] = value
    size = len(json.dumps(out).encode())
    if size > MAX_TRIGGER_PARAMS_BYTES:
        raise ConfigError(
            f"trigger parameters take {size} bytes; at most {MAX_TRIGGER_PARAMS_BYTES} are allowed"
        )
    return out


class Operations:
    """Operator requests against one namespace (see module docstring).

    ``store`` must be started; it is not closed by :meth:`close` unless this object
    opened it (:meth:`connect`).
    """

    def __init__(self, store: CoordinationStore, *, owns_store: bool = False) -> None:
        self.store = store
        self._owns_store = owns_store

    # -- lifecycle ------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str | RegistrySettings | None = None) -> Operations:
        """Open and start a store for ``url`` (None: ``SHARDKEEPER_REGISTRY``) and wrap
        it; close it with :meth:`close` or use the result as a context manager.
        Raises InvalidRegistryURLError, StoreUnavailableError or StoreAuthError."""
        store = open_store(url)
        store.start()
        return cls(store, owns_store=True)

    def close(self) -> None:
        """Close the store if this object opened it (idempotent)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Operations:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lookups --------------------------------------------------------------------

    def _job_state(self, job: str) -> JobState:
        if not _JOB_NAME.match(job) or job in (".", ".."):
            raise JobLookupError(job)
        paths = JobPaths(job)
        states = read_jobs(self.store.get_tree(paths.root), only=job)
        if job not in states:
            raise JobLookupError(job)
        return states[job]

    def _require_job(self, job: str) -> JobPaths:
        if not _JOB_NAME.match(job) or job in (".", ".."):
            raise JobLookupError(job)
        paths = JobPaths(job)
        node = self.store.get(paths.config)
        if node is None or not node.value:
            raise JobLookupError(job)
        return paths

    def _require_live(self, instance_id: str) -> None:
        if not _INSTANCE_ID.match(instance_id) or not self.store.exists(instance_path(instance_id)):
            raise InstanceLookupError(instance_id)

    @staticmethod
    def _check_item(state: JobState, item: int) -> None:
        total = state.total
        if not 0 <= item < total:
            valid = f"0..{total - 1}" if total else "none (the stored config is unreadable)"
            raise ConfigError(
                f"item {item} is out of range for job {state.name!r}: valid items are {valid} "
                f"(sharding_total_count={total})"
            )

    def _live_instances(self) -> list[str]:
        return self.store.children(INSTANCES)

    # -- reads ----------------------------------------------------------------------

    @staticmethod
    def _summary(state: JobState) -> JobSummary:
        reason = None if state.enabled else "disabled"
        if reason is None and not state.instances:
            reason = "no instance"  # nothing would fire at the trigger's next time
        return JobSummary(
            name=state.name,
            trigger=state.trigger,
            sharding_total_count=state.total,
            instances=list(state.instances),
            leader=state.leader,
            enabled=state.enabled,
            failover=bool(state.config and state.config.failover),
            next_fire=next_fire(state.config) if reason is None else None,
            config_error=state.config_error,
            next_fire_reason=reason if state.config is not None else None,
        )

    def _health(self, state: JobState) -> tuple[str, JobHealth]:
        """The job's health word and its items' health (see :class:`JobStatus`)."""
        items = assess(state, now=time.time(), grace=self.store.session_timeout + 1.0)
        if state.config_error:
            return "config-error", items
        if not state.instances:
            return "stale", items
        if not state.enabled:
            return "disabled", items
        if items.failing:
            return "failing", items
        if items.stale:
            return "stale", items
        if state.failover:
            return "failover-pending", items
        if state.necessary is not None:
            return "reshard-pending", items
        return "ok", items

    def jobs(self) -> list[JobSummary]:
        """Every registered job (one with a stored config), sorted by name."""
        return [self._summary(s) for s in read_jobs(self.store.get_tree(JOBS)).values()]

    def status(self) -> Overview:
        """Live instances and every job with its health (see :class:`JobStatus`)."""
        states = read_jobs(self.store.get_tree(JOBS))
        jobs = []
        for state in states.values():
            in_range = set(range(state.total))
            health, items = self._health(state)
            jobs.append(
                JobStatus(
                    summary=self._summary(state),
                    reshard_pending=state.necessary is not None,
                    running_items=len(state.running),
                    failover_queued=len(state.failover),
                    misfired_items=len(state.misfire),
                    disabled_items=len(state.disabled_items & in_range),
                    disabled_instances=len(state.disabled_instances & set(state.instances)),
                    health=health,
                    failing_items=items.failing,
                    stale_items=items.stale,
                )
            )
        settings: RegistrySettings | None = getattr(self.store, "settings", None)
        if not isinstance(settings, RegistrySettings):
            settings = getattr(self.store, "_settings", None)
        backend = settings.backend if isinstance(settings, RegistrySettings) else "?"
        return Overview(
            backend=backend,
            namespace=self.store.namespace,
            instances=self._live_instances(),
            jobs=jobs,
        )

    def job(self, name: str) -> JobDetail:
        """Everything about job ``name``; JobLookupError when it is not registered."""
        state = self._job_state(name)
        health, item_health = self._health(state)
        items: list[ItemView] = []
        owners = state.assignment.owners if state.assignment else {}
        params = state.config.sharding_item_parameters if state.config else {}
        for item in range(state.total):
            mark = state.running.get(item)
            entry = state.failover.get(item)
            result = state.results.get(item)
            items.append(
                ItemView(
                    item=item,
                    parameter=params.get(item, ""),
                    owner=owners.get(item),
                    running_on=(mark.instance_id if mark else "?")
                    if item in state.running
                    else None,
                    execution_id=mark.execution_id if mark else None,
                    fire_time=mark.fire_time if mark else None,
                    running_as_failover=bool(mark and mark.failover),
                    failover_queued=item in state.failover,
                    failover_from=entry.from_instance if entry else None,
                    misfire=item in state.misfire,
                    misfire_fire_time=state.misfire.get(item),
                    disabled=item in state.disabled_items,
                    last_run=result.ended if result else None,
                    last_duration=round(result.duration, 3) if result else None,
                    last_outcome=result.outcome if result else None,
                    last_ok=(result.last_ok or None) if result else None,
                    last_error=(
                        f"{result.error_type}: {result.error}" if result and result.failed else None
                    ),
                    last_instance=result.instance if result else None,
                    failures=result.failures if result else 0,
                    health=item_health.items.get(item, "ok"),
                )
            )
        assignment = state.assignment
        summary = self._summary(state)
        return JobDetail(
            name=state.name,
            config=state.config_data,
            config_error=state.config_error,
            trigger=state.trigger,
            enabled=state.enabled,
            disabled_by_operator=state.disabled_job,
            leader=state.leader,
            instances=list(state.instances),
            disabled_instances=sorted(state.disabled_instances),
            reshard_pending=state.necessary is not None,
            reshard_reason=state.necessary,
            assignment_generation=assignment.generation if assignment else None,
            assigned_at=assignment.at if assignment else None,
            next_fire=summary.next_fire,
            items=items,
            next_fire_reason=summary.next_fire_reason,
            health=health,
        )

    def instances(self, job: str | None = None) -> list[InstanceView]:
        """Live instances (of ``job`` only, when given), sorted by id."""
        states = read_jobs(self.store.get_tree(JOBS))
        if job is not None and job not in states:
            raise JobLookupError(job)
        live = self.store.get_tree(INSTANCES)
        views: list[InstanceView] = []
        for path in sorted(live):
            instance_id = path[len(INSTANCES) + 1 :]
            if not instance_id or "/" in instance_id:
                continue  # the parent itself (ZooKeeper lists it)
            member_of = [s for s in states.values() if instance_id in s.instances]
            if job is not None and all(s.name != job for s in member_of):
                continue
            info = instance_info(instance_id, live[path])
            views.append(
                InstanceView(
                    instance_id=instance_id,
                    host=info.host,
                    pid=info.pid or None,
                    version=info.version,
                    started_at=info.started_at or None,
                    labels=dict(info.labels),
                    jobs=[s.name for s in member_of],
                    items={
                        s.name: s.assignment.items_of(instance_id) if s.assignment else []
                        for s in member_of
                    },
                    running={
                        s.name: sorted(
                            i for i, m in s.running.items() if m and m.instance_id == instance_id
                        )
                        for s in member_of
                    },
                    disabled={s.name: instance_id in s.disabled_instances for s in member_of},
                    leader_of=[s.name for s in member_of if s.leader == instance_id],
                )
            )
        return views

    def get_config(self, job: str) -> JobConfig:
        """The stored configuration of ``job`` (JobConfigError when it is invalid,
        saying how to repair it; :meth:`stored_config` reads it without raising)."""
        config = ConfigService(self.store, self._require_job(job)).load()
        if config is None:
            raise JobLookupError(job)
        return config

    def stored_config(self, job: str) -> StoredConfig:
        """The stored config document of ``job`` as it is, valid or not: the raw text,
        the config or the reason it is invalid, and who wrote it last."""
        stored = ConfigService(self.store, self._require_job(job)).read()
        if stored is None:
            raise JobLookupError(job)
        return stored

    def dump(self, path: str = "/") -> dict[str, DumpEntry]:
        """Every node at or below ``path`` (path -> entry), sorted by path. Values are
        UTF-8 text, or base64 when they are not UTF-8. ConfigError for a bad path."""
        check_path(path)
        out: dict[str, DumpEntry] = {}
        tree = self.store.get_tree(path)
        for node_path in sorted(tree):
            node = tree[node_path]
            try:
                value, encoding = node.value.decode("utf-8"), "utf-8"
            except UnicodeDecodeError:
                value, encoding = base64.b64encode(node.value).decode("ascii"), "base64"
            out[node_path] = DumpEntry(
                path=node_path,
                value=value,
                encoding=encoding,
                kind="ephemeral" if node.ephemeral else "persistent",
                version=node.version,
                revision=node.revision,
                created_revision=node.created_revision,
            )
        return out

    # -- requests to running instances ----------------------------------------------

    def trigger(
        self,
        job: str,
        instance: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Ask one live instance of ``job`` (or every one) to run its items now, with
        one-off ``params`` (``ctx.params`` of those executions). Returns the instances
        asked. Refused when the job is disabled or has no live instance;
        InstanceLookupError when ``instance`` is not live; ConfigError naming a bad
        parameter."""
        checked = check_trigger_params(params or {})
        state = self._job_state(job)
        if not state.enabled:
            raise OperationRefusedError(
                f"job {job!r} is disabled; enable it first (shardkeeper enable {job})"
            )
        if instance is not None:
            self._require_live(instance)
            if instance not in state.instances:
                raise OperationRefusedError(
                    f"instance {instance!r} does not run job {job!r}; its instances are "
                    f"{', '.join(state.instances) or 'none'}"
                )
            targets = [instance]
        else:
            targets = list(state.instances)
        if not targets:
            raise OperationRefusedError(f"job {job!r} has no live instance to trigger")
        paths = JobPaths(job)
        value = _stamp("trigger", params=checked) if checked else _stamp("trigger")
        # One commit: either every instance is asked or none (chunked only past the
        # store's per-commit limit, which a realistic cluster never reaches).
        ops: list[Op] = [Put(paths.trigger(t), value) for t in targets]
        size = self.store.max_ops_per_commit
        for i in range(0, len(ops), size):
            self.store.commit(ops[i : i + size])
        return targets

    def shutdown(self, instance: str, *, wait: float | None = None) -> bool:
        """Ask ``instance`` to stop gracefully (it finishes its running items within its
        grace period, leaves its jobs and closes its session). With ``wait`` seconds,
        block until it is gone; returns whether it is gone (False without ``wait``)."""
        self._require_live(instance)
        self.store.put(shutdown_path(instance), _stamp("shutdown"))
        if wait is None:
            return False
        deadline = time.monotonic() + wait
        while self.store.exists(instance_path(instance)):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)  # polling an operator's wait, not synchronising code
        # An instance that stops quickly may exit before it consumed the request:
        # remove it so that no stale request stays behind (ids are never reused).
        self.store.delete(shutdown_path(instance), recursive=False)
        return True

    # -- switches -------------------------------------------------------------------

    def disable_job(self, job: str) -> None:
        """Switch the whole job off: no instance starts its items until enabled
        (running items finish)."""
        paths = self._require_job(job)
        self.store.put(paths.disabled_job, _stamp("disable job"))

    def enable_job(self, job: str) -> None:
        """Switch the job on again: removes the operator switch and, when the stored
        config says ``disabled``, clears that too (so the job really runs)."""
        paths = self._require_job(job)
        self.store.delete(paths.disabled_job, recursive=False)
        # No parse needed for the switch: a corrupt config does not block it (the
        # config's own flag can only be read, and cleared, once it is valid).
        stored = ConfigService(self.store, paths).read()
        if stored is not None and stored.config is not None and stored.config.disabled:
            self.update_config(job, disabled=False)

    def disable_item(self, job: str, item: int) -> None:
        """Switch one item off: its owner skips it from the next trigger on."""
        state = self._job_state(job)
        self._check_item(state, item)
        self.store.put(JobPaths(job).disabled_item(item), _stamp("disable item"))

    def enable_item(self, job: str, item: int) -> None:
        """Switch one item on again. A leftover switch of an item beyond the current
        count may be removed too."""
        state = self._job_state(job)
        if item not in state.disabled_items:
            self._check_item(state, item)
        self.store.delete(JobPaths(job).disabled_item(item), recursive=False)

    def _instance_jobs(self, instance: str, job: str | None, *, enabling: bool) -> list[str]:
        if job is not None:
            state = self._job_state(job)
            known = instance in state.instances or (
                enabling and instance in state.disabled_instances
            )
            if not known:
                if not enabling:
                    self._require_live(instance)
                    raise OperationRefusedError(
                        f"instance {instance!r} does not run job {job!r}; its instances are "
                        f"{', '.join(state.instances) or 'none'}"
                    )
                raise InstanceLookupError(instance)
            return [job]
        states = read_jobs(self.store.get_tree(JOBS))
        names = [
            s.name
            for s in states.values()
            if instance in s.instances or (enabling and instance in s.disabled_instances)
        ]
        if not names:
            self._require_live(instance)
        return names

    def disable_instance(self, instance: str, job: str | None = None) -> list[str]:
        """Give ``instance`` no items of ``job`` (or of every job it runs). Sets the
        jobs' reshard flag: the leader moves the items at the next trigger. Returns
        the jobs switched."""
        jobs = self._instance_jobs(instance, job, enabling=False)
        for name in jobs:
            paths = JobPaths(name)
            # switch and flag together: a leader must never see one without the other
            self.store.commit(
                [
                    Put(paths.disabled_instance(instance), _stamp("disable instance")),
                    Put(paths.necessary, necessary_value(f"instance disabled: {instance}")),
                ]
            )
        return jobs

    def enable_instance(self, instance: str, job: str | None = None) -> list[str]:
        """Let ``instance`` take items of ``job`` (or of every job) again; sets the
        reshard flag where a switch was removed. Also removes the leftover switch
        of an instance that is gone. Returns the jobs switched."""
        jobs = self._instance_jobs(instance, job, enabling=True)
        changed: list[str] = []
        for name in jobs:
            paths = JobPaths(name)
            result = self.store.commit(
                [
                    Check(paths.disabled_instance(instance), exists=True),
                    Delete(paths.disabled_instance(instance)),
                    Put(paths.necessary, necessary_value(f"instance enabled: {instance}")),
                ]
            )
            if result:
                changed.append(name)
        return changed

    # -- configuration and removal ------------------------------------------------

    def update_config(self, job: str, **changes: Any) -> JobConfig:
        """Change fields of the stored config, validated as a whole by JobConfig
        (JobConfigError naming the field). The name cannot change. A new
        ``sharding_total_count`` also sets the reshard flag. Returns the new config.
        Concurrent edits are detected (version check) and retried. On a corrupt
        stored config its readable fields are the base, so an edit can repair it.
        The document records the edit as an operator's (see docs/configuration.md:
        an instance's ``overwrite`` does not undo it)."""
        if "name" in changes and changes["name"] != job:
            raise ConfigError(
                f"the name of job {job!r} cannot change; register a new job and remove "
                "this one instead"
            )
        if not changes:
            raise ConfigError("nothing to change")
        paths = self._require_job(job)
        new, _ = ConfigService(self.store, paths).update(changes, by=_operator())
        return new

    def replace_config(self, job: str, config: JobConfig) -> tuple[JobConfig, JobConfig | None]:
        """Replace the whole stored config of ``job`` with ``config`` (its name must be
        ``job``), also when the stored one is corrupt: the repair for a config no
        edit can fix. Sets the reshard flag when the count changes (or the old count
        is unreadable). Returns (new, old config or None when it was corrupt)."""
        if config.name != job:
            raise ConfigError(
                f"the config is for job {config.name!r}, not {job!r}; the name of a job "
                "cannot change"
            )
        paths = self._require_job(job)
        return ConfigService(self.store, paths).replace(config, by=_operator())

    def remove_job(self, job: str, *, force: bool = False) -> list[str]:
        """Delete everything stored for ``job``. Refused (OperationRefusedError) while
        live instances run it, unless ``force``; returns the instances that were
        still members. Forcing it does not stop them: they keep running the job
        from memory and write some of its nodes again, so stop them first."""
        self._require_job(job)
        paths = JobPaths(job)
        members = self.store.children(paths.instances)
        if members and not force:
            raise OperationRefusedError(
                f"job {job!r} is run by {len(members)} live instance(s) "
                f"({', '.join(members)}); stop them first or use force"
            )
        self.store.delete(paths.root, recursive=True)
        return members


def config_to_dict(config: JobConfig) -> dict[str, Any]:
    """A config as JSON data, exactly as stored (what ``config get --json`` prints)."""
    data: dict[str, Any] = json.loads(config.to_json())
    return data
