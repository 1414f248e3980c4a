"""The pure planner of ZooKeeper commits: a commit's operations in, one ``multi`` out.

No I/O here: :func:`reads_needed` says which nodes a commit must pre-read, and
:func:`build_multi` turns the operations and those pre-reads into the multi's
operations (kazoo's protocol records, built by ``kazoo_private``) with the reason for
each, or a failed result when a condition is already false. ``planner.py`` does the
reads, sends the multi and retries; the table of how each operation is sent is in its
docstring. Tested without a server (``tests/registry/test_zookeeper_plan.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from kazoo.protocol.states import ZnodeStat

from shardkeeper.registry.base import Check, CommitResult, Create, Delete, Op, Put, ancestors
from shardkeeper.registry.zookeeper import kazoo_private

__all__ = [
    "Origin",
    "PlanContext",
    "Planned",
    "bare_exists",
    "build_multi",
    "reads_needed",
    "revision_check",
]

#: why a multi operation is there: (kind, the user's operation, the path it acts on);
#: kinds: ``user`` (the operation itself), ``derived`` (from a pre-read), ``guard``
#: (an absence guard), ``parent`` (a missing parent), ``create`` (a Put that creates),
#: ``existing`` (a Put sent blind), ``owned`` (a created-revision check of our own
#: ephemeral node sent as an existence check)
Origin = tuple[str, Op, str]

#: a pre-read: (data, stat), or None when the node is absent
Seen = tuple[bytes, ZnodeStat] | None


@dataclass(frozen=True)
class PlanContext:
    """What a plan needs of the session: the namespace node, the ACL of new nodes and
    the session id an ephemeral node of ours is owned by."""

    #: the namespace node (``/ns``): multi operations take absolute paths
    chroot: str
    #: the ACL every node created gets
    acl: list[Any]
    #: the session the multi is sent on (None between sessions)
    session: int | None

    def full(self, path: str) -> str:
        """The absolute ZooKeeper path of ``path``."""
        return self.chroot if path == "/" else self.chroot + path

    def create(self, path: str, value: bytes, ephemeral: bool) -> Any:
        """The multi operation creating ``path``."""
        return kazoo_private.create_op(self.full(path), value, self.acl, ephemeral)

    def wanted_owner(self, ephemeral: bool) -> int | None:
        """The ``ephemeralOwner`` a node written as asked has (0: persistent)."""
        return self.session if ephemeral else 0


@dataclass(frozen=True)
class Planned:
    """A multi: its operations, checks first, and why each is there."""

    ops: list[Any]
    origins: list[Origin]


@dataclass
class _Shape:
    """What a commit's operations say before anything is read (one per plan)."""

    ops: list[Op]
    #: created-revision checks of our own ephemeral nodes of known incarnation
    mine: frozenset[str]
    #: Put(existing=True) paths found missing: pre-read like any Put from now on
    reread: Collection[str]
    #: paths below a path the commit checks absent (``planner._under_absence``)
    below_absent: Collection[str]
    present: set[str] = field(init=False)

    def __post_init__(self) -> None:
        # Paths that exist if the commit applies at all: a bare existence check on
        # the path or on one of its descendants (it comes first in the multi and
        # fails it otherwise), and our own ephemeral nodes of known incarnation.
        # Deleting them needs no pre-read.
        known = {op.path for op in self.ops if bare_exists(op)} | self.mine
        self.present = known | {a for p in known for a in ancestors(p)}

    def blind(self, op: Op) -> bool:
        """A Put of a node the writer says exists (persistent): set it natively."""
        return (
            isinstance(op, Put) and op.existing and not op.ephemeral and op.path not in self.reread
        )

    def native_delete(self, op: Op) -> bool:
        """A Delete of a node known to exist: no pre-read."""
        return isinstance(op, Delete) and op.path in self.present and op.path != "/"

    def fresh(self, op: Op) -> bool:
        """A Put below a path the commit checks absent: if it applies, the node does
        not exist yet, so it is a create and needs no pre-read (a registration's
        membership node)."""
        return isinstance(op, Put) and op.path in self.below_absent and op.path not in self.reread


def reads_needed(
    ops: list[Op],
    mine: frozenset[str] = frozenset(),
    reread: Collection[str] = (),
    below_absent: Collection[str] = frozenset(),
) -> list[str]:
    """The paths a commit of ``ops`` must pre-read (sorted; one multiRead)."""
    shape = _Shape(ops, mine, reread, below_absent)
    return sorted(
        {
            op.path
            for op in ops
            if (isinstance(op, Put) and not shape.blind(op) and not shape.fresh(op))
            or (isinstance(op, Delete) and not shape.native_delete(op))
            or (
                isinstance(op, Check)
                and op.version is None
                and not bare_exists(op)
                and op.exists is not False
                and op.path not in mine
            )
        }
    )


