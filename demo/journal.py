"""The per-instance journal: one JSON line per event, written by a worker, read by
the story.

A worker appends a line when it is ready, when an item starts and ends, and when it
has stopped. Each line is written with one ``write`` and flushed, so a reader that
only consumes complete lines never sees half an event, even while the writer runs
(or after it was killed mid-line).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["Event", "JournalReader", "JournalWriter"]


@dataclass(frozen=True)
class Event:
    """One journal line.

    ``kind`` is ``ready``, ``start``, ``end`` or ``stopped``; ``t`` is the wall-clock
    time (``time.time()``) when it was written, comparable across processes on one
    machine. Item fields are set for ``start``/``end`` only.
    """

    kind: str
    worker: str
    instance_id: str
    t: float
    pid: int = 0
    item: int = -1
    param: str = ""
    fire: float = 0.0
    execution_id: str = ""
    failover: bool = False
    misfire: bool = False
    ok: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """Build from a parsed line (unknown keys are ignored)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


class JournalWriter:
    """Appends events to one file; safe to call from several worker threads."""

    def __init__(self, path: Path, worker: str) -> None:
        self.path = path
        self.worker = worker
        self.instance_id = ""
        self._lock = threading.Lock()
        # line-buffered text file in append mode: one write per complete line
        self._file = path.open("a", encoding="utf-8", buffering=1)

    def write(self, kind: str, **fields: Any) -> Event:
        """Append one event stamped with the current time; returns it."""
        event = Event(
            kind=kind, worker=self.worker, instance_id=self.instance_id, t=time.time(), **fields
        )
        line = json.dumps(asdict(event), separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
        return event

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()


class JournalReader:
    """Reads the complete lines appended to a journal since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> list[Event]:
        """The events appended since the previous call (none if the file is absent)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        # the last piece is either empty or a line still being written
        self._partial = lines.pop()
        events: list[Event] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                events.append(Event.from_dict(json.loads(line)))
            except (ValueError, TypeError):
                # a torn line from a killed writer: skip it, the story does not need it
                continue
        return events
