"""What the leader of a job does: take over, reconcile, requeue orphans, reshard.

Every duty re-reads the store and is safe to repeat: the housekeeping pass runs
them at its cadence whatever events were seen, so a member-left event missed by the
leader (suspended, one failed store call) delays the requeue of that member's marks
by one pass instead of stopping the job.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable

from shardkeeper.coordination.cuts import CutLedger
from shardkeeper.coordination.model import DocumentError, RunningMark
from shardkeeper.coordination.sharding import necessary_parts
from shardkeeper.counters import SkipReason
from shardkeeper.errors import StoreError
from shardkeeper.observe import ExecutionRecord, Outcome
from shardkeeper.runtime.job.coverage import MAX_COVERS, FireSchedule
from shardkeeper.runtime.job.jobstate import JobState
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.scheduling.triggers import build_trigger

__all__ = ["FOLLOWERS_SHARE", "LeaderDuties", "RemovedSink", "ReshardStep", "leader_wait"]

#: receives one skip record of the fires a count cut left owed: (fire time, the
#: removed items that owed it, the record's words)
RemovedSink = Callable[[float, tuple[int, ...], str], None]

log = logging.getLogger(__name__)

#: the share of ``sharding_wait_timeout`` that the leader's wait for running items
#: leaves to the followers: they wait for the reshard that long from their fire's
#: start, and need time to see it committed, read the assignment and commit their
#: start. A leader that waited as long as they do (both 5 s by default) committed
#: just after they had given the fire up: every instance skipped it ("resharding did
#: not finish in time") whenever items outlast the interval (issue 35 section 4).
FOLLOWERS_SHARE = 0.5


def leader_wait(execution_wait_timeout: float, sharding_wait_timeout: float) -> float:
    """How long the leader waits for running items before it reshards a fire:
    ``execution_wait_timeout``, and never past the part of ``sharding_wait_timeout``
    that leaves the followers their share (:data:`FOLLOWERS_SHARE`) after the commit."""
    return min(execution_wait_timeout, sharding_wait_timeout * (1.0 - FOLLOWERS_SHARE))


class ReshardStep(enum.Enum):
    """Where a leader's reshard at a trigger stands."""

    DONE = "done"  # committed, or nothing to do (no flag, not leader)
    WAIT = "wait"  # items still run: try again shortly (bounded by the caller)