def build_multi(
    ops: list[Op],
    ctx: PlanContext,
    seen: dict[str, Seen],
    *,
    mine: frozenset[str] = frozenset(),
    guards: dict[str, tuple[str, str]] | None = None,
    parents: Collection[str] = frozenset(),
    reread: Collection[str] = (),
    below_absent: Collection[str] = frozenset(),
) -> CommitResult | Planned:
    """The multi of ``ops`` given the pre-reads ``seen`` (of :func:`reads_needed`), or
    a failed result when a condition is already false.

    ``guards``: path -> the guard to use instead of a create+delete of the path
    itself, ``("pair", first missing ancestor)`` or ``("exists", ephemeral
    ancestor)``; ``parents``: missing parents the multi creates (top-down, before the
    first node below them)."""
    guards = guards or {}
    shape = _Shape(ops, mine, reread, below_absent)
    checks: list[tuple[Any, Origin]] = []
    writes: list[tuple[Any, Origin]] = []
    made: set[str] = set()
    full: Callable[[str], str] = ctx.full

    # Absence checks of paths this multi creates as parents anyway (a registration's
    # job node): that create fails on an existing node by itself, so the guard's
    # create+delete (two operations and two notifications for every watcher) is left
    # out, unless an operation of the commit writes or deletes the path itself (then
    # the create would not see the state before).
    touched = {op.path for op in ops if not isinstance(op, Check)}
    folded = {
        op.path
        for op in ops
        if isinstance(op, Check)
        and op.exists is False
        and op.path in parents
        and op.path not in touched
        and op.path not in guards
    }

    def guard(op: Op) -> None:
        if op.path in folded:
            return  # the parent create below is the check (see ``folded``)
        mode, g = guards.get(op.path, ("pair", op.path))
        if mode == "exists":
            checks.append((kazoo_private.check_op(full(g), -1), ("guard", op, g)))
            return
        checks.append((kazoo_private.create_op(full(g), b"", ctx.acl, False), ("guard", op, g)))
        checks.append((kazoo_private.delete_op(full(g), -1), ("guard", op, g)))

    def create(op: Create | Put, kind: str) -> None:
        # (no missing parents known: the common first attempt skips the walk)
        # top-down: a parent is made before its children
        for a in reversed(ancestors(op.path)) if parents else ():
            if a in parents and a not in made:
                made.add(a)
                writes.append((ctx.create(a, b"", False), ("parent", op, a)))
        writes.append((ctx.create(op.path, op.value, op.ephemeral), (kind, op, op.path)))

    for op in ops:
        path = full(op.path)
        if isinstance(op, Check):
            if op.version is not None:
                checks.append((kazoo_private.check_op(path, op.version), ("user", op, op.path)))
                continue
            if bare_exists(op):
                # version -1 checks existence only: native, no pre-read
                checks.append((kazoo_private.check_op(path, -1), ("user", op, op.path)))
                continue
            if op.path in mine:
                checks.append((kazoo_private.check_op(path, -1), ("owned", op, op.path)))
                continue
            if op.exists is False:
                # the guard itself fails when the node exists: no pre-read
                guard(op)
                continue
            got = seen[op.path]
            if got is None:
                return CommitResult(False, failed_path=op.path)
            value, stat = got
            if (op.value is not None and value != op.value) or (
                op.created_revision is not None and stat.czxid != op.created_revision
            ):
                return CommitResult(False, failed_path=op.path)
            checks.append((kazoo_private.check_op(path, stat.version), ("derived", op, op.path)))
        elif isinstance(op, Create):
            create(op, "user")
        elif isinstance(op, Put) and shape.blind(op) and op.path not in seen:
            writes.append(
                (kazoo_private.set_data_op(path, op.value, -1), ("existing", op, op.path))
            )
        elif isinstance(op, Put) and shape.fresh(op):
            create(op, "create")
        elif isinstance(op, Put):
            got = seen[op.path]
            if got is None:
                create(op, "create")
                continue
            stat = got[1]
            if stat.ephemeralOwner == ctx.wanted_owner(op.ephemeral):
                writes.append(
                    (
                        kazoo_private.set_data_op(path, op.value, stat.version),
                        ("derived", op, op.path),
                    )
                )
            else:
                writes.append(
                    (kazoo_private.delete_op(path, stat.version), ("derived", op, op.path))
                )
                writes.append(
                    (ctx.create(op.path, op.value, op.ephemeral), ("derived", op, op.path))
                )
        elif shape.native_delete(op):
            writes.append((kazoo_private.delete_op(path, -1), ("user", op, op.path)))
        elif seen[op.path] is None:
            guard(op)
        else:
            writes.append((kazoo_private.delete_op(path, -1), ("derived", op, op.path)))
    for op in ops:
        if op.path in folded and op.path not in made:
            # nothing created it after all (e.g. a blind set below it): guard it
            folded.discard(op.path)
            guard(op)
    both = checks + writes
    return Planned([z for z, _ in both], [o for _, o in both])


def revision_check(op: Op) -> bool:
    """A check of the created revision alone (no value, no version)."""
    return (
        isinstance(op, Check)
        and op.created_revision is not None
        and op.value is None
        and op.version is None
        and op.exists is not False
    )


def bare_exists(op: Op) -> bool:
    """A check of existence alone (no version, value or created revision)."""
    return (
        isinstance(op, Check)
        and op.exists is True
        and op.version is None
        and op.value is None
        and op.created_revision is None
    )
