"""One-off jobs on this instance: record them done, and catch up what was missed.

A one-off job (``JobConfig.at``) fires once, at ``at``, on every instance up then,
through the ordinary fire path (with the one-off rules of runtime/fire/trigger.py). What
this module adds runs on the job's lane, after each batch and at every housekeeping
pass, from a fresh read each time (level-triggered, see the design's self-repair
note):

* every item completed for ``at`` -> create ``/jobs/{job}/done`` (any instance: the
  create is idempotent);
* otherwise, on the leader only, once nothing of the job runs, waits for failover
  or has a trigger request pending, and the fire at ``at`` had time to be decided:
  - ``misfire`` on (the default): a **catch-up**: one run-now request per live member,
    all with the same fire time and the list of outstanding items, so the items that
    did not run (nobody was up at ``at``, an instance's fire was skipped, an item's
    owner died without failover) run once, spread over the live instances;
  - ``misfire`` off and more than ``MISFIRE_GRACE_SECONDS`` after ``at``: the job is
    recorded done with the items that never ran listed as skipped.

A catch-up can never run an item twice: its start is conditional on the item's
result node (coordination/oneoff.py), whichever fire gets there first.

An operator's switch has a time, as for the fires of the schedule
(JobState.job_disabled/item_disabled): an item (or the job) switched off at or
before ``at`` holds the job open and runs at a catch-up once enabled, as before;
one switched off after ``at`` is still owed the fire due before its switch, which
that switch does not drop: it is caught up at once, with a fire time before the
switch (the latest join of the members asked, at least ``at``), by the members
that had joined by then, even while the switch is on. Before, such items (and a
job switched off after ``at``) waited for the enable.
"""

from __future__ import annotations

import logging
import time

from shardkeeper.coordination.model import encode
from shardkeeper.coordination.oneoff import OneOffService
from shardkeeper.errors import StoreError
from shardkeeper.registry import batching
from shardkeeper.registry.base import Op, Put
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.scheduling.scheduler import MISFIRE_GRACE_SECONDS

__all__ = ["OneOffDuties"]

log = logging.getLogger(__name__)

#: seconds beyond sharding_wait_timeout that a fire may take to be decided everywhere
SETTLE_MARGIN = 1.0
#: a catch-up of items a switch holds is fired at least this long before the switch
#: (fire times are stored to the millisecond)
_BEFORE = 0.002


