"""The etcd v3 requests the backend plans, as plain records.

The planner (``planner.py``, ``conditions.py``, ``nesting.py``), the keyspace
(``keys.py``), the tree watch and the store describe what they send with these frozen
dataclasses: a :class:`Compare`, a :class:`Range` read, a :class:`PutKey`, a
:class:`DeleteRange` and a :class:`Txn` of them (a transaction's operation may be a
transaction: etcd's nested transactions). The transport alone turns them into etcd3's
generated protobuf messages (``messages.py``, which only ``transport.py`` imports), so
nothing else of the backend imports ``etcd3.etcdrpc``, and the planner's output can be
compared and shown by its tests without the client's types
(``tests/registry/test_etcd_plan.py``; ``test_client_privates.py`` checks the rule).

Each record has the fields of its etcd message that the backend uses, with the
message's defaults (an empty ``range_end`` is one key, a ``limit`` of 0 is no limit).
The answers are not recorded: the parts read the response messages' fields as etcd
names them (``header.revision``, ``succeeded``, ``responses[i].response_range.kvs``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Compare", "DeleteRange", "PutKey", "Range", "Request", "Result", "Target", "Txn"]


class Target(enum.Enum):
    """What a :class:`Compare` looks at (etcd's ``Compare.CompareTarget``)."""

    VERSION = "version"
    CREATE = "create"
    MOD = "mod"
    VALUE = "value"
    LEASE = "lease"


class Result(enum.Enum):
    """How a :class:`Compare` compares (etcd's ``Compare.CompareResult``)."""

    EQUAL = "=="
    GREATER = ">"
    LESS = "<"
    NOT_EQUAL = "!="


@dataclass(frozen=True, slots=True)
class Compare:
    """``target(key) result wanted``; with ``range_end``, over every key of
    ``[key, range_end)`` (an empty range compares as one zero key-value).

    ``wanted`` is the version or revision (an ``int``) or, for ``Target.VALUE``, the
    value (``bytes``); ``Target.LEASE`` compares the lease id."""

    key: bytes
    target: Target
    result: Result
    wanted: int | bytes
    range_end: bytes = b""


@dataclass(frozen=True, slots=True)
class Range:
    """A read of ``key``, or of ``[key, range_end)``: at most ``limit`` keys (0: all),
    only those created at ``min_create_revision`` or later (0: any)."""

    key: bytes
    range_end: bytes = b""
    keys_only: bool = False
    limit: int = 0
    min_create_revision: int = 0


@dataclass(frozen=True, slots=True)
class PutKey:
    """A write of ``key``, attached to ``lease`` (0: none); ``prev_kv`` asks for the
    key-value it replaced."""

    key: bytes
    value: bytes
    lease: int = 0
    prev_kv: bool = False


@dataclass(frozen=True, slots=True)
class DeleteRange:
    """A delete of ``key``, or of every key of ``[key, range_end)``."""

    key: bytes
    range_end: bytes = b""


@dataclass(frozen=True, slots=True)
class Txn:
    """A transaction: ``success`` runs when every compare holds, else ``failure``.
    Either branch may hold transactions (nested, etcd 3.3 and later)."""

    compare: tuple[Compare, ...] = ()
    success: tuple[Request, ...] = ()
    failure: tuple[Request, ...] = ()


#: one operation of a transaction's branch
Request = Range | PutKey | DeleteRange | Txn
