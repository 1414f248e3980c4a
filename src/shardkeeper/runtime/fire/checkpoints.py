"""The checkpoints and progress of the executions of one job here: what ``ctx.checkpoint``
and ``ctx.progress`` do (the documents and their fenced commits are
coordination/checkpoints.py).

Each execution has an :class:`ItemCheckpoints` (the context's ``ItemState``), opened
when its context is made and taken back by the batch's completion:

* A call is checked at once (JSON, size: named errors), then written in ONE commit
  conditional on the execution's fence and on the membership incarnation (an
  ephemeral node of the store session) it began under, in the caller's thread, when
  the job's ``checkpoint_interval`` has passed since the last write; a call within
  the interval is held (the latest replaces the one held) and written when the
  interval is up, by the lanes' timer (no thread waits). A refused write means the
  execution is no longer the item's: that call and every later one answer False (or
  raise CheckpointFencedError when strict) without a store call, counted in
  ``checkpoints_refused``.
* The last state is never lost: the completion commit writes it (with ``ended``, the
  outcome) beside the deletion of the mark, and the hand-off of a fenced or
  interrupted item writes what is held beside the move to the failover queue (both
  retried by housekeeping until they succeed).
* An execution begun under a store session is never valid under the next one: the
  membership check makes the store refuse its writes once that session ended (its
  persistent mark and fence child outlive the session; the client may have
  reconnected and registered again), and once the runtime fenced it (``ctx.is_valid``
  false) its calls are refused here, without a store call.
* A call whose commit met a store error sends it again (conditional, whole documents:
  safe) until the store answers, True or False, or the execution is fenced (False):
  True is never said of a write that may not have landed (ZooKeeper fails the
  request in flight when a session expires; the successor then resumed from an older
  state than the one reported accepted). Only a store silent for
  UNKNOWN_OUTCOME_WAIT while the execution stays valid leaves the call held (True,
  logged "not written; kept"). A held write of the timer or of ``ctx.progress`` that
  meets a store error is kept and written at the next chance.
* The resume state is read on first use (before the first write: a successor reads its
  predecessor's state, never its own), only for failover and misfire re-runs, and the
  previous run's state only with ``checkpoint_carry``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import (
    CheckpointDoc,
    CheckpointReader,
    ProgressDoc,
    check_progress,
    fence_check,
    serialise_state,
)
from shardkeeper.errors import (
    CheckpointFencedError,
    CheckpointUnavailableError,
    StoreError,
)
from shardkeeper.registry.base import Check, Delete, Op, Put

__all__ = ["RESUME_READ_TRIES", "ItemCheckpoints", "ItemStates", "describe_checkpoint"]

log = logging.getLogger(__name__)

#: reads of the resume state before the attempt fails (CheckpointUnavailableError)
RESUME_READ_TRIES = 3
#: the least wait before a held write whose commit met a store error is sent again
RETRY_AFTER_ERROR = 0.5
#: how long a ``ctx.checkpoint`` call whose commit met a store error goes on sending it
#: (in the caller's thread) for a definite answer while its execution stays valid; the
#: runtime fences an execution whose session may be lost well before (within a session
#: timeout), and a fenced one is refused: only a store that answers nothing for this
#: long while the session is believed alive leaves the call "held"
UNKNOWN_OUTCOME_WAIT = 30.0
#: the back-off between two such sends (the first is quick: a dropped connection is
#: usually back within a few tens of milliseconds)
UNKNOWN_OUTCOME_BACKOFF = (0.05, 0.1, 0.2, 0.4)

Defer = Callable[[str, float, Callable[[], None]], None]


class ItemStates:
    """The checkpoint sessions of one job's executions on this instance."""

    def __init__(
        self,
        *,
        reader: CheckpointReader,
        instance_id: str,
        config: Callable[[], JobConfig],
        count: Callable[[str, int], None],
        defer: Defer | None = None,
    ) -> None:
        self.reader = reader
        self.instance_id = instance_id
        self.config = config
        self.count = count
        #: runs a function after a delay under a merge key (the lanes' timer)
        self.defer = defer
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], ItemCheckpoints] = {}

    def open(
        self,
        *,
        item: int,
        fire_time: float,
        execution_id: str,
        token: int,
        fence: str,
        rerun: bool,
        member: Check | None = None,
        valid: Callable[[], bool] | None = None,
    ) -> ItemCheckpoints:
        """The session of one execution (``rerun``: a failover or misfire re-run,
        which looks for a checkpoint of its fire).

        ``member``: the condition "this instance is still the member it was when the
        execution began" (its membership node's incarnation, an ephemeral node of the
        store session the execution began in), checked by every write beside the
        fence: a write of an execution begun under one session is refused by the store
        once that session ended, even when the client reconnected under a new one and
        registered again (the persistent mark's fence child outlives the session).
        ``valid``: whether the execution may still run (the runtime's ``ctx.is_valid``):
        once it is not, its checkpoints are refused here, before any store call."""
        cfg = self.config()
        session = ItemCheckpoints(
            self,
            item=item,
            fire_time=fire_time,
            execution_id=execution_id,
            token=token,
            fence=fence,
            rerun=rerun,
            carry=cfg.checkpoint_carry,
            monitor=cfg.monitor_execution,
            member=member,
            valid=valid,
        )
        with self._lock:
            self._open[(execution_id, token)] = session
        return session

    def get(self, execution_id: str, token: int) -> ItemCheckpoints | None:
        """The open session of that execution, if any."""
        with self._lock:
            return self._open.get((execution_id, token))

    def take(self, execution_id: str, token: int) -> ItemCheckpoints | None:
        """Close and forget the session of that execution (its batch completes)."""
        with self._lock:
            return self._open.pop((execution_id, token), None)

    def running_progress(self) -> list[ProgressDoc]:
        """The last progress report of each open execution that reported one."""
        with self._lock:
            sessions = list(self._open.values())
        return [p for s in sessions if (p := s.last_progress()) is not None]


