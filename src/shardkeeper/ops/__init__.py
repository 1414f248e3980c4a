"""Operations: inspect and steer running jobs through the registry (API of the CLI).

:class:`Operations` reads and writes the registry nodes the running instances
watch; its results are the typed views of :mod:`shardkeeper.ops.views`, each with a
``to_dict()`` that is the CLI's ``--json`` output. :meth:`Operations.audited` gives
the same writes recorded in the audit trail (:class:`AuditedOperations`, for an
:class:`Actor`); :meth:`Operations.audit` reads it (:class:`AuditEntry`).
"""

from __future__ import annotations

from shardkeeper.ops.api import Operations, config_to_dict
from shardkeeper.ops.audit import Actor, AuditEntry
from shardkeeper.ops.audited import AuditedOperations
from shardkeeper.ops.edits import parse_assignments, parse_value
from shardkeeper.ops.views import (
    DumpEntry,
    InstanceView,
    ItemView,
    JobDetail,
    JobStatus,
    JobSummary,
    Overview,
    item_ranges,
)

__all__ = [
    "Actor",
    "AuditEntry",
    "AuditedOperations",
    "DumpEntry",
    "InstanceView",
    "ItemView",
    "JobDetail",
    "JobStatus",
    "JobSummary",
    "Operations",
    "Overview",
    "config_to_dict",
    "item_ranges",
    "parse_assignments",
    "parse_value",
]
