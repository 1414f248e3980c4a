"""The fires a cut of ``sharding_total_count`` leaves owed: ``/jobs/{job}/removed``.

An item whose owner could not run some of its fires (partitioned, frozen, its lane
held, the store leaderless) owes them: with misfire on its next run folds them
(runtime/job/coverage.py). An item an operator's cut of the count removes has no next
run, so those fires would stand nowhere. The leader that commits the cut writes, in
the same commit, what each removed item owes: since when (the fire of its last
stored result, or its birth) and up to the cut's effective fire. Then the leader
(that one, or the next after a crash) records each owed (fire, item) once as a skip
with reason ``removed`` and deletes the document in a commit checked against its
version and leadership: only the leader whose delete commits records them.

The document is level-triggered: a leader killed between the cut's commit and the
skips leaves it in the store, and the next leader's repair pass settles it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from shardkeeper.coordination.model import Assignment, DocumentError
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.registry.base import Check, CoordinationStore, Delete, Op, Put

__all__ = ["BEFORE_BIRTH", "Cut", "CutLedger"]

#: an item never completed is owed from its birth fire on: counted from just before
#: it (fire times closer than 1 ms are one fire: runtime/job/coverage.py's SAME_FIRE)
BEFORE_BIRTH = 1.5e-3


@dataclass(frozen=True)
class Cut:
    """One committed cut: fires strictly before ``until`` (its effective fire) still
    named the removed items; ``since`` maps each removed item to the last fire it
    stands for (its last result's fire, or just before its birth)."""

    until: float
    since: dict[int, float] = field(default_factory=dict)


def _encode(cuts: Iterable[Cut]) -> bytes:
    return json.dumps(
        {
            "cuts": [
                {"until": c.until, "since": {str(i): t for i, t in sorted(c.since.items())}}
                for c in cuts
            ]
        },
        separators=(",", ":"),
    ).encode()


def _decode(raw: bytes, path: str) -> list[Cut]:
    try:
        doc = json.loads(raw.decode())
        return [
            Cut(float(c["until"]), {int(i): float(t) for i, t in c["since"].items()})
            for c in doc["cuts"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DocumentError(f"{path}: not a cut ledger ({exc})") from exc


class CutLedger:
    """Reads and writes ``/jobs/{job}/removed`` (module docstring)."""

    def __init__(self, store: CoordinationStore, paths: JobPaths) -> None:
        self._store = store
        self._paths = paths

    def last_fires(self, items: Iterable[int]) -> dict[int, float]:
        """The fire of each of ``items``' last stored result (items with one)."""
        wanted = set(items)
        root = self._paths.results_root + "/"
        out: dict[int, float] = {}
        for path, node in self._store.get_tree(self._paths.results_root).items():
            name = path[len(root) :] if path.startswith(root) else ""
            if not name.isdigit() or int(name) not in wanted:
                continue
            try:
                out[int(name)] = ItemResult.from_bytes(node.value, path).fire_time
            except DocumentError:
                continue
        return out

    def ops_for(self, previous: Assignment | None, assignment: Assignment) -> list[Op]:
        """The ops that add the cut ``assignment`` makes of ``previous`` to the ledger,
        for the reshard's commit (none when it removes no item). Reads the removed
        items' results and the ledger (a cut not settled yet is kept: its version is
        checked)."""
        if previous is None or assignment.total >= previous.total:
            return []
        removed = range(assignment.total, previous.total)
        last = self.last_fires(removed)
        since: dict[int, float] = {}
        for item in removed:
            if item in last:
                since[item] = last[item]
                continue
            born = previous.born(item)
            if born is not None:  # never completed: owed from its birth
                since[item] = born - BEFORE_BIRTH
        if not since:
            return []
        path = self._paths.removed
        node = self._store.get(path)
        cuts = _decode(node.value, path) if node is not None else []
        cuts.append(Cut(assignment.effective_fire, since))
        guard = Check(path, version=node.version) if node is not None else Check(path, exists=False)
        return [guard, Put(path, _encode(cuts))]

    def read(self) -> tuple[list[Cut], int] | None:
        """The cuts not settled yet and the document's version; None without any."""
        node = self._store.get(self._paths.removed)
        if node is None:
            return None
        return _decode(node.value, self._paths.removed), node.version

    def settle(self, version: int, leader_check: Check) -> bool:
        """Delete the ledger read at ``version`` while still leader: True when this
        commit did it (its caller, and no one else, records the skips)."""
        path = self._paths.removed
        return bool(self._store.commit([leader_check, Check(path, version=version), Delete(path)]))
