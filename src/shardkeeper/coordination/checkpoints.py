"""Fenced checkpoints and progress of running items: the documents and their commits.

A checkpoint is the state a running item hands to ``ctx.checkpoint(state)``: the last
one accepted is what a successor of the same fire resumes from. It is kept at
``/checkpoints/{job}/{item}/{fire-ms}`` (one node per fire of an item, the newest
:data:`KEEP_FIRES` kept, and besides them the newest ended run's and that of a fire
waiting in the failover queue), outside ``/jobs/{job}`` so that the tools' snapshot reads
(one read of a job's subtree) never carry the states. Progress
(``ctx.progress(done, total, note)``) is small and read by the tools: it is kept at
``/jobs/{job}/progress/{item}``.

Every write is ONE commit that checks the execution's fence first: the fence child of
a persistent running mark (``running/{item}/fence-...``, unique to the execution), or
the created revision of an ephemeral one (its fencing token); the runtime adds the
created revision of its membership node as the execution began (an ephemeral node of
that store session: the fence child outlives the session, the membership does not).
A zombie (an execution whose mark was taken over or cleared, or whose session ended)
is refused by the store itself, whatever it believes: it never overwrites its
successor's state. The failover hand-off and the
claim do not touch these nodes, so the last accepted checkpoint survives them: the
successor of the same fire reads the node of its fire.

A run that ends writes its last state once more, with ``ended`` (its outcome), in its
completion commit (:func:`final_ops`, with the deletion of its mark): the checkpoint
of the item's previous ended run is what a job with ``checkpoint_carry`` gets as
``ctx.last_state``.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

from shardkeeper.coordination.model import DocumentError, FailoverEntry, decode
from shardkeeper.coordination.paths import (
    JobPaths,
    checkpoint_item_root,
    checkpoint_path,
)
from shardkeeper.errors import CheckpointStateError
from shardkeeper.registry.base import Check, CoordinationStore, Delete, Op, Put

__all__ = [
    "KEEP_FIRES",
    "NOTE_MAX_CHARS",
    "CheckpointDoc",
    "CheckpointReader",
    "ProgressDoc",
    "check_progress",
    "fence_check",
    "serialise_state",
]

#: checkpoint nodes kept per item (the newest fires): a run's first write prunes older
#: ones, so an item's checkpoints never grow with its fires (the newest ended run's node
#: and the node of a fire waiting in the failover queue are kept besides, whatever
#: their age: see :meth:`CheckpointReader.prune_ops`)
KEEP_FIRES = 4
#: a progress note is cut to this many characters (the document stays small)
NOTE_MAX_CHARS = 200


def fence_check(paths: JobPaths, item: int, token: int, fence: str) -> Check:
    """The condition that the running mark of ``item`` is still this execution's: its
    fence child exists (a persistent mark), or the mark has the created revision
    ``token`` (an ephemeral one). The same test as the completion's (execution.py)."""
    path = paths.running(item)
    if fence:
        return Check(f"{path}/{fence}", exists=True)
    return Check(path, created_revision=token)