class OneOffDuties:
    """Done marker and catch-ups of one one-off job on this instance (module docstring)."""

    def __init__(self, services: JobServices, state: JobState, leader: LeaderDuties) -> None:
        self._s = services
        self._state = state
        self._leader = leader
        self._service = OneOffService(services.store, services.paths, services.instance_id)
        #: the ``at`` known to be done (a changed ``at`` is not done)
        self._done_at: float | None = None
        #: monotonic time this instance was first seen leading (None: not leading)
        self._leading_since: float | None = None
        #: monotonic time of this instance's last catch-up request
        self._last_catchup = 0.0

    @property
    def done(self) -> bool:
        """Whether the job's one-off fire is known done here (no store read)."""
        at = self._state.config.at
        return at is not None and self._done_at == at.timestamp()

    def check(self) -> str | None:
        """One pass (lane task): what it did (``"done"``, ``"skipped"``,
        ``"catch-up"``) or None. Store errors are logged, the next pass tries again."""
        try:
            return self._check()
        except StoreError as exc:
            log.info("%s: one-off check failed (the next pass retries): %s", self._name, exc)
            return None

    @property
    def _name(self) -> str:
        return self._state.config.name

    def _check(self) -> str | None:
        cfg = self._state.config
        if cfg.at is None or self.done:
            return None
        at = cfg.at.timestamp()
        reason = self._state.skip_reason()
        if reason is not None and not (
            # a job switched off after ``at`` still owes the fire due before it
            reason is SkipReason.DISABLED and not self._state.job_disabled(at)
        ):
            return None
        now = time.time()
        if now < at:
            return None
        view = self._service.view(at)
        if view.done is not None:
            self._done_at = at
            log.info(
                "%s: one-off job is done (recorded by %s); it is not run again here",
                self._name,
                view.done.by,
            )
            return None
        outstanding = view.outstanding(cfg.sharding_total_count)
        if not outstanding:
            if self._service.mark_done(at):
                log.info("%s: one-off job done: every item completed", self._name)
            self._done_at = at
            return "done"
        return self._lead(at, now, outstanding)

    def _lead(self, at: float, now: float, outstanding: list[int]) -> str | None:
        cfg = self._state.config
        if not self._leader.is_leader:
            self._leading_since = None
            return None
        mono = time.monotonic()
        if self._leading_since is None:
            self._leading_since = mono
        # Give the fire at ``at`` (and a previous leader's or our own last catch-up)
        # the time to be decided on every instance: a catch-up meanwhile would be
        # harmless (starts are conditional) but noisy.
        settle = cfg.sharding_wait_timeout + SETTLE_MARGIN
        if (
            now < at + settle
            or mono - self._leading_since < settle
            or mono - self._last_catchup < settle
        ):
            return None
        if self._busy():
            return None
        if not cfg.misfire and now > at + MISFIRE_GRACE_SECONDS:
            if self._service.mark_done(at, outstanding):
                log.warning(
                    "%s: one-off fire at %s missed and misfire is off: items %s skipped; "
                    "the job is done",
                    self._name,
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
                    outstanding,
                )
            self._done_at = at
            return "skipped"
        st = self._state
        with st.lock:
            job_later = st.job_disabled() and not st.job_disabled(at)
            runnable = [i for i in outstanding if not job_later and not st.item_disabled(i)]
            # owed items a switch set after ``at`` holds now, and that switch's time
            held = {
                i: (st.disabled_job_at if job_later else st.disabled_items_at.get(i, 0.0))
                for i in outstanding
                if i not in runnable and not st.item_disabled(i, at)
            }
        if runnable:
            members = self._s.sharding.live_instances()
            if not members:
                return None
            self._request(sorted(members), runnable, now)
            self._last_catchup = mono
            return "catch-up"
        if held and self._request_before_switch(at, held):
            self._last_catchup = mono
            return "catch-up"
        return None  # only items switched off at or before ``at``: they run once enabled

    def _request_before_switch(self, at: float, held: dict[int, float]) -> bool:
        """Catch up ``held`` (item -> the time of the switch set after ``at`` that
        holds it) at a fire time before the earliest of those switches, by the
        members that had joined by then (a later one would skip it as fired before
        it joined). False when no member had: they wait for the enable."""
        switch = min(held.values())
        joined = {
            m: t for m, t in self._s.sharding.enabled_members().items() if t < switch - _BEFORE
        }
        if not joined:
            return False
        fire = max(at, *joined.values())
        if fire >= switch - _BEFORE:
            return False
        log.info(
            "%s: one-off items %s are switched off since after their fire: caught up at "
            "a time before the switch",
            self._name,
            sorted(held),
        )
        self._request(sorted(joined), sorted(held), fire)
        return True

    def _busy(self) -> bool:
        """Items run, wait for failover, or a trigger request is not consumed yet."""
        return (
            self._s.execution.any_running()
            or bool(self._s.failover.queued())
            or bool(self._s.store.children(self._s.paths.trigger_root))
        )

    def _request(self, members: list[str], items: list[int], fire: float) -> None:
        value = encode(
            {
                "by": f"one-off catch-up ({self._s.instance_id})",
                "at": fire,
                "action": "trigger",
                "catchup": True,
                "items": items,
            }
        )
        ops: list[Op] = [Put(self._s.paths.trigger(m), value) for m in members]
        size = batching.max_ops_per_commit(self._s.store)
        for i in range(0, len(ops), size):
            self._s.store.commit(ops[i : i + size])
        log.info(
            "%s: one-off fire at %s: catch-up of items %s over %d instance(s)",
            self._name,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._state.config.at.timestamp()))
            if self._state.config.at
            else "?",
            items,
            len(members),
        )
