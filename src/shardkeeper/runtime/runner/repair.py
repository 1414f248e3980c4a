"""The level-triggered housekeeping pass of one job.

Each pass re-derives from a fresh read what must be true and repairs it; events only
make the next pass come sooner (docs/architecture.md, "Self-repair"):

1. registered in the job? (retried at every pass until it succeeds; one job's
   failure never holds up another's)
2. still the member we registered as? (our membership node exists and is the one we
   created; if not, our executions are fenced and we register again)
3. a leader exists? If the node is missing, elect; if it names us, act as leader; if
   it names another, do not;
4. as leader: marks of owners that are not live are requeued (conditionally on the
   owner being absent), and the assignment is reconciled with the live members;
5. marks naming us that no local execution owns (a start commit whose reply was lost,
   an earlier session) are handed to failover (or cleared without failover);
6. marks that a failed completion commit left are cleared;
7. the switches and the config are re-read (a lost event must not keep a stale view);
8. an orphaned item waits in the failover queue and we are idle: claim it.
"""

from __future__ import annotations

import logging
import time

from shardkeeper.coordination.model import RunningMark
from shardkeeper.errors import StoreError
from shardkeeper.runtime.fire.batches import Batches
from shardkeeper.runtime.job.jobstate import JobState
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.ports import MembershipAndClaims
from shardkeeper.runtime.job.services import JobServices

__all__ = ["MARKS_BUDGET", "MARKS_MAX_WAIT", "RepairPass"]

#: at most this share of the job's lane goes to the periodic mark checks: each reads
#: every running mark of the job (10,000 marks: a quarter of a second of a loaded
#: machine, per instance), so the next periodic check waits that many times its
#: duration. Suspect marks (a new session, an unknown commit outcome) and the
#: leader's reaction to a member leaving are checked at once whatever it costs.
MARKS_BUDGET = 0.05
#: but never longer than this between two periodic checks (they are the safety net
#: for a lost event: an orphan's mark waits at most this long for its requeue)
MARKS_MAX_WAIT = 30.0

log = logging.getLogger(__name__)


class RepairPass:
    """One job's housekeeping pass (module docstring)."""

    def __init__(
        self,
        services: JobServices,
        state: JobState,
        leader: LeaderDuties,
        batches: Batches,
        port: MembershipAndClaims,
    ) -> None:
        self._s = services
        self._state = state
        self._leader = leader
        self._batches = batches
        self._port = port
        self.passes = 0
        #: monotonic time before which a periodic (unsuspected) mark check waits
        self._marks_after = 0.0

    def run(self) -> list[str]:
        """One pass; returns what it repaired (for logs and tests)."""
        done: list[str] = []
        st = self._state
        if st.stopping or st.suspended:
            return done
        self.passes += 1
        if not st.registered:
            self._port.register_logged()
            done.append("registered")
        else:
            member = self._s.store.get(self._s.paths.instance(self._s.instance_id))
            if member is None and not self._s.store.exists(self._s.paths.config):
                self._port.reload()  # the job was removed: retire it, do not rejoin
                return done
            if member is None or member.created_revision != st.member_revision:
                self._port.fence("membership node gone or replaced")
                st.phase.lose_membership("membership node gone or replaced")
                self._port.register_logged()
                done.append("re-registered")
        leader = self._s.store.get(self._s.paths.leader)
        holder = leader.value.decode(errors="replace") if leader is not None else None
        if holder is None or (holder == self._s.instance_id) != self._leader.is_leader:
            if holder is None or holder == self._s.instance_id:
                if self._leader.elect():
                    done.append("took leadership")
                elif holder == self._s.instance_id and self._s.election.sync(holder):
                    self._leader.take_over()
                    done.append("resumed leadership")
            else:
                self._s.election.sync(holder)
        # Reading every mark costs a request per item on ZooKeeper: the mark checks
        # run every third pass (about one session timeout) but at most MARKS_BUDGET
        # of the time, and at once when something made them suspect (a new session,
        # an unknown commit outcome).
        began = time.monotonic()
        marks_due = st.marks_suspect or (self.passes % 3 == 1 and began >= self._marks_after)
        if self._leader.is_leader:
            if marks_due and self._leader.requeue_orphans():
                done.append("requeued orphans")
            spent = time.monotonic() - began
            if self._leader.settle_cuts():
                done.append("recorded the fires owed by items a count cut removed")
            self._leader.reconcile()
        else:
            spent = 0.0
        if marks_due and st.config.monitor_execution:
            st.marks_checked()
            own = time.monotonic()
            moved = self._s.failover.requeue_own(
                self._known,
                keep=st.config.failover,
                done=lambda mark: self._batches.ran_here(mark.execution_id),
            )
            spent += time.monotonic() - own
            if moved:
                done.append(f"handed off own stray marks {moved}")
        if marks_due:
            self._marks_after = time.monotonic() + min(spent / MARKS_BUDGET, MARKS_MAX_WAIT)
        if self._batches.unfinished():
            try:
                if self._batches.retry_unfinished():
                    done.append("cleared marks of a failed completion")
                    self._port.batch_done()
            except StoreError:
                pass
        self._port.reload()
        if st.config.failover and st.skip_reason() is None:
            queued = self._s.failover.queued()
            self._port.queued_seen(queued)
            if queued:
                self._port.try_claim()
        if done:
            st.count("repairs")
            log.info("%s: housekeeping: %s", st.config.name, "; ".join(done))
        return done

    def _known(self, item: int, mark: RunningMark) -> bool:
        # A mark of a fire still being decided here is that fire's: a start commit
        # whose outcome was unknown may have been applied meanwhile, and the fire's
        # next attempt adopts it. Handed to failover instead, the item ran twice:
        # once by that attempt (the hand-off had removed the mark it would have met)
        # and once by the failover claim (chaos, etcd seed 21404).
        return self._batches.owns(item, mark.execution_id) or self._port.mark_in_hand(
            mark.fire_time
        )
