"""Groups checked apart in one request: :meth:`commit_groups` as nested transactions.

etcd limits a transaction to ``--max-txn-ops`` compares, writes and reads (128 by
default), so a commit that marks 1,000 items running, one exact absence check (two
compares) each, would take 16 transactions. But a transaction's operation may itself
be a transaction (etcd 3.3 and later), and the limit applies to each transaction on
its own. So :func:`commit_groups` sends:

* the ``fixed`` operations as the outer transaction, exactly as :meth:`commit` would
  (their compares gate everything, their failure-branch reads name what failed);
* each group as a transaction of its own, nested in the outer one's success branch:
  its compares, its writes, and failure-branch reads of its conditions;
* when the groups are more than the outer branch has room for, containers: nested
  transactions without compares, each holding up to ``fan`` group transactions.

The server applies it all in one revision, and each group only if its own compares
hold: the groups are checked apart, not all or nothing. The response says which
groups were applied; a refused group's reads name its condition found false.

A group whose existence check fails in the own-key form but would hold as a pure
parent (the form the outer planner would re-send) is committed again alone, with the
fixed operations, by :meth:`commit`: rare, and exact. Groups that write one key twice
between them, or that are too large to nest, fall back to one plain commit.

:func:`plan_group`, :func:`judge_group` and :func:`group_bytes` are pure (tabled in
``tests/registry/test_etcd_plan.py``); :func:`commit_groups` sends through the store's
:class:`~shardkeeper.registry.etcd.planner.Commits` and, for the fallbacks, the store's
public ``commit``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shardkeeper.registry.base import Check, CoordinationStore, Create, GroupsResult, Op, Put
from shardkeeper.registry.batching import plain_commit_groups
from shardkeeper.registry.etcd.conditions import Condition, Verdict
from shardkeeper.registry.etcd.core import groups_per_commit
from shardkeeper.registry.etcd.planner import Commits, PlanContext, fold, writes
from shardkeeper.registry.etcd.records import Request, Txn

__all__ = ["Planned", "commit_groups", "group_bytes", "judge_group", "plan_group"]


class Planned:
    """One group as a nested transaction (a :class:`~.records.Txn`): its request,
    conditions and written keys."""

    __slots__ = ("conds", "keys", "request", "spares", "width")

    def __init__(self, request: Txn, conds: list[Condition], spares: int, keys: set[bytes]):
        self.request = request
        self.conds = conds
        #: failure-branch reads of the existence checks' other form (the last ones)
        self.spares = spares
        #: the keys the group writes
        self.keys = keys
        #: its largest branch, which etcd counts against the limit
        self.width = max(len(request.compare), len(request.success), len(request.failure))


def group_bytes(group: Sequence[Op], root: int) -> int:
    """A group's nested transaction, generously (k: the key's length with the
    namespace prefix of ``root`` characters, v: the value's): a ``Create`` is two
    compares, two reads (one key, one subtree range each) and a put, 7k + v; a
    ``Check`` a compare and its reads, 4k + v (an existence check reads both forms); a
    ``Put`` k + v; a ``Delete`` k; each with framing, and the group's own. A test
    checks it against the encoded size."""
    size = 16
    for op in group:
        k = root + len(op.path)
        if isinstance(op, Create):
            size += 7 * k + len(op.value) + 96
        elif isinstance(op, Check):
            size += 4 * k + len(op.value or b"") + 64
        elif isinstance(op, Put):
            size += k + len(op.value) + 32
        else:
            size += k + 16
    return size


def commit_groups(
    store: CoordinationStore,
    commits: Commits,
    limit: int,
    fixed: Sequence[Op],
    groups: Sequence[Sequence[Op]],
) -> GroupsResult:
    """``fixed`` as the outer transaction and each group nested in it, checked apart
    (see the module docstring); one request whatever the number of groups, within
    ``limit`` operations a transaction. ``store`` (its public ``commit``) takes the
    fallbacks."""
    half = limit // 2
    keys = commits.ctx.keys
    planned: list[Planned | str] = []
    written: set[bytes] = {keys.key(op.path) for op in fixed if not isinstance(op, Check)}
    guards: dict[str, None] = {}
    for group in groups:
        plan = plan_group(group, guards, commits.ctx)
        if isinstance(plan, Planned):
            if plan.keys & written or plan.width > half:
                # a key written twice (etcd refuses it) or a group too large to
                # nest: the plain commit says what it can
                return plain_commit_groups(store, fixed, groups)
            written |= plan.keys
        planned.append(plan)
    sent = [p for p in planned if isinstance(p, Planned)]
    if len(sent) > groups_per_commit(limit):
        return plain_commit_groups(store, fixed, groups)
    fan = max(1, math.ceil(math.sqrt(len(sent)))) if len(sent) > half - 8 else len(sent)
    nested: list[Request]
    if fan == len(sent):
        nested = [p.request for p in sent]
    else:
        nested = [
            Txn(success=tuple(p.request for p in sent[i : i + fan]))
            for i in range(0, len(sent), fan)
        ]
    what = f"commit of {len(fixed)} operations and {len(groups)} groups"
    resp, failed_path = commits.write(what, fixed, limit, nested=nested, nested_guards=guards)
    if resp is None or not resp.succeeded:
        return GroupsResult(False, failed_path=failed_path)
    revision = int(resp.header.revision)
    replies = list(resp.responses[len(resp.responses) - len(nested) :])
    if fan != len(sent):
        replies = [inner for r in replies for inner in r.response_txn.responses]
    outcome = iter(replies)
    applied: dict[int, int] = {}
    refused: dict[int, str | None] = {}
    again: list[int] = []
    for n, plan in enumerate(planned):
        if isinstance(plan, str):
            refused[n] = plan  # doomed: never sent
            continue
        reply = next(outcome).response_txn
        if reply.succeeded:
            applied[n] = revision
            continue
        verdict = judge_group(plan, reply)
        if verdict is None:
            again.append(n)
        else:
            refused[n] = verdict
    for n in again:
        # an existence check in the form the nested transaction could not take
        alone = store.commit([*fixed, *groups[n]])
        if alone:
            applied[n] = alone.revision
        else:
            refused[n] = alone.failed_path
    return GroupsResult(True, revision, applied, refused)


def plan_group(group: Sequence[Op], guards: dict[str, None], ctx: PlanContext) -> Planned | str:
    """The nested transaction of ``group`` (exact condition forms), or the path that
    dooms it; its written paths' ancestors are added to ``guards``."""
    folded = fold(group, ctx.keys)
    if folded.doomed is not None:
        return folded.doomed
    own: dict[str, None] = {}
    success = writes("commit group", folded.final, own, ctx)
    for ancestor in own:
        if ancestor not in folded.final:  # an ancestor the group writes is checked by it
            guards.setdefault(ancestor, None)
    conds = list(folded.conditions.values())
    compares = [cmp for c in conds for cmp in c.compares()]
    probes = [p for c in conds for p in c.probes()]
    exists = [c for c in conds if c.kind == "exists"]
    # existence: read the other form too, to tell a pure parent at once
    probes.extend(c.other_probe() for c in exists)
    request = Txn(tuple(compares), tuple(success), tuple(probes))
    keys = {ctx.keys.key(path) for path in folded.final}
    return Planned(request, conds, len(exists), keys)


def judge_group(plan: Planned, reply: Any) -> str | None:
    """The path of the refused group's condition found false; None when every
    condition held in some form (a pure parent: commit the group alone)."""
    reads = [list(r.response_range.kvs) for r in reply.responses]
    spare = iter(reads[len(reads) - plan.spares :]) if plan.spares else iter(())
    got = iter(reads[: len(reads) - plan.spares])
    first_false: str | None = None
    for cond in plan.conds:
        mine = [next(got) for _ in cond.probes()]
        other = next(spare) if cond.kind == "exists" else None
        if cond.judge(mine, other) is Verdict.FALSE and first_false is None:
            first_false = cond.path
    return first_false
