"""Failover: orphaned running items are queued and claimed by idle instances.

When an instance dies with failover on, its running marks (persistent) stay. The
leader (at every housekeeping pass, when it takes over, and when a member leaves)
moves each orphaned mark to the failover queue in one conditional commit per item:
conditional on the mark being the one read (created_revision) AND on its owner's
membership node being absent, so a requeue decided from a stale view of the
members can never move the live mark of an instance that came back under the same
id. An instance hands its own marks over the same way when it fences a batch or
finds a mark of its own that no local execution owns (a commit whose reply was
lost, an earlier session). Idle instances claim a queued item with ONE
atomic commit that removes the queue entry and creates the running mark: no lock
that could be left behind, and exactly one claimer wins. The mark's Create also
fails while the item runs elsewhere, so a claim never overlaps a normal run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from shardkeeper.coordination.execution import clear_mark_ops, new_fence
from shardkeeper.coordination.model import DocumentError, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.snapshot import snapshots_from_tree
from shardkeeper.errors import ConfigError
from shardkeeper.registry.base import (
    Check,
    CoordinationStore,
    Create,
    Delete,
    Op,
    Put,
    check_path,
)

__all__ = ["Claim", "FailoverService"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """An orphaned item this instance now runs: its queue entry and fencing token."""

    item: int
    entry: FailoverEntry
    token: int
    #: the fence child created with the mark (see ExecutionService.finish)
    fence: str = ""


class FailoverService:
    """Queues orphaned items and claims them for this instance."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id

    def requeue_orphans(self, live: Collection[str], *, keep: bool = True) -> list[int]:
        """Queue (``keep``) or drop every item whose running mark names an instance not
        in ``live``, or is unreadable. Returns the items moved by this call."""
        queued = self._move_marks(
            lambda mark, item: mark.instance_id not in live, keep=keep, owner_absent=True
        )
        if queued:
            log.info("%s: queued orphaned items %s for failover", self._paths.job, queued)
        return queued

    def requeue_own(
        self,
        known: Callable[[int, RunningMark], bool] | Collection[int],
        *,
        keep: bool,
        done: Callable[[RunningMark], bool] | None = None,
    ) -> list[int]:
        """Marks naming this instance that no local execution owns (``known(item,
        mark)`` False, or the item not in ``known`` when a collection is given): queue
        them for failover when ``keep``, else delete them. Such a mark was left by a
        commit whose reply was lost, or by an earlier session.

        A mark whose execution already ran here (``done(mark)``) is deleted, never
        queued: a start commit that timed out can still be applied by the store after
        the retried one ran and cleared its items (etcd applies a proposal that was
        in flight when its leader was lost once a new one is elected), and running
        that fire again elsewhere would run it twice."""
        finished = done or (lambda _mark: False)
        is_known: Callable[[int, RunningMark], bool]
        if callable(known):
            is_known = known
        else:
            active = set(known)

            def is_known(item: int, mark: RunningMark) -> bool:
                return item in active

        # one read of the marks: a mark of an execution that ran here is cleared, any
        # other stray mark of ours is queued for failover (``keep``) or cleared
        outcome = self._move_marks_detail(
            lambda mark, item: mark.instance_id == self._me and not is_known(item, mark),
            keep=lambda mark: keep and not finished(mark),
            owner_absent=False,
        )
        cleared = [item for item, mark in outcome if finished(mark)]
        moved = [item for item, mark in outcome if not finished(mark)]
        if cleared:
            log.warning(
                "%s: running marks of items %s named executions that already ran here "
                "(a start commit applied late); cleared",
                self._paths.job,
                cleared,
            )
        if moved:
            log.warning(
                "%s: running marks of items %s named this instance without an execution here; %s",
                self._paths.job,
                moved,
                "queued for failover" if keep else "cleared",
            )
        return moved

    def hand_off(
        self, marks: dict[int, tuple[int, FailoverEntry, str]], *, keep: bool
    ) -> list[int]:
        """Move this instance's own marks of ``marks`` (item -> (token, queue entry,
        fence)) to the failover queue (``keep``) or delete them, each only while it is
        still ours. Used for items of a fenced batch that never started. Returns the
        items moved; a mark that is gone or replaced is left alone."""
        moved: list[int] = []
        for item, (token, entry, fence) in sorted(marks.items()):
            ops: list[Op] = self._clear_ops(item, token, fence)
            if keep:
                ops.append(Put(self._paths.failover_item(item), entry.to_bytes()))
            if self._store.commit(ops):
                moved.append(item)
        if moved:
            log.info(
                "%s: items %s of a fenced execution %s",
                self._paths.job,
                moved,
                "handed to failover" if keep else "unmarked",
            )
        return moved

    def _move_marks(
        self, select: Callable[[RunningMark, int], bool], *, keep: bool, owner_absent: bool
    ) -> list[int]:
        outcome = self._move_marks_detail(
            select, keep=lambda _mark: keep, owner_absent=owner_absent
        )
        return [item for item, _mark in outcome]

    def _move_marks_detail(
        self,
        select: Callable[[RunningMark, int], bool],
        *,
        keep: Callable[[RunningMark], bool],
        owner_absent: bool,
    ) -> list[tuple[int, RunningMark]]:
        """(item, mark) of each mark moved: queued for failover when ``keep(mark)``,
        else deleted (see _move_marks)."""
        # One conditional commit per mark: it moves only the mark we read (same
        # created_revision), so racing leaders and the mark's owner never clash; and
        # (owner_absent) only while the owner's membership node is absent.
        moved: list[tuple[int, RunningMark]] = []
        if not self._store.children(self._paths.running_root):
            return moved  # the common case: nothing runs, one cheap read
        # One read of the subtree (marks and their fence children): etcd answers it
        # with one range read, ZooKeeper with one pipelined batch per level.
        tree = self._store.get_tree(self._paths.running_root)
        # the one snapshot reader: a stray node under running/ is not a mark
        job = self._paths.job
        snap = snapshots_from_tree(tree, only=job, registered=False).get(job)
        if snap is None:
            return moved
        for item, node in sorted(snap.running_nodes.items()):
            read = snap.running[item]
            readable = read is not None
            mark = read if read is not None else RunningMark("?", 0.0, f"{job}@unknown#{item}")
            if not select(mark, item):
                continue
            fence = snap.fences.get(item, "")
            ops: list[Op] = self._clear_ops(item, node.created_revision, fence)
            if fence:
                # the fence proves the incarnation; the revision check keeps it exact
                ops.insert(0, Check(node.path, created_revision=node.created_revision))
            if owner_absent and readable and _valid_segment(mark.instance_id):
                ops.append(Check(self._paths.instance(mark.instance_id), exists=False))
            if keep(mark):
                entry = FailoverEntry(mark.fire_time, mark.execution_id, mark.instance_id)
                ops.append(Put(self._paths.failover_item(item), entry.to_bytes()))
            if self._store.commit(ops):
                moved.append((item, mark))
        return moved

    def _clear_ops(self, item: int, token: int, fence: str) -> list[Op]:
        return clear_mark_ops(self._paths, item, token, fence)

    def queued(self) -> list[int]:
        """Items waiting in the failover queue."""
        return sorted(
            int(n) for n in self._store.children(self._paths.failover_queue) if n.isdigit()
        )

    def claim(
        self, exclude: Collection[int] = (), *, membership: Check | None = None
    ) -> Claim | None:
        """Claim one queued item (lowest first) for this instance, or None. The claim
        commit also holds ``membership`` (this instance is still the member it
        registered as), so a process whose session ended cannot claim."""
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
            fence = new_fence()
            result = self._store.commit(
                [
                    *([membership] if membership is not None else []),
                    Check(node.path, version=node.version),
                    Delete(node.path),
                    Create(self._paths.running(item), mark.to_bytes()),
                    Create(f"{self._paths.running(item)}/{fence}"),
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
                return Claim(item, entry, result.revision, fence)
        return None


def _valid_segment(name: str) -> bool:
    try:
        check_path("/" + name)
    except ConfigError:
        return False
    return "/" not in name
