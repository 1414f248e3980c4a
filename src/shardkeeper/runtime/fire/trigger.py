"""One fire of one job on this instance: items launched, a typed skip, or "wait".

The flow (docs/concepts.md):

1. a fire that finds this instance's previous items still running is a misfire: the
   items are marked and run once more when that batch ends;
2. the leader reshards if the flag is set (once no item runs);
3. the instance reads the assignment and marks its enabled items running in one
   commit that checks its own membership, that no reshard is pending and that the
   assignment is the one it read;
4. the batch is launched (runtime/fire/batches.py).

A one-off job (``at``) adds one rule, and only for it: a fire of its schedule or a
leader's catch-up starts no item whose completion for ``at`` is recorded, skips
altogether once the job is done, and commits each mark only while the item's result
is still the one read (coordination/oneoff.py). An operator's trigger re-runs it.

:meth:`TriggerFlow.step` never blocks: where the old flow waited (for a reshard, for
the leader's running items) it returns :class:`Wait`, and the runner re-submits the
fire on its job's lane after the delay. So no pool thread is held by a waiting job,
and every wait is bounded by the fire's deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shardkeeper import tracing
from shardkeeper.coordination.model import Assignment, RunningMark
from shardkeeper.coordination.oneoff import OneOffService, OneOffView
from shardkeeper.coordination.results import CompletedView, read_completed
from shardkeeper.errors import StoreError
from shardkeeper.registry.base import Check, ConnectionState
from shardkeeper.runtime.fire.batches import Batch, execution_id
from shardkeeper.runtime.job.coverage import (
    SAME_FIRE,
    Coverage,
    Covered,
    FireSchedule,
    counted,
    listed,
)
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.leader import LeaderDuties, ReshardStep
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.scheduling.triggers import build_trigger

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["Fire", "Launched", "Skipped", "StepResult", "TriggerFlow", "Wait", "fmt_fire"]

log = logging.getLogger(__name__)

#: how often a waiting fire looks again (events wake it sooner through the lane)
POLL = 0.05
#: retries of the decision when the store moved under it (assignment changed, ...)
MAX_RETRIES = 6


@dataclass
class Fire:
    """A fire in progress on this instance."""

    fire_time: float
    misfire: bool = False
    #: monotonic deadline of the whole fire (sharding_wait_timeout after it began)
    deadline: float = 0.0
    #: when the leader started waiting for running items before resharding (0: not yet)
    reshard_wait_since: float = 0.0
    retries: int = 0
    started: float = field(default_factory=time.monotonic)
    #: only these items are still to start (the others of the fire started already)
    only: frozenset[int] | None = None
    #: an operator's run-now request (not in the schedule's order of fires)
    manual: bool = False
    #: one-off parameters of an operator's run-now request (ctx.params)
    params: dict[str, str] = field(default_factory=dict)
    #: a one-off job's catch-up, asked for by its leader (not an operator's re-run)
    catchup: bool = False
    #: the id of the operator's run-now request this fire runs parts of
    #: (coordination/runnow.py): each item's start commit creates its record
    request: str = ""
    #: a misfire re-run: the latest fire folded into it (the fires of the schedule
    #: after ``fire_time`` up to this one ran nowhere: the re-run covers them)
    folds_until: float | None = None
    #: the span of this fire's decision (shardkeeper/tracing.py), opened at its first
    #: step and ended by :meth:`TriggerFlow.finish`; None without OpenTelemetry
    span: Span | None = None
    #: a misfire re-run: the trace context of the fires it stands for (linked)
    replaces: tuple[str, ...] = ()
    #: this instance's items of the fire an operator disabled (from before the fire),
    #: as found by its steps so far: a later step that narrows ``only`` to the items
    #: still to start (busy elsewhere, a request's parts recorded) no longer looks at
    #: them, yet their skip is recorded once the fire is decided
    disabled: tuple[int, ...] = ()
    #: the switches were read from the store for this fire (once a fire at most):
    #: see :meth:`TriggerFlow._confirm_switches`
    switches_read: bool = False
    #: a run-now request's fire decided again at its own time after an attempt that
    #: gave up waiting (runtime/fire/fires.py, Fires.record): how many times so far
    request_retries: int = 0


#: the words of a skip of items an operator disabled (reason DISABLED, the job's)
ITEM_DISABLED = "item disabled by an operator"


@dataclass(frozen=True)
class Skipped:
    """No item started; ``reason`` says why (``items`` it concerned, if any;
    ``message``: the reason in words when it says more, as :attr:`SkipRecord.message`)."""

    reason: SkipReason
    items: tuple[int, ...] = ()
    message: str = ""


@dataclass(frozen=True)
class Launched:
    """Items marked and handed to the batch runner; ``skipped``: the fire's other
    items, when they were decided as a skip (recorded like one)."""

    items: tuple[int, ...]
    skipped: Skipped | None = None


@dataclass(frozen=True)
class Wait:
    """Look again after ``delay`` seconds (bounded by the fire's deadline)."""

    delay: float
    why: str


@dataclass(frozen=True)
class Deferred:
    """The items are held by an earlier batch here: recorded as a misfire."""

    items: tuple[int, ...]


StepResult = Launched | Skipped | Wait | Deferred


class TriggerFlow:
    """Decides and commits one fire at a time for one job (module docstring)."""

    def __init__(
        self,
        services: JobServices,
        state: JobState,
        leader: LeaderDuties,
        *,
        local_items: Callable[[], set[int]],
        launch: Callable[[Batch], None],
        session: Callable[[], str],
        owns: Callable[[int, str], bool] = lambda _item, _execution: False,
        ran: Callable[[str], bool] = lambda _execution: False,
        on_missed: Callable[[float, tuple[int, ...]], None] = lambda _ft, _items: None,
        reread_switches: Callable[[], None] | None = None,
    ) -> None:
        self._s = services
        #: reads the job's and items' switches from the store into the state
        #: (JobSettings.reload_switches): a skip for an operator's switch is
        #: decided on a fresh read (:meth:`_confirm_switches`)
        self._reread_switches = reread_switches
        self._state = state
        self._leader = leader
        self._local_items = local_items
        self._launch = launch
        self._session = session
        self._owns = owns
        self._ran = ran
        self._on_missed = on_missed
        #: the earlier fires each started item stands for (no fire silently lost)
        self.coverage = Coverage(services.store, services.paths)
        self._schedule: tuple[object, FireSchedule] | None = None
        #: the assignment as last read, with its version: a fire that finds items of
        #: its own in it commits against that version (a stale copy fails the commit
        #: and the fire reads again); a fire that finds none reads it fresh
        self._cached: tuple[Assignment, int] | None = None
        self._cache_lock = threading.Lock()
        #: the assignment the step in progress decided from (lane-confined): it
        #: says when each item was first due, for the fires a first run covers
        self._decided_from: Assignment | None = None
        #: a one-off job's progress as read by the step in progress (lane-confined)
        self._oneoff: OneOffView | None = None
        #: a misfire re-run being decided: its items' results as read for it
        self._rerun_results: CompletedView | None = None
        #: this instance's items of the step's fire that a cut of the count removed
        #: before they started (lane-confined; recorded as a skip once decided)
        self.removed: tuple[int, ...] = ()
        #: this instance's items of the step's fire that an operator had disabled
        #: (lane-confined; recorded as a skip, reason DISABLED, once decided)
        self.disabled: tuple[int, ...] = ()
        #: fires a misfire re-run launched by the step folds in which an operator's
        #: switch had turned some of its items off (fire -> those items and the
        #: skip's words; the job's disable: every item of the run): ``disabled``
        #: skips, not folds, recorded as such once decided (lane-confined)
        self.folded_disabled: dict[float, tuple[tuple[int, ...], str]] = {}
        #: the fires every run the step launched stands for: its own and those all
        #: of its items cover (lane-confined): an owed misfire re-run within them
        #: is redundant (Fires._stood_for_owed)
        self.stood_for: frozenset[float] = frozenset()
        #: trace context of the fires deferred here since the last misfire re-run
        #: started: the re-run stands for them and links to them (lane-confined)
        self._deferred_spans: list[str] = []

    def forget_assignment(self) -> None:
        """The assignment changed (a watch event) or may have: read it, and the reshard
        flag, at the next fire."""
        with self._cache_lock:
            self._cached = None
        self._s.sharding.forget_flag()

    def _read_assignment(
        self, fire: Fire, *, fresh: bool = False
    ) -> tuple[Assignment | None, int, bool]:
        """(assignment, version, from the cache). The cache serves a fire's first
        attempt only (and not when ``fresh``): every retry reads the store."""
        with self._cache_lock:
            cached = self._cached
        if cached is not None and fire.retries == 0 and not fresh:
            self._decided_from = cached[0]
            return cached[0], cached[1], True
        assignment, version = self._s.sharding.read()
        with self._cache_lock:
            self._cached = (assignment, version) if assignment is not None else None
        self._decided_from = assignment
        return assignment, version, False

    def _owns_mark(self, item: int, mark: RunningMark) -> bool:
        return self._owns(item, mark.execution_id)

    def step(self, fire: Fire) -> StepResult:
        """One non-blocking attempt at ``fire`` (see module docstring)."""
        cfg = self._state.config
        self.removed = ()
        self.folded_disabled = {}
        self.stood_for = frozenset()
        # the disabled items found by the fire's earlier steps (Fire.disabled)
        self.disabled = fire.disabled
        if fire.span is None:
            if fire.misfire:
                fire.replaces = tuple(self._deferred_spans[-tracing.MAX_LINKS :])
            fire.span = tracing.start_fire(
                cfg.name,
                self._s.instance_id,
                fire.fire_time,
                misfire=fire.misfire,
                manual=fire.manual,
                replaces=fire.replaces,
            )
        if not fire.deadline:
            fire.deadline = time.monotonic() + cfg.sharding_wait_timeout
        reason = self._state.skip_reason(fire.fire_time)
        if reason is SkipReason.DISABLED and self._confirm_switches(fire):
            reason = self._state.skip_reason(fire.fire_time)
        registering = reason is SkipReason.NOT_REGISTERED and self._state.registering
        if registering and time.monotonic() < fire.deadline:
            return Wait(POLL, "registration under way")
        if reason is SkipReason.NOT_REGISTERED:
            # A fire delivered ahead of its time (the scheduler's lead) may come before
            # the registration at start-up has begun: it is skipped only if the job is
            # still not registered when it is due.
            not_due = self._not_due(fire, "not registered yet; not due yet")
            if not_due is not None:
                return not_due
        if reason is SkipReason.SUSPENDED and time.monotonic() < fire.deadline:
            # A connection that is merely suspended (a slow link, a store member
            # failing over) usually comes back within a moment, the session intact:
            # the fire is decided then, its commit checked as always, instead of
            # being skipped for a blip.
            return Wait(POLL * 2, "connection to the store suspended")
        if reason is not None:
            if reason is SkipReason.DISABLED:
                self._hold(fire, None)  # the operator's: no later run covers it
                self.disabled = ()  # the job's skip names every item of the fire
            return Skipped(reason)
        ft = fire.fire_time
        if ft < self._state.joined_at - 1e-3:
            # This membership began after the fire: the leader assigns its items to
            # the members that fire it (a fire queued across a freeze and a new
            # session would otherwise run again here after others ran it).
            return Skipped(SkipReason.BEFORE_JOIN)
        self._oneoff = None
        if cfg.at is not None and (fire.catchup or not fire.manual):
            self._oneoff = OneOffService(self._s.store, self._s.paths, self._s.instance_id).view(
                cfg.at.timestamp()
            )
            if self._oneoff.done is not None:
                return Skipped(SkipReason.DONE)
        self._rerun_results = None
        if self._leader.is_leader:
            if not fire.reshard_wait_since:
                fire.reshard_wait_since = time.monotonic()
            # a reshard this leader committed changed the assignment (its counter)
            before = self._state.stats.get("reshards", 0)
            step = self._leader.serve_reshard(ft, fire.reshard_wait_since)
            if self._state.stats.get("reshards", 0) != before:
                self.forget_assignment()
            if step is ReshardStep.WAIT:
                return Wait(POLL * 2, "leader waits for running items before resharding")
        assignment, version, cached = self._read_assignment(fire)
        if assignment is None or assignment.total != cfg.sharding_total_count:
            if self._leader.is_leader:
                self._s.sharding.set_necessary("no assignment for the current count")
                return self._retry(fire, "no assignment yet")
            return self._wait_reshard(fire)
        items = self._mine(assignment, fire)
        if not items and cached:
            # "nothing for me" is decided without a commit: never from a copy
            assignment, version, _ = self._read_assignment(fire, fresh=True)
            if assignment is None or assignment.total != cfg.sharding_total_count:
                return self._retry(fire, "assignment changed")
            items = self._mine(assignment, fire)
        if not items:
            # An instance without items in the old assignment must still wait for a
            # pending reshard: the new assignment may give it items for this fire.
            if not self._leader.is_leader and self._s.sharding.is_necessary(fresh=True):
                return self._wait_reshard(fire)
            # The flag may have been cleared by a reshard committed between our read
            # and the check (a joiner's first trigger): read again then.
            if self._s.sharding.read()[1] != version:
                return self._retry(fire, "assignment changed")
            return Skipped(SkipReason.NO_ITEMS)
        plain_rerun = fire.misfire and not fire.manual and not fire.params
        if plain_rerun:
            # Each item ends on its own (runtime/fire/batches.py): an item whose run
            # ended while a sibling still ran started its next fires here meanwhile,
            # and that start stood for this fire (its own, or one it covered). The
            # re-run is only of the items held here since: running it again would run
            # this fire twice. (Its later fires folded here are covered by its next
            # start, which finds them in its gap.)
            stood = self.coverage.stood_for(items, fire.fire_time, self._fire_schedule())
            if stood:
                log.info(
                    "%s: misfire re-run of the fire at %s leaves out items %s: a run "
                    "started here since stood for that fire",
                    cfg.name,
                    fmt_fire(fire.fire_time),
                    sorted(stood),
                )
                items = [i for i in items if i not in stood]
                if not items:
                    return Skipped(SkipReason.NO_ITEMS)
        held = self._local_items() & set(items)
        if held:
            not_due = self._not_due(fire, "earlier items still run; not due yet")
            if not_due is not None:
                return not_due
            free = [i for i in items if i not in held]
            if free and not fire.request and not fire.misfire and cfg.monitor_execution:
                # decided late behind a sibling: a free item's fire may have been run
                # elsewhere meanwhile (a failover run of it that completed), as a
                # misfire re-run's may (below): one results read, on this path only
                done = read_completed(self._s.store, self._s.paths, fire.fire_time, exact=True)
                free = [i for i in free if i not in done.completed]
            if free and (fire.request or not fire.misfire):
                # the items free here start now; only those still running here are
                # folded (a request's parts wait for them): a slow item no longer
                # holds its siblings' next fire (issue 36 §2)
                return self._start_free(fire, free, frozenset(held), version)
            # folded into the run still going here: not "decided" yet, the re-run that
            # stands for it is (it says so, Fire.folds_until); if it never comes, the
            # next start finds the gap and covers it
            return Deferred(tuple(sorted(held)))
        if plain_rerun:
            # The owners kept for the re-run's fire may have been replaced since: an
            # item the assignment now gives another instance (from a later fire) is
            # that owner's, whose first run of it reads the item's last result and
            # covers this fire and those folded here (600 s etcd chaos: cpu item 3
            # moved to vm@3407 from fire 736, its run covered 724; vm@1813's re-run
            # of 724 started 1 s after it and ran 724 again, folding 726 and 728
            # after the new owner's run). Judged on the assignment the start commit
            # is conditional on (``version``): a newer one refuses it.
            ours = set(assignment.items_of(self._s.instance_id))
            moved = [i for i in items if i not in ours]
            if moved:
                log.info(
                    "%s: misfire re-run of the fire at %s leaves out items %s: they "
                    "belong to another instance now, whose next run covers that fire",
                    cfg.name,
                    fmt_fire(fire.fire_time),
                    moved,
                )
                items = [i for i in items if i in ours]
                if not items:
                    return Skipped(SkipReason.NO_ITEMS)
        if plain_rerun and self._oneoff is None and cfg.monitor_execution:
            # A plain misfire re-run is decided long after its fire (behind a run
            # that lasted several intervals), from the owners kept for that fire:
            # its items may have run that very fire elsewhere meanwhile (a
            # failover taker of a run stopped at a graceful shutdown: 600 s chaos
            # runs, a duplicate on each store). Items whose last completed run is
            # of this fire are left out, and the start is conditional on the
            # results read. Only this fire: a later fire completed elsewhere does
            # not stand for this one (the item's next start would then find no
            # gap and the fire would be lost), and an operator's run-now is a
            # request of its own, run as asked. Read here, once the re-run is
            # about to start: not on the steps that wait (reshard, registration).
            self._rerun_results = read_completed(
                self._s.store, self._s.paths, fire.fire_time, exact=True
            )
            ran = sorted(self._rerun_results.completed.intersection(items))
            if ran:
                log.info(
                    "%s: misfire re-run of the fire at %s leaves out items %s: that fire "
                    "of theirs completed meanwhile",
                    cfg.name,
                    fmt_fire(fire.fire_time),
                    ran,
                )
                items = [i for i in items if i not in self._rerun_results.completed]
                if not items:
                    return Skipped(SkipReason.COMPLETED, tuple(ran))
        return self._start(fire, items, version)

    def finish(self, fire: Fire, result: Launched | Skipped | Deferred) -> None:
        """``fire`` is decided (lane task): its span ends with the outcome. A deferred
        fire's span is kept for the misfire re-run that stands for it to link to."""
        if isinstance(result, Deferred):
            parent = tracing.traceparent(fire.span)
            if parent:
                self._deferred_spans = [*self._deferred_spans, parent][-tracing.MAX_LINKS :]
            tracing.end_fire(fire.span, "deferred", items=result.items)
        elif isinstance(result, Skipped):
            tracing.end_fire(
                fire.span, "skipped", reason=result.reason.name.lower(), items=result.items
            )
        else:
            if fire.misfire:
                self._deferred_spans = []  # the re-run that stood for them started
            skipped = result.skipped
            tracing.end_fire(
                fire.span,
                "launched",
                reason=skipped.reason.name.lower() if skipped is not None else "",
                items=result.items,
            )
        fire.span = None

    def _confirm_switches(self, fire: Fire) -> bool:
        """Read the switches from the store before ``fire`` is skipped for one (once
        a fire; True when read). The watched view can be stale: an instance frozen
        while an operator enabled the job decided its first fire after the thaw on
        the disable it knew, before the enable's event was delivered, and recorded
        a ``disabled`` skip with no disable in force (600 s etcd chaos, seed
        20261244). A read that fails leaves the view as it is (the store does not
        answer: the skip is decided on what is known)."""
        if fire.switches_read or self._reread_switches is None:
            return False
        if self._s.store.state not in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            return False  # no answer to wait for: the watch delivers what comes back
        fire.switches_read = True
        try:
            self._reread_switches()
        except StoreError as exc:
            log.debug("%s: switches not re-read: %s", self._state.config.name, exc)
            return False
        return True

    @staticmethod
    def _not_due(fire: Fire, why: str) -> Wait | None:
        """A Wait until ``fire`` is due, when it is decided ahead of its time (the
        scheduler's lead): items still running then may end before it is due, and a
        fire is called a misfire, skipped as running elsewhere or as not registered,
        only when that still holds at its due time.

        Bounded by the fire's deadline like every wait: a fire time far ahead (an
        operator's run-now stamped by a clock that runs ahead of ours) is decided at
        the deadline as if due, instead of being looked at again without a pause
        until then."""
        early = fire.fire_time - time.time()
        if early <= 0:
            return None
        if fire.deadline:
            left = fire.deadline - time.monotonic()
            if left <= 0:
                return None
            early = min(early, left)
        return Wait(early, why)

    def _mine(self, assignment: Assignment, fire: Fire) -> list[int]:
        cfg = self._state.config
        owned = [
            i
            for i in assignment.items_of(self._s.instance_id, fire.fire_time)
            if fire.only is None or i in fire.only
        ]
        # The owners kept for an earlier fire may name items an operator has cut
        # since (a fire delayed behind a freeze or a running item): nobody can run
        # them any more, so they are recorded as a skip, not left out silently.
        self.removed = tuple(i for i in owned if i >= cfg.sharding_total_count)
        # Items an operator disabled at or before the fire's time: this fire of theirs
        # is no later run's to cover. A fire due before the disable (decided late:
        # a reshard wait, an item still busy) is decided as usual, run or folded: the
        # disable excuses fires from its time on only.
        ft = fire.fire_time
        off = [i for i in owned if self._state.item_disabled(i, ft)]
        if off and self._confirm_switches(fire):
            off = [i for i in owned if self._state.item_disabled(i, ft)]
        if off:
            self._hold(fire, off)
        # An operator's item disable leaves the item out of the fire: recorded as a
        # skip (reason DISABLED, with the items) so that the fire is accounted for,
        # as a whole job's disable is; kept on the fire across its steps.
        fire.disabled = tuple(
            sorted({*fire.disabled, *(i for i in off if i < cfg.sharding_total_count)})
        )
        self.disabled = fire.disabled
        return [
            i
            for i in owned
            if not self._state.item_disabled(i, ft)
            and i < cfg.sharding_total_count
            and (self._oneoff is None or i not in self._oneoff.completed)
        ]

    def _item_checks(self, items: list[int]) -> dict[int, Check] | None:
        """The start's conditions on the items' results: a one-off job's (never run an
        item completed for its time) or a misfire re-run's (never run again a fire
        completed elsewhere meanwhile); None for a plain fire."""
        if self._oneoff is not None:
            return self._oneoff.guards(self._s.paths, items)
        if self._rerun_results is not None:
            return self._rerun_results.guards(self._s.paths, items)
        return None

    def _start(self, fire: Fire, items: list[int], version: int) -> StepResult:
        cfg = self._state.config
        ft = fire.fire_time
        ids = {i: execution_id(cfg.name, ft, i) for i in items}
        membership = self._state.membership_check(self._s.paths.instance(self._s.instance_id))
        session = self._session()
        with self._state.lock:  # misfire marks this re-run deletes as it starts
            marked = [i for i in items if i in self._state.misfire_marked] if fire.misfire else []
        # opened before the commit: each mark carries its span's trace context, for a
        # run that replaces it (failover, perhaps after this process died) to link to
        spans = {
            i: tracing.start_item(
                cfg.name,
                i,
                self._s.instance_id,
                ft,
                ids[i],
                parent=fire.span,
                run="misfire" if fire.misfire else "fire",
                replaces=fire.replaces,
            )
            for i in items
        }
        result = self._s.execution.start(
            items,
            fire_time=ft,
            execution_ids=ids,
            assignment_version=version,
            persistent=cfg.failover,
            monitor=cfg.monitor_execution,
            membership=membership,
            item_checks=self._item_checks(items),
            clear_misfire=marked,
            traceparents={i: tracing.traceparent(span) for i, span in spans.items()},
            claims={i: self._s.runnow.claim_ops(fire.request, i, ids[i]) for i in items}
            if fire.request
            else None,
            params=fire.params,
            request=fire.request,
        )
        if result.marked:
            if marked:
                with self._state.lock:  # their misfire marks went with the commit
                    self._state.misfire_marks_cleared(result.marked)
            covered = self._covers(list(result.marked), ft, fire.folds_until)
            self._stands_for(ft, result.marked, covered)
            batch = Batch(
                fire_time=ft,
                items=list(result.marked),
                tokens=dict(result.tokens),
                fences=dict(result.fences),
                execution_ids={i: ids[i] for i in result.marked},
                misfire=fire.misfire,
                session=session,
                params=dict(fire.params),
                request=fire.request,
                covers=listed(covered),
                covered_before=counted(covered),
                spans={i: span for i in result.marked if (span := spans[i]) is not None},
            )
            self._launch(batch)
            if result.reason is not None:
                # Some items were not marked: refused apart (etcd), or a later commit
                # of a fire packed into several was refused or lost. They are decided
                # again like any refused start, never dropped.
                if result.reason == "unknown":
                    self._state.suspect_marks()
                done = set(result.marked)
                rest = [i for i in items if i not in done]
                if rest:
                    return self._start_rest(fire, result.marked, rest, version)
            return Launched(tuple(result.marked))
        if result.reason == "limit":
            return Skipped(SkipReason.STORE_LIMIT, tuple(items))
        if result.reason == "claimed":
            # some items of the request have their record already (run by another
            # owner, or skipped by the leader): decide the others again
            recorded = self._s.runnow.recorded(fire.request)
            left = [i for i in items if recorded is not None and i not in recorded]
            if not left:
                return Skipped(SkipReason.NO_ITEMS, tuple(items))
            fire.only = frozenset(left) if fire.only is None else fire.only & frozenset(left)
            return self._retry(fire, "run-now items recorded meanwhile")
        if result.reason in ("reshard", "assignment", "unknown"):
            self.forget_assignment()
        if result.reason == "reshard":
            return self._wait_reshard(fire)
        if result.reason == "membership":
            self._state.phase.lose_membership("a start commit found the membership gone")
            return Skipped(SkipReason.MEMBERSHIP)
        if result.reason == "unknown":
            self._state.suspect_marks()
        if result.reason in ("assignment", "unknown", "result"):
            return self._retry(fire, f"start commit: {result.reason}")
        # "running": some item is marked already
        not_due = self._not_due(fire, "items marked running; not due yet")
        if not_due is not None:
            return not_due
        held = self._local_items() & set(items)
        if held:
            # folded into the run still going here (decided by its re-run, as above)
            return Deferred(tuple(sorted(held)))
        # Marks of this very fire written by an earlier attempt whose reply was lost
        # are ours: adopt them instead of calling them "running elsewhere".
        adopted = self._s.execution.read_back(items, ids) if cfg.monitor_execution else {}
        if adopted:
            covered = self._covers(sorted(adopted), ft, fire.folds_until)
            self._stands_for(ft, adopted, covered)
            batch = Batch(
                fire_time=ft,
                items=sorted(adopted),
                tokens={i: t for i, (t, _f) in adopted.items()},
                fences={i: f for i, (_t, f) in adopted.items() if f},
                execution_ids={i: ids[i] for i in adopted},
                misfire=fire.misfire,
                session=session,
                params=dict(fire.params),
                request=fire.request,
                covers=listed(covered),
                covered_before=counted(covered),
                spans={i: span for i in adopted if (span := spans[i]) is not None},
            )
            self._launch(batch)
            rest = [i for i in items if i not in adopted]
            if rest:
                # the rest's own decision (wait for a busy item, retry, skip) is the
                # fire's from now on: a bare call would throw it away
                return self._start_rest(fire, sorted(adopted), rest, version)
            return Launched(tuple(sorted(adopted)))
        marks = self._s.execution.running_items()
        stray = [
            i
            for i in items
            if i in marks
            and marks[i].instance_id == self._s.instance_id
            and not self._owns(i, marks[i].execution_id)
        ]
        if stray:
            # Our own marks without an execution here (an earlier start commit whose
            # reply was lost): hand them to failover now (a valid run of their fire
            # follows elsewhere), then decide this fire again.
            self._s.failover.requeue_own(
                self._owns_mark, keep=cfg.failover, done=lambda mark: self._ran(mark.execution_id)
            )
            return self._retry(fire, f"own stray marks of items {stray} handed over")
        elsewhere = set(marks)
        left = [i for i in items if i not in elsewhere]
        # Items running for a LATER fire elsewhere (a reshard moved them back and
        # forth around this fire): this fire of theirs is still due here. Items
        # running for an EARLIER fire elsewhere (a failover taker runs the fire a
        # fenced or dead owner could not finish) with misfire on: this fire runs
        # after that run, as it would after a run here. Start the free items now and
        # come back for these once that run ended, within the fire's deadline,
        # instead of skipping them for this fire.
        later = frozenset(i for i in items if i in marks and marks[i].fire_time > ft + 1e-6)
        earlier = frozenset(i for i in items if i in marks and marks[i].fire_time < ft - 1e-6)
        busy = later | earlier if cfg.misfire else later
        if busy and time.monotonic() < fire.deadline:
            started = isinstance(self._start(fire, left, version), Launched) if left else True
            fire.only = busy if started else busy | frozenset(left)
            return Wait(POLL * 2, f"items {sorted(busy)} busy elsewhere with another fire")
        if not left:
            return Skipped(SkipReason.RUNNING_ELSEWHERE, tuple(items))
        if left == items:
            return self._retry(fire, "marks changed")
        step = self._start(fire, left, version)
        if isinstance(step, Launched) and step.skipped is None:
            # the others run elsewhere for this fire: recorded as that skip
            gone = tuple(i for i in items if i in elsewhere)
            return Launched(step.items, Skipped(SkipReason.RUNNING_ELSEWHERE, gone))
        return step

    def _stands_for(self, ft: float, items: Iterable[int], covered: dict[int, Covered]) -> None:
        """A run of ``items`` at ``ft`` was launched: the fires each of them stands for
        (its own, and the covers every item has) narrow :attr:`stood_for`."""
        each = [frozenset(covered.get(i, Covered()).fires) for i in items]
        fires = frozenset({ft}) | (frozenset.intersection(*each) if each else frozenset())
        self.stood_for = fires if not self.stood_for else self.stood_for & fires

    def covers_for(self, items: list[int], fire_time: float) -> dict[int, Covered]:
        """The earlier fires a failover claim of ``items`` for ``fire_time`` stands for,
        as a start of them here would (lane task): a dead owner's fires between the
        item's last completed run and the claimed one were never run anywhere, and
        nothing else would ever cover them. Marks the items decided at ``fire_time``."""
        return self._covers(items, fire_time)

    def _fire_schedule(self) -> FireSchedule:
        """The schedule of the job's current config (built again when it changed)."""
        cfg = self._state.config
        if self._schedule is None or self._schedule[0] is not cfg:
            self._schedule = (cfg, FireSchedule(build_trigger(cfg)))
        return self._schedule[1]

    def folded_off(self, fire: Fire, result: object) -> list[float]:
        """The fires a misfire re-run folds (after its own, up to ``folds_until``) that
        are ``disabled`` skips like it, when ``result`` skipped it as disabled (the
        job's) or ``fire.disabled`` names items: each is recorded as that skip too
        (with the re-run's reason and items), and held in the coverage. Without this
        the folded fires of a re-run decided after a disable stood nowhere: the fires
        were deferred into the re-run, which was then skipped for its first fire
        only. Empty for any other fire."""
        job_off = isinstance(result, Skipped) and result.reason is SkipReason.DISABLED
        if fire.folds_until is None or not (job_off or fire.disabled):
            return []
        if fire.folds_until <= fire.fire_time + SAME_FIRE:
            return []
        schedule = self._fire_schedule()
        between, _older = schedule.window(fire.fire_time, fire.folds_until)
        folded = [*between, fire.folds_until]
        for ft in folded:
            self.coverage.held(ft, schedule, None if job_off else fire.disabled)
        return folded

    def _note_folded_off(
        self, items: list[int], folded: Iterable[float], schedule: FireSchedule
    ) -> None:
        """The folded fires of a launched re-run's ``items`` that an operator's
        switch excludes (:meth:`_not_off`): each is held in the coverage and noted
        for its ``disabled`` skip (:attr:`folded_disabled`). Without the skip, a fire
        inside an item's disable whose item was busy (a completion commit retried
        across a store leader's loss) was folded into a re-run of a fire from before
        the disable, left out of its covers, and recorded nowhere (600 s etcd chaos,
        seed 20261244)."""
        st = self._state
        for ft in folded:
            job_off = st.job_disabled(ft)
            off = tuple(i for i in items if job_off or st.item_disabled(i, ft))
            if off:
                self.coverage.held(ft, schedule, off)
                self.folded_disabled[ft] = (off, "" if job_off else ITEM_DISABLED)

    def _not_off(self, item: int, fires: Iterable[float]) -> list[float]:
        """``fires`` of ``item`` that no operator's switch excuses: a re-run of a fire
        from before a disable runs, and folds the later fires, but not those due at
        or after the disable (they are ``disabled`` skips, never a fold)."""
        st = self._state
        return [f for f in fires if not st.job_disabled(f) and not st.item_disabled(item, f)]

    def _hold(self, fire: Fire, items: list[int] | None) -> None:
        """``fire`` of the job (``items`` None) or of ``items`` is skipped because an
        operator disabled it: no run stands for it later (runtime/job/coverage.py). Only
        the schedule's own fires: a run-now or a misfire re-run is not one."""
        if fire.manual or fire.misfire or fire.params or self._state.config.at is not None:
            return
        self.coverage.held(fire.fire_time, self._fire_schedule(), items)

    def _covers(
        self, items: list[int], fire_time: float, folds_until: float | None = None
    ) -> dict[int, Covered]:
        """The fires of just-started ``items`` that no run stood for: the earlier ones
        (runtime/job/coverage.py) and, for a misfire re-run, the later fires folded into
        it here up to ``folds_until``. With misfire on this run is their fold; with it
        off they are recorded as skips (owner gone) and the run covers nothing. Each
        item's newest MAX_COVERS are listed, the older ones counted (``Covered``)."""
        cfg = self._state.config
        if cfg.at is not None:
            return {}  # a one-off job has one fire: nothing before it to cover
        schedule = self._fire_schedule()
        # the start commit checked the version this assignment was read at
        read = self._decided_from
        gaps = self.coverage.gaps(
            items,
            fire_time,
            schedule,
            monitored=cfg.monitor_execution,
            born=read.born if read is not None else None,
        )
        if folds_until is not None and folds_until > fire_time + SAME_FIRE and cfg.misfire:
            # the fires that came while the run ahead went on (or queued behind it)
            # and were folded into this re-run: it stands for them, and says so
            between, older = schedule.window(fire_time, folds_until)
            folded = (*between, folds_until)
            gaps = {
                item: gaps.get(item, Covered()).plus(self._not_off(item, folded), older)
                for item in items
            }
            self._note_folded_off(items, folded, schedule)
            self.coverage.decided(items, folds_until)
        if not gaps or cfg.misfire:
            return gaps
        by_fire: dict[float, list[int]] = {}
        for item, missed in gaps.items():
            for ft in missed.fires:
                by_fire.setdefault(ft, []).append(item)
        for ft in sorted(by_fire):
            self._on_missed(ft, tuple(sorted(by_fire[ft])))
        unlisted = {item: c.before for item, c in gaps.items() if c.before}
        if unlisted:
            # recorded one skip a fire for the newest MAX_COVERS of each item only:
            # the older ones are counted here, not dropped without a word
            log.warning(
                "%s: %d older fires of items %s ran nowhere before %s and are not "
                "recorded one by one (misfire off; the newest of each are recorded as "
                "owner_gone skips): per item %s",
                cfg.name,
                sum(unlisted.values()),
                sorted(unlisted),
                fmt_fire(fire_time),
                unlisted,
            )
        return {}

    def _start_free(
        self, fire: Fire, free: list[int], held: frozenset[int], version: int
    ) -> StepResult:
        """The items of ``fire`` free here start now; only those of ``held`` (items
        still running here) wait for their run to end. A run-now request's parts (or
        a catch-up's) are held as they are for those items (Fires.record): before,
        the whole request waited for its busiest item, and the parts of idle items
        ran behind that item's run and re-runs. A plain fire of the schedule is
        folded for the held items into their misfire re-run, which is of those items
        only (``step``): before, a slow item held its siblings' fires too."""
        step = self._start(fire, free, version)
        if isinstance(step, Launched):
            if not _plain_fire(fire):
                fire.only = held if fire.only is None else fire.only & held
            return Deferred(tuple(sorted(held)))
        if isinstance(step, Wait) and fire.only is not None:
            # the wait narrowed the fire to the free items still to start: the held
            # ones stay in it (decided again at its next step)
            fire.only = fire.only | held
        return step

    def _start_rest(
        self, fire: Fire, launched: Sequence[int], rest: list[int], version: int
    ) -> StepResult:
        """The items a store that checks items apart (etcd) refused while it marked
        ``launched``: decided as a refused start of ``rest`` alone, so they get what
        they would have had in an all-or-nothing commit (adopted, handed over, waited
        for, or skipped as running elsewhere). From now on this fire is about ``rest``
        only: ``launched`` run already."""
        fire.only = frozenset(rest) if fire.only is None else fire.only & frozenset(rest)
        step = self._start(fire, rest, version)
        if isinstance(step, Launched):
            return Launched(tuple(sorted({*launched, *step.items})), step.skipped)
        if isinstance(step, Skipped):
            # recorded as the skip of those items (running elsewhere, or a reason
            # that leaves them unrun), not hidden behind the launch
            return Launched(tuple(launched), step)
        return step

    def _wait_reshard(self, fire: Fire) -> StepResult:
        if time.monotonic() >= fire.deadline:
            log.warning(
                "%s: trigger at %s skipped: resharding did not finish within %.1fs (leader: %s)",
                self._state.config.name,
                fmt_fire(fire.fire_time),
                self._state.config.sharding_wait_timeout,
                self._s.election.current_leader(),
            )
            return Skipped(SkipReason.RESHARD_TIMEOUT)
        return Wait(POLL, "waiting for the leader to reshard")

    def _retry(self, fire: Fire, why: str) -> StepResult:
        fire.retries += 1
        if fire.retries > MAX_RETRIES or time.monotonic() >= fire.deadline:
            log.warning(
                "%s: trigger at %s skipped: %s",
                self._state.config.name,
                fmt_fire(fire.fire_time),
                why,
            )
            return Skipped(SkipReason.CHANGING)
        return Wait(0.0 if fire.retries < 3 else POLL, why)


def fmt_fire(ft: float) -> str:
    """A fire time for log lines."""
    return datetime.fromtimestamp(ft, UTC).isoformat(timespec="milliseconds")


def _plain_fire(fire: Fire) -> bool:
    """Whether ``fire`` is a plain fire of the schedule (nothing a misfire re-run
    would lose: no request, params or item subset; Fires' own test)."""
    return not fire.params and fire.only is None and not fire.catchup and not fire.request
