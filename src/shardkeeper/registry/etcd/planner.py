"""The transaction planner: a commit's operations become one etcd transaction
(compares, writes and failure-branch reads), re-sent when a condition needs another
form; the failure branch's reads name the condition that failed.

Pure, like ZooKeeper's ``plan.py``: :func:`fold`, :func:`writes`, :func:`shape`,
:func:`build`, :func:`judge` and the pre-read helpers turn operations into requests
and answers into verdicts with no I/O (``tests/registry/test_etcd_plan.py`` tables
them without a server). The requests are plain records (``records.py``: compares,
reads, puts, deletes, transactions); the transport alone turns them into etcd3's
generated messages. :class:`Commits` is the only part here that sends: it asks a
:class:`Txns` (the transport) for the pre-reads and the transaction, and re-sends
while a condition needs another form.

* Checks see the state before the commit. etcd refuses a transaction that writes
  one key twice, so repeated writes of a path are folded into their net effect.
* "An ephemeral node cannot have children": every write also compares ``lease == 0``
  on each strict ancestor (one compare per distinct ancestor, in the same
  transaction) and raises StoreError when one is ephemeral. The guards use what is
  left of the 128 operations after the checks and creates; in a commit that exceeds
  them, the farthest ancestors are not guarded.

The conditions themselves (their compares and reads) are in ``conditions.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry.base import Check, Create, Delete, Op, Put, ancestors
from shardkeeper.registry.etcd.conditions import EQUAL, Condition, Verdict
from shardkeeper.registry.etcd.keys import Keyspace, below_range, own_range
from shardkeeper.registry.etcd.records import (
    Compare,
    DeleteRange,
    PutKey,
    Range,
    Request,
    Target,
)

__all__ = [
    "COMMIT_ATTEMPTS",
    "Attempt",
    "Commits",
    "Folded",
    "PlanContext",
    "Txns",
    "absence_chunks",
    "absence_refuted",
    "build",
    "fold",
    "judge",
    "shape",
    "writes",
]

#: how often a commit is re-sent when a condition needs another form (see Condition)
COMMIT_ATTEMPTS = 8

#: a net write: (value, ephemeral) to put, or None to delete
Write = tuple[bytes, bool] | None


@dataclass(frozen=True)
class PlanContext:
    """What a plan needs of the store: its keyspace, and the lease an ephemeral write
    is attached to (``lease_for(False)`` is 0; ``lease_for(True)`` raises when the
    store has no session)."""

    keys: Keyspace
    lease_for: Callable[[bool], int]


@dataclass
class Folded:
    """A commit's operations folded: the conditions they state, their net writes
    (path -> :data:`Write`) and the path that dooms them, if any."""

    conditions: dict[object, Condition]
    final: dict[str, Write]
    doomed: str | None


@dataclass(frozen=True)
class Attempt:
    """One transaction of a commit: its compares and failure-branch reads, the ancestors
    it guards and the existence checks given a spare read of their other form."""

    compares: list[Compare]
    probes: list[Range]
    guards: list[str]
    spare: list[Condition]


class Txns(Protocol):
    """What :class:`Commits` needs of the transport: one transaction, counted."""

    def txn(
        self,
        what: str,
        *,
        compare: Sequence[Compare] = (),
        success: Sequence[Request] = (),
        failure: Sequence[Request] = (),
    ) -> Any: ...


# -- the pure planner -------------------------------------------------------------------


def fold(ops: Sequence[Op], keys: Keyspace) -> Folded:
    """The conditions ``ops`` state, their net writes and the path that dooms them (a
    Create after a write of the same path), if any. etcd refuses a transaction that
    writes one key twice: Delete then Create is a put without a compare."""
    conditions: dict[object, Condition] = {}
    final: dict[str, Write] = {}
    doomed: str | None = None
    for op in ops:
        key = keys.key(op.path)
        if isinstance(op, Check):
            cond = Condition.for_check(key, op)
            conditions.setdefault(cond.identity(op), cond)
        elif isinstance(op, Delete):
            final[op.path] = None
        elif isinstance(op, Create | Put):
            if op.ephemeral and op.path == "/":
                raise ConfigError("the namespace root '/' cannot be ephemeral")
            if isinstance(op, Create):
                if op.path not in final:
                    cond = Condition(op.path, key, "absent")
                    conditions.setdefault(cond.identity(op), cond)
                elif final[op.path] is not None and doomed is None:
                    doomed = op.path  # created after being written in this commit
            final[op.path] = (op.value, op.ephemeral)
        else:
            raise ConfigError(f"unknown commit operation {op!r}")
    return Folded(conditions, final, doomed)


def writes(
    what: str,
    final: dict[str, Write],
    guarded: dict[str, None],
    ctx: PlanContext,
    *,
    prev_kv: bool = False,
) -> list[Request]:
    """The transaction's write operations for the net writes ``final``; adds the
    written paths' strict ancestors to ``guarded`` (each must have no lease). A write
    below an ephemeral node this commit writes raises StoreError."""
    success: list[Request] = []
    for path, write in final.items():
        key = ctx.keys.key(path)
        if write is None:
            success.append(DeleteRange(key))
            continue
        value, ephemeral = write
        success.append(PutKey(key, value, ctx.lease_for(ephemeral), prev_kv))
        for ancestor in ancestors(path):
            guarded.setdefault(ancestor, None)
            # an ephemeral node this commit writes cannot receive children in it
            parent = final.get(ancestor)
            if parent is not None and parent[1]:
                raise StoreError(
                    f"{what}: cannot write {path!r}: {ancestor!r} is ephemeral and an "
                    "ephemeral node cannot have children"
                )
    return success


def shape(conds: list[Condition], limit: int) -> None:
    """Choose each absence's form. Every condition costs at least one compare and one
    read, an exact absence two of each; when they do not all fit in ``limit``, the
    absences last in op order take the compact form (one compare, after a pre-read)."""
    slack = limit - len(conds)
    for cond in conds:
        if cond.kind == "absent":
            cond.compact = slack <= 0
            slack -= 1


def build(conds: list[Condition], guarded: Iterable[str], limit: int, keys: Keyspace) -> Attempt:
    """The compares and failure-branch reads of one transaction: the conditions',
    then ancestor guards (nearest parents first) while they fit in ``limit``, then
    spare reads of the existence checks' other form with the room left."""
    compares = [cmp for c in conds for cmp in c.compares()]
    probes = [p for c in conds for p in c.probes()]
    room = limit - max(len(compares), len(probes))
    guards = list(guarded)[: max(room, 0)]
    room -= len(guards)
    # spare reads let a failed existence check tell its two forms apart at once
    spare = [c for c in conds if c.kind == "exists"][: max(room, 0)]
    for ancestor in guards:
        key = keys.key(ancestor)
        compares.append(Compare(key, Target.LEASE, EQUAL, 0))
        probes.append(own_range(key))
    probes.extend(c.other_probe() for c in spare)
    return Attempt(compares, probes, guards, spare)


