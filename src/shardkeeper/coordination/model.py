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

__all__ = [
    "Assignment",
    "DocumentError",
    "FailoverEntry",
    "InstanceInfo",
    "RunningMark",
    "decode",
    "encode",
    "new_instance_id",
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

    def items_of(self, instance_id: str, fire: float | None = None) -> list[int]:
        """Sorted items owned by ``instance_id`` (for the fire at ``fire``: a fire that
        had already started under the previous assignment keeps using it)."""
        owners = self.owners
        if fire is not None and fire < self.effective_fire and self.previous:
            owners = self.previous
        return sorted(i for i, o in owners.items() if o == instance_id)

    def to_bytes(self) -> bytes:
        """Encode (item keys as strings, as JSON requires)."""
        return encode(
            {
                "total": self.total,
                "owners": {str(i): o for i, o in sorted(self.owners.items())},
                "generation": self.generation,
                "leader": self.leader,
                "at": self.at,
                "effective_fire": self.effective_fire,
                "previous": {str(i): o for i, o in sorted(self.previous.items())},
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> Assignment:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        with _fields(path, "an assignment"):
            return cls(
                total=int(d["total"]),
                owners={int(k): str(v) for k, v in dict(d["owners"]).items()},
                generation=int(d.get("generation", 0)),
                leader=str(d.get("leader", "")),
                at=float(d.get("at", 0.0)),
                effective_fire=float(d.get("effective_fire", 0.0)),
                previous={int(k): str(v) for k, v in dict(d.get("previous", {})).items()},
            )


@dataclass(frozen=True)
class RunningMark:
    """An item executing now (``/jobs/{job}/running/{item}``)."""

    instance_id: str
    fire_time: float
    execution_id: str
    failover: bool = False
    started_at: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        """Encode."""
        return encode(self)

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
            )


@dataclass(frozen=True)
class FailoverEntry:
    """An orphaned item queued for failover (``/jobs/{job}/failover/queue/{item}``)."""

    fire_time: float
    execution_id: str
    from_instance: str
    queued_at: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        """Encode."""
        return encode(self)

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
            )
