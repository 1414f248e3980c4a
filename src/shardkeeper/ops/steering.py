"""Steering instances (:class:`Steering`): run-now requests, remote graceful
shutdown, and switching an instance off or on for a job. Each is a node the running
instances watch (see :mod:`shardkeeper.coordination.paths`); a run-now request is a
document of the job, kept until each of its items ran or was skipped
(:mod:`shardkeeper.coordination.runnow`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence

from shardkeeper.coordination.paths import JobPaths, instance_path, shutdown_path
from shardkeeper.coordination.runnow import check_request_at, new_request_id, request_value
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.coordination.snapshot import read_snapshots
from shardkeeper.errors import ConfigError, InstanceLookupError, OperationRefusedError
from shardkeeper.ops.base import OperationsBase, operator, stamp
from shardkeeper.registry.base import Check, Create, Delete, Put

__all__ = ["MAX_TRIGGER_PARAMS_BYTES", "Steering", "check_trigger_params"]

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


class Steering(OperationsBase):
    """Requests to running instances and per-instance switches."""

    def trigger(
        self,
        job: str,
        instance: str | None = None,
        params: Mapping[str, str] | None = None,
        items: Sequence[int] | None = None,
    ) -> list[str]:
        """Run every item of ``job`` now (or, with ``instance``, the items that live
        instance owns now; with ``items``, only those items, wherever they run), once
        each, with one-off ``params`` (``ctx.params`` of those executions). The
        request is a document of the job: each item is run by whichever instance owns
        it when it gets to it (after a death, a partition or a reshard too), or
        recorded skipped (item disabled, removed by a cut of the count). Returns the
        live instances of the job (with ``instance``: that one; with ``items``: the
        owners of those items now, or every live instance when the assignment does
        not name them yet). Refused when the job is disabled or has no live
        instance, or an item asked is disabled; InstanceLookupError when
        ``instance`` is not live; ConfigError naming a bad parameter or an item out
        of range, or ``items`` given with ``instance`` (an item runs on its owner)."""
        checked = check_trigger_params(params or {})
        state = self._job_state(job)
        if not state.enabled:
            raise OperationRefusedError(
                f"job {job!r} is disabled; enable it first (shardkeeper enable {job})"
            )
        if items is not None and instance is not None:
            raise ConfigError(
                "give items or an instance, not both: an item runs on whichever instance owns it"
            )
        owners = state.assignment.owners if state.assignment is not None else {}
        asked: list[int] | None
        if items is not None:
            if not items:
                raise ConfigError("no item given: name at least one item to run")
            for item in items:
                self._check_item(state, item)
            asked = sorted(set(items))
            off = [i for i in asked if i in state.disabled_items]
            if off:
                raise OperationRefusedError(
                    f"item(s) {', '.join(map(str, off))} of job {job!r} are disabled; "
                    f"enable them first (shardkeeper enable {job} --item N)"
                )
            named = {owners[i] for i in asked if i in owners and owners[i] in state.instances}
            targets = sorted(named) or list(state.instances)
        elif instance is not None:
            self._require_live(instance)
            if instance not in state.instances:
                raise OperationRefusedError(
                    f"instance {instance!r} does not run job {job!r}; its instances are "
                    f"{', '.join(state.instances) or 'none'}"
                )
            targets = [instance]
            asked = sorted(i for i, o in owners.items() if o == instance)
        else:
            targets = list(state.instances)
            asked = None
        if not targets:
            raise OperationRefusedError(f"job {job!r} has no live instance to trigger")
        at = check_request_at(time.time())
        paths = JobPaths(job)
        value = request_value(by=operator(), at=at, params=checked, total=state.total, items=asked)
        self.store.commit([Create(paths.runnow(new_request_id(at)), value)])
        return targets

    def shutdown(self, instance: str, *, wait: float | None = None) -> bool:
        """Ask ``instance`` to stop gracefully (it finishes its running items within its
        grace period, leaves its jobs and closes its session). With ``wait`` seconds,
        block until it is gone; returns whether it is gone (False without ``wait``)."""
        self._require_live(instance)
        self.store.put(shutdown_path(instance), stamp("shutdown"))
        return False if wait is None else self.shutdown_wait(instance, wait)

    def shutdown_wait(self, instance: str, wait: float) -> bool:
        """After :meth:`shutdown`: block up to ``wait`` seconds until ``instance`` is
        gone; returns whether it is (then its request node is removed)."""
        deadline = time.monotonic() + wait
        while self.store.exists(instance_path(instance)):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)  # polling an operator's wait, not synchronising code
        # An instance that stops quickly may exit before it consumed the request:
        # remove it so that no stale request stays behind (ids are never reused).
        self.store.delete(shutdown_path(instance), recursive=False)
        return True

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
        names = [
            s.name
            for s in read_snapshots(self.store).values()
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
                    Put(paths.disabled_instance(instance), stamp("disable instance")),
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
