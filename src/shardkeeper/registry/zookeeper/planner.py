"""Commits of the ZooKeeper backend: one ``multi`` each, planned from a pre-read.

:class:`Commits` is the part that reads what a commit's conditions need, sends the
multi the PURE planner (``plan.py``) builds, and retries; it sends through the
transport and asks the tree watch through :class:`Coverage` whether a watch covers a
node (our own ephemeral nodes of known incarnation: ``owned.py``).

Commits
    A commit is one ZooKeeper ``multi``. ZooKeeper can only check a data *version*
    inside a multi, so the other conditions are derived from a pre-read:

    ============================== ================================================
    operation                      inside the multi
    ============================== ================================================
    ``Check(version=v)``           ``check(path, v)`` (native)
    ``Check(exists=True)``         ``check(path, -1)`` (native: existence only)
    ``Check(value/created_        if the pre-read satisfies the condition:
    revision)``                    ``check(path, pre-read version)``; else the
                                   commit fails without sending anything
    ``Check(created_revision)``    no pre-read when the node is our own ephemeral
    of our own ephemeral node      node of known incarnation (``owned.py``):
                                   ``check(path, -1)``
    ``Check(exists=False)``        *absence guard*, no pre-read: ``create(g)`` +
                                   ``delete(g)`` where ``g`` is the path (or, when
                                   its parent is missing, the first missing
                                   ancestor segment); NodeExists on the path itself
                                   is the failed condition
    ``Create``                     ``create`` (NodeExists -> failed commit)
    ``Put``                        present with the right kind: ``set_data(path,
                                   pre-read version)``; wrong ephemeral kind:
                                   ``delete`` + ``create``; absent: ``create``
    ``Put(existing=True)``         persistent: ``set_data(path, -1)`` with no
                                   pre-read (a missing node fails the multi, which
                                   is then planned again with the pre-read)
    ``Delete``                     present: ``delete``; absent: absence guard;
                                   no pre-read when an existence check on the path
                                   or a descendant is in the same commit (then it
                                   exists whenever the multi applies)
    ============================== ================================================

    Every check and guard comes first in the multi, so conditions are evaluated against
    the state *before* the commit (as etcd's ``If``/``Then`` does). When the multi
    fails on an operation derived from the pre-read, something changed concurrently:
    the commit re-reads and retries, at most ``_COMMIT_ATTEMPTS`` times; if the store
    keeps changing it reports a failed commit naming the contended path. Missing parents
    of ``Create``/``Put`` (those of every node the commit writes, found with one read
    after the multi failed for one of them) are created, persistent and empty, inside
    the retried multi, so a failed commit leaves no parents behind. The result's
    ``revision`` is the multi's own zxid, read from the reply header
    (``kazoo_private``), so it equals the ``created_revision`` of every node the commit
    created.

    Known limit: a version check cannot tell two incarnations of a node apart. If a
    node is deleted and re-created with the same data version between the pre-read
    and the multi, a derived ``value``/``created_revision`` check passes against the
    new incarnation. An ephemeral node of our own session is immune (it can only be
    deleted explicitly, or by expiry, which also kills the multi): a plan made on one
    session is never sent on another (the session is compared before sending; a
    change plans again), since the multi of an expired session's plan, queued by the
    client while it reconnected, would otherwise meet the node as re-created under
    the new session (what remains is the instant between that comparison and the
    client queueing the request).

    The created-revision check of an ephemeral node this client created (or read as
    its own) while a watch covers it is an existence check with no pre-read: its
    incarnation is known until a delete notification or a connection change says
    otherwise (``owned.py`` has the argument).
"""

from __future__ import annotations

from typing import Any, Protocol

from kazoo import exceptions as kz
from kazoo.security import OPEN_ACL_UNSAFE

from shardkeeper.errors import StoreError, StoreUnavailableError
from shardkeeper.registry.base import (
    Check,
    CommitResult,
    Create,
    Node,
    Op,
    Put,
    ancestors,
)
from shardkeeper.registry.zookeeper import kazoo_private
from shardkeeper.registry.zookeeper.errors import _first_error
from shardkeeper.registry.zookeeper.nodes import _node, _parent
from shardkeeper.registry.zookeeper.owned import OwnedEphemerals, Ticket
from shardkeeper.registry.zookeeper.plan import (
    Origin,
    PlanContext,
    build_multi,
    reads_needed,
    revision_check,
)
from shardkeeper.registry.zookeeper.reads import Reads
from shardkeeper.registry.zookeeper.transport import Transport

