"""The JSON documents stored in registry nodes, with strict decoding.

Values are small JSON objects so that a person can read them with ``zkCli`` or
``etcdctl``. Decoding never trusts the store: a malformed value raises
:class:`DocumentError` naming the path, and callers treat it as "absent/unknown"
rather than crash an instance.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from shardkeeper.coordination import assignment_codec as codec
from shardkeeper.errors import JobConfigError

__all__ = [
    "ASSIGNMENT_FORMAT",
    "MAX_FOLDS",
    "Assignment",
    "DocumentError",
    "FailoverEntry",
    "InstanceInfo",
    "RunningMark",
    "decode",
    "encode",
    "new_instance_id",
    "next_births",
]


class DocumentError(ValueError):
    """A registry value that is not the JSON document expected there."""


def encode(doc: Any) -> bytes:
    """Compact, key-sorted JSON bytes of a document (dataclass or plain data)."""
    data = asdict(doc) if hasattr(doc, "__dataclass_fields__") else doc
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode(raw: bytes, path: str = "?") -> dict[str, Any]:
    """Parse a JSON object from a registry value; DocumentError if it is not one."""
    try:
        data = json.loads(raw.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DocumentError(f"value of {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DocumentError(f"value of {path} is not a JSON object")
    return data


@contextmanager
def _fields(path: str, what: str) -> Iterator[None]:
    """Turn a missing or mistyped field of a decoded document into DocumentError."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as exc:
        raise DocumentError(f"value of {path} is not {what}: {exc}") from None


def _params(value: Any) -> dict[str, str]:
    """A run-now request's params as stored in a mark or a queue entry (a JSON object
    of strings); TypeError/ValueError when it is not an object (see :func:`_fields`)."""
    if not isinstance(value, dict):
        raise TypeError(f"params {value!r} are not a JSON object")
    return {str(k): str(v) for k, v in value.items()}


def new_instance_id() -> str:
    """A fresh instance id: ``host@pid@suffix`` (unique even for two runtimes in one pid)."""
    host = socket.gethostname().split(".")[0] or "host"
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in host)
    return f"{host}@{os.getpid()}@{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class InstanceInfo:
    """Metadata of a running instance (``/instances/{id}`` and job membership)."""

    instance_id: str
    host: str
    pid: int
    version: str
    started_at: float
    labels: dict[str, str] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> InstanceInfo:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        with _fields(path, "instance metadata"):
            return cls(
                instance_id=str(d["instance_id"]),
                host=str(d["host"]),
                pid=int(d["pid"]),
                version=str(d.get("version", "")),
                started_at=float(d.get("started_at", 0.0)),
                labels={str(k): str(v) for k, v in dict(d.get("labels", {})).items()},
                jobs=[str(j) for j in d.get("jobs", [])],
            )


