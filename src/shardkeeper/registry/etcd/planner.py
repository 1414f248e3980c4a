"""The transaction planner: a commit's operations become one etcd transaction
(compares, writes and failure-branch reads), re-sent when a condition needs another
form; the failure branch's reads name the condition that failed.

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

from collections.abc import Iterable, Sequence
from typing import Any

import etcd3.etcdrpc as rpc

from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry.base import Check, Create, Delete, Op, Put, ancestors
from shardkeeper.registry.etcd.conditions import EQUAL, Condition, Verdict
from shardkeeper.registry.etcd.keys import below_range, own_range
from shardkeeper.registry.etcd.members import MembersMixin

__all__ = ["COMMIT_ATTEMPTS", "PlannerMixin"]

#: how often a commit is re-sent when a condition needs another form (see Condition)
COMMIT_ATTEMPTS = 8


class PlannerMixin(MembersMixin):
    """Commits of :class:`EtcdStore` as etcd transactions (see the module docstring)."""

    def _write(
        self,
        what: str,
        ops: Sequence[Op],
        *,
        prev_kv: bool = False,
        nested: Sequence[Any] = (),
        nested_guards: Iterable[str] = (),
    ) -> tuple[Any, str | None]:
        """Send ``ops`` as one transaction; return the response (None when the commit
        cannot succeed and nothing was sent) and, if it failed, the path of the first
        condition found false.

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
        conditions, final, doomed = self._fold(ops)
        guarded: dict[str, None] = {}
        success = self._writes(what, final, guarded, prev_kv=prev_kv)
        if doomed is not None:
            return None, doomed
        # nested transactions (commit_groups) go after the writes; their writes'
        # ancestors are guarded here, after this commit's own
        success.extend(nested)
        for ancestor in nested_guards:
            guarded.setdefault(ancestor, None)
        conds = list(conditions.values())
        limit = self.max_ops_per_commit
        # Every condition costs at least one compare and one read, an exact absence two
        # of each. When they do not all fit, the absences last in op order take the
        # compact form (one compare, after a pre-read).
        slack = limit - len(conds)
        for cond in conds:
            if cond.kind == "absent":
                cond.compact = slack <= 0
                slack -= 1
        resp: Any = None
        contended = conds[0].path if conds else None
        for _attempt in range(COMMIT_ATTEMPTS):
            refuted = self._read_absences(what, [c for c in conds if c.compact and c.since < 0])
            if refuted is not None:
                return None, refuted
            compares = [cmp for c in conds for cmp in c.compares()]
            probes = [p for c in conds for p in c.probes()]
            room = limit - max(len(compares), len(probes))
            guards = list(guarded)[: max(room, 0)]
            room -= len(guards)
            # spare reads let a failed existence check tell its two forms apart at once
            spare = [c for c in conds if c.kind == "exists"][: max(room, 0)]
            for ancestor in guards:
                key = self._key(ancestor)
                compares.append(
                    rpc.Compare(key=key, target=rpc.Compare.LEASE, result=EQUAL, lease=0)
                )
                probes.append(rpc.RangeRequest(key=key, keys_only=True))
            probes.extend(c.other_probe() for c in spare)
            resp = self._txn(
                what,
                compare=compares,
                success=success,
                failure=[rpc.RequestOp(request_range=p) for p in probes],
            )
            if resp.succeeded:
                return resp, None
            reads = iter([list(r.response_range.kvs) for r in resp.responses])
            cond_reads = [[next(reads) for _ in c.probes()] for c in conds]
            for ancestor in guards:
                kvs = next(reads)
                if kvs and kvs[0].lease != 0:
                    # (a nested group's write when none of the commit's own is below it)
                    child = next(
                        (
                            p
                            for p, w in final.items()
                            if w is not None and p.startswith(ancestor + "/")
                        ),
                        f"{ancestor}/...",
                    )
                    raise StoreError(
                        f"{what}: cannot write {child!r}: {ancestor!r} is an ephemeral node and "
                        "an ephemeral node cannot have children"
                    )
            spare_reads = {id(c): next(reads) for c in spare}
            retry = False
            for cond, got in zip(conds, cond_reads, strict=True):
                verdict = cond.judge(got, spare_reads.get(id(cond)))
                if verdict is Verdict.FALSE:
                    return resp, cond.path
                if verdict is Verdict.RETRY and not retry:
                    retry, contended = True, cond.path
            if not retry:
                return resp, None
        return resp, contended

    def _fold(
        self, ops: Sequence[Op]
    ) -> tuple[dict[object, Condition], dict[str, tuple[bytes, bool] | None], str | None]:
        """The conditions ``ops`` state, their net writes (path -> (value, ephemeral)
        to put, or None to delete) and the path that dooms them (a Create after a
        write of the same path), if any."""
        conditions: dict[object, Condition] = {}
        # path -> net write: (value, ephemeral) to put, or None to delete
        final: dict[str, tuple[bytes, bool] | None] = {}
        doomed: str | None = None
        for op in ops:
            key = self._key(op.path)
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
        return conditions, final, doomed

    def _writes(
        self,
        what: str,
        final: dict[str, tuple[bytes, bool] | None],
        guarded: dict[str, None],
        *,
        prev_kv: bool = False,
    ) -> list[Any]:
        """The transaction's write operations for the net writes ``final``; adds the
        written paths' strict ancestors to ``guarded`` (each must have no lease)."""
        success: list[Any] = []
        for path, write in final.items():
            key = self._key(path)
            if write is None:
                success.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key)))
                continue
            value, ephemeral = write
            put = rpc.PutRequest(
                key=key, value=value, lease=self._lease_for(ephemeral), prev_kv=prev_kv
            )
            success.append(rpc.RequestOp(request_put=put))
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

    def _read_absences(self, what: str, conds: list[Condition]) -> str | None:
        """The pre-read of compact absence conditions: note the revision at which each
        path had no key and nothing below it, or return the first path that had."""
        per_txn = self.max_ops_per_commit // 2  # two reads per path
        for i in range(0, len(conds), per_txn):
            chunk = conds[i : i + per_txn]
            reads = [
                rpc.RequestOp(request_range=r)
                for c in chunk
                for r in (own_range(c.key), below_range(c.key))
            ]
            resp = self._txn(f"{what}: read before the commit", success=reads)
            for j, c in enumerate(chunk):
                if any(resp.responses[2 * j + k].response_range.kvs for k in (0, 1)):
                    return c.path
                c.since = int(resp.header.revision)
        return None
