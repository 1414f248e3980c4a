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

A mark of a run-now request's execution carries the request's params and id
(``RunningMark.params``, ``request``); its queue entry and the claimed run's mark
carry them on, so a failover re-run has the same ``ctx.params`` whoever queued it
(the instance that ran it may be dead), and again after a second death.

The queue holds one entry per item. An item queued while an entry of another fire
of it waits (two interrupted runs of one item handed off by a stopping instance, a
fenced claim handed back) folds that entry in: the later fire is run and stands for
the earlier one (``FailoverEntry.folds``, the claimed run's ``ctx.covers``), as a
misfire re-run stands for the fires folded into it. Overwriting it lost a fire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from shardkeeper.coordination.execution import clear_mark_ops, new_fence
from shardkeeper.coordination.model import DocumentError, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.snapshot import snapshots_from_tree
from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry import batching
from shardkeeper.registry.base import (
    Check,
    CoordinationStore,
    Create,
    Delete,
    Node,
    Op,
    Put,
    check_path,
)
from shardkeeper.registry.packing import pack_groups

__all__ = ["Claim", "FailoverService"]

log = logging.getLogger(__name__)

#: a hand-off of more items than this lists the running marks first (one request) and
#: leaves out the items whose mark is gone (FailoverService._present)
HAND_OFF_LISTING_FROM = 16


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
        return [item for item, _mark in self.requeue_orphan_marks(live, keep=keep)]

    def requeue_orphan_marks(
        self, live: Collection[str], *, keep: bool = True
    ) -> list[tuple[int, RunningMark]]:
        """:meth:`requeue_orphans`, returning each moved item with the mark it had: the
        run its dead owner left cut off (for that run's history row)."""
        moved = self._move_marks_detail(
            lambda mark, item: mark.instance_id not in live,
            keep=lambda _mark: keep,
            owner_absent=True,
        )
        if moved:
            log.info(
                "%s: queued orphaned items %s for failover",
                self._paths.job,
                [item for item, _mark in moved],
            )
        return moved

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
        self,
        marks: dict[int, tuple[int, FailoverEntry, str]],
        *,
        keep: bool,
        extra: Mapping[int, Sequence[Op]] | None = None,
        why: Mapping[int, str] | None = None,
    ) -> list[int]:
        """Move this instance's own marks of ``marks`` (item -> (token, queue entry,
        fence)) to the failover queue (``keep``) or delete them, each only while it is
        still ours. Used for items whose run here did not complete: never started or
        ran while fenced, interrupted by a stop, crashed. Returns the items moved; a
        mark that is gone or replaced is left alone. ``extra`` (item -> ops) go in the
        item's commit: the last checkpoint the run held unwritten
        (coordination/checkpoints.py), for its successor to resume from. ``why``
        (item -> reason) is what the log line says of each item."""
        moved: list[int] = []
        left = self._present(marks)
        # An entry of another fire may wait for the item (one entry per item): it is
        # folded in, conditional on being the one read; if it changed meanwhile (a
        # claim, another hand-off) the item is tried again on a fresh read. The items
        # go in as few commits as the store takes, each on its own conditions: one
        # commit per item held a bulk job's lane for 20-80 s on etcd (2,500 items of
        # a fenced batch), and its fires and repairs waited behind it.
        for _attempt in range(3 if keep else 1):
            waiting = self._waiting(left) if keep else {}
            order = sorted(left)
            groups: list[list[Op]] = []
            for item in order:
                token, entry, fence = left[item]
                ops: list[Op] = self._clear_ops(item, token, fence)
                ops += (extra or {}).get(item, ())
                if keep:
                    ops += self._queue_ops(item, entry, waiting.get(item))
                groups.append(ops)
            # strict: an unknown outcome raises, so that the caller keeps every item
            # to hand off again (each group is conditional on our mark: safe to resend)
            for k in self._commit_each([], groups, strict=True):
                moved.append(order[k])
                del left[order[k]]
            if not left:
                break
        moved.sort()
        # one line per reason: "fenced" was said of every item, also of those a
        # graceful stop interrupted (newcomer review N9)
        by_why: dict[str, list[int]] = {}
        for item in moved:
            by_why.setdefault((why or {}).get(item, "not completed here"), []).append(item)
        for reason, items in by_why.items():
            log.info(
                "%s: items %s %s (%s)",
                self._paths.job,
                items,
                "handed to failover" if keep else "unmarked (run at their next fire)",
                reason,
            )
        return moved

    def _move_marks_detail(
        self,
        select: Callable[[RunningMark, int], bool],
        *,
        keep: Callable[[RunningMark], bool],
        owner_absent: bool,
    ) -> list[tuple[int, RunningMark]]:
        """(item, mark) of each mark moved: queued for failover when ``keep(mark)``,
        else deleted."""
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
        chosen: list[tuple[int, RunningMark]] = []
        groups: list[list[Op]] = []
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
            chosen.append((item, mark))
            groups.append(ops)
        # queued ones fold the entry of another fire waiting for the item, if any
        # (one read of the queue, only when something is to be queued)
        to_queue = {k: item for k, (item, mark) in enumerate(chosen) if keep(mark)}
        waiting = self._waiting(to_queue.values())
        for k, item in to_queue.items():
            mark = chosen[k][1]
            # the run-now params travel with the item: its re-run has them
            entry = FailoverEntry(
                mark.fire_time,
                mark.execution_id,
                mark.instance_id,
                traceparent=mark.traceparent,
                params=dict(mark.params),
                request=mark.request,
            )
            groups[k] += self._queue_ops(item, entry, waiting.get(item))
        applied = self._commit_each([], groups)
        return [chosen[k] for k in sorted(applied)]

    def _commit_each(
        self,
        fixed: list[Op],
        groups: list[list[Op]],
        *,
        strict: bool = False,
        proceed: Callable[[], bool] | None = None,
    ) -> dict[int, int]:
        """Apply each group (with ``fixed``) on its own conditions, in as few commits
        as the store takes: index -> revision of each group applied. A store that
        checks groups apart applies those whose checks hold; where one refused
        condition refuses a whole commit (ZooKeeper), that chunk's groups are sent
        in halves, so one moved mark never holds back the others. A failed
        ``fixed`` check or a store error ends it (what was applied is returned);
        ``strict``: a store error is raised instead (the caller keeps the work).
        ``proceed`` False before a commit ends it too."""
        applied: dict[int, int] = {}
        fixed_paths = {op.path for op in fixed}
        for members, _ops in pack_groups(self._store, groups, fixed, apart=True):
            if proceed is not None and not proceed():
                return applied
            try:
                result = batching.commit_groups(self._store, fixed, [groups[m] for m in members])
            except StoreError as exc:
                if strict:
                    raise
                # outcome unknown: the marks read next time tell (every group is
                # conditional on what was read, so sending it again is safe)
                log.info("%s: failover commit outcome unknown: %s", self._paths.job, exc)
                return applied
            if result.succeeded:
                applied.update({members[k]: rev for k, rev in result.applied.items()})
                continue
            if result.failed_path in fixed_paths:
                return applied
            if not self._bisect(fixed, groups, members, applied, strict=strict):
                return applied
        return applied

    def _bisect(
        self,
        fixed: list[Op],
        groups: list[list[Op]],
        members: list[int],
        applied: dict[int, int],
        *,
        strict: bool = False,
    ) -> bool:
        """A refused chunk's groups, in halves: a half that commits is done, a refused
        half is halved again, down to single groups. A few refused groups among
        thousands cost a few dozen commits, not one per group (a take-over of 1,000
        orphans sent one by one held the lane for seconds on a loaded store). False
        when ``fixed`` failed or the store gave no answer (stop: what was applied is
        in ``applied``)."""
        fixed_paths = {op.path for op in fixed}
        pending = [members]
        while pending:
            part = pending.pop()
            if len(part) > 1:
                half = len(part) // 2
                chunks = [part[:half], part[half:]]
            else:
                chunks = [part]
            for chunk in chunks:
                ops = [*fixed, *(op for m in chunk for op in groups[m])]
                try:
                    done = self._store.commit(ops)
                except StoreError as exc:
                    if strict:
                        raise
                    log.info("%s: failover commit outcome unknown: %s", self._paths.job, exc)
                    return False
                if done:
                    applied.update(dict.fromkeys(chunk, done.revision))
                elif done.failed_path in fixed_paths:
                    return False
                elif len(chunk) > 1:
                    pending.append(chunk)
        return True

    def _present(
        self, marks: dict[int, tuple[int, FailoverEntry, str]]
    ) -> dict[int, tuple[int, FailoverEntry, str]]:
        """``marks`` without the items whose mark is gone (one listing, for a hand-off
        of more than a few items): their commit could only be refused. A bulk job's
        2,500 fenced items after a session loss, whose marks the leader had requeued
        as orphans meanwhile, were refused in halves down to single items, 5,000
        commits a housekeeping pass, which held the job's lane for 16 s at a time and
        its fires behind it for a minute (600 s ZooKeeper chaos, seed 20261263). A
        mark still there but replaced is refused by its own condition, as before."""
        if len(marks) <= HAND_OFF_LISTING_FROM:
            return dict(marks)
        names = self._store.children(self._paths.running_root)
        present = {int(n) for n in names if n.isdigit()}
        gone = sorted(i for i in marks if i not in present)
        if gone:
            log.info(
                "%s: %d of the %d items to hand off have no running mark any more "
                "(requeued by the leader, or taken over): left alone",
                self._paths.job,
                len(gone),
                len(marks),
            )
        return {i: m for i, m in marks.items() if i in present}

    def _clear_ops(self, item: int, token: int, fence: str) -> list[Op]:
        return clear_mark_ops(self._paths, item, token, fence)

    def _waiting(self, items: Collection[int]) -> dict[int, Node]:
        """The queue entries waiting now for any of ``items``: one listing, and one
        read of the queue only when one of them is there."""
        wanted = set(items)
        if not wanted:
            return {}
        there = wanted.intersection(self.queued())
        if not there:
            return {}
        tree = self._store.get_tree(self._paths.failover_queue)
        out: dict[int, Node] = {}
        for item in there:
            node = tree.get(self._paths.failover_item(item))
            if node is not None:
                out[item] = node
        return out

    def _queue_ops(self, item: int, entry: FailoverEntry, waiting: Node | None) -> list[Op]:
        """Queue ``entry`` for ``item``, conditional on the queue holding what was
        read: nothing, or ``waiting``, which is folded in (FailoverEntry.fold): a
        second fire's hand-off never overwrites the first's, or that fire is lost."""
        path = self._paths.failover_item(item)
        if waiting is None:
            return [Check(path, exists=False), Put(path, entry.to_bytes())]
        try:
            queued = entry.fold(FailoverEntry.from_bytes(waiting.value, waiting.path))
        except DocumentError:
            queued = entry  # unreadable: nothing to fold from it (the claim says so too)
        return [Check(path, version=waiting.version), Put(path, queued.to_bytes())]

    def queued(self) -> list[int]:
        """Items waiting in the failover queue."""
        return sorted(
            int(n) for n in self._store.children(self._paths.failover_queue) if n.isdigit()
        )

    def claim(
        self, exclude: Collection[int] = (), *, membership: Check | None = None
    ) -> Claim | None:
        """Claim one queued item (lowest first) for this instance, or None (see
        :meth:`claim_many`)."""
        claims = self.claim_many(exclude, limit=1, membership=membership)
        return claims[0] if claims else None

    def claim_many(
        self,
        exclude: Collection[int] = (),
        *,
        limit: int | Callable[[int], int],
        membership: Check | None = None,
        traceparent: Callable[[int, FailoverEntry], str] | None = None,
        proceed: Callable[[], bool] | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` queued items (lowest first) for this instance. Each
        item's claim is its own condition (its queue entry is the one read; its mark
        absent), sent together in as few commits as the store takes: a dead
        instance's thousands of items are taken over in a few round trips, not one
        commit each. Every commit also holds ``membership`` (this instance is still
        the member it registered as), so a process whose session ended cannot
        claim. An item another instance claimed first is simply not ours.

        ``proceed()`` is asked before each commit: False sends no more (the claims
        already applied are returned). A stopping instance must claim nothing, and
        the reads and commits of a big round take seconds on a loaded store.

        ``limit`` may be a function of how many items the listing found queued (not
        excluded): a round is then sized by the queue as it is now, not by a count
        the caller learnt earlier from watch events that trickle in under load.

        ``traceparent(item, entry)``: the trace context of the run about to claim the
        item (its execution span, shardkeeper/tracing.py), written in its mark."""
        if isinstance(limit, int) and limit < 1:
            return []
        skip = set(exclude)
        wanted = [i for i in self.queued() if i not in skip]
        if not wanted:
            return []
        if not isinstance(limit, int):
            limit = limit(len(wanted))
            if limit < 1:
                return []
        tree = self._store.get_tree(self._paths.failover_queue)
        chosen: list[tuple[int, FailoverEntry, str]] = []
        groups: list[list[Op]] = []
        for item in wanted:
            node = tree.get(self._paths.failover_item(item))
            if node is None:
                continue
            try:
                entry = FailoverEntry.from_bytes(node.value, node.path)
            except DocumentError:
                entry = FailoverEntry(0.0, f"{self._paths.job}@unknown#{item}", "?")
            mark = RunningMark(
                self._me,
                entry.fire_time,
                entry.execution_id,
                failover=True,
                traceparent=traceparent(item, entry) if traceparent is not None else "",
                # kept in the claimed run's mark too: if it dies in turn, the next
                # re-run still has the request's params
                params=dict(entry.params),
                request=entry.request,
            )
            fence = new_fence()
            chosen.append((item, entry, fence))
            groups.append(
                [
                    Check(node.path, version=node.version),
                    Delete(node.path),
                    Create(self._paths.running(item), mark.to_bytes()),
                    Create(f"{self._paths.running(item)}/{fence}"),
                ]
            )
            if len(chosen) >= limit:
                break
        applied = self._commit_each(
            [membership] if membership is not None else [], groups, proceed=proceed
        )
        claims = [
            Claim(chosen[k][0], chosen[k][1], rev, chosen[k][2])
            for k, rev in sorted(applied.items())
        ]
        # one line per (fire, previous owner), not per item: a claim of thousands of a
        # big job's items was thousands of log lines on a loaded coordinating thread
        grouped: dict[tuple[float, str], list[int]] = {}
        for claim in claims:
            key = (claim.entry.fire_time, claim.entry.from_instance)
            grouped.setdefault(key, []).append(claim.item)
        for (fire_time, from_instance), items in grouped.items():
            log.info(
                "%s: %s took over %s (fired %s, from %s)",
                self._paths.job,
                self._me,
                f"item {items[0]}" if len(items) == 1 else f"{len(items)} items {_span(items)}",
                fire_time,
                from_instance,
            )
        return claims

    def hand_back(self, claims: Sequence[Claim], why: str) -> list[int]:
        """Put ``claims`` (never run) back in the queue at once, each entry as it was
        claimed (its fire, execution, previous owner and folds), each only while our
        mark is still the claim's: for another instance to take over. Returns the
        items handed back; raises StoreError when the outcome is unknown."""
        return self.hand_off(
            {c.item: (c.token, c.entry, c.fence) for c in claims},
            keep=True,
            why=dict.fromkeys((c.item for c in claims), why),
        )


def _span(items: list[int]) -> str:
    """Items for a log line: all of a few, else the first and last few."""
    ordered = sorted(items)
    if len(ordered) <= 10:
        return str(ordered)
    head = ", ".join(map(str, ordered[:5]))
    tail = ", ".join(map(str, ordered[-3:]))
    return f"[{head}, ..., {tail}]"


def _valid_segment(name: str) -> bool:
    try:
        check_path("/" + name)
    except ConfigError:
        return False
    return "/" not in name
