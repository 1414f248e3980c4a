"""Failover: orphaned running items are queued and claimed by idle instances.

When an instance dies with failover on, its running marks (persistent) stay. The
leader (and every new leader when it takes over, and the first instance back
after a whole-cluster outage) moves each orphaned mark to the failover queue in
one conditional commit per item. Idle instances claim a queued item with ONE
atomic commit that removes the queue entry and creates the running mark: no lock
that could be left behind, and exactly one claimer wins. The mark's Create also
fails while the item runs elsewhere, so a claim never overlaps a normal run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from shardkeeper.coordination.model import DocumentError, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import Check, CoordinationStore, Create, Delete, Op, Put

__all__ = ["Claim", "FailoverService"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """An orphaned item this instance now runs: its queue entry and fencing token."""

    item: int
    entry: FailoverEntry
    token: int


class FailoverService:
    """Queues orphaned items and claims them for this instance."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id

    def requeue_orphans(self, live: Collection[str]) -> list[int]:
        """Queue every item whose running mark names an instance not in ``live``.
        Returns the items queued by this call."""
        queued = self._move_marks(lambda mark, item: mark.instance_id not in live, keep=True)
        if queued:
            log.info("%s: queued orphaned items %s for failover", self._paths.job, queued)
        return queued

    def requeue_own(self, active: Collection[int], *, keep: bool) -> list[int]:
        """Marks naming this instance for items it does not run now (left by a lost
        session): queue them for failover when ``keep``, else just delete them."""
        return self._move_marks(
            lambda mark, item: mark.instance_id == self._me and item not in active, keep=keep
        )

    def _move_marks(self, select: Callable[[RunningMark, int], bool], *, keep: bool) -> list[int]:
        # One conditional commit per mark: it moves only the mark we read (same
        # created_revision), so racing leaders and the mark's owner never clash.
        moved: list[int] = []
        for name in self._store.children(self._paths.running_root):
            item = int(name)
            node = self._store.get(self._paths.running(item))
            if node is None:
                continue
            try:
                mark = RunningMark.from_bytes(node.value, node.path)
            except DocumentError:
                mark = RunningMark("?", 0.0, f"{self._paths.job}@unknown#{item}")
            if not select(mark, item):
                continue
            ops: list[Op] = [
                Check(node.path, created_revision=node.created_revision),
                Delete(node.path),
            ]
            if keep:
                entry = FailoverEntry(mark.fire_time, mark.execution_id, mark.instance_id)
                ops.append(Put(self._paths.failover_item(item), entry.to_bytes()))
            if self._store.commit(ops):
                moved.append(item)
        return moved

    def queued(self) -> list[int]:
        """Items waiting in the failover queue."""
        return sorted(int(n) for n in self._store.children(self._paths.failover_queue))

    def claim(self, exclude: Collection[int] = ()) -> Claim | None:
        """Claim one queued item (lowest first) for this instance, or None."""
        for item in self.queued():
            if item in exclude:
                continue
            node = self._store.get(self._paths.failover_item(item))
            if node is None:
                continue
            try:
                entry = FailoverEntry.from_bytes(node.value, node.path)
            except DocumentError:
                entry = FailoverEntry(0.0, f"{self._paths.job}@unknown#{item}", "?")
            mark = RunningMark(self._me, entry.fire_time, entry.execution_id, failover=True)
            result = self._store.commit(
                [
                    Check(node.path, version=node.version),
                    Delete(node.path),
                    Create(self._paths.running(item), mark.to_bytes()),
                ]
            )
            if result:
                log.info(
                    "%s: %s took over item %d (fired %s, from %s)",
                    self._paths.job,
                    self._me,
                    item,
                    entry.fire_time,
                    entry.from_instance,
                )
                return Claim(item, entry, result.revision)
        return None