def serialise_state(state: Any, limit: int) -> str:
    """The compact JSON of ``state``, taken now (later changes of the caller's object
    do not change what is written); CheckpointStateError when it is not
    JSON-serialisable or longer than ``limit`` bytes (the message names both)."""
    try:
        text = json.dumps(state, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CheckpointStateError(
            f"checkpoint state of type {type(state).__name__} is not JSON-serialisable "
            f"({exc}); give dicts, lists, strings, numbers (finite), booleans or None"
        ) from None
    size = len(text.encode())
    if size > limit:
        raise CheckpointStateError(
            f"checkpoint state is {size} bytes of JSON, over the limit of {limit} bytes "
            "(the job's checkpoint_max_bytes); keep a cursor or a key in the state, "
            "not the data itself"
        )
    return text


@dataclass(frozen=True)
class CheckpointDoc:
    """One fire's run of an item: its last accepted state (``/checkpoints/...``)."""

    execution_id: str
    fire_time: float
    instance: str
    #: the state as compact JSON text (decoded by :attr:`state`)
    state_json: str
    at: float
    #: how many checkpoints this execution took (the one written included)
    seq: int = 0
    #: the outcome of the run that ended with this state ("ok", "failed",
    #: "timed_out"); "" while it runs or after it was cut off (not written then)
    ended: str = ""

    @property
    def state(self) -> Any:
        """The state as the job gave it (decoded from JSON)."""
        return json.loads(self.state_json)

    def to_bytes(self) -> bytes:
        """Encode: the state is spliced in as the JSON it was checked as."""
        meta: dict[str, Any] = {
            "execution_id": self.execution_id,
            "fire_time": self.fire_time,
            "instance": self.instance,
            "at": self.at,
            "seq": self.seq,
        }
        if self.ended:
            meta["ended"] = self.ended
        head = json.dumps(meta, sort_keys=True, separators=(",", ":"))
        return f'{head[:-1]},"state":{self.state_json}}}'.encode()

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> CheckpointDoc:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        try:
            return cls(
                execution_id=str(d["execution_id"]),
                fire_time=float(d["fire_time"]),
                instance=str(d.get("instance", "")),
                state_json=json.dumps(d["state"], separators=(",", ":"), sort_keys=True),
                at=float(d.get("at", 0.0)),
                seq=int(d.get("seq", 0)),
                ended=str(d.get("ended", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DocumentError(f"value of {path} is not a checkpoint: {exc}") from None


@dataclass(frozen=True)
class ProgressDoc:
    """The last progress of an execution (``/jobs/{job}/progress/{item}``).

    ``first_done``/``first_at`` are this execution's first report: the rate is taken
    over the execution's own reports (a resumed run counts from its own first one).
    """

    execution_id: str
    instance: str
    fire_time: float
    done: float
    total: float | None
    note: str
    at: float
    first_done: float
    first_at: float

    @property
    def percent(self) -> float | None:
        """Done as a percentage of total (None without a total)."""
        if self.total is None or self.total <= 0:
            return None
        return max(0.0, min(100.0, 100.0 * self.done / self.total))

    @property
    def rate(self) -> float | None:
        """Units done per second over this execution's reports (None before two)."""
        span = self.at - self.first_at
        if span <= 0:
            return None
        return (self.done - self.first_done) / span

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left at the current rate, from ``now`` (None without a total or a
        positive rate)."""
        rate = self.rate
        if self.total is None or rate is None or rate <= 0:
            return None
        left = max(0.0, (self.total - self.done) / rate)
        elapsed = (time.time() if now is None else now) - self.at
        return max(0.0, left - max(0.0, elapsed))

    def to_bytes(self) -> bytes:
        """Encode (``total`` and ``note`` only when given)."""
        data: dict[str, Any] = {
            "execution_id": self.execution_id,
            "instance": self.instance,
            "fire_time": self.fire_time,
            "done": self.done,
            "at": self.at,
            "first_done": self.first_done,
            "first_at": self.first_at,
        }
        if self.total is not None:
            data["total"] = self.total
        if self.note:
            data["note"] = self.note
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, path: str = "?") -> ProgressDoc:
        """Decode; DocumentError if malformed."""
        d = decode(raw, path)
        try:
            total = d.get("total")
            return cls(
                execution_id=str(d["execution_id"]),
                instance=str(d.get("instance", "")),
                fire_time=float(d.get("fire_time", 0.0)),
                done=float(d["done"]),
                total=None if total is None else float(total),
                note=str(d.get("note", "")),
                at=float(d["at"]),
                first_done=float(d.get("first_done", d["done"])),
                first_at=float(d.get("first_at", d["at"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DocumentError(f"value of {path} is not a progress document: {exc}") from None

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """A JSON-friendly view with percent, rate and ETA (the tools show it)."""
        return {
            "execution_id": self.execution_id,
            "instance": self.instance,
            "done": self.done,
            "total": self.total,
            "note": self.note,
            "at": self.at,
            "percent": self.percent,
            "rate": self.rate,
            "eta": self.eta(now),
        }


def check_progress(done: Any, total: Any, note: Any) -> tuple[float, float | None, str]:
    """``ctx.progress``'s arguments checked: finite numbers >= 0, a string note;
    CheckpointStateError naming the bad value and what is valid."""

    def number(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CheckpointStateError(
                f"progress {name}={value!r} is not a number; give a count or amount >= 0"
            )
        out = float(value)
        if not math.isfinite(out) or out < 0:
            raise CheckpointStateError(
                f"progress {name}={value!r} is invalid; give a finite number >= 0"
            )
        return out

    d = number("done", done)
    t = None if total is None else number("total", total)
    if note is not None and not isinstance(note, str):
        raise CheckpointStateError(f"progress note={note!r} is not a string (or None)")
    return d, t, (note or "")[:NOTE_MAX_CHARS]


class CheckpointReader:
    """Reads and writes one job's checkpoint and progress nodes (module docstring)."""

    def __init__(self, store: CoordinationStore, paths: JobPaths) -> None:
        self._store = store
        self._paths = paths

    @property
    def paths(self) -> JobPaths:
        """The job's paths."""
        return self._paths

    def path(self, item: int, fire_time: float) -> str:
        """The checkpoint node of ``item``'s run of the fire at ``fire_time``."""
        return checkpoint_path(self._paths.job, item, fire_time)

    def read(self, item: int, fire_time: float) -> CheckpointDoc | None:
        """The checkpoint of that fire's run of ``item`` (None: none, or unreadable).
        A StoreError is raised: the caller must not take "unknown" for "none"."""
        node = self._store.get(self.path(item, fire_time))
        if node is None or not node.value:
            return None
        try:
            return CheckpointDoc.from_bytes(node.value, node.path)
        except DocumentError:
            return None

    def fires(self, item: int) -> list[int]:
        """The fires (milliseconds) with a checkpoint node of ``item``, oldest first."""
        names = self._store.children(checkpoint_item_root(self._paths.job, item))
        return sorted(int(n) for n in names if n.isdigit())

    def read_last(self, item: int, before: float) -> CheckpointDoc | None:
        """The checkpoint of ``item``'s newest ended run of a fire before ``before``
        (``ctx.last_state``); None when there is none."""
        limit = round(before * 1000)
        for fire_ms in reversed(self.fires(item)):
            if fire_ms >= limit:
                continue
            doc = self.read(item, fire_ms / 1000)
            if doc is not None and doc.ended:
                return doc
        return None

    def prune_ops(self, item: int, keep: float) -> list[Op]:
        """Deletions of ``item``'s checkpoint nodes beyond the newest
        :data:`KEEP_FIRES`, never of these (whatever their age):

        * the fire ``keep`` (the run writing);
        * the newest node of an ended run: it is what ``ctx.last_state`` carries, and
          runs cut off meanwhile (failover off: nobody ends their fires) write no
          ``ended``; four of them pruned it and the carried cursor was gone;
        * the node of the fire whose entry waits in the failover queue: its run,
          claimed after newer fires ran here (a stale failover run), resumes from it.

        One read of the item's nodes (with their documents) and one of its queue
        entry, and only when there is something to prune."""
        root = checkpoint_item_root(self._paths.job, item)
        names = self._store.children(root)
        fires = sorted(int(n) for n in names if n.isdigit())
        mine = round(keep * 1000)
        if len([f for f in fires if f != mine]) < KEEP_FIRES:
            return []
        kept = {mine}
        tree = self._store.get_tree(root)
        for fire_ms in reversed(fires):
            node = tree.get(checkpoint_path(self._paths.job, item, fire_ms / 1000))
            if node is None or not node.value:
                continue
            try:
                ended = CheckpointDoc.from_bytes(node.value, node.path).ended
            except DocumentError:
                continue
            if ended:
                kept.add(fire_ms)
                break
        queued = self._store.get(self._paths.failover_item(item))
        # (an unreadable entry: its claim resumes from nothing anyway)
        if queued is not None:
            with contextlib.suppress(DocumentError):
                entry = FailoverEntry.from_bytes(queued.value, queued.path)
                kept.add(round(entry.fire_time * 1000))
        others = [f for f in fires if f not in kept]
        room = max(0, KEEP_FIRES - len(kept))
        stale = others[: max(0, len(others) - room)]
        return [Delete(checkpoint_path(self._paths.job, item, f / 1000)) for f in stale]

    def write_ops(
        self,
        fence: Check,
        item: int,
        *,
        checkpoint: CheckpointDoc | None = None,
        progress: ProgressDoc | None = None,
        extra: list[Op] | None = None,
    ) -> list[Op]:
        """The one conditional commit of a write: the fence check, then the puts."""
        ops: list[Op] = [fence, *(extra or [])]
        if checkpoint is not None:
            ops.append(Put(self.path(item, checkpoint.fire_time), checkpoint.to_bytes()))
        if progress is not None:
            ops.append(Put(self._paths.progress(item), progress.to_bytes()))
        return ops

    def commit(self, ops: list[Op]) -> bool:
        """Send one write; False when its fence check was refused (the execution is
        no longer the item's). A StoreError (outcome unknown) is raised: every write
        is conditional on the fence and carries whole documents, so sending it again
        is safe."""
        return bool(self._store.commit(ops))

    def read_progress(self, item: int) -> ProgressDoc | None:
        """The progress document of ``item`` (None: none or unreadable)."""
        node = self._store.get(self._paths.progress(item))
        if node is None or not node.value:
            return None
        try:
            return ProgressDoc.from_bytes(node.value, node.path)
        except DocumentError:
            return None