__all__ = ["COMMIT_ATTEMPTS", "Commits", "Coverage"]

#: how often a commit re-reads and retries when a pre-read node changed under it
COMMIT_ATTEMPTS = 8


class Coverage(Protocol):
    """What the commits ask of the tree watch: whether a recursive watch armed on the
    current connection covers ``path`` (then every delete of it is heard: ``owned.py``)."""

    def covered(self, path: str) -> bool: ...


class Commits:
    """Commit planning and sending: pre-reads, checks and guards, the multi, retries
    (see the module docstring). Owns no state of its own beyond its collaborators."""

    def __init__(
        self,
        transport: Transport,
        reads: Reads,
        owned: OwnedEphemerals,
        coverage: Coverage,
        acl: list[Any] | None,
    ) -> None:
        self._transport = transport
        self._reads = reads
        #: our ephemeral nodes of known incarnation (records made and used here)
        self._owned = owned
        self._coverage = coverage
        self._acl = acl or OPEN_ACL_UNSAFE

    def context(self) -> PlanContext:
        """What a plan needs of the session now: the namespace node, the ACL of new
        nodes, the session id requests go on."""
        t = self._transport
        return PlanContext(t.chroot, self._acl, t.session())

    def learn(self, paths: list[str]) -> Ticket:
        """Start learning the incarnation of those ``paths`` a watch covers (see
        ``owned.py``); hand the ticket to ``self._owned.end``."""
        return self._owned.begin([p for p in paths if self._coverage.covered(p)])

    def _missing_ancestors(self, deadline: float, path: str, stop: set[str]) -> list[str]:
        """Ancestors of ``path`` that do not exist, top-down, up to the first one in
        ``stop`` (paths the caller creates itself). One pipelined batch of exists."""
        todo: list[str] = []
        for a in reversed(ancestors(path)):  # top-down
            if a in stop:
                break
            todo.append(a)
        t = self._transport
        sent = [t.send_exists(a) for a in todo]
        stats = [t.wait(ar, deadline) for ar in sent]
        for i, st in enumerate(stats):
            if st is None:
                return todo[i:]  # nothing exists below a missing node
        return []

    def _missing_parents(self, deadline: float, targets: set[str]) -> set[str]:
        """The missing ancestors of every path in ``targets`` that ``targets`` does not
        hold itself, from one read whatever their number: a commit that creates many
        new subtrees (an instance registering its jobs) then needs one retry, not one
        per subtree."""
        wanted = sorted({a for t in targets for a in ancestors(t)} - targets)
        if not wanted:
            return set()
        return {p for p, got in self._reads.read_many(deadline, wanted).items() if got is None}

    def create_node(self, deadline: float, path: str, value: bytes, ephemeral: bool) -> Node | None:
        """Create ``path`` (see ``_create_plain``); an ephemeral node created is
        recorded as ours (``owned.py``)."""
        if not ephemeral:
            return self._create_plain(deadline, path, value, ephemeral)
        ticket = self.learn([path])
        node: Node | None = None
        try:
            node = self._create_plain(deadline, path, value, ephemeral)
            return node
        finally:
            self._owned.end(ticket, {path: node.created_revision} if node is not None else None)

    def _create_plain(
        self, deadline: float, path: str, value: bytes, ephemeral: bool
    ) -> Node | None:
        """Create ``path``, with its missing parents in the same multi; None if it existed.

        Parents are created in the transaction that creates their first child, so they
        share its czxid: that is how watchers tell implicit parents from nodes written
        on purpose (see ``_sync_levels``)."""
        try:
            _, stat = self._transport.create(
                deadline, path, value, ephemeral=ephemeral, include_data=True
            )
            return _node(path, value, stat)
        except kz.NodeExistsError:
            return None
        except kz.NoNodeError:
            pass  # parents usually exist, so only pay for them when they are missing
        for _ in range(COMMIT_ATTEMPTS):
            parents = self._missing_ancestors(deadline, path, set())
            ctx = self.context()
            ops = [ctx.create(a, b"", False) for a in parents]
            ops.append(ctx.create(path, value, ephemeral))
            results, zxid = self._transport.multi(deadline, ops)
            failed = _first_error(results)
            if failed is None:
                return Node(path, value, 0, zxid, zxid, ephemeral)
            index, exc = failed
            if index == len(ops) - 1 and isinstance(exc, kz.NodeExistsError):
                return None
            if isinstance(exc, kz.NoChildrenForEphemeralsError):
                raise exc
            # a parent appeared or vanished meanwhile: look again
        raise StoreError(f"create {path}: its parents kept changing concurrently; try again")

    def commit(self, deadline: float, ops: list[Op]) -> CommitResult:
        """Apply ``ops`` in one multi (the table in the module docstring)."""
        targets = {op.path for op in ops if isinstance(op, Create | Put)}
        # path -> guard to use instead of create+delete of the path itself:
        # ("pair", first missing ancestor) or ("exists", ephemeral ancestor)
        guards: dict[str, tuple[str, str]] = {}
        # missing parents of created nodes, made in the multi; known at once below a
        # path the commit checks absent, otherwise found after a multi fails on them
        parents, fresh = _under_absence(ops, targets)
        # Put(existing=True) paths found missing: pre-read like any Put from now on
        reread: set[str] = set()
        last_contended = ops[0].path if ops else None
        #: the last attempt's plan was not sent: its session ended meanwhile
        moved = False
        for _ in range(COMMIT_ATTEMPTS):
            planned_on = self._transport.session()
            plan = self.plan(deadline, ops, guards, parents, reread, fresh)
            if isinstance(plan, CommitResult):
                return plan
            if planned_on is not None and self._transport.session() != planned_on:
                # The session the plan was made on ended meanwhile (its pre-reads and
                # our-own-ephemeral records are that session's): a multi sent now
                # goes out on the next session, where a re-created node of the same
                # data version passes a check meant for the old incarnation (a
                # checkpoint of an execution of the expired session was accepted
                # under the new one). Plan again on the session requests go on now.
                moved = True
                continue
            moved = False
            zk_ops, origins = plan
            results, zxid = self._multi_learning(deadline, zk_ops, origins)
            failed = _first_error(results)
            if failed is None:
                return CommitResult(True, revision=zxid)
            index, exc = failed
            kind, op, zk_path = origins[index]
            if kind == "owned":
                # the existence check that stood for the created revision: it is gone
                self._owned.forget([zk_path])
                return CommitResult(False, failed_path=op.path)
            if kind == "guard" and isinstance(exc, kz.NoChildrenForEphemeralsError):
                # nothing can live below an ephemeral node: its existence is the guard
                _mode, g = guards.get(op.path, ("pair", op.path))
                guards[op.path] = ("exists", _parent(g))
                continue
            if isinstance(exc, kz.NoChildrenForEphemeralsError):
                raise exc
            if isinstance(exc, kz.NotEmptyError):
                raise StoreError(f"commit cannot delete {op.path}: it has children (delete leaves)")
            if (
                isinstance(exc, kz.NoNodeError)
                and kind in ("user", "create", "parent")
                and (isinstance(op, Create | Put))
            ):
                parents.update(self._missing_parents(deadline, targets))
                continue
            if kind == "existing" and isinstance(exc, kz.NoNodeError):
                reread.add(op.path)  # the hint was wrong: the node is gone
                continue
            if kind == "parent" and isinstance(exc, kz.NodeExistsError):
                if any(
                    isinstance(o, Check) and o.exists is False and o.path == zk_path for o in ops
                ):
                    # the create that stood for an absence check (see plan: folded)
                    return CommitResult(False, failed_path=zk_path)
                parents.discard(zk_path)  # someone else made it meanwhile
                continue
            if kind == "user":
                return CommitResult(False, failed_path=op.path)
            if kind == "guard" and isinstance(exc, kz.NoNodeError):
                guards[op.path] = ("pair", self._absent_guard(deadline, op.path))
                continue
            if kind == "guard" and isinstance(exc, kz.NodeExistsError):
                if isinstance(op, Check) and zk_path == op.path:
                    return CommitResult(False, failed_path=op.path)  # it exists
                guards.pop(op.path, None)  # a missing ancestor appeared: plan again
                continue
            # an operation derived from the pre-read failed: the store changed, re-read
            last_contended = op.path
        if moved:
            # nothing was sent for it: not a refusal, the session kept changing
            raise StoreUnavailableError(
                "commit: the ZooKeeper session changed while the commit was planned; "
                "nothing was sent, try again"
            )
        return CommitResult(False, failed_path=last_contended)

    def _read_many_learning(
        self, deadline: float, paths: list[str], ops: list[Op]
    ) -> dict[str, tuple[bytes, Any] | None]:
        """The pre-reads; a created-revision check's node found to be an ephemeral of
        our session is recorded as ours (the next check of it needs no pre-read)."""
        wanted = sorted({op.path for op in ops if revision_check(op)} & set(paths))
        ticket = self.learn(wanted)
        learned: dict[str, int] | None = None
        try:
            seen = self._reads.read_many(deadline, paths)
            sid = self._transport.session()
            learned = {}
            for p in wanted:
                got = seen.get(p)
                if got is not None and sid is not None and got[1].ephemeralOwner == sid:
                    learned[p] = got[1].czxid
            return seen
        finally:
            self._owned.end(ticket, learned)

    def _multi_learning(
        self, deadline: float, zk_ops: list[Any], origins: list[tuple[str, Op, str]]
    ) -> tuple[list[Any], int]:
        """Send the multi; when it applies, record the ephemeral nodes it created as
        ours (their czxid is the multi's zxid) and forget those it deleted."""
        pairs = list(zip(zk_ops, origins, strict=True))
        made = [o[2] for z, o in pairs if kazoo_private.is_ephemeral_create(z)]
        ticket = self.learn(made)
        learned: dict[str, int] | None = None
        try:
            results, zxid = self._transport.multi(deadline, zk_ops)
            if _first_error(results) is None:
                learned = dict.fromkeys(made, zxid)
                self._owned.forget(o[2] for z, o in pairs if kazoo_private.is_delete(z))
            return results, zxid
        finally:
            self._owned.end(ticket, learned)

    def _absent_guard(self, deadline: float, path: str) -> str:
        """The path whose create+delete proves ``path`` absent when its parent is missing:
        the first missing ancestor segment (nothing can be below a missing node)."""
        missing = self._missing_ancestors(deadline, path, set())
        return missing[0] if missing else path

    def plan(
        self,
        deadline: float,
        ops: list[Op],
        guards: dict[str, tuple[str, str]],
        parents: set[str],
        reread: set[str] | None = None,
        below_absent: frozenset[str] = frozenset(),
    ) -> CommitResult | tuple[list[Any], list[Origin]]:
        """Pre-read what the conditions need and build the multi with the pure planner
        (``plan.py``), checks first; or a failed result when a condition is already
        false. Origins say, per multi operation, why it is there: (kind, user op,
        path). ``below_absent``: paths below a path the commit checks absent (see
        ``_under_absence``)."""
        reread = reread or set()
        # created-revision checks of our own ephemeral nodes whose incarnation is known
        # (owned.py): an existence check says the same, natively
        mine = frozenset(
            op.path
            for op in ops
            if isinstance(op, Check)
            and revision_check(op)
            and op.created_revision is not None
            and self._owned.knows(op.path, op.created_revision)
            and self._coverage.covered(op.path)
        )
        need = reads_needed(ops, mine, reread, below_absent)
        # one request for all the pre-reads (a multiRead), whatever their number
        seen = self._read_many_learning(deadline, need, ops) if need else {}
        planned = build_multi(
            ops,
            self.context(),
            seen,
            mine=mine,
            guards=guards,
            parents=parents,
            reread=reread,
            below_absent=below_absent,
        )
        if isinstance(planned, CommitResult):
            return planned
        return planned.ops, planned.origins


def _under_absence(ops: list[Op], targets: set[str]) -> tuple[set[str], frozenset[str]]:
    """What a commit's absence checks tell before anything is read, if it applies at
    all: (the parents it must create: the nodes from a path it checks absent down to a
    node it creates below that path, a registration's job node and its ``instances``
    node; the paths it writes below such a path, which cannot exist yet). Known
    without a read, they spare a pre-read and a multi that would fail on the parents."""
    absent = {op.path for op in ops if isinstance(op, Check) and op.exists is False}
    absent.discard("/")
    implied: set[str] = set()
    below: set[str] = set()
    if not absent:
        return implied, frozenset()
    for op in ops:
        if not isinstance(op, Create | Put):
            continue
        under = False
        for a in reversed(ancestors(op.path)):  # top-down
            under = under or a in absent
            if under and a not in targets:
                implied.add(a)
        if under:
            below.add(op.path)
    return implied, frozenset(below)
