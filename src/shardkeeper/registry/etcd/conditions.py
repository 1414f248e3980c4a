"""The preconditions of an etcd transaction: their compares, and the failure-branch
reads that tell whether each held (see :class:`Condition`).

* Checks and creates see pure parents, as ``exists`` does. etcd compares support a
  key range (``range_end``): the compare must hold for every key in it, and an empty
  range compares as one zero KeyValue (version 0). So "absent" (``create``, ``Create``,
  ``Check(exists=False)``) is ``version(K) == 0`` AND ``version([K/, K0)) == 0``: no
  own key and nothing below (never ``[K, K0)``, which also holds siblings such as
  ``K-x``). "Exists" would be an OR, which a transaction cannot express (it ANDs its
  compares): ``Check(exists=True)`` is sent as ``version(K) > 0``, and when the failure
  branch's reads show a pure parent, the transaction is sent again with
  ``version([K/, K0)) > 0`` (one more request, only for a pure parent).
  ``Check(version=v)``, ``Check(value=b)`` and ``Check(created_revision=r)`` look at
  the own key: a pure parent has no version, value or creation of its own, and
  ``v``/``r`` <= 0 never pass (synthetic numbers do not identify a real node).
* Compares and the failure branch's reads each count against etcd's 128 operations
  per transaction. An exact absence takes two compares; when a commit has no room for
  that (e.g. 128 ``Create``), the last absences take a compact form: a pre-read at
  revision R finds no key at K nor below it, and one compare ``create_revision <
  R + 1`` over ``[K, K0)`` says no key of that range was created since (a sibling
  such as ``K-x`` created since fails it spuriously: read again and re-send). Only
  such large commits pay the extra read. See ``Condition``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

from shardkeeper.registry.base import Check, Op
from shardkeeper.registry.etcd.keys import below_range, in_subtree, own_range, subtree
from shardkeeper.registry.etcd.records import Compare, Range, Result, Target

__all__ = ["EQUAL", "GREATER", "LESS", "Condition", "Verdict", "compare_holds"]

EQUAL = Result.EQUAL
GREATER = Result.GREATER
LESS = Result.LESS


def version_compare(key: bytes, result: Result, *, below: bool = False) -> Compare:
    """``version`` of ``key`` compared with 0; ``below``: over the subtree range.

    A range compare must hold for every key in the range, and an empty range compares
    as one zero KeyValue (version 0): over a subtree, ``== 0`` means "nothing below"
    and ``> 0`` means "something below"."""
    if below:
        start, end = subtree(key)
        return Compare(start, Target.VERSION, result, 0, range_end=end)
    return Compare(key, Target.VERSION, result, 0)


class Verdict(enum.Enum):
    """What a failed transaction's reads say about one condition."""

    HOLDS = "holds"
    FALSE = "false"
    #: neither: the condition must be sent again in another form
    RETRY = "retry"


