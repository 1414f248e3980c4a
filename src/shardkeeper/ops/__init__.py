"""Operations: inspect and steer running jobs through the registry (API of the CLI).

:class:`Operations` reads and writes the registry nodes the running instances
watch; its results are the typed views of :mod:`shardkeeper.ops.views`, each with a
``to_dict()`` that is the CLI's ``--json`` output.
"""

from __future__ import annotations

from shardkeeper.ops.api import Operations, config_to_dict
from shardkeeper.ops.edits import parse_assignments, parse_value
from shardkeeper.ops.views import (
    DumpEntry,
    InstanceView,
    ItemView,
    JobDetail,
    JobStatus,
    JobSummary,
    Overview,
)

__all__ = [
    "DumpEntry",
    "InstanceView",
    "ItemView",
    "JobDetail",
    "JobStatus",
    "JobSummary",
    "Operations",
    "Overview",
    "config_to_dict",
    "parse_assignments",
    "parse_value",
]