def judge(
    what: str,
    attempt: Attempt,
    conds: list[Condition],
    final: dict[str, Write],
    reads: list[list[Any]],
) -> tuple[Verdict, str | None]:
    """What a failed transaction's failure-branch ``reads`` (the key-values of each
    probe, in order) say: FALSE and the first condition found false, RETRY and the
    first one that needs another form, or HOLDS. A guarded ancestor found ephemeral
    raises StoreError."""
    it = iter(reads)
    cond_reads = [[next(it) for _ in c.probes()] for c in conds]
    for ancestor in attempt.guards:
        kvs = next(it)
        if kvs and kvs[0].lease != 0:
            # (a nested group's write when none of the commit's own is below it)
            child = next(
                (p for p, w in final.items() if w is not None and p.startswith(ancestor + "/")),
                f"{ancestor}/...",
            )
            raise StoreError(
                f"{what}: cannot write {child!r}: {ancestor!r} is an ephemeral node and "
                "an ephemeral node cannot have children"
            )
    spare_reads = {id(c): next(it) for c in attempt.spare}
    retry: str | None = None
    for cond, got in zip(conds, cond_reads, strict=True):
        verdict = cond.judge(got, spare_reads.get(id(cond)))
        if verdict is Verdict.FALSE:
            return Verdict.FALSE, cond.path
        if verdict is Verdict.RETRY and retry is None:
            retry = cond.path
    return (Verdict.HOLDS, None) if retry is None else (Verdict.RETRY, retry)


