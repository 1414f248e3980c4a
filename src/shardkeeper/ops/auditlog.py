"""The audit trail kept in the registry: a bounded list of recent entries per job.

Each entry is one persistent node, ``/audit/jobs/{job}/{id}`` (or
``/audit/namespace/{id}`` for an action on no job; see
:mod:`shardkeeper.coordination.paths`), whose name sorts by time
(:func:`~shardkeeper.ops.audit.new_entry_id`). One node per entry, rather than one
document holding the list, so that two operators writing at once never contend for
a version and no node grows towards the stores' size limits.

After a write the list is pruned to its newest ``keep`` entries (200 by default):
what remains needs no database and stays cheap to read. Two writers pruning at once
delete the same oldest nodes, which is harmless (a missing node is no error). The
order is the writers' clocks; entries of one microsecond from two hosts keep either
order.

The trail lives outside ``/jobs/{job}`` so that removing a job keeps its trail (its
removal is the last entry), and the runtime's namespace watch leaves ``/audit`` out
(:func:`~shardkeeper.coordination.paths.is_high_churn`).
"""

from __future__ import annotations

import logging
import re

from shardkeeper.coordination.paths import (
    AUDIT,
    audit_entry,
    audit_job_root,
    audit_namespace_root,
)
from shardkeeper.errors import ConfigError
from shardkeeper.ops.audit import AuditEntry
from shardkeeper.registry import batching
from shardkeeper.registry.base import CoordinationStore, Delete, Op

__all__ = ["DEFAULT_KEEP", "RegistryAuditLog"]

log = logging.getLogger(__name__)

#: entries kept per job (and for the namespace)
DEFAULT_KEEP = 200
_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}\Z")


class RegistryAuditLog:
    """The registry's audit trail of one namespace (an :class:`~shardkeeper.ops.audit.
    AuditSink`). ``keep``: entries kept per list (at least 1)."""

    def __init__(self, store: CoordinationStore, *, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ConfigError(f"keep={keep!r} must be >= 1")
        self.store = store
        self.keep = keep

    @staticmethod
    def root_of(job: str | None) -> str:
        """The list an entry of ``job`` (None: of no job) goes to."""
        return audit_namespace_root() if job is None else audit_job_root(job)

    def write(self, entry: AuditEntry) -> None:
        """Add ``entry`` to its list, then prune the list to the newest ``keep``."""
        root = self.root_of(entry.job)
        self.store.put(audit_entry(root, entry.id), entry.encode())
        self._prune(root)

    def _prune(self, root: str) -> None:
        names = self.store.children(root)
        excess = len(names) - self.keep
        if excess <= 0:
            return
        ops: list[Op] = [Delete(audit_entry(root, name)) for name in names[:excess]]
        size = batching.max_ops_per_commit(self.store)
        for i in range(0, len(ops), size):
            self.store.commit(ops[i : i + size])

    def read(
        self, job: str | None = None, *, since: float | None = None, limit: int | None = None
    ) -> list[AuditEntry]:
        """Entries newest first: of ``job`` (its list survives the job's removal), or of
        every job and the namespace when None; only those at or after ``since``
        (epoch seconds); at most ``limit``. ConfigError for a name no job can have."""
        if job is not None and (not _JOB_NAME.match(job) or job in (".", "..")):
            raise ConfigError(
                f"{job!r} is not a job name: 1-100 of letters, digits, '.', '_' and '-'"
            )
        if limit is not None and limit < 1:
            raise ConfigError(f"limit {limit!r} must be >= 1")
        prefix = AUDIT if job is None else audit_job_root(job)
        entries: list[AuditEntry] = []
        for path, node in self.store.get_tree(prefix).items():
            if not node.value:
                continue  # a parent of entries (ZooKeeper's are nodes of their own)
            try:
                entry = AuditEntry.decode(node.value)
            except ConfigError as exc:
                # not written by the tools: shown to no one, but never an error
                log.debug("skipping %s: %s", path, exc)
                continue
            if since is None or entry.at >= since:
                entries.append(entry)
        entries.sort(key=lambda e: (e.at, e.id), reverse=True)
        return entries if limit is None else entries[:limit]