@dataclass(eq=False)
class Condition:
    """One precondition of a transaction: its etcd compares and the reads ("probes")
    that, in the failure branch, tell whether it held. A node exists when it has a key
    of its own OR keys below it (a pure parent), as :meth:`EtcdStore.exists` says.

    * ``absent`` (Create, Check(exists=False)): exact form ``version(K) == 0`` AND
      ``version([K/, K0)) == 0`` (two compares). Compact form, when a commit has no
      room for two compares per absence: a pre-read at revision R found no key at K
      nor below it, and ``create_revision < R + 1`` over ``[K, K0)`` (one compare) says
      no key of that range was created since. The range also holds siblings such as
      ``K-x``: one that already existed at R passes, one created since fails the
      compare and its probe tells it apart, so the pre-read is repeated.
    * ``exists`` (Check(exists=True)): ``version(K) > 0`` (own form, tried first) or
      ``version([K/, K0)) > 0`` (below form). etcd ANDs compares, so the OR is one
      form at a time: when the form sent fails but the other one holds (a pure parent,
      or a key of its own with nothing below), the transaction is re-sent in the other
      form. With a spare failure read, both forms are read at one revision; without,
      a check fails once both forms have failed.
    * ``check`` (version, value, created_revision): one compare on the own key.
    """

    path: str
    key: bytes
    kind: Literal["absent", "exists", "check"]
    #: the compare of a ``check``
    check: Compare | None = None
    #: an absence in the compact form
    compact: bool = False
    #: compact absence: revision of the pre-read that found the path absent (-1: none)
    since: int = -1
    #: existence: the form in use is the subtree range
    below: bool = False
    #: existence: forms found false so far
    failed_forms: set[bool] = field(default_factory=set)

    @classmethod
    def for_check(cls, key: bytes, check: Check) -> Condition:
        path = check.path
        if check.exists is not None:
            return cls(path, key, "exists" if check.exists else "absent")
        return cls(path, key, "check", check=check_compare(key, check))

    def identity(self, op: Op) -> object:
        """Ops that state the same condition share one (Create + Check(exists=False))."""
        return (self.kind, self.path) if self.kind != "check" else op

    def compares(self) -> list[Compare]:
        if self.kind == "check":
            assert self.check is not None
            return [self.check]
        if self.kind == "exists":
            return [version_compare(self.key, GREATER, below=self.below)]
        if self.compact:
            return [
                Compare(
                    self.key,
                    Target.CREATE,
                    LESS,
                    self.since + 1,
                    range_end=subtree(self.key)[1],
                )
            ]
        return [
            version_compare(self.key, EQUAL),
            version_compare(self.key, EQUAL, below=True),
        ]

    def probes(self) -> list[Range]:
        if self.kind == "check":
            return [Range(self.key)]  # a value check needs the value
        if self.kind == "exists":
            return [below_range(self.key) if self.below else own_range(self.key)]
        if self.compact:
            # the first key of the range created since the pre-read, if any
            return [
                Range(
                    self.key,
                    subtree(self.key)[1],
                    keys_only=True,
                    limit=1,
                    min_create_revision=self.since + 1,
                )
            ]
        return [own_range(self.key), below_range(self.key)]

    def other_probe(self) -> Range:
        """Existence: the read of the form not in use."""
        return own_range(self.key) if self.below else below_range(self.key)

    def judge(self, reads: list[list[Any]], other: list[Any] | None) -> Verdict:
        """Decide from the probes' results (and the other form's read, if sent)."""
        if self.kind == "check":
            assert self.check is not None
            return Verdict.HOLDS if compare_holds(self.check, first_kv(reads[0])) else Verdict.FALSE
        if self.kind == "absent" and not self.compact:
            return Verdict.FALSE if any(reads) else Verdict.HOLDS
        if self.kind == "absent":
            first = first_kv(reads[0])
            if first is None:
                return Verdict.HOLDS
            if in_subtree(self.key, first.key, own=True):
                return Verdict.FALSE
            self.since = -1  # a new sibling, not our node: read again
            return Verdict.RETRY
        if reads[0]:
            return Verdict.HOLDS
        self.failed_forms.add(self.below)
        if other is not None:
            if not other:
                return Verdict.FALSE
        elif (not self.below) in self.failed_forms:
            return Verdict.FALSE
        self.below = not self.below
        return Verdict.RETRY


def first_kv(kvs: list[Any]) -> Any:
    return kvs[0] if kvs else None


def check_compare(key: bytes, check: Check) -> Compare:
    # (existence checks are Condition's own kinds)
    if check.value is not None:
        # etcd fails a value compare on a missing key: "exists with this value"
        return Compare(key, Target.VALUE, EQUAL, check.value)
    if check.version is not None and check.version > 0:
        return Compare(key, Target.MOD, EQUAL, check.version)
    if check.created_revision is not None and check.created_revision > 0:
        return Compare(key, Target.CREATE, EQUAL, check.created_revision)
    # A version/revision <= 0 belongs to no real key ("== 0" would match a missing
    # one): a compare that can never hold keeps failed_path reporting in order.
    return Compare(key, Target.VERSION, LESS, 0)


def compare_holds(cmp: Compare, kv: Any) -> bool:
    """Evaluate an etcd compare as the server does (``kv`` None: the key is missing)."""
    actual: Any
    wanted: Any = cmp.wanted
    if cmp.target is Target.LEASE:
        actual = kv.lease if kv else 0
    elif cmp.target is Target.VALUE:
        if kv is None:
            return False
        actual, wanted = bytes(kv.value), bytes(cmp.wanted)
    elif cmp.target is Target.VERSION:
        actual = kv.version if kv else 0
    elif cmp.target is Target.MOD:
        actual = kv.mod_revision if kv else 0
    else:
        actual = kv.create_revision if kv else 0
    if cmp.result is EQUAL:
        return bool(actual == wanted)
    if cmp.result is GREATER:
        return bool(actual > wanted)
    if cmp.result is LESS:
        return bool(actual < wanted)
    return bool(actual != wanted)
