"""Run-now requests on this instance: run the parts that are ours, and (as leader)
record the parts nobody can run and retire finished requests.

A request lives in the store until each of its items has a record
(coordination/runnow.py); this module only reads it again, level-triggered: at
every housekeeping pass and on every event that may give us a part (a new request,
a new assignment). So a missed event, a partition, a restart, a reshard or a
failover delays a part, it never loses it:

* owner: for each pending request, the items without a record that the current
  assignment gives us (enabled ones) are queued as one fire, ``Fire.request`` set,
  at our clock's time now; the start commit creates each item's record with its
  mark, on the condition that it has none (exactly once per item per request);
* leader: the parts of a disabled item, of an item a count cut removed, of a
  disabled job, or of a request that is not valid are recorded skipped (with a
  skip record to the observers); a request whose items all have a record is
  deleted.

An operator's switch (a job or item disable) has a time, as for the fires of the
schedule (JobState.job_disabled/item_disabled): a request made at or after it is a
``disabled`` skip of the parts it switches off; a request made before it is not
dropped by it. Its parts are decided at the request's time, by the owners of that
time (an instance that joined after it leaves them to the enable), and run even
while the switch is on, as a fire due before a disable does.

Runs on the job's lane, like every coordination task of the job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from shardkeeper.coordination.runnow import RunNowRequest
from shardkeeper.errors import StoreError
from shardkeeper.runtime.fire.fires import Fires
from shardkeeper.runtime.fire.trigger import ITEM_DISABLED, Fire, Skipped
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.services import JobServices

__all__ = ["RunNowDuties"]

log = logging.getLogger(__name__)


class RunNowDuties:
    """The run-now requests of one job on this instance (module docstring)."""

    def __init__(
        self,
        services: JobServices,
        state: JobState,
        leader: LeaderDuties,
        fires: Fires,
        *,
        on_skip: Callable[[Fire, Skipped], None],
    ) -> None:
        self._s = services
        self._state = state
        self._leader = leader
        self._fires = fires
        self._on_skip = on_skip
        #: the last look found requests with parts still to record (housekeeping then
        #: looks at every tick, not only in the job's round-robin turn)
        self.pending = False
        #: requests already reported as not valid (logged once)
        self._reported: set[str] = set()

    def check(self) -> list[str]:
        """One look at the requests (lane task); returns what it did."""
        st = self._state
        if st.stopping or st.suspended or not st.registered:
            return []
        try:
            requests = self._s.runnow.pending()
        except StoreError as exc:
            log.info("%s: could not read the run-now requests: %s", self._s.paths.job, exc)
            self.pending = True
            return []
        done: list[str] = []
        self.pending = any(r.pending() for r in requests)
        try:
            if self._leader.is_leader:
                done += self._lead(requests)
            # a job switched off now may still owe the parts of requests made before
            # its switch (decided at their time, in _own)
            if st.skip_reason() in (None, SkipReason.DISABLED) and self.pending:
                done += self._own(requests)
        except StoreError as exc:
            # the next look (housekeeping pass, event) does it again from a fresh read
            log.info("%s: run-now requests: %s", self._s.paths.job, exc)
        if done:
            log.info("%s: %s", self._s.paths.job, "; ".join(done))
        return done

    def _own(self, requests: list[RunNowRequest]) -> list[str]:
        st = self._state
        assignment, _version = self._s.sharding.read()
        total = st.config.sharding_total_count
        now = time.time()
        if assignment is None or assignment.total != total:
            # no assignment for the current count yet: the leader's fire makes one
            # (the others look again when it is written, a watch event)
            if not self._leader.is_leader:
                return []
            owners: Mapping[int, str] = dict.fromkeys(range(total), self._s.instance_id)
        else:
            # the owners of a fire now (a reshard may apply from a later fire only)
            owners = assignment.owners_for(now)
            if self._leader.is_leader and self._orphaned(requests, owners):
                # parts whose owner is gone: the leader's fire of them serves the
                # reshard that gives them owners (a job whose schedule fires rarely
                # would otherwise wait for its next fire); each new owner looks again
                # when the assignment is written
                owners = dict.fromkeys(range(total), self._s.instance_id)
        me = self._s.instance_id
        # the parts queued or held here already are not queued again; the others
        # are, also of a request in hand (a part that became ours since waited for
        # the parts in hand before: 600 s chaos on ZooKeeper, 48 s behind them)
        in_hand = self._fires.request_items_in_hand()
        done: list[str] = []
        for request in requests:
            if request.invalid:
                continue
            taken = in_hand.get(request.id, frozenset())
            if taken is None:
                continue
            at = request.at
            # sets throughout: a request may name 100,000 items, looked at every tick
            pending = request.pending()
            with st.lock:
                if st.job_disabled(at):
                    continue  # the leader records its parts skipped
                job_off = st.job_disabled()
                # parts a switch set after the request holds off now: decided at
                # the request's time (below); those it switched off are the leader's
                later = {i for i in pending if st.item_disabled(i)}
                skipped = {i for i in later if st.item_disabled(i, at)}
                joined = st.joined_at
            held = skipped | taken
            parts = [i for i in pending if i < total and i not in held]
            if job_off:
                now_parts, before = [], parts
            else:
                now_parts = [i for i in parts if i not in later]
                before = [i for i in parts if i in later]
            mine = [i for i in now_parts if owners.get(i) == me]
            if mine:
                self._queue(request, now, mine)
                done.append(f"run-now {request.id}: items {mine}")
            if before and at >= joined - 1e-3 and assignment is not None:
                # as the owners of the request's time would have run them then: the
                # start commit's fire is the request's (its switches, its owners)
                then = assignment.owners_for(at) if assignment.total == total else {}
                mine = [i for i in before if then.get(i) == me]
                if mine:
                    self._queue(request, at, mine)
                    done.append(f"run-now {request.id}: items {mine} (from before a switch)")
        return done

    def _queue(self, request: RunNowRequest, fire_time: float, items: list[int]) -> None:
        """Queue the fire of ``items`` of ``request`` at ``fire_time``."""
        self._fires.request(
            Fire(
                fire_time,
                manual=True,
                params=dict(request.params),
                only=frozenset(items),
                request=request.id,
            )
        )

    def _orphaned(self, requests: list[RunNowRequest], owners: Mapping[int, str]) -> bool:
        """Whether a pending part's owner is not a live member, or a reshard is due."""
        if self._s.sharding.is_necessary(fresh=True):
            return True
        live = set(self._s.sharding.live_instances())
        return any(i in owners and owners[i] not in live for r in requests for i in r.pending())

    def _settle_started(self, request: RunNowRequest) -> tuple[list[int], list[int]]:
        """With failover off (nobody takes over a run cut short): the started parts
        of ``request`` whose runs still go on, and those reopened now because their
        run ended without a completion (leader). Before, such a part (its run
        fenced, interrupted by a stop, or its instance dead) stayed "started" in
        the request's record, and the request was deleted as if it had run.

        Judged on store revisions, not clocks: the start commit created the record
        with the item's mark, and the completion deletes the mark and writes the
        item's result in one commit. So, the mark gone, a result written before
        the record (or none) means the run never completed: the record is deleted
        and the item's owner runs the part again at its next look. A result of the
        run itself means it completed. A later run's result (written after the
        record, of another execution) cannot tell: the part is left as started,
        never run twice."""
        cfg = self._state.config
        if not cfg.monitor_execution:
            return [], []  # no marks, no results: nothing to judge by
        marks = self._s.execution.running_items()
        running: list[int] = []
        reopened: list[int] = []
        for item, part in sorted(request.started.items()):
            mark = marks.get(item)
            if mark is not None and mark.execution_id == part.execution_id:
                running.append(item)
                continue
            node = self._s.store.get(self._s.paths.result(item))
            if node is not None and node.revision > part.created_revision:
                continue  # completed since its start: this run, or one after it
            if self._s.runnow.reopen(request, item, part):
                reopened.append(item)
                log.warning(
                    "%s: run-now request %s: the run of item %d on %s (%s) ended without "
                    "completing and failover is off: its part runs again at its owner's "
                    "next look",
                    cfg.name,
                    request.id,
                    item,
                    part.instance,
                    part.execution_id,
                )
        return running, reopened

    def _lead(self, requests: list[RunNowRequest]) -> list[str]:
        st = self._state
        cfg = st.config
        done: list[str] = []
        for request in requests:
            # a switch set after the request does not drop it (_own runs its parts
            # at the request's time); one set at or before it makes them skips
            with st.lock:
                job_off = st.job_disabled(request.at)
                pending = request.pending()
                disabled = {i for i in pending if st.item_disabled(i, request.at)}
            if request.invalid and not request.total and request.items is None:
                # it does not say which items: the job's, as they are now
                total = cfg.sharding_total_count
                pending = [i for i in range(total) if i not in request.recorded]
            unsettled = False
            if request.started and not request.invalid and not cfg.failover:
                running, reopened = self._settle_started(request)
                if reopened:
                    done.append(f"run-now {request.id}: items {reopened} reopened")
                unsettled = bool(running or reopened)
                # looked at every tick until they ended (housekeeping)
                self.pending = self.pending or unsettled
            if not pending and not unsettled:
                self._s.runnow.delete(request.id)
                self._reported.discard(request.id)
                done.append(f"run-now {request.id} done")
                continue
            # (reason, the record's text, items)
            skips: list[tuple[SkipReason, str, list[int]]] = []
            if request.invalid:
                if request.id not in self._reported:
                    self._reported.add(request.id)
                    log.error(
                        "%s: run-now request %s is not valid, its items are recorded skipped: %s",
                        cfg.name,
                        request.id,
                        request.invalid,
                    )
                why = f"{SkipReason.INVALID_REQUEST.value}: {request.invalid}"
                skips.append((SkipReason.INVALID_REQUEST, why, pending))
            elif job_off:
                skips.append((SkipReason.DISABLED, SkipReason.DISABLED.value, pending))
            else:
                total = cfg.sharding_total_count
                removed = [i for i in pending if i >= total]
                off = [i for i in pending if i in disabled and i < total]
                if removed:
                    skips.append((SkipReason.REMOVED, SkipReason.REMOVED.value, removed))
                if off:
                    skips.append((SkipReason.DISABLED, ITEM_DISABLED, off))
            for reason, why, items in skips:
                recorded = self._s.runnow.skip(request.id, items, why)
                if recorded:
                    self._on_skip(
                        Fire(request.at, manual=True, params=dict(request.params)),
                        # the record's words where they say more than the reason's value
                        Skipped(reason, tuple(recorded), "" if why == reason.value else why),
                    )
                    done.append(f"run-now {request.id}: items {recorded} skipped ({reason.name})")
        return done