@dataclass(frozen=True)
class Assignment:
    """Which instance owns each item (``/jobs/{job}/sharding``)."""

    total: int
    owners: dict[int, str]
    generation: int = 0
    leader: str = ""
    at: float = 0.0
    #: fires at or after this time use ``owners``; earlier ones use ``previous``
    effective_fire: float = 0.0
    previous: dict[int, str] = field(default_factory=dict)
    #: fires at or after this time (and before ``effective_fire``) use ``previous``
    previous_effective: float = 0.0
    #: older generations still possibly in flight: (effective fire, owners), newest
    #: first; a fire waiting for a reshard may be older than the last two
    older: tuple[tuple[float, dict[int, str]], ...] = ()
    #: when the items came into being, as breakpoints ``(first item, fire)`` sorted
    #: by item: items from ``first item`` up to the next breakpoint were first due
    #: at the first fire at or after ``fire`` (the job's first assignment, then each
    #: raise of the count). Empty when unknown (written by an older version).
    births: tuple[tuple[int, float], ...] = ()

    def born(self, item: int) -> float | None:
        """When ``item`` was first due (see :attr:`births`); None when unknown or the
        item is not in this assignment. The fire of an item that never completed
        anywhere is counted from here (runtime/job/coverage.py)."""
        if not 0 <= item < self.total:
            return None
        found: float | None = None
        for first, fire in self.births:
            if first > item:
                break
            found = fire
        return found

    def owners_for(self, fire: float | None) -> dict[int, str]:
        """The owner map in effect for the fire at ``fire``: one assignment per fire
        cluster-wide, whatever reshards came after it."""
        if fire is None or fire >= self.effective_fire:
            return self.owners
        levels = [(self.previous_effective, self.previous), *self.older]
        kept = [(eff, own) for eff, own in levels if own]
        for eff, own in kept:
            if fire >= eff:
                return own
        # older than every generation kept: the oldest one is the best guess
        return kept[-1][1] if kept else self.owners

    def items_of(self, instance_id: str, fire: float | None = None) -> list[int]:
        """Sorted items owned by ``instance_id`` (for the fire at ``fire``: see
        :meth:`owners_for`)."""
        owners = self.owners_for(fire)
        return sorted(i for i, o in owners.items() if o == instance_id)

    def to_bytes(self) -> bytes:
        """Encode compactly (see :mod:`~shardkeeper.coordination.assignment_codec`):
        readable ranges per instance while small, else packed owner indices.
        JobConfigError when even that exceeds what a store value may hold."""
        header: dict[str, Any] = {
            "format": ASSIGNMENT_FORMAT,
            "total": self.total,
            "generation": self.generation,
            "leader": self.leader,
            "at": self.at,
            "effective_fire": self.effective_fire,
        }
        if self.previous_effective:
            header["previous_effective"] = self.previous_effective
        if self.births:
            header["births"] = [[first, fire] for first, fire in self.births]
        # Older generations are kept while the document stays small: drop the
        # oldest first (they only serve fires that waited through several reshards).
        for keep in range(len(self.older), -1, -1):
            older = self.older[:keep]
            readable = {
                **header,
                "encoding": "ranges",
                "owners": _by_instance(self.owners),
                "previous": _by_instance(self.previous),
            }
            if older:
                readable["older"] = [[eff, _by_instance(own)] for eff, own in older]
            if codec.json_size(readable) <= codec.READABLE_MAX_BYTES:
                return encode(readable)
            instances = sorted(
                set(self.owners.values())
                | set(self.previous.values())
                | {i for _eff, own in older for i in own.values()}
            )
            table = {inst: index for index, inst in enumerate(instances)}
            packed: dict[str, Any] = {
                **header,
                "encoding": "packed",
                "instances": instances,
                "owners": codec.encode_packed(self.owners, table),
                "previous": codec.encode_packed(self.previous, table),
            }
            if older:
                packed["older"] = [[eff, codec.encode_packed(own, table)] for eff, own in older]
            raw = encode(packed)
            if len(raw) <= codec.ASSIGNMENT_MAX_BYTES:
                return raw
        if len(raw) > codec.ASSIGNMENT_MAX_BYTES:
            raise JobConfigError(
                f"the assignment of {self.total} items over {len(instances)} instances "
                f"encodes to {len(raw)} bytes, over the limit of "
                f"{codec.ASSIGNMENT_MAX_BYTES} bytes a store value may hold; use a "
                "smaller sharding_total_count"
            )
        return raw

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> Assignment:
        """Decode any form written so far (ranges, packed, or the first form with one
        ``"item": "instance"`` pair per item); DocumentError if malformed."""
        d = decode(raw, path)
        with _fields(path, "an assignment"):
            form = d.get("format", 1)
            older: tuple[tuple[float, dict[int, str]], ...] = ()
            if form == 1:
                owners = {int(k): str(v) for k, v in dict(d["owners"]).items()}
                previous = {int(k): str(v) for k, v in dict(d.get("previous", {})).items()}
            elif form == ASSIGNMENT_FORMAT and d.get("encoding") == "ranges":
                owners = _from_instances(dict(d["owners"]))
                previous = _from_instances(dict(d.get("previous", {})))
                older = tuple(
                    (float(eff), _from_instances(dict(own))) for eff, own in d.get("older", [])
                )
            elif form == ASSIGNMENT_FORMAT and d.get("encoding") == "packed":
                instances = [str(i) for i in list(d["instances"])]
                owners = codec.decode_packed(str(d["owners"]), instances)
                previous = codec.decode_packed(str(d.get("previous", "")), instances)
                older = tuple(
                    (float(eff), codec.decode_packed(str(own), instances))
                    for eff, own in d.get("older", [])
                )
            else:
                raise ValueError(
                    f"unknown format {form!r} / encoding {d.get('encoding')!r} (written by a "
                    "newer version?)"
                )
            return cls(
                total=int(d["total"]),
                owners=owners,
                generation=int(d.get("generation", 0)),
                leader=str(d.get("leader", "")),
                at=float(d.get("at", 0.0)),
                effective_fire=float(d.get("effective_fire", 0.0)),
                previous=previous,
                previous_effective=float(d.get("previous_effective", 0.0)),
                older=older,
                births=tuple((int(first), float(fire)) for first, fire in d.get("births", [])),
            )