#: how much of a resumed state the history row quotes (the whole is in the store)
STATE_QUOTE = 80


def describe_checkpoint(doc: CheckpointDoc) -> str:
    """A checkpoint as a history row names it: its number (the how-manieth of its
    execution), writer, time and the start of its state."""
    when = datetime.fromtimestamp(doc.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    state = doc.state_json
    if len(state) > STATE_QUOTE:
        state = state[: STATE_QUOTE - 3] + "..."
    return f"checkpoint {doc.seq} of {doc.instance} ({when}): {state}"


class ItemCheckpoints:
    """One execution's checkpoints and progress (module docstring); an ``ItemState``."""

    def __init__(
        self,
        owner: ItemStates,
        *,
        item: int,
        fire_time: float,
        execution_id: str,
        token: int,
        fence: str,
        rerun: bool,
        carry: bool,
        monitor: bool,
        member: Check | None = None,
        valid: Callable[[], bool] | None = None,
    ) -> None:
        self._o = owner
        self.item = item
        self.fire_time = fire_time
        self.execution_id = execution_id
        self._token = token
        self._fence = fence
        self._rerun = rerun
        self._carry = carry
        self._monitor = monitor
        self._member = member
        self._valid = valid or (lambda: True)
        self._lock = threading.Lock()
        #: one write at a time, in order: a later state never lands before an earlier
        self._io = threading.Lock()
        self._load_lock = threading.Lock()
        self._loaded: tuple[Any, bool, Any] | None = None
        #: the resumed state as JSON (the run's state until it checkpoints)
        self._resume_json: str | None = None
        #: the checkpoint resumed from, as the history says it ("" for none)
        self._resumed_from = ""
        self._seq = 0
        self._pending: str | None = None
        self._pending_seq = 0
        self._accepted: str | None = None
        self._latest: str | None = None
        self._progress: ProgressDoc | None = None
        self._progress_pending = False
        self._progress_given = False
        self._last_write = float("-inf")
        self._armed = False
        self._pruned = False
        self._refused = False
        #: the execution is no longer valid (fenced: its session may have ended, others
        #: may run the item): later calls are refused; what was taken before it is
        #: still written by the hand-off, conditional on the mark
        self._invalid = False
        self._closed = False

    # -- the context's calls ----------------------------------------------------------

    def checkpoint(self, state: Any, strict: bool | None) -> bool:
        """``ctx.checkpoint``: check, then write now or hold (module docstring)."""
        cfg = self._o.config()
        strict = cfg.checkpoint_strict if strict is None else strict
        if not self._monitor:
            raise CheckpointUnavailableError(
                f"job {cfg.name!r} runs with monitor_execution off: no running mark to "
                "fence a checkpoint on; turn monitor_execution on to use checkpoints"
            )
        text = serialise_state(state, cfg.checkpoint_max_bytes)
        self.resume()  # the predecessor's state is read before this run writes its own
        # (asked outside the lock: the runtime's answer may fence its batches)
        valid = self._valid()
        with self._lock:
            if not valid:
                self._invalid = True
            if self._refused or self._closed or self._invalid:
                return self._refuse(strict)
            self._seq += 1
            self._pending, self._pending_seq = text, self._seq
            self._latest = text
        written = self._write_or_hold(call=True)
        if written is None:
            written = self._until_definite()
        if written is False:
            with self._lock:
                return self._refuse(strict)
        return True

    def _until_definite(self) -> bool | None:
        """A call whose commit met a store error: send it again (it is conditional and
        carries whole documents) until the store answers, while the execution stays
        valid. "True" is never said of a write whose outcome is unknown: a connection
        lost as the session expired (ZooKeeper fails the request in flight) left the
        write unapplied, and a successor then resumed from an older state than the one
        the job had been told was accepted. False once the execution is not valid (the
        runtime fenced it: its session may have ended); None (held, written at the next
        chance) only if the store answers nothing for UNKNOWN_OUTCOME_WAIT."""
        deadline = time.monotonic() + UNKNOWN_OUTCOME_WAIT
        tries = 0
        while time.monotonic() < deadline:
            if not self._valid():
                with self._lock:
                    self._invalid = True
                log.warning(
                    "%s: checkpoint of item %d (execution %s) refused: the store did not "
                    "answer before the execution was fenced off",
                    self._job,
                    self.item,
                    self.execution_id,
                )
                return False
            pause = UNKNOWN_OUTCOME_BACKOFF[min(tries, len(UNKNOWN_OUTCOME_BACKOFF) - 1)]
            tries += 1
            time.sleep(pause)  # a back-off between sends, not a synchronisation
            written = self._flush(call=True)
            if written is not None:
                return written
        # held after all: said as a store failure's hold is (the chaos worker counts
        # this line's calls as held, not accepted)
        log.warning(
            "%s: checkpoint of item %d not written (the store gave no answer for %gs); "
            "kept, written at the next chance",
            self._job,
            self.item,
            UNKNOWN_OUTCOME_WAIT,
        )
        with self._lock:
            self._arm(max(RETRY_AFTER_ERROR, self._o.config().checkpoint_interval))
        return None

    def progress(self, done: float, total: float | None, note: str | None) -> None:
        """``ctx.progress``: check, then write now or hold (never raises for the store)."""
        d, t, n = check_progress(done, total, note)
        now = time.time()
        with self._lock:
            if self._refused or self._closed:
                return
            first = self._progress
            self._progress = ProgressDoc(
                execution_id=self.execution_id,
                instance=self._o.instance_id,
                fire_time=self.fire_time,
                done=d,
                total=t,
                note=n,
                at=now,
                first_done=first.first_done if first is not None else d,
                first_at=first.first_at if first is not None else now,
            )
            self._progress_given = True
            if not self._monitor:
                return  # kept for the history and the metrics: no mark to fence on
            self._progress_pending = True
        self._write_or_hold()

    def resume(self) -> tuple[Any, bool, Any]:
        """``(resume_state, resumed, last_state)``, read once on first use."""
        with self._load_lock:
            if self._loaded is None:
                self._loaded = self._read_resume()
            return self._loaded

    def current(self) -> Any:
        """This run's latest state, else the resumed one, else the carried one."""
        with self._lock:
            latest = self._latest
        if latest is not None:
            return json.loads(latest)
        resume_state, _resumed, last = self.resume()
        return resume_state if resume_state is not None else last

    # -- the runtime's side -------------------------------------------------------------

    def resumed_from(self) -> str:
        """The checkpoint this run resumed from, for its history row: ``checkpoint 7
        of vm@12@ab (2026-12-07T02:47:22Z): {"next": 7}``; "" when it read none
        (not a re-run, nothing stored, or the job never asked for its resume state)."""
        with self._lock:
            return self._resumed_from

    def last_progress(self) -> ProgressDoc | None:
        """The last progress report given (written or not)."""
        with self._lock:
            return self._progress

    def final_ops(self, outcome: str) -> list[Op]:
        """Ops for the completion commit of a run that ended with ``outcome``: its last
        state with ``ended`` (the pending one, else the last written, else the one it
        resumed from), and the deletion of its progress. Closes the session."""
        with self._lock:
            self._closed = True
            if self._refused:
                return []
            text = self._pending or self._accepted or self._resume_json
            seq = self._seq
            # a re-run deletes its predecessor's report too (same fire, cut off)
            progress = (self._progress_given or self._rerun) and self._monitor
        ops: list[Op] = []
        if text is not None:
            doc = self._doc(text, seq, ended=outcome)
            ops.append(Put(self._o.reader.path(self.item, self.fire_time), doc.to_bytes()))
        if progress:
            ops.append(Delete(self._o.reader.paths.progress(self.item)))
        return ops

    def handoff_ops(self) -> list[Op]:
        """Ops for the hand-off commit of a run cut off here (fenced, interrupted): what
        it holds unwritten, for its successor to resume from. Closes the session."""
        with self._lock:
            self._closed = True
            if self._refused:
                return []
            # (an invalid execution's held state, taken before it was fenced, goes on:
            # this commit is conditional on the mark, so a successor reads it)
            text, seq = self._pending, self._seq
            progress = self._progress if self._progress_pending else None
        ops: list[Op] = []
        if text is not None:
            doc = self._doc(text, seq)
            ops.append(Put(self._o.reader.path(self.item, self.fire_time), doc.to_bytes()))
        if progress is not None:
            ops.append(Put(self._o.reader.paths.progress(self.item), progress.to_bytes()))
        return ops

    # -- writing ------------------------------------------------------------------------

    def _refuse(self, strict: bool) -> bool:
        """A refused call (the lock held): counted; False, or raised when strict."""
        self._o.count("checkpoints_refused", 1)
        if strict:
            if self._closed and not self._refused:
                why = "the run has ended"
            elif self._invalid and not self._refused:
                why = (
                    "the execution was fenced off (its store session may have ended: "
                    "others may run the item); its last accepted state is kept"
                )
            else:
                why = (
                    "its running mark is no longer this execution's, or the store "
                    "session it began in has ended (taken over or cleared); the "
                    "successor's state is kept"
                )
            raise CheckpointFencedError(
                f"job {self._o.reader.paths.job!r} item {self.item}: checkpoint of "
                f"execution {self.execution_id} refused: {why}"
            )
        return False

    def _write_or_hold(self, *, call: bool = False) -> bool | None:
        """Write what is held now if the interval is up, else arm the timer for it.
        True: written or held; False: refused; None: a store error (held)."""
        interval = self._o.config().checkpoint_interval
        with self._lock:
            wait = self._last_write + interval - time.monotonic()
            if wait > 0:
                self._arm(wait)
                return True
        return self._flush(call=call)

    def _arm(self, delay: float) -> None:
        """(the lock held) Have the timer write what is held after ``delay``."""
        if self._armed or self._o.defer is None:
            return
        self._armed = True
        key = f"{self.execution_id}:{self._token}"
        self._o.defer(key, delay, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._armed = False
            if self._closed or self._refused:
                return
        try:
            self._write_or_hold()
        except Exception:  # never let a held write kill the lane
            log.exception("%s: checkpoint write of item %d failed", self._job, self.item)

    @property
    def _job(self) -> str:
        return self._o.reader.paths.job

    def _doc(self, text: str, seq: int, *, ended: str = "") -> CheckpointDoc:
        return CheckpointDoc(
            execution_id=self.execution_id,
            fire_time=self.fire_time,
            instance=self._o.instance_id,
            state_json=text,
            at=time.time(),
            seq=seq,
            ended=ended,
        )

    def _flush(self, *, call: bool = False) -> bool | None:
        """Write what is held in one fenced commit (see _write_or_hold). ``call``: in
        a ``ctx.checkpoint`` call, which sends it again itself after a store error
        (_until_definite): no timer is armed for it, and the error is not reported as
        a write left unwritten."""
        reader = self._o.reader
        with self._io:
            with self._lock:
                if self._refused:
                    return False
                if self._closed:
                    return True  # the completion or hand-off commit writes it
                if self._invalid:
                    return False
                text, seq = self._pending, self._pending_seq
                progress = self._progress if self._progress_pending else None
                prune = text is not None and not self._pruned
            if text is None and progress is None:
                return True
            extra: list[Op] = []
            if prune:
                try:
                    extra = reader.prune_ops(self.item, self.fire_time)
                except StoreError:
                    extra = []  # pruned at the next write
            doc = self._doc(text, seq) if text is not None else None
            ops = reader.write_ops(
                fence_check(reader.paths, self.item, self._token, self._fence),
                self.item,
                checkpoint=doc,
                progress=progress,
                extra=[*([self._member] if self._member is not None else []), *extra],
            )
            try:
                ok = reader.commit(ops)
            except StoreError as exc:
                self._o.count("checkpoint_errors", 1)
                if call:
                    log.info(
                        "%s: checkpoint commit of item %d met a store error (%s); sent "
                        "again for a definite answer",
                        self._job,
                        self.item,
                        exc,
                    )
                    return None
                log.warning(
                    "%s: checkpoint of item %d not written (%s); kept, written at the next chance",
                    self._job,
                    self.item,
                    exc,
                )
                with self._lock:
                    self._arm(max(RETRY_AFTER_ERROR, self._o.config().checkpoint_interval))
                return None
            with self._lock:
                self._last_write = time.monotonic()
                if not ok:
                    self._refused = True
                    log.warning(
                        "%s: checkpoint of item %d (execution %s) refused: its running "
                        "mark is no longer this execution's, or the store session it "
                        "began in ended",
                        self._job,
                        self.item,
                        self.execution_id,
                    )
                    return False
                if text is not None:
                    self._accepted = text
                    self._pruned = True
                    if self._pending_seq == seq:
                        self._pending = None
                    self._o.count("checkpoints", 1)
                if progress is not None and self._progress is progress:
                    self._progress_pending = False
                if self._pending is not None or self._progress_pending:
                    # newer calls came in while this one was written: the timer's
                    self._arm(self._o.config().checkpoint_interval)
            return True

    def _read_resume(self) -> tuple[Any, bool, Any]:
        """Read the resume state (re-runs) and the carried one (``checkpoint_carry``);
        a store that does not answer after a few tries fails the attempt."""
        if not self._monitor or not (self._rerun or self._carry):
            return None, False, None
        reader = self._o.reader
        error: StoreError | None = None
        for attempt in range(RESUME_READ_TRIES):
            try:
                resume_state: Any = None
                resumed = False
                if self._rerun:
                    doc = reader.read(self.item, self.fire_time)
                    if doc is not None and doc.execution_id == self.execution_id:
                        resume_state, resumed = doc.state, True
                        with self._lock:
                            self._resume_json = doc.state_json
                            self._resumed_from = describe_checkpoint(doc)
                last = None
                if self._carry:
                    prev = reader.read_last(self.item, self.fire_time)
                    last = prev.state if prev is not None else None
                return resume_state, resumed, last
            except StoreError as exc:
                error = exc
                time.sleep(0.1 * (attempt + 1))  # a short back-off between tries
        raise CheckpointUnavailableError(
            f"job {self._job!r} item {self.item}: the store did not answer the read of "
            f"its checkpoint ({error}); the attempt fails and is retried per the job's "
            "policy (the stored state is untouched)"
        ) from error
