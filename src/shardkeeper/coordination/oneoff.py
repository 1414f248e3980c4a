"""One-off jobs (``JobConfig.at``): what is done, what is still owed, and the done marker.

A one-off job has exactly one scheduled fire, at ``at``. An item counts as
*completed* for it when its last result (``/jobs/{job}/results/{item}``, written by
the completion commit that clears its running mark) is of a fire at or after ``at``.
When every item is completed, ``/jobs/{job}/done`` is created: from then on no
instance starts the job's items on a schedule again, whenever it starts.

Starting an item of a one-off job is conditional on its result node being the one
read when it showed the item not completed (:meth:`OneOffView.guards`): two fires
that race for an item (the one at ``at`` and a leader's catch-up, say) cannot both
run it, because the completion of the first changes the node the second checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shardkeeper.coordination.model import DocumentError, decode, encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import CompletedView, read_completed
from shardkeeper.registry.base import Check, CoordinationStore, Put

__all__ = ["DoneRecord", "OneOffService", "OneOffView"]

#: fire times are stored to the millisecond
_EPS = 1e-3


@dataclass(frozen=True)
class DoneRecord:
    """The content of ``/jobs/{job}/done``.

    ``at`` is the one-off time it is for (a config whose ``at`` changed is not done);
    ``skipped`` the items that never ran (the fire was missed and ``misfire`` is off).
    """

    at: float
    done_at: float
    by: str
    skipped: tuple[int, ...] = ()

    def to_bytes(self) -> bytes:
        """Encode as JSON."""
        return encode(
            {
                "at": round(self.at, 3),
                "done_at": round(self.done_at, 3),
                "by": self.by,
                "skipped": list(self.skipped),
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> DoneRecord:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        try:
            return cls(
                at=float(d["at"]),
                done_at=float(d.get("done_at", 0.0)),
                by=str(d.get("by", "")),
                skipped=tuple(int(i) for i in d.get("skipped", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DocumentError(f"value of {path} is not a done record: {exc}") from None

    def is_for(self, at: float) -> bool:
        """Whether this record is for the one-off time ``at``."""
        return abs(self.at - at) < _EPS


@dataclass(frozen=True)
class OneOffView:
    """What one read found about a one-off job's fire at ``at``."""

    at: float
    done: DoneRecord | None
    #: items whose last result is of a fire at or after ``at``
    completed: frozenset[int]
    #: version of each existing result node (items without one are absent)
    versions: dict[int, int] = field(default_factory=dict)

    def outstanding(self, total: int) -> list[int]:
        """Items 0..total-1 not completed yet."""
        return [i for i in range(total) if i not in self.completed]

    def guards(self, paths: JobPaths, items: list[int]) -> dict[int, Check]:
        """Per item, the condition "its result is still the one this view read"."""
        return CompletedView(self.at, self.completed, self.versions).guards(paths, items)


class OneOffService:
    """Reads a one-off job's progress and writes its done marker."""

    def __init__(self, store: CoordinationStore, paths: JobPaths, instance_id: str) -> None:
        self._store = store
        self._paths = paths
        self._me = instance_id

    def done(self, at: float) -> DoneRecord | None:
        """The done record for ``at`` (None when absent, unreadable or for another time)."""
        node = self._store.get(self._paths.done)
        if node is None:
            return None
        try:
            record = DoneRecord.from_bytes(node.value, node.path)
        except DocumentError:
            return None
        return record if record.is_for(at) else None

    def view(self, at: float) -> OneOffView:
        """The done record and the completed items for ``at`` (two reads)."""
        done = self.done(at)
        results = read_completed(self._store, self._paths, at)
        return OneOffView(at, done, results.completed, results.versions)

    def mark_done(self, at: float, skipped: list[int] | tuple[int, ...] = ()) -> bool:
        """Create the done marker for ``at``; False when one exists already (a marker
        for another ``at`` is replaced: the job's time was changed)."""
        record = DoneRecord(at, time.time(), self._me, tuple(sorted(skipped)))
        if self._store.create(self._paths.done, record.to_bytes()) is not None:
            return True
        if self.done(at) is not None:
            return False
        node = self._store.get(self._paths.done)
        if node is None:
            return self._store.create(self._paths.done, record.to_bytes()) is not None
        # a marker of an earlier ``at``: replaced only while it is still the one read
        return bool(
            self._store.commit(
                [Check(node.path, version=node.version), Put(node.path, record.to_bytes())]
            )
        )
