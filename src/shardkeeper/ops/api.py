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

:class:`Operations` is put together from one module per concern: ``base`` (the
store, its lifecycle, lookups), ``reads`` (inspection), ``steering`` (run-now,
shutdown, instance switches) and ``writes`` (job and item switches, config,
removal). Each write made for an operator goes through :meth:`Operations.audited`,
which records it in the audit trail (``audit``, ``auditlog``, ``audited``).
"""

from __future__ import annotations

from collections.abc import Sequence

from shardkeeper.ops.audit import Actor, AuditEntry, AuditSink
from shardkeeper.ops.audited import AuditedOperations
from shardkeeper.ops.auditlog import RegistryAuditLog
from shardkeeper.ops.reads import Reads
from shardkeeper.ops.steering import MAX_TRIGGER_PARAMS_BYTES, Steering, check_trigger_params
from shardkeeper.ops.writes import Writes, config_to_dict

__all__ = ["MAX_TRIGGER_PARAMS_BYTES", "Operations", "check_trigger_params", "config_to_dict"]


class Operations(Reads, Steering, Writes):
    """Operator requests against one namespace (see the module docstring).

    ``store`` must be started; it is not closed by :meth:`close` unless this object
    opened it (:meth:`connect`).
    """

    def audited(self, actor: Actor, sinks: Sequence[AuditSink] | None = None) -> AuditedOperations:
        """The writes of this object made by ``actor``, each recorded in the audit trail
        (the registry's, and ``sinks`` when given instead; see ops/audited.py)."""
        return AuditedOperations(self, actor, sinks)

    def audit(
        self, job: str | None = None, *, since: float | None = None, limit: int | None = None
    ) -> list[AuditEntry]:
        """The registry's audit trail, newest first: of ``job`` (also once removed) or
        of every job and the namespace; entries at or after ``since`` (epoch
        seconds); at most ``limit``. Read-only: no tool edits or deletes entries."""
        return RegistryAuditLog(self.store).read(job, since=since, limit=limit)
