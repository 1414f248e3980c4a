"""The last result of each item (``/jobs/{job}/results/{item}``).

Written by the completion commit that deletes the item's running mark (one more
``Put`` in the same commit: no extra round trip), so an operator sees how every item
last ended without a history database: when it last ran, how long it took, whether it
failed and why, and when it last succeeded. The document is small and bounded (the
error message is cut to :data:`ERROR_LIMIT` characters), whatever the item raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardkeeper.coordination.model import DocumentError, decode, encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import Check, CoordinationStore

__all__ = ["ERROR_LIMIT", "CompletedView", "ItemResult", "read_completed"]

#: fire times are stored to the millisecond
_EPS = 1e-3

#: longest error message kept in a result document (the store holds one per item)
ERROR_LIMIT = 200
#: longest error type name kept
TYPE_LIMIT = 100


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ItemResult:
    """How an item's last execution ended (times are epoch seconds, UTC).

    ``outcome`` is ``ok`` or ``failed``; ``last_ok`` is the end of the last execution
    that succeeded (0 when none is known); ``failures`` counts the failed executions
    in a row up to this one (0 after a success).
    """

    outcome: str
    fire_time: float
    started: float
    ended: float
    instance: str
    last_ok: float = 0.0
    failures: int = 0
    error_type: str = ""
    error: str = ""

    @property
    def duration(self) -> float:
        """Seconds the last execution took."""
        return max(0.0, self.ended - self.started)

    @property
    def failed(self) -> bool:
        """Whether the last execution raised."""
        return self.outcome in ("failed", "timed_out", "crashed")

    def to_bytes(self) -> bytes:
        """Encode (bounded: the error fields are cut to their limits)."""
        return encode(
            {
                "outcome": self.outcome,
                "fire_time": round(self.fire_time, 3),
                "started": round(self.started, 3),
                "ended": round(self.ended, 3),
                "instance": self.instance,
                "last_ok": round(self.last_ok, 3),
                "failures": self.failures,
                "error_type": _cut(self.error_type, TYPE_LIMIT),
                "error": _cut(self.error, ERROR_LIMIT),
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> ItemResult:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        try:
            return cls(
                outcome=str(d["outcome"]),
                fire_time=float(d["fire_time"]),
                started=float(d["started"]),
                ended=float(d["ended"]),
                instance=str(d["instance"]),
                last_ok=float(d.get("last_ok", 0.0)),
                failures=int(d.get("failures", 0)),
                error_type=str(d.get("error_type", "")),
                error=str(d.get("error", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DocumentError(f"value of {path} is not an item result: {exc}") from None


@dataclass(frozen=True)
class CompletedView:
    """Which items have a last result of a fire at or after ``at``, as one read found
    them, with the version of every result node read (for :meth:`guards`)."""

    at: float
    #: items whose last completed run is of a fire at or after ``at`` (or, read
    #: ``exact``, of the fire at ``at``)
    completed: frozenset[int]
    #: version of each existing result node (items without one are absent)
    versions: dict[int, int] = field(default_factory=dict)

    def guards(self, paths: JobPaths, items: list[int]) -> dict[int, Check]:
        """Per item, the condition "its result is still the one this view read": a
        start conditional on them is refused when a run of the item completed in
        between (it may have been of this very fire)."""
        return {
            i: (
                Check(paths.result(i), version=self.versions[i])
                if i in self.versions
                else Check(paths.result(i), exists=False)
            )
            for i in items
        }


def read_completed(
    store: CoordinationStore, paths: JobPaths, at: float, *, exact: bool = False
) -> CompletedView:
    """The items of ``paths``' job whose last result is of a fire at or after ``at``
    (with ``exact``: of the fire at ``at`` itself). One read of the results; an
    unreadable document counts as not completed."""
    completed: set[int] = set()
    versions: dict[int, int] = {}
    prefix = paths.results_root + "/"
    for path, node in store.get_tree(paths.results_root).items():
        name = path[len(prefix) :] if path.startswith(prefix) else ""
        if not name.isdigit():
            continue
        item = int(name)
        versions[item] = node.version
        try:
            result = ItemResult.from_bytes(node.value, node.path)
        except DocumentError:
            continue
        if abs(result.fire_time - at) < _EPS if exact else result.fire_time >= at - _EPS:
            completed.add(item)
    return CompletedView(at, frozenset(completed), versions)