class LeaderDuties:
    """The leader's repairs and resharding for one job (module docstring)."""

    def __init__(
        self,
        services: JobServices,
        state: JobState,
        on_cut_off: Callable[[ExecutionRecord], None] | None = None,
        on_removed: RemovedSink | None = None,
    ) -> None:
        self._s = services
        self._state = state
        #: receives the skips of the fires items a count cut removed still owed
        #: (coordination/cuts.py): recorded by the leader whose settle commits
        self._on_removed = on_removed
        self._cuts = CutLedger(services.store, services.paths)
        #: whether the cut ledger may hold cuts to settle (read once per leadership
        #: and after each cut, not at every repair pass)
        self._cuts_due = True
        #: receives the record of each run a dead owner left cut off (its orphaned
        #: mark, found and moved here): the history's row of that attempt
        self._on_cut_off = on_cut_off
        self._last_reconcile = time.monotonic()
        #: (fire, reason) of a reshard owed to instances that joined after that fire:
        #: the flag is set at the first later fire (setting it at once would block
        #: every start commit of the fire just resharded)
        self._owed: tuple[float, str] | None = None
        #: the fire during which the owed flag was set (its reshard applies after it)
        self._owed_flag_fire: float | None = None

    @property
    def is_leader(self) -> bool:
        """Whether this instance leads the job now."""
        return self._s.election.is_leader

    def elect(self) -> bool:
        """Try to become leader; True when this instance just became it (then it has
        taken over already)."""
        if not self._state.registered or self._state.stopping:
            return False
        if self._state.clock_skew is not None:
            return False  # a skewed instance leads no job (runtime/clockskew.py)
        if self._s.election.try_acquire():
            self.take_over()
            return True
        return False

    def take_over(self) -> None:
        """What a new leader does: repair state a dead leader may have left behind."""
        self.requeue_orphans()
        self._cuts_due = True  # a leader killed after a cut's commit left it owed
        self.settle_cuts()
        self.reconcile()

    def requeue_orphans(self) -> list[int]:
        """Move the marks of owners that are not live members to the failover queue
        (or drop them without failover); conditional on each owner being absent."""
        if not self.is_leader or not self._state.config.monitor_execution:
            return []
        if not self._s.execution.any_running():
            return []
        live = set(self._s.sharding.live_instances())
        keep = self._state.config.failover
        moved = self._s.failover.requeue_orphan_marks(live, keep=keep)
        if self._on_cut_off is not None:
            found = time.time()
            for item, mark in moved:
                self._on_cut_off(self.cut_off_record(item, mark, found, requeued=keep))
        return [item for item, _mark in moved]

    def cut_off_record(
        self, item: int, mark: RunningMark, found: float, *, requeued: bool
    ) -> ExecutionRecord:
        """The record of a run its instance left cut off (the instance is gone, its
        running mark orphaned): outcome ``crashed``, on the dead instance, from the
        run's start to when this leader found it (the death itself is not known more
        precisely), reported by this instance (newcomer review N12)."""
        cfg = self._state.config
        me = self._s.instance_id
        then = (
            "queued for failover: another instance runs it again"
            if requeued
            else "not run again (failover is off): the item runs at its next fire"
        )
        started = mark.started_at if mark.started_at > 0 else mark.fire_time
        return ExecutionRecord(
            job=cfg.name,
            item=item,
            fire_time=mark.fire_time,
            execution_id=mark.execution_id,
            instance=mark.instance_id,
            started=min(started, found),
            ended=found,
            outcome=Outcome.CRASHED,
            failover=mark.failover,
            error_type="InstanceGone",
            error_message=(
                f"instance {mark.instance_id} left the cluster while this run was running "
                f"(killed, lost, or frozen past its session); found by the leader {me}, "
                f"and {then}"
            ),
            reported_by=me,
        )

    def member_left(self, instance_id: str) -> None:
        """A member's node went: requeue its marks, reshard at the next trigger."""
        log.info("%s: instance %s left", self._state.config.name, instance_id)
        self.requeue_orphans()
        self._s.sharding.set_necessary(f"instance left: {instance_id}")

    def reconcile(self) -> None:
        """Set the reshard flag when the assignment does not fit the live enabled
        instances (e.g. it names only dead ones, or an item has no owner)."""
        self._last_reconcile = time.monotonic()
        if not self.is_leader or self._owed is not None:
            return  # a reshard is owed already: it comes at the next fire
        assignment, _ = self._s.sharding.read()
        enabled = self._s.sharding.enabled_instances()
        total = self._state.config.sharding_total_count
        if (
            not self._s.sharding.is_consistent(assignment, enabled, total)
            and not self._s.sharding.is_necessary()
        ):
            self._s.sharding.set_necessary("reconcile: assignment does not fit live instances")

    def reconcile_due(self) -> bool:
        """Whether the periodic full reconcile should run now."""
        interval = self._state.config.reconcile_interval
        return interval > 0 and time.monotonic() - self._last_reconcile >= interval

    def serve_reshard(self, fire: float, waited_since: float) -> ReshardStep:
        """Reshard for the trigger at ``fire`` if the flag is set, in one commit
        checked against leadership and the flag's version.

        It waits (WAIT, up to :func:`leader_wait` from ``waited_since``: the first
        step of this fire, when the followers' own waits began) for the running
        items to end, so that the new assignment can apply to this fire (marks of
        dead owners are requeued first, so they never hold it). Items still running
        then are not waited for further, and never stopped (a pending reshard is no
        reason to: ``ctx.should_stop()``): the reshard is committed to apply from
        the next fire, early enough for the followers, who wait for it up to
        ``sharding_wait_timeout``, to decide this fire after it. It does not wait at
        all when the reshard applies from the next fire whatever runs: a flag set
        after the fire, or the one owed to instances that joined after it. The
        fires up to this one keep their owners (the assignment keeps the previous
        ones), and an item that moved while it still runs starts at its new owner
        once its running mark is gone (the start commit checks it), so waiting on
        long items can neither stop them nor hold the reshard (and with its flag
        every start commit of the job) for good."""
        cfg = self._state.config
        if not self.is_leader:
            return ReshardStep.DONE
        owed = self._owed
        from_next_fire = False
        if owed is not None and fire > owed[0] + 1e-6:
            self._owed = None
            self._s.sharding.set_necessary(owed[1])
            # set during this fire: the joiners decided it already (no items), so
            # the reshard that includes them applies from the next fire
            self._owed_flag_fire = fire
        if self._owed_flag_fire is not None:
            from_next_fire = abs(self._owed_flag_fire - fire) < 1e-6
        if not self._s.sharding.is_necessary():
            self._owed_flag_fire = None
            return ReshardStep.DONE
        if cfg.monitor_execution:
            self.requeue_orphans()
            if not from_next_fire and self._s.execution.any_running():
                wait = leader_wait(cfg.execution_wait_timeout, cfg.sharding_wait_timeout)
                if time.monotonic() - waited_since < wait and not self._late_flag(fire):
                    return ReshardStep.WAIT
                log.info(
                    "%s: items still running (waited %.1fs at most): the reshard applies "
                    "from the next fire (they go on)",
                    cfg.name,
                    wait,
                )
                from_next_fire = True
        for _attempt in range(3):  # the flag may be set again while we compute
            flag = self._s.store.get(self._s.paths.necessary)
            if flag is None:
                return ReshardStep.DONE
            current, _ = self._s.sharding.read()
            generation = (current.generation + 1) if current else 1
            # A flag set after the fire (a member left, the reconcile check) came
            # while the instances decided it: one without items in the previous
            # assignment may have skipped it already, and would never run items the
            # new one gave it for this fire. Such a reshard applies from the next fire.
            _reason, set_at = necessary_parts(flag.value or b"")
            late_flag = set_at is not None and set_at > fire + 1e-3
            done = self._s.sharding.reshard(
                self._state.strategy,
                cfg.sharding_total_count,
                self._s.election.leader_check(),
                generation,
                fire=fire,
                previous=current,
                flag_version=flag.version,
                on_late=lambda late: self._owe(fire, late),
                from_next_fire=from_next_fire or late_flag,
                extra=self._cuts.ops_for if cfg.monitor_execution else None,
            )
            if done:
                self._owed_flag_fire = None
                self._state.count("reshards")
                if current is not None and done.total < current.total:
                    self._cuts_due = True
                    self.settle_cuts()
                return ReshardStep.DONE
            if not self.is_leader:
                return ReshardStep.DONE
        return ReshardStep.DONE

    def settle_cuts(self) -> int:
        """Record, once, the fires that items removed by a cut of the count owed: each
        fire of each removed item after its last stored result (or from its birth)
        and before the cut's effective fire, as a skip with reason ``removed`` (no run
        of theirs can come any more, and with misfire on their next run would have
        folded them: coordination/cuts.py). Waits (0) while a removed item still runs
        a fire before the cut (its end may write a newer result). Lists at most
        MAX_COVERS fires per item, the newest; older ones are counted in the record's
        words. Returns the number of skip records made."""
        if not self._cuts_due or not self.is_leader:
            return 0
        if not self._state.config.monitor_execution:
            self._cuts_due = False
            return 0
        try:
            return self._settle_cuts()
        except StoreError as exc:
            log.info("%s: the fires owed by removed items wait: %s", self._state.config.name, exc)
            return 0  # still due: the next repair pass tries again
        except DocumentError as exc:
            self._cuts_due = False
            log.error("%s: %s: the fires it names are not recorded", self._state.config.name, exc)
            return 0

    def _settle_cuts(self) -> int:
        found = self._cuts.read()
        if found is None:
            self._cuts_due = False
            return 0
        cuts, version = found
        items = sorted({i for cut in cuts for i in cut.since})
        if any(self._s.store.exists(self._s.paths.running(i)) for i in items):
            return 0  # settled at a later pass, once they ended
        last = self._cuts.last_fires(items)
        schedule = FireSchedule(build_trigger(self._state.config))
        owed: dict[float, set[int]] = {}
        older: dict[int, int] = {}
        for cut in cuts:
            for item, since in cut.since.items():
                fires, more = self._owed_fires(
                    schedule, max(since, last.get(item, since)), cut.until
                )
                for ft in fires:
                    owed.setdefault(ft, set()).add(item)
                if more:
                    older[item] = older.get(item, 0) + more
        if not self._cuts.settle(version, self._s.election.leader_check()):
            return 0  # another leader settled it, or we are not leader any more
        self._cuts_due = False
        why = SkipReason.REMOVED.value
        counted = ""
        if older:
            counted = ", ".join(f"item {i}: {n}" for i, n in sorted(older.items()))
            log.warning(
                "%s: items removed by a cut of the count owed more fires than listed "
                "(the newest %d per item are recorded as skips; older ones counted: %s)",
                self._state.config.name,
                MAX_COVERS,
                counted,
            )
        first = min(owed, default=None)
        for ft in sorted(owed):
            text = ""
            if older and ft == first:
                text = f"{why}; older fires owed, counted, not listed: {counted}"
            if self._on_removed is not None:
                self._on_removed(ft, tuple(sorted(owed[ft])), text)
        if owed:
            log.info(
                "%s: %d fires owed by items %s that a cut of the count removed are recorded "
                "as skips (removed)",
                self._state.config.name,
                len(owed),
                items,
            )
        return len(owed)

    @staticmethod
    def _owed_fires(schedule: FireSchedule, after: float, until: float) -> tuple[list[float], int]:
        """The schedule's fires after ``after`` and strictly before ``until``: the
        newest MAX_COVERS, and how many older. (A cut applying from the next fire is
        dated a millisecond after the fire it left to the old owners, which the
        schedule's own look-up would take for that fire: it is owed.)"""
        fires, more = schedule.window(after, until + 2e-3, MAX_COVERS + 1)
        fires = [ft for ft in fires if ft < until - 1e-6]
        cut = max(0, len(fires) - MAX_COVERS)
        return fires[cut:], more + cut

    def _late_flag(self, fire: float) -> bool:
        """Whether the reshard flag was set after ``fire`` (its reshard applies from
        the next fire: waiting for running items cannot change that)."""
        flag = self._s.store.get(self._s.paths.necessary)
        if flag is None:
            return False
        _reason, set_at = necessary_parts(flag.value or b"")
        return set_at is not None and set_at > fire + 1e-3

    def _owe(self, fire: float, late: list[str]) -> None:
        self._owed = (fire, f"joined after the fire: {', '.join(late)}")

    def prune_once_markers(self, keep_seconds: float = 3600.0) -> None:
        """Forget cluster-once markers older than ``keep_seconds``."""
        if not self.is_leader:
            return
        cutoff = (time.time() - keep_seconds) * 1000
        for name in self._s.store.children(self._s.paths.once_root):
            stamp = name.split("-", 1)[0]
            if stamp.isdigit() and int(stamp) < cutoff:
                self._s.store.delete(self._s.paths.once(name), recursive=False)
