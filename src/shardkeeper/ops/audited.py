"""The write operations, each recorded in the audit trail (:class:`AuditedOperations`).

The CLI, the console's forms and the REST API make every write through this class,
for an :class:`~shardkeeper.ops.audit.Actor`. Order: the action first, then its
entry. The action is what the operator asked for and its state is in the registry
whatever happens next, so an entry that cannot be written (the store or the
database failing) never undoes it nor turns it into an error: the failure is logged
at WARNING and kept in :attr:`AuditedOperations.warnings` for the tool to show
(the CLI prints it on stderr, the console adds it to its message, the REST API
answers it in the ``X-Shardkeeper-Audit-Warning`` header).

What is recorded: every call that reached the registry, with outcome ``ok``,
``refused`` (the state forbade it: nothing changed) or ``failed`` (an error such as a
timeout: the change may or may not have been made). Bad input and unknown targets
(ConfigError, JobLookupError, InstanceLookupError) are not: they are rejected before
anything is read or written, and an unknown name has no trail to go to.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from shardkeeper.config import JobConfig
from shardkeeper.errors import (
    ConfigError,
    InstanceLookupError,
    JobLookupError,
    OperationRefusedError,
)
from shardkeeper.ops.audit import Actor, AuditEntry, AuditSink, config_changes, new_entry_id
from shardkeeper.ops.auditlog import RegistryAuditLog

if TYPE_CHECKING:
    from shardkeeper.ops.api import Operations

__all__ = ["AuditedOperations"]

log = logging.getLogger(__name__)

T = TypeVar("T")
#: errors that stop a request before it touches anything (see the module docstring)
_NOT_RECORDED = (ConfigError, JobLookupError, InstanceLookupError)


def _config_dict(config: JobConfig | None) -> dict[str, Any] | None:
    # the values as stored: compared unmasked (two secrets may share a mask), then
    # masked field by field in the entry (config_changes)
    if config is None:
        return None
    data: dict[str, Any] = json.loads(config.to_json())
    return data


class AuditedOperations:
    """The writes of ``ops`` made by ``actor``, each followed by its audit entry.

    ``sinks``: where entries go (default: the registry's trail of ``ops``'s
    namespace); every sink is written even when another failed. Reads are made on
    :attr:`ops` itself."""

    def __init__(
        self, ops: Operations, actor: Actor, sinks: Sequence[AuditSink] | None = None
    ) -> None:
        self.ops = ops
        self.actor = actor
        self.sinks: list[AuditSink] = (
            list(sinks) if sinks is not None else [RegistryAuditLog(ops.store)]
        )
        #: one line per entry (or sink) that could not be written, oldest first
        self.warnings: list[str] = []

    # -- recording ------------------------------------------------------------------

    def _record(
        self,
        action: str,
        outcome: str,
        *,
        job: str | None = None,
        item: int | None = None,
        instance: str | None = None,
        error: str = "",
        details: Mapping[str, Any] | None = None,
    ) -> None:
        at = time.time()
        entry = AuditEntry(
            id=new_entry_id(at),
            at=at,
            who=self.actor.name,
            via=self.actor.via,
            host=self.actor.host,
            action=action,
            outcome=outcome,
            job=job,
            item=item,
            instance=instance,
            error=error,
            details=dict(details or {}),
            namespace=self.ops.store.namespace,
        )
        for sink in self.sinks:
            try:
                sink.write(entry)
            except Exception as exc:  # any failure of any sink: the action stands
                message = (
                    f"the action was done, but its audit entry ({action} on {entry.target}) "
                    f"was not written to {type(sink).__name__}: {type(exc).__name__}: {exc}"
                )
                log.warning("%s", message)
                self.warnings.append(" ".join(message.split()))

    def _run(
        self,
        action: str,
        call: Callable[[], T],
        *,
        job: str | None = None,
        item: int | None = None,
        instance: str | None = None,
        details: Mapping[str, Any] | None = None,
        after: Callable[[T], Mapping[str, Any]] | None = None,
    ) -> T:
        """``call()``, then its entry (with ``after(result)`` added to ``details``)."""
        target: dict[str, Any] = {"job": job, "item": item, "instance": instance}
        try:
            result = call()
        except _NOT_RECORDED:
            raise
        except OperationRefusedError as exc:
            self._record(action, "refused", error=str(exc), details=details, **target)
            raise
        except Exception as exc:
            self._record(
                action, "failed", error=f"{type(exc).__name__}: {exc}", details=details, **target
            )
            raise
        extra = after(result) if after is not None else {}
        self._record(action, "ok", details={**(details or {}), **extra}, **target)
        return result

    @property
    def _by(self) -> str | None:
        # who the stored config document names: the CLI keeps the process's name
        return None if self.actor.via == "cli" else f"{self.actor.name} ({self.actor.via})"

    # -- the writes -----------------------------------------------------------------

    def trigger(
        self,
        job: str,
        instance: str | None = None,
        params: Mapping[str, str] | None = None,
        items: Sequence[int] | None = None,
    ) -> list[str]:
        """:meth:`Operations.trigger <shardkeeper.ops.steering.Steering.trigger>`, recorded."""
        details: dict[str, Any] = {"params": dict(params)} if params else {}
        if items is not None:
            details["items"] = sorted(set(items))
        return self._run(
            "trigger",
            lambda: self.ops.trigger(job, instance, params=params, items=items),
            job=job,
            instance=instance,
            details=details,
            after=lambda asked: {"asked": asked},
        )

    def disable_job(self, job: str) -> None:
        """Switch the job off, recorded."""
        self._run("disable-job", lambda: self.ops.disable_job(job), job=job)

    def enable_job(self, job: str) -> None:
        """Switch the job on, recorded."""
        self._run("enable-job", lambda: self.ops.enable_job(job), job=job)

    def disable_item(self, job: str, item: int) -> None:
        """Switch one item off, recorded."""
        self._run("disable-item", lambda: self.ops.disable_item(job, item), job=job, item=item)

    def enable_item(self, job: str, item: int) -> None:
        """Switch one item on, recorded."""
        self._run("enable-item", lambda: self.ops.enable_item(job, item), job=job, item=item)

    def _instance_switch(self, enable: bool, instance: str, job: str | None) -> list[str]:
        action = "enable-instance" if enable else "disable-instance"
        fn = self.ops.enable_instance if enable else self.ops.disable_instance
        if job is not None:
            return self._run(action, lambda: fn(instance, job), job=job, instance=instance)
        # Every job the instance runs: one entry in each job's trail, so that reading
        # one job's trail shows it; in the namespace's trail when it switched none.
        try:
            jobs = fn(instance, None)
        except _NOT_RECORDED:
            raise
        except OperationRefusedError as exc:
            self._record(action, "refused", instance=instance, error=str(exc))
            raise
        except Exception as exc:
            self._record(action, "failed", instance=instance, error=f"{type(exc).__name__}: {exc}")
            raise
        for name in jobs:
            self._record(action, "ok", job=name, instance=instance, details={"all_jobs": True})
        if not jobs:
            self._record(action, "ok", instance=instance, details={"all_jobs": True, "jobs": []})
        return jobs

    def disable_instance(self, instance: str, job: str | None = None) -> list[str]:
        """Give an instance no items of ``job`` (or of every job), recorded."""
        return self._instance_switch(False, instance, job)

    def enable_instance(self, instance: str, job: str | None = None) -> list[str]:
        """Let an instance take items of ``job`` (or of every job) again, recorded."""
        return self._instance_switch(True, instance, job)

    def shutdown(self, instance: str, *, wait: float | None = None) -> bool:
        """Ask an instance to stop, recorded (in the namespace's trail) once the
        request is made: before ``wait``, so that a long wait never delays it."""
        # the request and the wait are split so that the entry is written at once
        self._run("shutdown", lambda: self.ops.shutdown(instance), instance=instance)
        return False if wait is None else self.ops.shutdown_wait(instance, wait)

    def remove_job(self, job: str, *, force: bool = False) -> list[str]:
        """Delete everything stored for the job, recorded (the trail stays)."""
        return self._run(
            "remove-job",
            lambda: self.ops.remove_job(job, force=force),
            job=job,
            details={"force": force},
            after=lambda members: {"members": members},
        )

    def update_config(self, job: str, **changes: Any) -> JobConfig:
        """Change fields of the stored config, recorded with each changed field's
        before and after."""
        requested = sorted(changes)
        new, _old = self._run(
            "config-set",
            lambda: self.ops.edit_config(job, changes, by=self._by),
            job=job,
            details={"fields": requested},
            after=lambda pair: {
                "changes": config_changes(_config_dict(pair[1]), _config_dict(pair[0]) or {})
            },
        )
        return new

    def replace_config(self, job: str, config: JobConfig) -> tuple[JobConfig, JobConfig | None]:
        """Replace the whole stored config, recorded with each changed field's before
        and after (every field, before null, when the stored one was corrupt)."""
        return self._run(
            "config-replace",
            lambda: self.ops.replace_config(job, config, by=self._by),
            job=job,
            after=lambda pair: {
                "changes": config_changes(_config_dict(pair[1]), _config_dict(pair[0]) or {})
            },
        )

    def record(
        self,
        action: str,
        *,
        job: str | None = None,
        instance: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Record an action made elsewhere (``fix-acl``, which needs a store of its
        own) as done."""
        self._record(action, "ok", job=job, instance=instance, details=details)
