"""Running marks: what executes now, written in batched conditional commits.

At a trigger an instance marks all its items running in ONE commit (chunked only
past the store's per-commit limit) that also checks that no reshard is pending and
the assignment is the one it read. A commit's revision is the created_revision of
every mark it wrote: the fencing token of those executions. When the items are
done, one commit deletes the marks, each only if it is still ours (its token, or for
a persistent mark its unique fence child: see :meth:`ExecutionService.finish`), so an
instance that was cut off and taken over can never erase the taker's marks.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import FENCE_PREFIX, JobPaths
from shardkeeper.coordination.snapshot import snapshots_from_tree
from shardkeeper.errors import StoreError, StoreLimitError
from shardkeeper.registry import batching
from shardkeeper.registry.base import Check, CoordinationStore, Create, Delete, Node, Op, Put
from shardkeeper.registry.packing import pack_groups

__all__ = ["FENCE_PREFIX", "ExecutionService", "StartResult", "clear_mark_ops", "new_fence"]


def new_fence() -> str:
    """A fence child name that is never used twice."""
    return f"{FENCE_PREFIX}{uuid.uuid4().hex[:16]}"


def clear_mark_ops(paths: JobPaths, item: int, token: int, fence: str) -> list[Op]:
    """Ops that delete ``item``'s mark only while it is the one an execution owns: a
    persistent mark by its fence child (checked, deleted, then the mark), any other by
    its created_revision ``token``."""
    path = paths.running(item)
    if fence:
        child = f"{path}/{fence}"
        return [Check(child, exists=True), Delete(child), Delete(path)]
    return [Check(path, created_revision=token), Delete(path)]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartResult:
    """Outcome of marking items running.

    ``marked`` are the items now ours, ``tokens`` their fencing tokens, ``reason``
    why the commit was refused (``"reshard"``, ``"assignment"``, ``"running"``,
    ``"membership"`` when this instance's membership is not the one it registered,
    ``"result"`` when an ``item_checks`` condition failed, ``"limit"`` when the store
    refuses even one item's commit as too large, or ``"unknown"`` when the store did
    not answer and reading back found nothing of ours) or None. With some items
    marked, ``reason`` says why the others were not: a store that checks items apart
    (etcd) marks those whose own checks hold, and a fire packed into several commits
    keeps the chunks that were applied. Every item not in ``marked`` is the caller's
    to decide again (never silently dropped).
    """

    marked: tuple[int, ...]
    reason: str | None = None
    #: the fencing token of each marked item (the revision of the commit that marked it)
    tokens: dict[int, int] = field(default_factory=dict)
    #: the fence child of each persistent mark (see ExecutionService.finish)
    fences: dict[int, str] = field(default_factory=dict)


class ExecutionService:
    """Writes and clears the running and misfire marks of one job."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id
        #: this instance's "fired" node was written (a hint: a wrong one costs a retry)
        self._fired_written = False
        #: the latest fire this instance wrote into its "fired" node: the node never
        #: goes back (a misfire re-run of an older fire, started after a newer fire,
        #: wrote the older time, the leader then saw the newer fire as started nowhere
        #: and a reshard applied to it: two instances ran one item for one fire). Too
        #: late a value only defers a reshard to the next fire; too early duplicates.
        self._fired_latest = 0.0
        self._fired_lock = threading.Lock()

    def start(
        self,
        items: Sequence[int],
        *,
        fire_time: float,
        execution_ids: dict[int, str],
        assignment_version: int,
        persistent: bool,
        monitor: bool,
        membership: Check | None = None,
        item_checks: dict[int, Check] | None = None,
        clear_misfire: Sequence[int] = (),
        traceparents: Mapping[int, str] | None = None,
        claims: Mapping[int, Sequence[Op]] | None = None,
        params: Mapping[str, str] | None = None,
        request: str = "",
    ) -> StartResult:
        """Mark ``items`` running for this instance, if no reshard is pending, the
        assignment is unchanged and (``membership``) this instance is still the member
        it registered as. With ``monitor`` off only the checks are committed.
        ``item_checks`` are further conditions, one per item, committed with that
        item's mark (a one-off job: "its result is still the one read").
        ``clear_misfire`` (a misfire re-run): items whose misfire marks are deleted in
        the commit that marks them running. ``traceparents``: each item's execution
        span (shardkeeper/tracing.py), written in its mark for a run that replaces it.
        ``claims`` (a run-now request's run, coordination/runnow.py): ops committed with
        each item's mark, its record of the request; refused as ``"claimed"`` when the
        item has one already. ``params`` and ``request``: that request's params and id,
        written in each mark, so that a failover re-run of the item has them (its
        queue entry is made from the mark, maybe by another instance after this one
        died).

        A commit whose reply is lost may have been applied: the marks are then read
        back, and those that carry this instance and the execution ids it wrote are
        adopted (their created_revision is the token). What cannot be read back now is
        found by the housekeeping pass (a mark naming this instance without a local
        execution is handed to failover), so an unknown outcome never strands a mark.
        """
        with self._fired_lock:
            self._fired_latest = max(self._fired_latest, fire_time)
            fired = self._fired_latest
        fixed: list[Op] = [
            *([membership] if membership is not None else []),
            Check(self._paths.necessary, exists=False),
            Check(self._paths.sharding, version=assignment_version),
            # tells a leader about to reshard that this fire (or a later one) already
            # started here
            Put(
                self._paths.fired(self._me),
                repr(fired).encode(),
                existing=self._fired_written,
            ),
        ]
        groups: list[list[Op]] = []
        fences: dict[int, str] = {}
        if monitor:
            for item in items:
                mark = RunningMark(
                    self._me,
                    fire_time,
                    execution_ids[item],
                    traceparent=(traceparents or {}).get(item, ""),
                    params=dict(params or {}),
                    request=request,
                )
                path = self._paths.running(item)
                group: list[Op] = [Create(path, mark.to_bytes(), ephemeral=not persistent)]
                if item_checks and item in item_checks:
                    group.insert(0, item_checks[item])
                if persistent:
                    fences[item] = new_fence()
                    group.append(Create(f"{path}/{fences[item]}"))
                groups.append(group)
        else:
            groups = [[] for _ in items]
        if claims:
            # the request's record of the item, with its mark: exactly once per item
            for item, group in zip(items, groups, strict=True):
                group.extend(claims.get(item, ()))
        if clear_misfire:
            # in the commit that starts the re-run, not one of its own after it
            for item, group in zip(items, groups, strict=True):
                if item in clear_misfire:
                    group.append(Delete(self._paths.misfire(item)))
        token = 0
        marked: list[int] = []
        tokens: dict[int, int] = {}
        refused: str | None = None
        chunks = pack_groups(
            self._store, groups, fixed, apart=monitor or bool(clear_misfire) or bool(claims)
        )
        # A worklist, not a loop over the packing: a chunk the store refuses as too
        # large (its limits are lower than the packing assumed) is split in two and
        # sent again, so a definite refusal never turns into a skipped fire.
        work: deque[list[int]] = deque(members for members, _ops in chunks)
        while work:
            members = work.popleft()
            chunk_items = [items[m] for m in members]
            try:
                result = batching.commit_groups(self._store, fixed, [groups[m] for m in members])
            except StoreLimitError as exc:
                # definite: the store applied nothing (it refused the request)
                if len(members) > 1:
                    half = len(members) // 2
                    work.extendleft([members[half:], members[:half]])
                    log.info(
                        "%s: the store refused a start commit of %d items as too large "
                        "(%s); sending it in two",
                        self._paths.job,
                        len(members),
                        exc,
                    )
                    continue
                log.error(
                    "%s: the store refuses even a single item's start commit (%s): raise "
                    "its request limits (etcd --max-request-bytes, --max-txn-ops)",
                    self._paths.job,
                    exc,
                )
                refused = "limit"
                break
            except StoreError as exc:
                adopted = self.read_back(chunk_items, execution_ids) if monitor else {}
                if adopted:
                    log.info(
                        "%s: start commit outcome unknown (%s); marks of items %s were applied",
                        self._paths.job,
                        exc,
                        sorted(adopted),
                    )
                    marked.extend(i for i in chunk_items if i in adopted)
                    tokens.update({i: t for i, (t, _f) in adopted.items()})
                    if len(adopted) == len(chunk_items):
                        continue
                else:
                    log.warning(
                        "%s: start commit outcome unknown (%s); nothing of ours found",
                        self._paths.job,
                        exc,
                    )
                # The rest (this chunk's unadopted items and every later chunk) goes
                # back to the caller as "unknown": it decides them like any refused
                # start (a retry adopts marks applied late), never drops them.
                refused = "unknown"
                break
            if not result.succeeded:
                refused = self._why(result.failed_path, membership)
                if marked:
                    log.info(
                        "%s: %d of %d items marked running; the others' commit was "
                        "refused (%s) and is decided again",
                        self._paths.job,
                        len(marked),
                        len(items),
                        refused,
                    )
                break
            token = token or result.revision
            self._fired_written = True  # from now on it is overwritten without a read
            for k, m in enumerate(members):
                if k in result.applied:
                    marked.append(items[m])
                    tokens[items[m]] = result.applied[k]
            if result.refused and refused is None:
                # a store that checks items apart started the others (see StartResult)
                refused = self._why(next(iter(result.refused.values())), membership)
        if not monitor and refused is None:
            return StartResult(tuple(items), tokens=dict.fromkeys(items, token))
        return StartResult(
            tuple(marked),
            refused,
            tokens=tokens,
            fences={i: fences[i] for i in marked if i in fences},
        )

    def read_back(
        self, items: Sequence[int], execution_ids: dict[int, str]
    ) -> dict[int, tuple[int, str]]:
        """Items whose mark is ours (this instance, this execution id) -> (token, fence)
        (what a start commit whose reply was lost applied). One tree read of the
        running marks (with their fence children), whatever the number of items.
        Never raises: what cannot be read is left to the housekeeping pass."""
        try:
            tree = self._store.get_tree(self._paths.running_root)
        except StoreError:
            return {}
        marks = self._marks_in(tree)
        found: dict[int, tuple[int, str]] = {}
        for item in items:
            entry = marks.get(item)
            if entry is None:
                continue
            mark, token, fence = entry
            if mark.instance_id == self._me and mark.execution_id == execution_ids[item]:
                found[item] = (token, fence)
        return found

    def _marks_in(self, tree: dict[str, Node]) -> dict[int, tuple[RunningMark, int, str]]:
        """The readable marks of a tree read of ``running/``: item -> (mark, its
        created_revision, its fence child or ""), by the one snapshot reader."""
        snap = snapshots_from_tree(tree, only=self._paths.job, registered=False).get(
            self._paths.job
        )
        if snap is None:
            return {}
        return {
            item: (mark, snap.running_nodes[item].created_revision, snap.fences.get(item, ""))
            for item, mark in snap.running.items()
            if mark is not None
        }

    def _why(self, failed_path: str | None, membership: Check | None = None) -> str:
        if membership is not None and failed_path == membership.path:
            return "membership"
        if failed_path == self._paths.necessary:
            return "reshard"
        if failed_path == self._paths.sharding:
            return "assignment"
        if failed_path and failed_path.startswith(self._paths.running_root + "/"):
            return "running"
        if failed_path and failed_path.startswith(self._paths.results_root + "/"):
            return "result"  # an item_checks condition: the item completed meanwhile
        if failed_path and failed_path.startswith(self._paths.runnow_root + "/"):
            return "claimed"  # a run-now request's item has its record already
        # the backend could not tell: find out cheaply
        if self._store.exists(self._paths.necessary):
            return "reshard"
        return "running"

    def running_items(self) -> dict[int, RunningMark]:
        """Items marked running anywhere in the cluster, with their marks (one tree
        read, whatever the number of items)."""
        tree = self._store.get_tree(self._paths.running_root)
        return {i: mark for i, (mark, _t, _f) in self._marks_in(tree).items()}

    def any_running(self) -> bool:
        """Whether any item of the job is marked running."""
        return bool(self._store.children(self._paths.running_root))

    def finish(
        self,
        items: Iterable[int],
        token: int | Mapping[int, int],
        fences: dict[int, str] | None = None,
        results: dict[int, bytes] | None = None,
        written: Collection[int] = (),
        *,
        extra: Mapping[int, Sequence[Op]] | None = None,
    ) -> list[int]:
        """Delete the marks of ``items`` that are still ours. Returns the items whose
        mark was no longer ours (fenced: someone else took them over).

        ``token``: the created_revision of the marks, one for all (a fire's start
        commit) or per item (a failover batch: each item's claim made its own mark).
        Per item, a batch of thousands of claimed items completes in a few chunked
        commits; completed token by token it took one commit (and, refused, one
        tree read) per item, and held its job's lane for half a minute.

        A persistent mark is ours while its fence child (a unique name created with it
        in the start or claim commit) exists: the completion checks the child, deletes
        it, then the mark. That check is native on every store (a ZooKeeper multi fails
        on the missing child by itself), so no pre-read can race with a take-over: a
        replaced mark has another fence. Other marks are checked by ``token`` (their
        created_revision).

        ``results`` (item -> an encoded :class:`~shardkeeper.coordination.results.ItemResult`)
        are written by the same commit, each with its item's deletion: a result is
        recorded exactly when the item's completion is, and costs no round trip.
        ``written`` are the items whose result node is known to exist (written
        before): ZooKeeper then sets it without reading it first. ``extra`` (item ->
        ops) go with the item's deletion too: its last checkpoint and the deletion of
        its progress (coordination/checkpoints.py), fenced with it."""
        items = list(items)
        fences = fences or {}
        results = results or {}
        tokens = token if isinstance(token, Mapping) else dict.fromkeys(items, token)
        clears = [self.clear_ops(item, tokens.get(item, 0), fences.get(item, "")) for item in items]
        more = extra or {}
        groups = [
            [
                *ops,
                *(
                    [Put(self._paths.result(item), results[item], existing=item in written)]
                    if item in results
                    else []
                ),
                *more.get(item, ()),
            ]
            for item, ops in zip(items, clears, strict=True)
        ]
        fenced: list[int] = []
        for members, _ops in pack_groups(self._store, groups, [], apart=True):
            done_all = batching.commit_groups(self._store, [], [groups[m] for m in members])
            if done_all.succeeded and not done_all.refused:
                continue
            # Some mark is not ours any more (taken over, or cleared by an earlier
            # attempt of this very completion whose reply was lost). Find which with
            # one read, not one commit per item: thousands of one-by-one commits kept
            # a loaded instance's lane busy for a minute while its next fires waited.
            rest = [m for k, m in enumerate(members) if k not in done_all.applied]
            ours = self._still_ours({items[m]: fences.get(items[m], "") for m in rest}, tokens)
            fenced += [items[m] for m in rest if items[m] not in ours]
            rest = [m for m in rest if items[m] in ours]
            if rest:
                again = batching.commit_groups(self._store, [], [groups[m] for m in rest])
                if again.succeeded and not again.refused:
                    continue
                rest = [m for k, m in enumerate(rest) if k not in again.applied]
            # still refused (a take-over between the read and the commit, or only a
            # result write failed): ours one by one, never theirs
            for m in rest:
                done = self._store.commit(groups[m])
                if not done and done.failed_path == self._paths.result(items[m]):
                    # only the result write failed: the completion must not hinge on it
                    done = self._store.commit(clears[m])
                if not done:
                    fenced.append(items[m])
        if fenced:
            log.warning(
                "%s: items %s were taken over; their completion wrote nothing",
                self._paths.job,
                fenced,
            )
        return fenced

    def _still_ours(self, fences: dict[int, str], tokens: Mapping[int, int]) -> set[int]:
        """Which of the items (-> their fence child, "" for none) still have the mark
        this execution made: its fence child, or else its created_revision
        ``tokens[item]`` (one tree read; a failed read raises, and the completion is
        retried whole)."""
        marks = self._marks_in(self._store.get_tree(self._paths.running_root))
        ours: set[int] = set()
        for item, fence in fences.items():
            found = marks.get(item)
            if found is None:
                continue
            _mark, revision, child = found
            if (fence and child == fence) or (not fence and revision == tokens.get(item, 0)):
                ours.add(item)
        return ours

    def clear_ops(self, item: int, token: int, fence: str) -> list[Op]:
        """The conditional deletion of ``item``'s mark (see :meth:`finish`)."""
        return clear_mark_ops(self._paths, item, token, fence)

    def publish_results(
        self,
        results: Mapping[int, bytes],
        tokens: Mapping[int, int],
        fences: Mapping[int, str],
        written: Collection[int] = (),
    ) -> list[int]:
        """Write the results of items that ended while their batch still runs, each
        only while its mark is still this execution's (its fence child, else its
        created_revision ``tokens[item]``): readers then show such an item finished,
        and a failure at once, not when the batch's slowest item ends. The marks stay
        (the batch's completion clears them, writing the results again). Returns the
        items written; a refused chunk (a mark taken over: the batch is fenced) is
        left to the completion or the hand-off. StoreError propagates."""
        items = sorted(results)
        groups: list[list[Op]] = []
        for item in items:
            path = self._paths.running(item)
            fence = fences.get(item, "")
            check = (
                Check(f"{path}/{fence}", exists=True)
                if fence
                else Check(path, created_revision=tokens.get(item, 0))
            )
            put = Put(self._paths.result(item), results[item], existing=item in written)
            groups.append([check, put])
        applied: list[int] = []
        for members, _ops in pack_groups(self._store, groups, [], apart=True):
            done = batching.commit_groups(self._store, [], [groups[m] for m in members])
            applied += [items[members[k]] for k in done.applied]
        return applied

    def mark_misfire(self, items: Sequence[int], fire_time: float) -> None:
        """Record that a trigger was missed while ``items`` ran (for operators)."""
        ops: list[Op] = [Put(self._paths.misfire(i), str(fire_time).encode()) for i in items]
        for _members, chunk in pack_groups(self._store, [[op] for op in ops], []):
            if chunk:
                self._store.commit(chunk)
