"""Batches: the items one trigger (or one failover claim) runs here, from launch to
the completion commit.

Items run on the shared worker pool, at most ``max_threads`` of a batch at once.
Each item ends on its own: an item that ends while others of its batch still run is
completed by itself (its mark deleted and its result written, conditional on its
token), coalesced with the siblings that ended near it (EARLY_RESULTS_DELAY after the
first, at most one such commit per EARLY_RESULTS_EVERY), so its outcome shows at once
and its next fire is never held by a slower sibling. A batch whose items all end
within that delay is completed as a whole: when its last item is done, ONE commit per
fencing token deletes the marks of the items that ran, each only while it still
carries the batch's token (a fast fire costs its start and completion commits only).
Items of a fenced batch (that never started, or ran while fenced: they were told
they are invalid and may have stopped half-way) are handed to failover by a
conditional commit, so a valid execution runs them again; they are never left
marked (a live instance must not keep a mark it will not clear), and never cleared
as if done. An item that returned after ``ctx.should_stop()`` told it to stop (a
graceful or hard stop) is *interrupted*: its work may be unfinished, so it is handed
off the same way (failover on: another instance runs it again; failover off: its mark
is cleared and its owner runs it at the next fire), and recorded as such. A commit
that fails is remembered and retried by every housekeeping pass (and by a graceful
stop, within its grace period) until it succeeds; until then those marks count as
this instance's own. The
completion commit also writes each finished item's last result
(coordination/results.py), with that item's deletion: no extra round trip.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shardkeeper import tracing
from shardkeeper.coordination.model import DocumentError, FailoverEntry
from shardkeeper.coordination.results import ItemResult
from shardkeeper.errors import StoreError
from shardkeeper.job import (
    ClusterOnceListener,
    JobListener,
    ShardedJob,
    ShardingContext,
    StopReason,
)
from shardkeeper.observe import ExecutionRecord, Observers, Outcome, format_traceback
from shardkeeper.runtime.execute.attempts import run_once
from shardkeeper.runtime.execute.batch import (
    CRASHED,
    EARLY_RESULTS_DELAY,
    EARLY_RESULTS_EVERY,
    FAILED,
    FENCED,
    FIRE_LEAD,
    INTERRUPTED,
    MAX_BACKOFF,
    OK,
    RAN_FIRES,
    RAN_MEMORY,
    TIMED_OUT,
    ZOMBIE,
    Batch,
    _Unfinished,
    execution_id,
)
from shardkeeper.runtime.execute.pool import WorkerPool
from shardkeeper.runtime.job.jobstate import JobState
from shardkeeper.runtime.job.services import JobServices

if TYPE_CHECKING:
    from shardkeeper.config import JobConfig
    from shardkeeper.registry.base import Op
    from shardkeeper.runtime.execute.procpool import RunOnce
    from shardkeeper.runtime.fire.checkpoints import ItemStates

# Batch and execution_id live in batch.py; re-exported here for the runner and tests
__all__ = ["Batch", "Batches", "execution_id"]

log = logging.getLogger(__name__)

#: outcomes of items to be run again: never started, ran fenced, or returned when
#: told to stop (handed off with their batch, never completed on their own)
_AGAIN = (FENCED, ZOMBIE, INTERRUPTED)

#: items per completion call when settling (the store packs each call into commits
#: of its own size limit): a store failure leaves at most this many items both
#: cleared and still listed as to settle, which the retry then counts as fenced.
#: Above a batch's usual size: at 256, a fire of 1,000 items here cost 4 completion
#: calls, 5 requests a trigger instead of 2 (bench/coordination_cost.py)
SETTLE_CHUNK = 4096


class Batches:
    """Runs and completes the batches of one job (module docstring)."""

    def __init__(
        self,
        *,
        services: JobServices,
        state: JobState,
        job: ShardedJob,
        workers: WorkerPool,
        listeners: list[JobListener],
        valid: Callable[[Batch], bool],
        session: Callable[[], str] = lambda: "",
        on_idle: Callable[[], None],
        observers: Observers | None = None,
        defer: Callable[[float, Callable[[], None]], None] | None = None,
        on_undone: Callable[[list[int]], None] | None = None,
        executor: Callable[[JobConfig], RunOnce] | None = None,
        item_states: ItemStates | None = None,
        publish: Callable[[float, Callable[[], None]], None] | None = None,
    ) -> None:
        self._s = services
        #: runs the write of results of items that ended while their batch runs,
        #: after a delay, off the worker threads (None: they wait for the completion)
        self._publish = publish
        #: the executions' checkpoints: their last state travels in the completion or
        #: hand-off commit (runtime/fire/checkpoints.py)
        self._item_states = item_states
        #: where an attempt runs, by the job's config now (runtime/execute/procpool.py):
        #: the worker thread itself, or a worker process it waits for
        self._executor = executor
        #: told the items whose run here ended without a valid completion
        self._on_undone = on_undone
        #: runs a function after a delay without holding a thread (the runtime's timer)
        self._defer = defer
        #: first items of batches waiting for their fire's due time, by deferral
        self._deferred: dict[int, tuple[Batch, list[int]]] = {}
        self._deferral = itertools.count()
        self._observers = observers if observers is not None else Observers()
        self._state = state
        self._job = job
        self._workers = workers
        self._listeners = listeners
        self._valid = valid
        self._session = session
        self._on_idle = on_idle
        self._lock = threading.RLock()
        self._batches: list[Batch] = []
        #: execution ids that ran here lately, by fire time, oldest fire first (a
        #: late-applied start commit may mark their items again: those marks are
        #: cleared, not failed over); the latest RAN_FIRES fires are kept whole
        self._ran: OrderedDict[float, set[str]] = OrderedDict()
        #: execution id -> its fire time in ``_ran`` (one lookup per mark checked)
        self._ran_index: dict[str, float] = {}
        self._unfinished: list[_Unfinished] = []
        #: item -> (end of its last success, failures in a row since), as known here:
        #: carried into the next result document without reading the store
        self._history: dict[int, tuple[float, int]] = {}
        #: items whose result node exists (written or read here): set, not created
        self._written: set[int] = set()

    # -- inspection -------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No batch in progress."""
        with self._lock:
            return not self._batches

    def running_count(self) -> int:
        """Items executing or queued to execute here."""
        with self._lock:
            return sum(b.running + len(b.pending) for b in self._batches)

    def busy_items(self, *, include_failover: bool = True) -> set[int]:
        """Items of batches in progress (and of marks a failed commit left)."""
        with self._lock:
            items = {
                i
                for b in self._batches
                if include_failover or not b.failover
                for i in b.items
                if i not in b.settled
            }
            items |= {i for u in self._unfinished for i in (*u.ran, *u.handoff)}
            return items

    def running_since(self, items: Iterable[int]) -> float | None:
        """When the oldest batch in progress holding one of ``items`` was launched
        (monotonic seconds); None when no batch holds them (a failed commit's marks
        may)."""
        wanted = set(items)
        with self._lock:
            since = [
                b.launched_at for b in self._batches if wanted.intersection(b.items) - b.settled
            ]
        return min(since) if since else None

    def owns(self, item: int, execution: str) -> bool:
        """Whether a local batch (or a pending retry) holds ``item`` for ``execution``."""
        with self._lock:
            for b in self._batches:
                if item in b.settled:
                    continue  # completed on its own: a failed commit of it is below
                if item in b.execution_ids and b.execution_ids[item] == execution:
                    return True
            return any(
                u.execution_ids.get(item) == execution
                for u in self._unfinished
                if item in u.ran or item in u.handoff
            )

    def ran_here(self, execution: str) -> bool:
        """Whether ``execution`` ran here lately (see ``FailoverService.requeue_own``):
        every execution of the latest RAN_FIRES fires run here, and of older fires as
        many as RAN_MEMORY ids allow."""
        with self._lock:
            return execution in self._ran_index

    def _remember_ran(self, fire_time: float, executions: list[str]) -> None:
        if not executions:
            return
        with self._lock:
            ids = self._ran.setdefault(fire_time, set())
            self._ran.move_to_end(fire_time)
            for execution in executions:
                old = self._ran_index.get(execution)
                if old is not None and old != fire_time:
                    self._ran[old].discard(execution)
                ids.add(execution)
                self._ran_index[execution] = fire_time
            # Whole fires are forgotten, oldest first, and never one of the latest
            # RAN_FIRES: a batch of 100,000 items is remembered whole (an id memory
            # bounded by count alone evicted a big batch's own first items).
            while len(self._ran) > RAN_FIRES and len(self._ran_index) > RAN_MEMORY:
                _fire, gone = self._ran.popitem(last=False)
                for execution in gone:
                    del self._ran_index[execution]

    def unfinished(self) -> bool:
        """Whether marks of finished batches still wait to be cleared or handed off."""
        with self._lock:
            return bool(self._unfinished)

    def unfinished_items(self) -> set[int]:
        """The items whose marks a failed completion or hand-off commit left."""
        with self._lock:
            return {i for u in self._unfinished for i in (*u.ran, *u.handoff)}

    def stop_reason(self, batch: Batch, item: int) -> StopReason | None:
        """Why ``item`` of ``batch`` must end, as far as this instance knows (its
        ``ctx.stop_reason()`` adds fencing): its execution timed out, or the instance
        is stopping and its grace period runs out (``JobState.stop_notice_at``; not
        as the stop begins: until then the item may finish its work, which is what
        a graceful stop promises). A stop answered here is remembered: an execution
        that then returns is interrupted, not done. A pending reshard is no reason
        (the new assignment applies from the next fire)."""
        if item in batch.timed_out:
            return StopReason.TIMEOUT
        st = self._state
        with st.lock:
            ending = st.hard_stop or (st.stopping and time.monotonic() >= st.stop_notice_at)
        if ending:
            with self._lock:
                batch.told_to_stop.add(item)
            return StopReason.SHUTDOWN
        return None

    # -- running ------------------------------------------------------------------

    def launch(self, batch: Batch, make_context: Callable[[Batch, int], ShardingContext]) -> None:
        """Start ``batch`` (its marks are committed)."""
        for item in batch.items:
            batch.contexts[item] = make_context(batch, item)
        batch.pending.extend(batch.items)
        with self._lock:
            self._batches.append(batch)
        self._call_listeners("before", batch)
        limit = self._state.config.max_threads or len(batch.items)
        with self._lock:
            first = [batch.pending.popleft() for _ in range(min(limit, len(batch.pending)))]
            batch.running += len(first)
        # A scheduled fire is decided FIRE_LEAD ahead of its due time (batch.py): its
        # items go to the workers at that time, not before, and no thread waits for
        # it meanwhile (the batch is in place already: fencing and stops see it).
        early = min(batch.fire_time - time.time(), FIRE_LEAD)
        if early > 0 and self._defer is not None:
            with self._lock:
                key = next(self._deferral)
                self._deferred[key] = (batch, first)
            self._defer(early, lambda: self._start_deferred(key))
        else:
            self._submit_items(batch, first)

    def _start_deferred(self, key: int) -> None:
        with self._lock:
            entry = self._deferred.pop(key, None)
        if entry is not None:
            self._submit_items(*entry)

    def waiting_for_due_time(self) -> list[float]:
        """The fire times of the batches whose items wait for their due time."""
        with self._lock:
            return [batch.fire_time for batch, _items in self._deferred.values()]

    def start_deferred_now(self) -> None:
        """Hand the items waiting for their fire's due time to the workers now (a hard
        stop or a fencing: they end as fenced at once, and their batch completes,
        rather than wait on a timer that the stop may drop)."""
        with self._lock:
            entries = list(self._deferred.values())
            self._deferred.clear()
        for batch, items in entries:
            self._submit_items(batch, items)

    def _submit_items(self, batch: Batch, items: list[int]) -> None:
        for item in items:
            self._submit_item(batch, item)

    def _submit_item(self, batch: Batch, item: int) -> None:
        # under the job's name: jobs take turns for the threads (WorkerPool)
        if not self._workers.submit(lambda: self._run_item(batch, item), self._state.config.name):
            # the pool is shut down (hard stop): the item never starts
            self._item_done(batch, item, FENCED)

    def _run_item(self, batch: Batch, item: int) -> None:
        outcome = OK
        started = time.time()
        error: BaseException | None = None
        if batch.fenced or self._state.hard_stop or not self._valid(batch):
            outcome = FENCED
        else:
            outcome, started, ended, error = self._attempts(batch, item)
            if outcome == OK and item in batch.told_to_stop:
                # told to stop, it returned: maybe half-way, so not done for the
                # cluster (handed off below, like a fenced item, and run again)
                outcome = INTERRUPTED
                self._state.count("interrupted")
            if outcome in (FAILED, TIMED_OUT, CRASHED):
                self._state.count("timed_out" if outcome == TIMED_OUT else "failed")
                exc = error or TimeoutError(
                    f"item {item} ran longer than {self._state.config.execution_timeout}s"
                )
                error = exc
                try:
                    self._state.on_error(self._state.config.name, item, exc)
                except BaseException as handler_exc:
                    log.error(
                        "%s: item %d failed (%s); error handler raised: %r",
                        self._state.config.name,
                        item,
                        exc,
                        handler_exc,
                    )
            self._state.count("executed")
            if outcome == CRASHED and self._state.config.failover and not batch.failover:
                # maybe this host (an OOM kill): another instance runs it once more;
                # a failover run that crashes too is done for this fire, so a child
                # that always crashes cannot travel the cluster for ever
                batch.crash_handoff.add(item)
            if batch.fenced_at is not None and batch.fenced_at <= ended:
                # it ran (maybe only partly: it was told it is invalid) while fenced:
                # not "done" for the cluster, so it is handed to failover below. One
                # that had returned before the fence is done (its completion commit
                # is conditional on its mark all the same): handed off, it ran twice,
                # both runs valid (600 s etcd run: returned 8 ms before the fence).
                # ``ended`` is taken after the return, so a fence in between counts
                # the run fenced: the error is only ever on the side of running again.
                outcome = ZOMBIE
        if outcome in (OK, FAILED, TIMED_OUT) or (
            outcome == CRASHED and item not in batch.crash_handoff
        ):
            self._record_result(batch, item, outcome, started, error)
        if self._observers:
            self._observe(batch, item, outcome, started, error)
        self._item_done(batch, item, outcome)

    def _attempts(self, batch: Batch, item: int) -> tuple[str, float, float, BaseException | None]:
        """Run the item, and again after a failure while ``retries`` allow (waiting
        ``retry_backoff``, doubled each time, in its worker slot). A timed-out item is
        not retried (its thread may still run). Returns the last attempt's outcome,
        start, end (wall time, taken after the item returned) and error; the failed
        attempts before it are observed (history)."""
        cfg = self._state.config
        ctx = batch.contexts[item]
        attempt = 0
        while True:
            attempt += 1
            batch.attempts[item] = attempt
            span = batch.spans.get(item)
            run_attempt = run_once if self._executor is None else self._executor(cfg)
            run = run_attempt(
                self._job, ctx, cfg.execution_timeout, lambda: self._timed_out(batch, item), span
            )
            if run.error is not None:
                tracing.record_attempt_error(span, run.error, attempt)
            if (
                run.outcome not in (FAILED, CRASHED)
                or attempt > cfg.retries
                or not self._may_retry(batch)
            ):
                return run.outcome, run.started, run.ended, run.error
            if self._observers:
                self._observe(batch, item, run.outcome, run.started, run.error, attempt=attempt)
            self._state.count("retries")
            delay = min(cfg.retry_backoff * 2 ** (attempt - 1), MAX_BACKOFF)
            log.info(
                "%s: item %d failed (%r); attempt %d of %d in %.1fs",
                cfg.name,
                item,
                run.error,
                attempt + 1,
                cfg.retries + 1,
                delay,
            )
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                if not self._may_retry(batch):
                    return run.outcome, run.started, run.ended, run.error
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _may_retry(self, batch: Batch) -> bool:
        st = self._state
        return not (batch.fenced or st.stopping or st.hard_stop) and self._valid(batch)

    def _timed_out(self, batch: Batch, item: int) -> None:
        with self._lock:
            batch.timed_out.add(item)

    def _record_result(
        self, batch: Batch, item: int, outcome: str, started: float, error: BaseException | None
    ) -> None:
        """Keep the item's last result on the batch for the completion commit."""
        ended = time.time()
        with self._lock:
            known = self._history.get(item)
        if known is None and outcome == FAILED:
            # a failure of an item not run here before: carry its last success over
            # (one read, on the failure path only and once per item)
            known = self._stored_history(item)
        last_ok, failures = known or (0.0, 0)
        if outcome == OK:
            last_ok, failures = ended, 0
        else:
            failures += 1
        with self._lock:
            self._history[item] = (last_ok, failures)
        result = ItemResult(
            outcome=outcome,
            fire_time=batch.fire_time,
            started=started,
            ended=ended,
            instance=self._s.instance_id,
            last_ok=last_ok,
            failures=failures,
            error_type=type(error).__qualname__ if error is not None else "",
            error=str(error) if error is not None else "",
        )
        if item not in batch.uncounted:  # see Batch.uncounted
            batch.results[item] = result.to_bytes()

    def _stored_history(self, item: int) -> tuple[float, int] | None:
        try:
            node = self._s.store.get(self._s.paths.result(item))
            if node is None:
                return None
            with self._lock:
                self._written.add(item)
            stored = ItemResult.from_bytes(node.value, node.path)
        except (StoreError, DocumentError):
            return None
        return stored.last_ok, stored.failures

    def _observe(
        self,
        batch: Batch,
        item: int,
        outcome: str,
        started: float,
        error: BaseException | None,
        *,
        attempt: int = 0,
    ) -> None:
        kind = {
            OK: Outcome.OK,
            FAILED: Outcome.FAILED,
            TIMED_OUT: Outcome.TIMED_OUT,
            INTERRUPTED: Outcome.INTERRUPTED,
            CRASHED: Outcome.CRASHED,
        }.get(outcome, Outcome.FENCED)
        if outcome == FENCED:
            started = time.time()  # it never started: zero duration
        err_type, message, trace = format_traceback(error) if error is not None else ("", "", "")
        self._observers.on_execution(
            ExecutionRecord(
                job=self._state.config.name,
                item=item,
                fire_time=batch.fire_time,
                execution_id=batch.execution_ids.get(item)
                or execution_id(self._state.config.name, batch.fire_time, item),
                instance=self._s.instance_id,
                started=started,
                ended=time.time(),
                outcome=kind,
                failover=batch.failover,
                misfire=batch.misfire,
                fencing_token=batch.tokens.get(item, 0),
                error_type=err_type,
                error_message=message,
                traceback=trace,
                attempt=attempt or batch.attempts.get(item, 1),
                covers=batch.covers.get(item, ()),
                covered_before=batch.covered_before.get(item, 0),
                progress=self._last_progress(batch, item) if outcome != OK else "",
                taken_over_from=batch.taken_from.get(item, ""),
                resumed_from=self._resumed_from(batch, item),
            )
        )

    def _resumed_from(self, batch: Batch, item: int) -> str:
        """The checkpoint the item's run resumed from, for the history ("" for none)."""
        states = self._item_states
        session = (
            states.get(batch.execution_ids.get(item, ""), batch.tokens.get(item, 0))
            if states is not None
            else None
        )
        return session.resumed_from() if session is not None else ""

    def _last_progress(self, batch: Batch, item: int) -> str:
        """The item's last progress report as JSON, for the history ("" for none)."""
        states = self._item_states
        session = (
            states.get(batch.execution_ids.get(item, ""), batch.tokens.get(item, 0))
            if states is not None
            else None
        )
        report = session.last_progress() if session is not None else None
        if report is None:
            return ""
        return json.dumps(
            {"done": report.done, "total": report.total, "note": report.note, "at": report.at},
            separators=(",", ":"),
        )

    def _item_done(self, batch: Batch, item: int, outcome: str) -> None:
        nxt: int | None = None
        ended = [item]
        with self._lock:
            batch.outcomes[item] = outcome
            batch.running -= 1
            if batch.pending and not self._state.hard_stop:
                nxt = batch.pending.popleft()
                batch.running += 1
            elif self._state.hard_stop:
                for never in batch.pending:
                    batch.outcomes[never] = FENCED
                ended.extend(batch.pending)
                batch.pending.clear()
            complete = batch.running == 0 and not batch.pending
            # from here on the batch's completion commit settles what is left: an
            # item's own completion (Batches._flush_early) no longer may
            batch.completing = complete
        for done in ended:
            said = batch.outcomes[done]
            tracing.end_item(
                batch.spans.get(done),
                FENCED if said == ZOMBIE else said,  # as the history says it
                attempt=batch.attempts.get(done, 0),
                fencing_token=batch.tokens.get(done, 0),
            )
        if not complete:
            self._early_result(batch, item, outcome)
        if nxt is not None:
            self._submit_item(batch, nxt)
        elif complete:
            self._complete(batch)

    # -- items that end while their batch runs ---------------------------------------

    def _early_result(self, batch: Batch, item: int, outcome: str) -> None:
        """Complete ``item`` on its own, not at its batch's completion: its mark goes
        and its result is written, so ``shards``, ``status`` and the console show it
        finished (a failure at once) while its slower siblings still run (newcomer
        review N15), and its next fire is not held by them (issue 36 §2: with a fire
        every 2 s and one item of 5 s, its siblings ran every 5 s as misfire re-runs).
        Coalesced: at most one commit per EARLY_RESULTS_EVERY seconds per batch, none
        before EARLY_RESULTS_DELAY after the item's end (a batch done by then settles
        them in its completion commit: a fast batch costs nothing more). Only an item
        that ran to an end is completed so: one to be run again (fenced, interrupted,
        crashed and handed off) is handed off with its batch."""
        if outcome in _AGAIN or item in batch.crash_handoff:
            return
        monitor = self._state.config.monitor_execution
        with self._lock:
            if batch.fenced or batch.completing:
                return
            if not monitor:
                # no mark to clear and no result to write: it is free here at once
                batch.settled.add(item)
                settled_now = True
            else:
                settled_now = False
                if self._publish is None:
                    return  # no timer: the batch's completion settles it
                batch.early.add(item)
                if batch.early_armed:
                    return
                batch.early_armed = True
                delay = max(
                    EARLY_RESULTS_DELAY, batch.early_at + EARLY_RESULTS_EVERY - time.monotonic()
                )
        if settled_now:
            self._remember_ran(batch.fire_time, [batch.execution_ids.get(item, "")])
            self._on_idle()  # a fire of it held for this run may be decided now
            return
        assert self._publish is not None
        self._publish(delay, lambda: self._flush_early(batch))

    def _flush_early(self, batch: Batch) -> None:
        """The coalesced completion of the items of ``batch`` that ended while it runs."""
        with self._lock:
            items = sorted(batch.early)
            batch.early.clear()
            batch.early_armed = False
            batch.early_at = time.monotonic()
            if batch.fenced or batch.completing or batch not in self._batches:
                return  # its completion (or hand-off) commit settles them
            # taken out of the batch now, under the lock the completion decides under:
            # each item is settled by exactly one of the two
            items = [i for i in items if i not in batch.settled]
            batch.settled.update(items)
        if not items:
            return
        ran = {i: batch.tokens.get(i, 0) for i in items}
        self._remember_ran(
            batch.fire_time, [batch.execution_ids[i] for i in items if i in batch.execution_ids]
        )
        monitor = self._monitors(batch)
        extra = self._checkpoint_ops(batch, ran, {}, items) if monitor else {}
        entry = _Unfinished(
            batch.fire_time,
            {i: t for i, t in ran.items() if t} if monitor else {},
            {},
            {i: batch.execution_ids[i] for i in items if i in batch.execution_ids},
            {i: f for i, f in batch.fences.items() if i in ran},
            {i: batch.results[i] for i in items if i in batch.results} if monitor else {},
            extra=extra,
            params=dict(batch.params),
            request=batch.request,
        )
        try:
            self._settle(entry)
        except Exception as exc:  # StoreError, or a bug: the retry must not be lost
            self._state.count("store_errors")
            log.warning(
                "%s: could not complete items %s (retried by housekeeping): %s",
                self._state.config.name,
                sorted(entry.ran),
                exc,
            )
            with self._lock:
                self._unfinished.append(entry)
        # a fire of these items held for this run (a misfire re-run, a request's
        # part) may be decided now, as after a batch's completion
        self._on_idle()

    def fence_all(self, why: str = "session may be lost") -> list[int]:
        """Fence every batch in progress (ctx.is_valid() turns false for good); the
        items not yet started will not start. Returns the items fenced now. An item
        that returns after this ran fenced: it is handed to failover, not done."""
        with self._lock:
            fresh = [b for b in self._batches if not b.fenced]
            now = time.time()
            for b in fresh:
                b.fenced = True
                b.fenced_why = why
                b.fenced_at = now
        self.start_deferred_now()  # they see the fence and end at once
        items = sorted(i for b in fresh for i in b.items if i not in b.settled)
        if items:
            self._state.count("fenced", len(items))
            log.warning(
                "%s: executions of items %s fenced off (%s)",
                self._state.config.name,
                items,
                why,
            )
        return items

    # -- completion ---------------------------------------------------------------

    def _monitors(self, batch: Batch) -> bool:
        """Whether ``batch``'s marks are its own to clear (monitor_execution, and the
        session its ephemeral marks live in is still this instance's)."""
        if not self._state.config.monitor_execution:
            return False
        # ephemeral marks died with the session the batch started in: a mark at the
        # same path now is somebody else's, whatever a pre-read would say
        return not (batch.session and not batch.fences and batch.session != self._session())

    def _complete(self, batch: Batch) -> None:
        monitor = self._monitors(batch)
        with self._lock:
            # the items completed on their own are settled already (_flush_early)
            left = [i for i in batch.items if i not in batch.settled]
        # to be run again: never started, ran fenced, or returned when told to stop
        ran = {
            i: batch.tokens.get(i, 0)
            for i in left
            if batch.outcomes.get(i) not in _AGAIN and i not in batch.crash_handoff
        }
        self._remember_ran(
            batch.fire_time, [batch.execution_ids[i] for i in ran if i in batch.execution_ids]
        )
        never = {
            i: batch.tokens.get(i, 0)
            for i in left
            if batch.outcomes.get(i) in _AGAIN or i in batch.crash_handoff
        }
        if never:
            self._undone(list(never))
        # every session is closed; without marks to fence on, nothing is written
        extra = self._checkpoint_ops(batch, ran, never, left)
        if not monitor:
            extra = {}
        entry = _Unfinished(
            batch.fire_time,
            {i: t for i, t in ran.items() if t} if monitor else {},
            {i: t for i, t in never.items() if t} if monitor else {},
            dict(batch.execution_ids),
            dict(batch.fences),
            {i: batch.results[i] for i in ran if i in batch.results} if monitor else {},
            {i: batch.covers[i] for i in never if batch.covers.get(i)},
            {i: tp for i in never if (tp := tracing.traceparent(batch.spans.get(i)))},
            extra,
            {i: self._handoff_why(batch, i) for i in never},
            dict(batch.params),
            batch.request,
        )
        try:
            self._settle(entry)
        except Exception as exc:  # StoreError, or a bug: the retry must not be lost
            self._state.count("store_errors")
            log.warning(
                "%s: could not clear the marks of items %s (retried by housekeeping): %s",
                self._state.config.name,
                sorted({*entry.ran, *entry.handoff}),
                exc,
            )
            with self._lock:
                self._unfinished.append(entry)
        finally:
            with self._lock:
                if batch in self._batches:
                    self._batches.remove(batch)
        try:
            self._call_listeners("after", batch)
        finally:
            self._on_idle()

    @staticmethod
    def _handoff_why(batch: Batch, item: int) -> str:
        """Why ``item`` of ``batch`` is handed off rather than done, for the log line
        of its hand-off (it used to call every one "a fenced execution", a graceful
        stop's interrupted items too)."""
        outcome = batch.outcomes.get(item)
        fence = f"fenced ({batch.fenced_why})" if batch.fenced_why else "fenced"
        if item in batch.crash_handoff:
            return "crashed"
        if outcome == INTERRUPTED:
            return f"interrupted when told to stop: {StopReason.SHUTDOWN.value}"
        if outcome == ZOMBIE:
            return f"ran while {fence}"
        return f"not started: {fence}"

    def _checkpoint_ops(
        self, batch: Batch, ran: dict[int, int], never: dict[int, int], items: Iterable[int]
    ) -> dict[int, list[Op]]:
        """Each of ``items``' last checkpoint and progress ops, for its completion
        (``ran``, with its outcome) or hand-off (``never``) commit; closes their
        sessions."""
        states = self._item_states
        if states is None:
            return {}
        extra: dict[int, list[Op]] = {}
        for item in items:
            session = states.take(batch.execution_ids.get(item, ""), batch.tokens.get(item, 0))
            if session is None:
                continue
            if item in ran:
                ops = session.final_ops(batch.outcomes.get(item, OK))
            elif item in never:
                ops = session.handoff_ops()
            else:
                ops = []
            if ops:
                extra[item] = ops
        return extra

    def _undone(self, items: list[int]) -> None:
        if self._on_undone is not None:
            self._on_undone(items)

    def _settle(self, entry: _Unfinished) -> None:
        """Clear the marks of items that ran, hand off those that never started.
        Raises on a store failure with ``entry`` trimmed to what is left."""
        ran = sorted(entry.ran)
        for at in range(0, len(ran), SETTLE_CHUNK):
            # a completion for many items at once, each with its own mark's token (a
            # failover batch's items were claimed one by one, a token each); chunked
            # so that a store failure leaves ``entry`` trimmed to what is left
            items = ran[at : at + SETTLE_CHUNK]
            results = {i: entry.results[i] for i in items if i in entry.results}
            with self._lock:
                written = self._written & set(results)
            tokens = {i: entry.ran[i] for i in items}
            fenced = self._s.execution.finish(
                items, tokens, entry.fences, results, written, extra=entry.extra
            )
            self._state.count("fenced", len(fenced))
            if fenced:
                self._undone(sorted(fenced))
            with self._lock:
                self._written.update(set(results) - set(fenced))
            for item in items:
                entry.ran.pop(item, None)
                entry.results.pop(item, None)
        if entry.handoff:
            keep = self._state.config.failover
            marks = {
                item: (
                    token,
                    FailoverEntry(
                        entry.fire_time,
                        entry.execution_ids.get(item)
                        or execution_id(self._state.config.name, entry.fire_time, item),
                        self._s.instance_id,
                        folds=entry.covers.get(item, ()),
                        traceparent=entry.traceparents.get(item, ""),
                        # a run-now part run again keeps the request's params
                        params=dict(entry.params),
                        request=entry.request,
                    ),
                    entry.fences.get(item, ""),
                )
                for item, token in entry.handoff.items()
            }
            self._s.failover.hand_off(marks, keep=keep, extra=entry.extra, why=entry.why)
            entry.handoff.clear()

    def retry_unfinished(self) -> bool:
        """Housekeeping: settle what failed commits left. True when something was
        settled now (a misfire re-run or a claim may be due)."""
        with self._lock:
            pending = list(self._unfinished)
        settled = False
        for entry in pending:
            try:
                self._settle(entry)
            except StoreError:
                continue
            with self._lock:
                if entry in self._unfinished:
                    self._unfinished.remove(entry)
            settled = True
        return settled

    # -- listeners ----------------------------------------------------------------

    def _call_listeners(self, when: str, batch: Batch) -> None:
        contexts = [batch.contexts[i] for i in batch.items]
        ft = batch.fire_time
        for listener in self._listeners:
            try:
                if when == "before":
                    listener.before_job(contexts)
                    if isinstance(listener, ClusterOnceListener) and self._once(batch, "before"):
                        listener.before_all(datetime.fromtimestamp(ft, UTC))
                else:
                    listener.after_job(contexts)
                    if (
                        isinstance(listener, ClusterOnceListener)
                        and not self._s.execution.any_running()
                        and self._once(batch, "after")
                    ):
                        listener.after_all(datetime.fromtimestamp(ft, UTC))
            except Exception:
                log.exception("%s: listener %r failed", self._state.config.name, listener)

    def _once(self, batch: Batch, phase: str) -> bool:
        # A run-now request's parts run at each owner's own fire time: the request
        # is the trigger they share (its id begins with its time in ms, as the
        # leader's pruning of old markers reads it).
        trigger = batch.request or str(round(batch.fire_time * 1000))
        marker = f"{trigger}-{phase}"
        node = self._s.store.create(self._s.paths.once(marker), self._s.instance_id.encode())
        return node is not None
