"""The fire queue of one job: fires in order on the job's lane, folded when they
pile up, misfire re-runs queued behind the fire being decided, and what a decided
fire leaves behind (a misfire mark, a skip).

A part of :class:`~shardkeeper.runtime.runner.runner.JobRunner` with its own state (the
queue, the fire being decided, the requests held for a re-run): only this module
writes it. What it asks of the runner goes through its ``JobLane`` (job/ports.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.runnow import check_request_at
from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.observe import Observers, SkipRecord
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.runtime.execute.pool import Lanes
from shardkeeper.runtime.fire.batches import Batches
from shardkeeper.runtime.fire.trigger import (
    ITEM_DISABLED,
    Deferred,
    Fire,
    Launched,
    Skipped,
    TriggerFlow,
    Wait,
    fmt_fire,
)
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.ports import JobLane
from shardkeeper.runtime.job.services import JobServices

__all__ = [
    "MAX_QUEUED_FIRES",
    "MAX_QUEUED_REQUESTS",
    "POLL_AFTER_ERROR",
    "REQUEST_RETRIES",
    "Fires",
    "SkipSink",
]

log = logging.getLogger("shardkeeper.runtime.runner.runner")

#: receives every skipped trigger (the runtime aggregates them into few log lines)
SkipSink = Callable[[str, SkipReason, float, str], None]

#: fires queued behind the one in progress, at most (more are coalesced)
MAX_QUEUED_FIRES = 2
#: fires that carry a request (an operator's run-now ``params``, a one-off job's
#: catch-up ``only``) are not folded into a plain misfire re-run, which would lose
#: it; this many may wait, beyond that the oldest is skipped (recorded, logged)
MAX_QUEUED_REQUESTS = 8
#: how often a graceful stop retries a failed completion commit (seconds)
STOP_RETRY_EVERY = 0.2
#: how soon a fire whose decision met a store error is decided again
POLL_AFTER_ERROR = 0.1
#: how soon a failed completion commit is retried when a run waits for its marks to
#: go (a run-now request's part, a misfire re-run): sooner than the housekeeping
#: pass, which may be a T/3 tick and a round-robin turn away
SETTLE_RETRY_AFTER = 1.0
#: how many times a run-now request's fire that gave up waiting (a reshard, items
#: marked elsewhere) is decided again at once at its own time (Fires._request_again):
#: a dead owner's marks hold its items for up to a session timeout, its failover
#: run and the reshard that follows take one wait each
REQUEST_RETRIES = 2
#: the skips of a request's fire that only waited too long: decided again
_WAITED = frozenset({SkipReason.RESHARD_TIMEOUT, SkipReason.RUNNING_ELSEWHERE, SkipReason.CHANGING})
#: a missed fire is marked in the registry (``misfire/{item}``) only when the run
#: holding its items has gone on this long (seconds): a run that ends sooner is
#: re-run at once, before an operator could look
MISFIRE_MARK_AFTER = 1.0


class Fires:
    """Fires of one job, decided one at a time on its lane (module docstring)."""

    def __init__(
        self,
        *,
        services: JobServices,
        state: JobState,
        trigger: TriggerFlow,
        batches: Batches,
        lanes: Lanes,
        port: JobLane,
        on_skip: SkipSink,
        observers: Observers,
    ) -> None:
        self._s = services
        self.state = state
        self.trigger = trigger
        self.batches = batches
        self.paths: JobPaths = services.paths
        self._store: CoordinationStore = services.store
        self._me = services.instance_id
        self._lanes = lanes
        self._port = port
        self._on_skip = on_skip
        self._observers = observers
        self._fires: deque[Fire] = deque()
        #: the fire the pump is deciding (at the front of ``_fires``, also while it
        #: waits): nothing is ever queued in front of it
        self._current: Fire | None = None
        self._fires_lock = threading.Lock()
        #: the latest fire time a normal fire was decided for (fires of a job are
        #: decided in order: a normal fire at or before it is a duplicate delivery)
        self._last_fire = 0.0
        #: when a graceful stop may next retry the failed completion commits (monotonic)
        self._stop_retry_after = 0.0
        #: requests (run-now with params, catch-ups) that found their items still
        #: running here, misfire on: re-run as they were once the batch ends (a plain
        #: misfire re-run would lose their params); replaced, never mutated (under
        #: _fires_lock)
        self._held_requests: tuple[Fire, ...] = ()
        #: a retry of failed completion commits is scheduled (under _fires_lock)
        self._settle_scheduled = False
        #: the items whose runs held the fires the owed misfire re-run stands for (the
        #: Deferred results' items), None when unknown (under the state lock): the
        #: re-run waits for a failed completion commit of these items only, not of
        #: any item (a failover batch of other owners' items)
        self._rerun_waits_for: frozenset[int] | None = None
        #: the fire whose last step met a store error (lane-confined)
        self._store_failed: Fire | None = None

    @property
    def name(self) -> str:
        """The job name (its lane)."""
        return self.paths.job

    def stop_pending(self) -> bool:
        """During a graceful stop: items still run here, a batch whose items ended is
        still committing its completion or has a failed completion commit to retry,
        or a fire from before the stop is still to be decided (queued, waiting, or
        owed as a misfire re-run).

        The stop loop polls this; a failed completion commit is retried from here
        (on the job's lane, every STOP_RETRY_EVERY at most), as no housekeeping pass
        runs while stopping: leaving with it unsettled let the leader fail over the
        marks of items that had run, and they ran again elsewhere."""
        st = self.state
        unfinished = self.batches.unfinished()
        if unfinished:
            self._retry_unfinished_soon()
        settled = not unfinished
        with st.lock:
            owed = (
                settled
                and st.config.misfire
                and st.misfire_at is not None
                and st.skip_reason(st.misfire_at) is None
            )
        # a batch leaves the set only after its completion commit: leaving before it
        # closed the store under the commit, and the marks it was clearing were
        # failed over and run again elsewhere
        in_progress = not self.batches.idle
        with self._fires_lock:
            requests = bool(self._held_requests)
        return (
            owed
            or in_progress
            or unfinished
            or requests
            or self._port.running_count() > 0
            or self.pending_fires() > 0
        )

    def _retry_unfinished_soon(self) -> None:
        now = time.monotonic()
        if now < self._stop_retry_after:
            return
        self._stop_retry_after = now + STOP_RETRY_EVERY
        self._port.submit("settle", self._settle_unfinished)

    def _settle_unfinished(self) -> None:
        """Retry the failed completion commits (lane task, during a graceful stop)."""
        if self.batches.retry_unfinished():
            self.on_batch_done()  # a misfire re-run from before the stop may be due

    def _settle_soon(self) -> None:
        """Retry the failed completion commits in SETTLE_RETRY_AFTER (once at a time):
        a run waits for their marks to go."""
        with self._fires_lock:
            if self._settle_scheduled:
                return
            self._settle_scheduled = True
        self._lanes.submit_after(self.name, "settle-owed", self._settle_owed, SETTLE_RETRY_AFTER)

    def _settle_owed(self) -> None:
        """Lane task of :meth:`_settle_soon`: settled, what waited is queued (the next
        batch end or pass does it otherwise); still failing, tried again."""
        with self._fires_lock:
            self._settle_scheduled = False
        if not self.batches.unfinished():
            return
        if self.batches.retry_unfinished():
            self.on_batch_done()
        elif self.batches.unfinished() and self.state.skip_reason() is None:
            self._settle_soon()

    def deciding(self, fire_time: float) -> bool:
        """Whether a fire of ``fire_time`` is queued or being decided here (one whose
        start commit may have been applied without our knowing: its next attempt
        adopts the marks it finds of its own execution ids)."""
        with self._fires_lock:
            return any(abs(f.fire_time - fire_time) < 1e-6 for f in self._fires)

    def pending_fires(self) -> int:
        """Fires queued or in progress on the lane."""
        with self._fires_lock:
            return len(self._fires)

    def pending_fire_times(self) -> list[float]:
        """The fire times of the fires queued or in progress on the lane, in order (a
        scheduled fire is queued up to FIRE_LEAD before it is due)."""
        with self._fires_lock:
            return [f.fire_time for f in self._fires]

    def requests_in_hand(self) -> set[str]:
        """The run-now requests whose fires are queued, being decided or held here
        (their pending parts are not queued again meanwhile)."""
        with self._fires_lock:
            return {f.request for f in (*self._fires, *self._held_requests) if f.request}

    def request_items_in_hand(self) -> dict[str, frozenset[int] | None]:
        """The items of each run-now request whose fires are queued, being decided or
        held here (None: the fire names no items, every pending part is in hand).
        A part of the request that became ours since (a reshard, an owner gone) is
        not among them: it is queued at once, not after the parts in hand ended."""
        found: dict[str, frozenset[int] | None] = {}
        with self._fires_lock:
            for f in (*self._fires, *self._held_requests):
                if not f.request:
                    continue
                known = found.get(f.request, frozenset())
                found[f.request] = None if f.only is None or known is None else known | f.only
        return found

    def request(self, fire: Fire) -> None:
        """Queue the fire of a run-now request's parts (runtime/runner/runnow.py)."""
        self._enqueue(fire)

    # -- triggers -------------------------------------------------------------------

    def run_now(self) -> None:
        """A request addressed to this instance (``trigger/{instance}``: a one-off
        job's catch-up): queue it, and delete the node."""
        # Every instance uses the time the request carries: one fire time
        # cluster-wide, so one assignment serves it (with "now" per instance, a reshard
        # between two instances' fire times could leave items to nobody).
        node = self._store.get(self.paths.trigger(self._me))
        at = time.time()
        params: dict[str, str] = {}
        only: frozenset[int] | None = None
        catchup = False
        if node is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                request = json.loads(node.value)
                try:
                    at = check_request_at(request["at"])
                except ConfigError as exc:
                    # NaN, infinity, far ahead: never a fire time (review finding 15)
                    log.error("%s: request %s ignored: %s", self.name, node.value[:200], exc)
                    self._store.delete(self.paths.trigger(self._me), recursive=False)
                    return
                given = request.get("params") or {}
                params = {str(k): str(v) for k, v in dict(given).items()}
                if request.get("catchup") and self.state.config.at is not None:
                    # a one-off job's catch-up (runtime/runner/oneoff.py): only its items
                    catchup = True
                    only = frozenset(int(i) for i in request.get("items") or ())
        self._store.delete(self.paths.trigger(self._me), recursive=False)
        self._enqueue(Fire(at, manual=True, params=params, only=only, catchup=catchup))

    def on_trigger(self, fire_time: datetime) -> None:
        """A trigger fired: queue it on the job's lane (fires of one job run in order;
        beyond MAX_QUEUED_FIRES waiting behind the current one, the oldest waiting
        fire is folded into a misfire re-run or counted as skipped)."""
        self._enqueue(Fire(fire_time.timestamp()))

    def _enqueue(self, fire: Fire) -> None:
        self.state.count("triggers")
        dropped: Fire | None = None
        with self._fires_lock:
            if len(self._fires) > MAX_QUEUED_FIRES:
                dropped = self._to_fold(fire)
            if dropped is not fire:
                self._fires.append(fire)
        if dropped is not None:
            self._fold(dropped)
        self._port.submit("fires", self._pump)

    def _to_fold(self, arriving: Fire) -> Fire | None:
        """Which fire gives way when too many wait (under ``_fires_lock``): the oldest
        waiting plain fire (never the one being decided, at the front); else the
        arriving fire if plain; else, past MAX_QUEUED_REQUESTS, the oldest waiting
        request. None: the arriving request is queued beyond the plain bound.

        Folding turns a fire into a misfire re-run of every item with no params:
        right for a fire of the schedule, wrong for a run-now with params or a
        catch-up of a few items, which keep their place instead."""
        waiting = list(self._fires)[1:]
        for n, queued in enumerate(waiting, start=1):
            if _plain(queued):
                del self._fires[n]
                return queued
        if _plain(arriving):
            return arriving
        if len(waiting) >= MAX_QUEUED_REQUESTS:
            del self._fires[1]
            return waiting[0]
        return None

    def _fold(self, fire: Fire) -> None:
        # A fire that queued up behind one still waiting (for a reshard, say) is a
        # misfire: it runs once more after the fire ahead of it, like a fire that
        # found its items running. A request (params, only) cannot be folded into a
        # plain re-run: it is skipped, said so, only past MAX_QUEUED_REQUESTS.
        st = self.state
        if fire.request:
            # a run-now request's parts stay pending in the store: a later look at
            # the requests (the next housekeeping pass) queues them again
            log.info(
                "%s: %d requests already wait; run-now request %s is looked at again later",
                self.name,
                MAX_QUEUED_REQUESTS,
                fire.request,
            )
            return
        if not _plain(fire):
            log.warning(
                "%s: %d requests already wait; run-now at %s (params %s, items %s) skipped",
                self.name,
                MAX_QUEUED_REQUESTS,
                fmt_fire(fire.fire_time),
                fire.params,
                "all" if fire.only is None else sorted(fire.only),
            )
            st.count("skipped")
            self._on_skip(self.name, SkipReason.QUEUED, fire.fire_time, "")
            return
        if st.config.misfire:
            with st.lock:
                _note_missed(st, fire)
                self._rerun_waits_for = None  # not known: it waits for every item
            st.count("misfires")
        else:
            st.count("skipped")
            self._on_skip(self.name, SkipReason.QUEUED, fire.fire_time, "")

    def _remove(self, fire: Fire) -> None:
        """Take ``fire`` out of the queue, wherever it is (under ``_fires_lock``)."""
        for n, queued in enumerate(self._fires):
            if queued is fire:
                del self._fires[n]
                break
        if self._current is fire:
            self._current = None

    def _queue_misfire_rerun(self, fire_time: float, folds_until: float | None) -> bool:
        """Queue the misfire re-run of ``fire_time`` (the fold of the fires up to
        ``folds_until``) first, but behind a fire being decided; at most one re-run per
        fire time is queued (under ``_fires_lock``): a second one widens the first's
        fold. False when one was queued already."""
        for f in self._fires:
            if f.misfire and _plain(f) and abs(f.fire_time - fire_time) < 1e-6:
                if folds_until is not None:
                    # read when it starts (its covers): widened while still queued
                    f.folds_until = max(f.folds_until or folds_until, folds_until)
                return False
        self._queue_first(Fire(fire_time, misfire=True, folds_until=folds_until))
        return True

    def _queue_first(self, fire: Fire) -> None:
        """Queue ``fire`` first, but behind a fire being decided (under _fires_lock)."""
        if self._fires and self._fires[0] is self._current:
            self._fires.insert(1, fire)
        else:
            self._fires.appendleft(fire)

    def _queue_held_requests(self) -> bool:
        """Queue the re-runs of the requests that found their items running, as they
        were (params, items), first (under _fires_lock). True when some were."""
        requests, self._held_requests = self._held_requests, ()
        for request in reversed(requests):
            self._queue_first(
                Fire(
                    request.fire_time,
                    misfire=True,
                    only=request.only,
                    manual=request.manual,
                    params=dict(request.params),
                    catchup=request.catchup,
                    request=request.request,
                )
            )
        return bool(requests)

    def _pump(self) -> None:
        """Work the queued fires in order (lane task)."""
        while True:
            with self._fires_lock:
                if not self._fires:
                    return
                fire = self._current = self._fires[0]
            with self.state.lock:
                # a graceful stop still decides the fires from before it began
                stopping = self.state.skip_reason(fire.fire_time) is SkipReason.STOPPING
                if not stopping:
                    self.state.starting += 1
            if stopping:
                with self._fires_lock:
                    self._remove(fire)
                continue
            try:
                if not fire.misfire and not fire.manual and fire.fire_time <= self._last_fire:
                    # decided already (a second delivery of the same fire): running
                    # it again would run its items twice for one fire
                    log.warning(
                        "%s: fire at %s delivered again; ignored",
                        self.name,
                        fmt_fire(fire.fire_time),
                    )
                    result: Launched | Skipped | Deferred | Wait = Skipped(SkipReason.DUPLICATE)
                elif fire is self._store_failed and time.monotonic() >= fire.deadline:
                    # its last step met a store error and its deadline has passed: no
                    # further store round (each may take a whole operation timeout,
                    # the lane held meanwhile and the fires behind it waiting; 600 s
                    # chaos on ZooKeeper, 6.5 s for a 5 s deadline)
                    result = Skipped(SkipReason.STORE)
                else:
                    result = self.trigger.step(fire)
                self._store_failed = None
            except StoreError as exc:
                self.state.count("store_errors")
                self._store_failed = fire
                # a read or write of the decision failed: the fire is not dropped, it
                # is decided again shortly, until its deadline
                if fire.deadline and time.monotonic() < fire.deadline:
                    log.info(
                        "%s: fire at %s: %s; trying again", self.name, fmt_fire(fire.fire_time), exc
                    )
                    result = Wait(POLL_AFTER_ERROR, "store error")
                else:
                    result = Skipped(SkipReason.STORE)
            except Exception:
                with self._fires_lock:
                    self._remove(fire)
                raise
            finally:
                with self.state.lock:
                    self.state.starting -= 1
            if isinstance(result, Wait):
                remaining = max(0.0, fire.deadline - time.monotonic())
                self._lanes.submit_after(
                    self.name, "fires", self._pump, min(result.delay, remaining)
                )
                return
            with self._fires_lock:
                self._remove(fire)
                last = not self._fires
                if not fire.misfire and not fire.manual:
                    self._last_fire = max(self._last_fire, fire.fire_time)
            if isinstance(result, Launched):
                self._stood_for_owed(self.trigger.stood_for)
            self.trigger.finish(fire, result)  # its span (shardkeeper/tracing.py)
            self.record(fire, result)
            if self.trigger.removed:
                self.record(fire, Skipped(SkipReason.REMOVED, self.trigger.removed))
            if fire.disabled:  # what every step of this fire found (not a duplicate's)
                self.record(fire, Skipped(SkipReason.DISABLED, fire.disabled, ITEM_DISABLED))
            for folded in self.trigger.folded_off(fire, result):
                # a re-run skipped as disabled: so are the fires it would have folded
                if isinstance(result, Skipped) and result.reason is SkipReason.DISABLED:
                    self.record(Fire(folded), Skipped(SkipReason.DISABLED))
                if fire.disabled:
                    self.record(
                        Fire(folded), Skipped(SkipReason.DISABLED, fire.disabled, ITEM_DISABLED)
                    )
            for folded, (off, words) in sorted(self.trigger.folded_disabled.items()):
                # the launched re-run's own items that a switch turned off at a fire
                # it folds: that fire is theirs as a skip, not a fold
                self.record(Fire(folded), Skipped(SkipReason.DISABLED, off, words))
            if last and not isinstance(result, Launched) and self.batches.idle:
                self.on_batch_done()  # a folded fire's misfire re-run, if one is owed

    def _stood_for_owed(self, fires: frozenset[float]) -> None:
        """A start whose run stands for ``fires`` (its own and the fires its items
        cover): an owed misfire re-run whose fires are all among them is dropped, it
        would run them again. (600 s chaos on ZooKeeper: fire 371 ran covering
        368-370, then the re-run owed for 369-370 was decided anyway, and held the
        lane 6.5 s while later fires waited.) Kept while misfire marks are written:
        the re-run's start clears them."""
        st = self.state
        with st.lock:
            at, last = st.misfire_at, st.misfire_last
            if at is None or st.misfire_marked:
                return
            if not all(any(abs(f - owed) < 1e-6 for f in fires) for owed in (at, last or at)):
                return
            st.misfire_at = st.misfire_last = None
        log.info(
            "%s: the misfire re-run owed for %s..%s is dropped: a run stands for them",
            self.name,
            fmt_fire(at),
            fmt_fire(last or at),
        )

    def record(self, fire: Fire, result: Launched | Skipped | Deferred) -> None:
        st = self.state
        if isinstance(result, Launched):
            if result.skipped is not None:  # the fire's other items, as a skip
                self.record(fire, result.skipped)
            return
        if isinstance(result, Deferred):
            if (st.config.misfire or fire.request) and not _plain(fire):
                # a request: run again as it was once the batch ends (its params and
                # items kept), not folded into the plain misfire re-run
                with self._fires_lock:
                    if fire not in self._held_requests:
                        self._held_requests = (*self._held_requests, fire)
                st.count("misfires")
                if self.batches.idle:  # the holder ended meanwhile
                    self.on_batch_done()
                return
            if st.config.misfire:
                since = self.batches.running_since(result.items)
                # operators' view only (the re-run is recorded locally already): for
                # runs that keep items busy, not for one that ends in moments and is
                # re-run at once
                shown = since is None or time.monotonic() - since >= MISFIRE_MARK_AFTER
                with st.lock:
                    held = frozenset(result.items)
                    if st.misfire_at is None:
                        self._rerun_waits_for = held
                    elif self._rerun_waits_for is not None:
                        self._rerun_waits_for |= held
                    _note_missed(st, fire)
                    # a mark written for an earlier missed fire of the same run
                    # stays until the re-run starts: one commit per run, not per miss
                    unmarked = [i for i in result.items if i not in st.misfire_marked]
                    if shown:
                        # as if written: an unknown outcome may have written them
                        st.misfire_marks_written(unmarked)
                st.count("misfires")
                if shown and unmarked:
                    try:
                        self._s.execution.mark_misfire(unmarked, fire.fire_time)
                    except StoreError as exc:
                        log.info("%s: could not record the misfire: %s", self.name, exc)
                if self.batches.idle:  # the holder ended meanwhile
                    self.on_batch_done()
            else:
                st.count("skipped")
            return
        if result.reason is SkipReason.NO_ITEMS:
            return
        st.count("skipped")
        detail = ""
        if result.reason is SkipReason.NOT_REGISTERED and st.register_error:
            detail = f" (last error: {st.register_error})"
        elif result.items:
            detail = f" (items {list(result.items)})"
        if result.reason is SkipReason.MEMBERSHIP:
            self._port.request_repair()
        if fire.request:
            # not a skip of the request: its parts without a record stay pending in
            # the store, and are run by whoever owns them at the next look
            again = self._request_again(fire, result)
            log.info(
                "%s: run-now request %s not started here now (%s%s); %s",
                self.name,
                fire.request,
                result.reason.value,
                detail,
                "decided again at once, at its fire time" if again else "it stays pending",
            )
            return
        if result.reason is not SkipReason.STOPPING:
            self._on_skip(self.name, result.reason, fire.fire_time, detail)
            if self._observers:
                self._observers.on_skip(
                    SkipRecord(
                        job=self.name,
                        fire_time=fire.fire_time,
                        instance=self._me,
                        reason=result.reason.value,
                        items=tuple(result.items),
                        message=result.message,
                    )
                )

    def _request_again(self, fire: Fire, result: Skipped) -> bool:
        """Queue a run-now request's fire that gave up waiting (for a reshard, or
        for items still marked elsewhere) again, first, at its own fire time and
        with a fresh deadline, at most REQUEST_RETRIES times. True when queued.

        The next look at the requests queues a part at the time of that look, and
        from the owners of that time: after a death and the reshards it brings,
        the part followed each new owner in turn and waited for each one's reshard
        anew (600 s etcd chaos, job ``long``: the new owner's fire waited for the
        dead owner's marks and the reshard, gave up 1 s before the reshard came;
        the items moved twice more, and the part ran 35 s after the request). At
        its own time the part stays with the owner that had it then (a reshard
        applies from later fires), which runs it as soon as the reshard is written
        and the marks are gone; the start's claim still runs it once whoever
        else queues it meanwhile."""
        if fire.request_retries >= REQUEST_RETRIES:
            return False
        at = fire.fire_time
        if result.reason is SkipReason.BEFORE_JOIN:
            # queued here before this instance's membership began again (a new
            # session): decided again at once, at the time of the new membership, from
            # that time's owners, as the next look at the requests would queue it a
            # housekeeping pass later (600 s etcd chaos, seed 20261254: refused at
            # T+54.4 after a re-join, the part ran at the next look, 1.2 s later and
            # past its bound). Its start's claim of the part still runs it once.
            at = max(time.time(), self.state.joined_at)
        elif result.reason not in _WAITED:
            return False
        only = frozenset(result.items) if result.items else fire.only
        again = Fire(
            at,
            misfire=fire.misfire,
            manual=fire.manual,
            params=dict(fire.params),
            only=only,
            request=fire.request,
            request_retries=fire.request_retries + 1,
        )
        with self._fires_lock:
            self._queue_first(again)
        self._port.submit("fires", self._pump)
        return True

    def on_batch_done(self) -> None:
        """A batch ended (worker thread) or marks were settled: a misfire re-run or a
        failover claim may be due."""
        st = self.state
        if st.stopping:
            # graceful stop: only a misfire re-run of a fire from before the stop
            with st.lock:
                due = st.misfire_at
            with self._fires_lock:
                requests = bool(self._held_requests)
            owed = due is not None and st.skip_reason(due) is None
            if not (owed or requests) or not self.batches.idle:
                return
        elif st.skip_reason() is not None:
            with st.lock:
                due = st.misfire_at
            # a re-run owed for fires from before an operator's disable is still
            # decided (run, folding them) now: the disable excuses later fires only
            if due is None or st.skip_reason(due) is not None:
                return
        if not self.batches.idle:
            if st.config.failover and st.queue_hint:
                self._port.submit("claim", self._port.try_claim)
            return
        settled = not self.batches.unfinished()
        # The plain re-run waits only for the marks of the items whose runs held its
        # fires (a failed completion of theirs: its start would find them marked).
        # Another batch's failed completion (a failover batch of items other owners
        # have now) is no reason: 600 s chaos on ZooKeeper, vm@5301's re-run of its
        # own 2,500 bulk items, idle and unmarked, waited 15 s for the settling of
        # some 330 items it had failed over for another owner, past the stop, and
        # never ran.
        with st.lock:
            waits_for = self._rerun_waits_for
        rerun_free = settled or (
            waits_for is not None and not (self.batches.unfinished_items() & waits_for)
        )
        if not settled:
            with self._fires_lock:
                waiting = bool(self._held_requests)
            with st.lock:
                waiting = waiting or (
                    st.misfire_at is not None and st.config.misfire and not rerun_free
                )
            if waiting:
                # a failed completion commit holds their items' marks: retried soon,
                # not only at the next housekeeping pass (600 s chaos on ZooKeeper:
                # a run-now part waited 14 s for it)
                self._settle_soon()
        with st.lock:
            misfire_at, st.misfire_at = st.misfire_at, None
            misfire_last, st.misfire_last = st.misfire_last, None
            rerun = misfire_at is not None and st.config.misfire and rerun_free
            if rerun:
                self._rerun_waits_for = None
            with self._fires_lock:
                # queued under the state lock: a graceful stop never sees the re-run
                # neither owed nor queued. Each is queued first, behind the fire
                # being decided, so the one queued last runs first: the requests
                # held for these items run before the plain re-run, whatever their
                # fire times. (In fire-time order the re-run, whose fire is the first
                # one missed, nearly always went first, the request's fire being the
                # owner's clock when it queued it: the part waited one whole run
                # more, and the re-run's waits besides; 600 s chaos on ZooKeeper,
                # params 23 to 67 s after the request. Always in front, the re-run
                # had held a run-now behind every later fire before that.) The
                # re-run still runs, right after them: the fires it stands for are
                # not dropped.
                if rerun:
                    self._queue_misfire_rerun(misfire_at or 0.0, misfire_last)
                requests = settled and self._queue_held_requests()
        if rerun or requests:
            self._port.submit("fires", self._pump)
            if misfire_at is not None and not rerun:
                with st.lock:  # marks still to clear: keep it for later
                    _keep_missed(st, misfire_at, misfire_last)
        elif misfire_at is not None:
            with st.lock:  # marks still to clear: keep it for later
                _keep_missed(st, misfire_at, misfire_last)
        elif st.config.failover:
            self._port.submit("claim", self._port.try_claim)


def _note_missed(st: JobState, fire: Fire) -> None:
    """A plain fire missed here (folded, or its items still ran): the misfire re-run
    is of the earliest missed fire and folds every later one, up to the latest
    (under ``st.lock``). A missed re-run brings the fold it carried."""
    if st.misfire_at is None or fire.fire_time < st.misfire_at:
        st.misfire_at = fire.fire_time
    latest = max(fire.fire_time, fire.folds_until or fire.fire_time)
    if st.misfire_last is None or latest > st.misfire_last:
        st.misfire_last = latest


def _keep_missed(st: JobState, misfire_at: float, misfire_last: float | None) -> None:
    """Put back a re-run that is owed but not queued yet (under ``st.lock``), merged
    with what was missed meanwhile."""
    st.misfire_at = misfire_at if st.misfire_at is None else min(st.misfire_at, misfire_at)
    if misfire_last is not None and (st.misfire_last is None or misfire_last > st.misfire_last):
        st.misfire_last = misfire_last


def _plain(fire: Fire) -> bool:
    """Whether ``fire`` carries nothing a misfire re-run would lose (no run-now
    request or params, no catch-up's item subset)."""
    return not fire.params and fire.only is None and not fire.catchup and not fire.request