ASSIGNMENT_FORMAT = 2
"""The ``format`` of assignments written now (absent in the first form)."""

MAX_FOLDS = 100
"""Most earlier fires one failover entry stands for (as a run's ``covers``)."""

#: fire times closer than this are the same fire (floats from one schedule)
_SAME_FIRE = 1e-3


def next_births(
    previous: Assignment | None, total: int, effective: float
) -> tuple[tuple[int, float], ...]:
    """The :attr:`Assignment.births` of a new assignment of ``total`` items in effect
    from ``effective``: the first one makes every item born then; a raise of the count
    adds the new items' breakpoint; a cut forgets the items gone (raised again later,
    they are born again). A previous assignment that does not know its births (an
    older version wrote it) makes its items born now: later than the truth, so a run
    never claims a fire that was not due."""
    if previous is None or not previous.births:
        return ((0, effective),)
    kept = tuple((first, fire) for first, fire in previous.births if first < total)
    if total > previous.total:
        kept += ((previous.total, effective),)
    return kept


def _by_instance(owners: dict[int, str]) -> dict[str, str]:
    """``{item: instance}`` -> ``{instance: "0-49,100"}`` (the readable form)."""
    items: dict[str, list[int]] = {}
    for item, owner in owners.items():
        items.setdefault(owner, []).append(item)
    return {owner: codec.encode_ranges(its) for owner, its in sorted(items.items())}


def _from_instances(ranges: dict[str, Any]) -> dict[int, str]:
    """The inverse of :func:`_by_instance`; ValueError when an item has two owners."""
    owners: dict[int, str] = {}
    for owner, text in ranges.items():
        for item in codec.decode_ranges(str(text)):
            if owners.setdefault(item, str(owner)) != owner:
                raise ValueError(f"item {item} is given to {owners[item]!r} and {owner!r}")
    return owners


