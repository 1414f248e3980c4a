"""Run-now requests: an operator's "run the job's items now", kept as a document of
the job until every item of it has a final record.

Layout (coordination/paths.py)::

    /jobs/{job}/runnow/{request}          the request (JSON: by, at, action, params,
                                          total, items when only some were asked)
    /jobs/{job}/runnow/{request}/{item}   the item's record (JSON: outcome "started"
                                          with instance and execution id, or "skipped"
                                          with a reason)

Who writes what (one writer per node):

* the operator command creates the request (ops/steering.py); nothing else does;
* the owner of an item, whoever it is when it looks (a new owner after a reshard, a
  survivor after a death), runs the item's part: its record is created by the very
  commit that marks the item running (execution.py), on the condition that it does
  not exist. A second claim of one item fails its commit, so each item runs with the
  request's params once per request, whatever the owners do meanwhile;
* the job's leader records as skipped the parts no owner can run (the item is
  disabled, a cut of the count removed it, the job is disabled, the request is not
  valid), under the same condition, and deletes a request once each of its items
  has a record. With failover off (no other instance takes over a run cut short),
  it first waits for the runs of the started parts to end, and reopens a part
  whose run ended without a completion (fenced, interrupted, its instance died):
  it deletes that record, conditional on it being the one read, and the item's
  owner runs the part again at its next look, as a plain item cut short runs at
  its next fire.

Owners find the pending requests from a fresh read at every housekeeping pass and
on every event that may make them theirs (a new request, a new assignment): a
missed event, a partition or a restart delays a part, it never loses it.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shardkeeper.coordination.model import encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import ConfigError
from shardkeeper.registry import batching
from shardkeeper.registry.base import Check, CoordinationStore, Create, Delete, Node, Op, Put
from shardkeeper.registry.packing import pack_groups

__all__ = [
    "MAX_AHEAD",
    "RunNowRequest",
    "RunNowService",
    "StartedPart",
    "check_request_at",
    "new_request_id",
    "request_value",
]

log = logging.getLogger(__name__)

#: how far ahead of the reading clock a request's ``at`` may be (seconds): an
#: operator's clock a little ahead is fine (the run's fire time is the owner's own
#: clock when it starts it); a time further ahead is refused as not valid
MAX_AHEAD = 3600.0


def check_request_at(at: object, now: float | None = None) -> float:
    """``at`` (a request's time, seconds since the epoch) as a float, or ConfigError
    naming the value and what is valid: a finite number, not negative, at most
    MAX_AHEAD seconds ahead of ``now`` (default: this clock)."""
    now = time.time() if now is None else now
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise ConfigError(
            f"run-now request time at={at!r} is not valid: it must be a number of seconds "
            "since the epoch"
        )
    if not math.isfinite(at) or at < 0 or at > now + MAX_AHEAD:
        raise ConfigError(
            f"run-now request time at={at!r} is not valid: it must be a finite time in "
            f"seconds since the epoch, from 0 to at most {MAX_AHEAD:g} s ahead of this "
            f"clock (now {now:.3f})"
        )
    return float(at)


def new_request_id(at: float) -> str:
    """A request id that sorts by time and is never used twice."""
    return f"{int(at * 1000):013d}-{uuid.uuid4().hex[:8]}"


def request_value(
    *,
    by: str,
    at: float,
    params: Mapping[str, str],
    total: int,
    items: Sequence[int] | None = None,
) -> bytes:
    """The value of a request node (readable with zkCli/etcdctl)."""
    doc: dict[str, Any] = {
        "by": by,
        "at": at,
        "action": "trigger",
        "params": dict(params),
        "total": total,
    }
    if items is not None:
        doc["items"] = sorted(items)
    return encode(doc)


@dataclass(frozen=True)
class StartedPart:
    """The record of a part that an owner started (``outcome`` "started")."""

    instance: str
    execution_id: str
    #: the store revision of the start commit that created it with the item's mark
    created_revision: int
    #: the record node's version (a reopen is conditional on it)
    version: int


@dataclass(frozen=True)
class RunNowRequest:
    """One pending request as read, with the items that have a record."""

    id: str
    at: float
    params: dict[str, str] = field(default_factory=dict)
    #: the job's item count when it was asked (the items asked, without ``items``);
    #: 0 when a request that is not valid does not say
    total: int = 0
    #: only these items were asked (an operator's trigger of one instance's items)
    items: tuple[int, ...] | None = None
    #: items with a record (started or skipped)
    recorded: frozenset[int] = frozenset()
    #: why the request cannot be run ("" when it can): its parts are recorded skipped
    invalid: str = ""
    #: the records of the parts an owner started (item -> record)
    started: Mapping[int, StartedPart] = field(default_factory=dict)
    #: the request node's value as read (written again by :meth:`RunNowService.reopen`)
    value: bytes = b""

    def asked(self) -> list[int]:
        """The items of the request."""
        return list(self.items) if self.items is not None else list(range(self.total))

    def pending(self) -> list[int]:
        """The items of the request without a record yet."""
        return [i for i in self.asked() if i not in self.recorded]

    @classmethod
    def parse(
        cls, request: str, value: bytes, recorded: Iterable[int], now: float | None = None
    ) -> RunNowRequest:
        """The request ``request`` from its node's value; a value that cannot be run
        (unreadable, a bad ``at``, bad params or items) gives a request whose
        ``invalid`` says why, never an exception."""
        done = frozenset(recorded)
        doc: Any = None
        try:
            doc = json.loads(value)
            if not isinstance(doc, dict):
                raise ConfigError(f"run-now request {value[:80]!r} is not a JSON object")
            at = check_request_at(doc.get("at"), now)
            params = doc.get("params") or {}
            if not isinstance(params, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in params.items()
            ):
                raise ConfigError(f"run-now params {params!r} are not a map of strings")
            total = doc.get("total")
            if isinstance(total, bool) or not isinstance(total, int) or total < 0:
                raise ConfigError(f"run-now total={total!r} is not a count of items")
            items = doc.get("items")
            if items is not None:
                if not isinstance(items, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items
                ):
                    raise ConfigError(f"run-now items={items!r} are not item numbers")
                items = tuple(sorted(set(items)))
            return cls(request, at, dict(params), total, items, done)
        except (ValueError, ConfigError) as exc:
            # its items, as far as the value says: the leader records them skipped
            total = doc.get("total") if isinstance(doc, dict) else None
            if isinstance(total, bool) or not isinstance(total, int) or total < 0:
                total = 0
            return cls(
                request,
                time.time() if now is None else now,
                total=total,
                recorded=done,
                invalid=str(exc),
            )


def _record(outcome: str, instance: str, **extra: Any) -> bytes:
    return encode({"outcome": outcome, "instance": instance, "t": time.time(), **extra})


class RunNowService:
    """Reads the pending requests of one job and writes their items' records."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id

    def pending(self, now: float | None = None) -> list[RunNowRequest]:
        """Every request of the job (oldest first), from one tree read (none: one
        listing, the cost of a housekeeping pass's look when nothing is asked)."""
        if not self._store.children(self._paths.runnow_root):
            return []
        tree = self._store.get_tree(self._paths.runnow_root)
        return requests_in_tree(self._paths, tree, now)

    def recorded(self, request: str) -> frozenset[int] | None:
        """The items of ``request`` with a record; None when the request is gone."""
        names = self._store.children(self._paths.runnow(request))
        if not names and not self._store.exists(self._paths.runnow(request)):
            return None
        return frozenset(int(n) for n in names if n.isdigit())

    def claim_ops(self, request: str, item: int, execution_id: str) -> list[Op]:
        """Ops for the commit that marks ``item`` running for ``request``: the request
        still exists and the item has no record yet, and then has this one."""
        path = self._paths.runnow_item(request, item)
        return [
            Check(self._paths.runnow(request), exists=True),
            Check(path, exists=False),
            Create(path, _record("started", self._me, execution_id=execution_id)),
        ]

    def skip(self, request: str, items: Sequence[int], reason: str) -> list[int]:
        """Record ``items`` of ``request`` skipped for ``reason`` (each only if it has
        no record yet). Returns the items recorded by this call."""
        if not items:
            return []
        value = _record("skipped", self._me, reason=reason)
        fixed: list[Op] = [Check(self._paths.runnow(request), exists=True)]
        groups: list[list[Op]] = [
            [
                Check(self._paths.runnow_item(request, i), exists=False),
                Create(self._paths.runnow_item(request, i), value),
            ]
            for i in items
        ]
        done: list[int] = []
        for members, _ops in pack_groups(self._store, groups, fixed, apart=True):
            result = batching.commit_groups(self._store, fixed, [groups[m] for m in members])
            applied = set(result.applied) if result.succeeded else set()
            for k, m in enumerate(members):
                # one by one where a record appeared meanwhile (a plain commit
                # refuses them all for one)
                if k in applied or self._store.commit([*fixed, *groups[m]]):
                    done.append(items[m])
        return done

    def reopen(self, request: RunNowRequest, item: int, part: StartedPart) -> bool:
        """Delete ``item``'s record ``part`` of ``request`` (only while the request
        exists and the record is the one read): the part is pending again, its
        owner runs it at its next look. The request's value is written again in the
        same commit, unchanged: its event makes every instance look now (a deleted
        record is no event of its own). False when the record changed or went."""
        path = self._paths.runnow_item(request.id, item)
        node = self._paths.runnow(request.id)
        return bool(
            self._store.commit(
                [
                    Check(node, exists=True),
                    Check(path, version=part.version),
                    Delete(path),
                    Put(node, request.value, existing=True),
                ]
            )
        )

    def delete(self, request: str) -> None:
        """Delete ``request`` and its records (every item has one)."""
        self._store.delete(self._paths.runnow(request), recursive=True)


def requests_in_tree(
    paths: JobPaths, tree: Mapping[str, Node], now: float | None = None
) -> list[RunNowRequest]:
    """The requests in a tree read of ``runnow/`` (oldest first)."""
    prefix = paths.runnow_root + "/"
    values: dict[str, bytes] = {}
    records: dict[str, set[int]] = {}
    started: dict[str, dict[int, StartedPart]] = {}
    for path, node in tree.items():
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        if len(parts) == 1:
            values[parts[0]] = node.value
        elif len(parts) == 2 and parts[1].isdigit():
            records.setdefault(parts[0], set()).add(int(parts[1]))
            part = _started(node)
            if part is not None:
                started.setdefault(parts[0], {})[int(parts[1])] = part
    return [
        replace(
            RunNowRequest.parse(request, values[request], records.get(request, ()), now),
            started=started.get(request, {}),
            value=values[request],
        )
        for request in sorted(values)
    ]


def _started(node: Node) -> StartedPart | None:
    """The part record ``node`` when it says "started" (None: skipped, unreadable)."""
    try:
        doc = json.loads(node.value)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("outcome") != "started":
        return None
    return StartedPart(
        str(doc.get("instance", "")),
        str(doc.get("execution_id", "")),
        node.created_revision,
        node.version,
    )