def absence_chunks(
    conds: list[Condition], limit: int
) -> list[tuple[list[Condition], list[Request]]]:
    """The pre-reads of compact absences: per transaction (two reads per path within
    ``limit``), its conditions and its read operations."""
    per_txn = limit // 2
    chunks = []
    for i in range(0, len(conds), per_txn):
        chunk = conds[i : i + per_txn]
        reads: list[Request] = [r for c in chunk for r in (own_range(c.key), below_range(c.key))]
        chunks.append((chunk, reads))
    return chunks


def absence_refuted(chunk: list[Condition], revision: int, reads: list[list[Any]]) -> str | None:
    """From a pre-read at ``revision`` (two reads per condition of ``chunk``): the first
    path that had a key or keys below it; else None, each condition noting
    ``revision`` as the one its absence was seen at."""
    for j, c in enumerate(chunk):
        if reads[2 * j] or reads[2 * j + 1]:
            return c.path
        c.since = revision
    return None


def kvs_of(resp: Any) -> list[list[Any]]:
    """The key-values of each range response of a transaction's answer."""
    return [list(r.response_range.kvs) for r in resp.responses]


# -- the part that sends ------------------------------------------------------------------


class Commits:
    """Commits of :class:`EtcdStore` as etcd transactions: plans them (above) and sends
    them through ``txns``, re-sending while a condition needs another form."""

    def __init__(self, txns: Txns, ctx: PlanContext) -> None:
        self._txns = txns
        self.ctx = ctx

    def write(
        self,
        what: str,
        ops: Sequence[Op],
        limit: int,
        *,
        prev_kv: bool = False,
        nested: Sequence[Request] = (),
        nested_guards: Iterable[str] = (),
    ) -> tuple[Any, str | None]:
        """Send ``ops`` as one transaction of at most ``limit`` operations; return the
        response (None when the commit cannot succeed and nothing was sent) and, if it
        failed, the path of the first condition found false.

        Checks are evaluated on the state before the commit. etcd refuses a
        transaction that writes one key twice, so several writes of one path are
        folded into their net effect (Delete then Create -> put without a compare;
        Create after a write of the same path -> the commit fails).

        Conditions see pure parents (see :class:`Condition`). One that needs another
        form (a pure parent checked for existence, a sibling that spoiled a compact
        absence compare) has the transaction re-sent, at most ``COMMIT_ATTEMPTS``
        times; then the commit fails naming that path. Besides the conditions the ops
        ask for, every strict ancestor of a written path must have no lease (an
        ephemeral node cannot have children); a write below an ephemeral node raises
        StoreError. Ancestor guards are added, nearest parents first, while the
        compares and the failure-branch reads stay within etcd's 128 operations.
        """
        folded = fold(ops, self.ctx.keys)
        guarded: dict[str, None] = {}
        success = writes(what, folded.final, guarded, self.ctx, prev_kv=prev_kv)
        if folded.doomed is not None:
            return None, folded.doomed
        # nested transactions (commit_groups) go after the writes; their writes'
        # ancestors are guarded here, after this commit's own
        success.extend(nested)
        for ancestor in nested_guards:
            guarded.setdefault(ancestor, None)
        conds = list(folded.conditions.values())
        shape(conds, limit)
        resp: Any = None
        contended = conds[0].path if conds else None
        for _attempt in range(COMMIT_ATTEMPTS):
            refuted = self._read_absences(
                what, [c for c in conds if c.compact and c.since < 0], limit
            )
            if refuted is not None:
                return None, refuted
            attempt = build(conds, guarded, limit, self.ctx.keys)
            resp = self._txns.txn(
                what,
                compare=attempt.compares,
                success=success,
                failure=attempt.probes,
            )
            if resp.succeeded:
                return resp, None
            verdict, path = judge(what, attempt, conds, folded.final, kvs_of(resp))
            if verdict is Verdict.FALSE:
                return resp, path
            if verdict is Verdict.HOLDS:
                return resp, None
            contended = path
        return resp, contended

    def _read_absences(self, what: str, conds: list[Condition], limit: int) -> str | None:
        """The pre-read of compact absence conditions: note the revision at which each
        path had no key and nothing below it, or return the first path that had."""
        for chunk, reads in absence_chunks(conds, limit):
            resp = self._txns.txn(f"{what}: read before the commit", success=reads)
            refuted = absence_refuted(chunk, int(resp.header.revision), kvs_of(resp))
            if refuted is not None:
                return refuted
        return None