@dataclass(frozen=True)
class RunningMark:
    """An item executing now (``/jobs/{job}/running/{item}``)."""

    instance_id: str
    fire_time: float
    execution_id: str
    failover: bool = False
    started_at: float = field(default_factory=time.time)
    #: W3C trace context of the execution's span (shardkeeper/tracing.py), for the run
    #: that replaces it to link to; "" without tracing, and then not written
    traceparent: str = ""
    #: the one-off params of the operator's run-now request this execution runs a part
    #: of (``ctx.params``): a failover re-run of it gets them from here, whoever
    #: queues the mark (the instance that ran it may be dead). Empty for a fire of
    #: the schedule, and then not written
    params: dict[str, str] = field(default_factory=dict)
    #: the id of that run-now request (coordination/runnow.py); "" for none
    request: str = ""

    def to_bytes(self) -> bytes:
        """Encode (``traceparent``, ``params`` and ``request`` only when there are
        some: a mark of a scheduled fire stays as it was)."""
        data = asdict(self)
        for name in ("traceparent", "params", "request"):
            if not data[name]:
                del data[name]
        return encode(data)

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> RunningMark:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        with _fields(path, "a running mark"):
            return cls(
                instance_id=str(d["instance_id"]),
                fire_time=float(d["fire_time"]),
                execution_id=str(d["execution_id"]),
                failover=bool(d.get("failover", False)),
                started_at=float(d.get("started_at", 0.0)),
                traceparent=str(d.get("traceparent", "")),
                params=_params(d.get("params", {})),
                request=str(d.get("request", "")),
            )


@dataclass(frozen=True)
class FailoverEntry:
    """An orphaned item queued for failover (``/jobs/{job}/failover/queue/{item}``)."""

    fire_time: float
    execution_id: str
    from_instance: str
    queued_at: float = field(default_factory=time.time)
    #: earlier fires of the item this entry also stands for: an entry queued while
    #: another fire's entry of the item waited folds it (one entry per item), and the
    #: run that claims it covers them (``ctx.covers``); oldest first
    folds: tuple[float, ...] = ()
    #: the replaced run's W3C trace context (its running mark's), for the claiming run
    #: to link to; "" when it had none (not written then)
    traceparent: str = ""
    #: the replaced run's run-now params (its mark's): the claiming run has them in
    #: ``ctx.params``; empty for a fire of the schedule (not written then)
    params: dict[str, str] = field(default_factory=dict)
    #: the id of that run-now request; "" for none (not written then)
    request: str = ""

    def fold(self, waiting: FailoverEntry) -> FailoverEntry:
        """This entry and ``waiting`` (the item's entry already queued) as one: the
        later fire is run, and stands for the earlier one and both entries' folds (the
        newest :data:`MAX_FOLDS` of them). The same fire twice is one entry.

        The run keeps a run-now request's params: the later entry's when it has a
        request, else the earlier one's. A request's part folded into a fire of the
        schedule is run with the request's params, never dropped (the request's item
        has its record: nothing else would run it); of two requests' parts, the later
        one's params are run."""
        later, earlier = (self, waiting) if self.fire_time >= waiting.fire_time else (waiting, self)
        fires = {*self.folds, *waiting.folds}
        if abs(later.fire_time - earlier.fire_time) > _SAME_FIRE:
            fires.add(earlier.fire_time)
        kept = tuple(sorted(f for f in fires if f < later.fire_time - _SAME_FIRE))[-MAX_FOLDS:]
        asked = later if later.request or not earlier.request else earlier
        return FailoverEntry(
            later.fire_time,
            later.execution_id,
            later.from_instance,
            later.queued_at,
            kept,
            later.traceparent or earlier.traceparent,
            dict(asked.params),
            asked.request,
        )

    def to_bytes(self) -> bytes:
        """Encode (``folds``, ``traceparent``, ``params`` and ``request`` only when
        there are some: an entry of a scheduled fire stays as it was)."""
        data = asdict(self)
        for name in ("folds", "traceparent", "params", "request"):
            if not data[name]:
                del data[name]
        return encode(data)

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> FailoverEntry:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        with _fields(path, "a failover entry"):
            return cls(
                fire_time=float(d["fire_time"]),
                execution_id=str(d["execution_id"]),
                from_instance=str(d["from_instance"]),
                queued_at=float(d.get("queued_at", 0.0)),
                folds=tuple(float(f) for f in d.get("folds", [])),
                traceparent=str(d.get("traceparent", "")),
                params=_params(d.get("params", {})),
                request=str(d.get("request", "")),
            )
