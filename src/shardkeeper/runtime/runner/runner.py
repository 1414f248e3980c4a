"""One job on one instance: a composition of small parts over injected services.

Parts (each in its own module, each with its own state, each testable over the
reference MemoryStore):

* ``services.JobServices``: election, sharding, execution marks, failover, config;
* ``trigger.TriggerFlow``: one fire -> items launched, a typed skip, or "wait";
* ``fires.Fires``: the fire queue (order, folding, misfire re-runs, skips);
* ``batches.Batches``: items on the worker pool, completion by token, fenced items
  handed to failover, failed commits retried;
* ``leader.LeaderDuties``: take-over, reconcile, orphan requeue, reshard;
* ``repair.RepairPass``: the level-triggered housekeeping pass;
* ``settings.JobSettings``: the stored config and the switches;
* ``oneoff.OneOffDuties``: a one-off job's done marker and catch-ups (only when
  the config has ``at``);
* ``runnow.RunNowDuties``: the operators' run-now requests (our parts run, and as
  leader the parts nobody can run recorded skipped);
* ``reactions``: connection states and registry events (typed hints from
  ``events.classify``) turned into commands, a pure function; the runner executes
  the commands.

The parts call back into the runner only through their own small port
(``ports.JobLane``, ``ports.JobLifecycle``, ``ports.MembershipAndClaims``, which
the runner implements, or the callables the trigger and the batches are built
with); the runner alone wires them. All coordination work of a job runs on the
job's *lane* (``pool.Lanes``): one task at a time per job, in order, so a trigger,
a claim and a repair pass of one job never interleave, and a waiting fire
re-submits itself instead of holding a thread.

States of a job on this instance (``phase.JobPhase``), every legal move as
``phase.TRANSITIONS`` lists it (``Phase.transition`` refuses any other; a test
checks this drawing against the table)::

    unregistered --register--> registering
    unregistered --begin_stop--> leaving
    unregistered --hard stop--> stopped
    registering --register ok--> registered
    registering --register failed--> unregistered
    registering --begin_stop--> leaving
    registering --hard stop--> stopped
    registered --LOST / membership gone / register failed / unregister--> unregistered
    registered --begin_stop--> stopping
    registered --hard stop--> stopped
    stopping --LOST / membership gone / retire / unregister--> leaving
    stopping --grace over--> stopped
    leaving --register ok--> stopping
    leaving --grace over--> stopped

A trigger starts items only in ``registered``, and in ``stopping`` for fires from
before the stop; a skipped trigger has a ``SkipReason``. Registration is retried by
every housekeeping pass until it succeeds, whatever made it fail. Apart from the
phase, the store connection may be SUSPENDED (``JobState.connection``, in any
phase): fires then wait for it within their deadline and repair passes pause.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shardkeeper import tracing
from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import CheckpointReader
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.election import LeaderElection
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.failover import Claim, FailoverService
from shardkeeper.coordination.model import Assignment, FailoverEntry, InstanceInfo, encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import ShardingService
from shardkeeper.errors import ShardkeeperError, StoreError
from shardkeeper.job import JobListener, ShardedJob, ShardingContext
from shardkeeper.observe import Observers
from shardkeeper.registry.base import ConnectionState, WatchEvent
from shardkeeper.runtime.execute.batch import FENCED
from shardkeeper.runtime.execute.pool import Lanes, WorkerPool
from shardkeeper.runtime.fire.batches import Batch, Batches
from shardkeeper.runtime.fire.checkpoints import ItemStates
from shardkeeper.runtime.fire.fires import Fires, SkipSink
from shardkeeper.runtime.fire.trigger import Fire, Skipped, TriggerFlow, fmt_fire
from shardkeeper.runtime.job import reactions as rx
from shardkeeper.runtime.job.coverage import Covered, counted, listed
from shardkeeper.runtime.job.jobstate import JobState, SkipReason
from shardkeeper.runtime.job.leader import LeaderDuties
from shardkeeper.runtime.job.phase import HARD_STOP, JOINED, REGISTER_FAILED, STOP, JobPhase
from shardkeeper.runtime.job.services import JobServices
from shardkeeper.runtime.runner.oneoff import OneOffDuties
from shardkeeper.runtime.runner.repair import RepairPass
from shardkeeper.runtime.runner.runnow import RunNowDuties
from shardkeeper.runtime.runner.settings import JobSettings

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from shardkeeper.runtime.execute.procpool import RunOnce

__all__ = ["Batch", "JobRunner", "SkipSink"]

#: most orphans one claim round takes over (a few commits' worth)
MAX_CLAIM = 1024

log = logging.getLogger(__name__)


def _log_skip(job: str, reason: SkipReason, ft: float, detail: str) -> None:
    log.warning("%s: trigger at %s skipped: %s%s", job, fmt_fire(ft), reason.value, detail)


class JobRunner:
    """Coordinates one job for this instance (see module docstring); it is the
    port of each of its parts (``job/ports.py``)."""

    def __init__(
        self,
        *,
        services: JobServices,
        job: ShardedJob,
        config: JobConfig,
        instance: InstanceInfo,
        workers: WorkerPool,
        lanes: Lanes,
        listeners: list[JobListener] | None = None,
        fresh: Callable[[], bool] | None = None,
        session: Callable[[], str] | None = None,
        on_skip: SkipSink | None = None,
        observers: Observers | None = None,
        executor: Callable[[JobConfig], RunOnce] | None = None,
    ) -> None:
        self.job = job
        self._observers = observers if observers is not None else Observers()
        self.services = services
        self.state = JobState(config)
        self.paths: JobPaths = services.paths
        self._store = services.store
        self._instance = instance
        self._me = instance.instance_id
        self._lanes = lanes
        self._fresh = fresh or (lambda: True)
        self._session_now = session or (lambda: "")
        # the leader records the runs a dead owner left cut off (the history's row of
        # that attempt: newcomer review N12)
        self.leader = LeaderDuties(
            services,
            self.state,
            on_cut_off=self._observers.on_execution,
            # the fires items removed by a count cut owed: recorded as skips, once
            on_removed=lambda ft, items, text: self.fires.record(
                Fire(ft), Skipped(SkipReason.REMOVED, items, text)
            ),
        )
        self._workers = workers
        #: the executions' checkpoints and progress (runtime/fire/checkpoints.py); a held
        #: write waits on the lanes' timer, on a lane of its own
        self.item_states = ItemStates(
            reader=CheckpointReader(self._store, self.paths),
            instance_id=self._me,
            config=lambda: self.state.config,
            count=self.state.count,
            defer=lambda key, delay, fn: lanes.submit_after(
                f"{self.name}/checkpoints", key, fn, delay
            ),
        )
        self.batches = Batches(
            services=services,
            state=self.state,
            job=job,
            workers=workers,
            listeners=listeners or [],
            valid=self.valid,
            session=self.session,
            on_idle=self.after_batch,
            observers=self._observers,
            defer=self.defer,
            on_undone=self._undone,
            executor=executor,
            item_states=self.item_states,
            # results of items that ended while their batch runs: written on a lane
            # of their own, never behind a fire's decision or an item's start
            publish=lambda delay, fn: lanes.submit_after(f"{self.name}/results", None, fn, delay),
        )
        self.oneoff = OneOffDuties(services, self.state, self.leader)
        self.trigger = TriggerFlow(
            services,
            self.state,
            self.leader,
            local_items=self.local_items,
            launch=self.launch,
            session=self.session,
            owns=self.batches.owns,
            ran=self.batches.ran_here,
            on_missed=self.record_missed,
            reread_switches=lambda: self.settings.reload_switches(),
        )
        self.settings = JobSettings(services, self.state, self.leader, self)
        self.fires = Fires(
            services=services,
            state=self.state,
            trigger=self.trigger,
            batches=self.batches,
            lanes=lanes,
            port=self,
            on_skip=on_skip or _log_skip,
            observers=self._observers,
        )
        self.repairs = RepairPass(services, self.state, self.leader, self.batches, self)
        self.runnow = RunNowDuties(
            services, self.state, self.leader, self.fires, on_skip=self.fires.record
        )
        #: failover claims between their commit and their batch's launch: their new
        #: mark is ours but neither owned by a batch nor of a fire being decided
        self._claims_in_flight = 0
        self._claims_lock = threading.Lock()
        self._pass_count = 0
        #: set by the runtime: reschedules the trigger when the config changed
        self.on_config_change: Callable[[JobRunner, JobConfig], None] | None = None
        #: set by the runtime: unschedules the job when it is retired here
        self.on_retire: Callable[[JobRunner], None] | None = None

    # -- compatibility views --------------------------------------------------------

    @property
    def config(self) -> JobConfig:
        """The job's effective configuration."""
        return self.state.config

    @property
    def stats(self) -> dict[str, int]:
        """Counters for tests and benchmarks."""
        return self.state.stats

    @property
    def phase(self) -> JobPhase:
        """The job's phase here now."""
        return self.state.phase.current

    @property
    def election(self) -> LeaderElection:
        """The job's leader election."""
        return self.services.election

    @property
    def sharding(self) -> ShardingService:
        """The job's sharding service."""
        return self.services.sharding

    @property
    def execution(self) -> ExecutionService:
        """The job's execution marks."""
        return self.services.execution

    @property
    def failover(self) -> FailoverService:
        """The job's failover queue."""
        return self.services.failover

    @property
    def configs(self) -> ConfigService:
        """The job's stored configuration."""
        return self.services.configs

    @property
    def name(self) -> str:
        """The job name (its lane)."""
        return self.paths.job

    @property
    def idle(self) -> bool:
        """No batch of this job in progress here."""
        return self.batches.idle

    def running_count(self) -> int:
        """Items of this job executing now here (a trigger or claim that is still
        marking its items counts as one)."""
        with self.state.lock:
            starting = self.state.starting
        return starting + self.batches.running_count()

    def assignment(self) -> Assignment | None:
        """The stored assignment (a registry read)."""
        return self.sharding.read()[0]

    # -- fires (the Fires part) -------------------------------------------------------

    def on_trigger(self, fire_time: datetime) -> None:
        """A trigger fired: queue it on the job's lane (``Fires.on_trigger``)."""
        self.fires.on_trigger(fire_time)

    def stop_pending(self) -> bool:
        """During a graceful stop: whether work from before the stop is still in
        hand here (``Fires.stop_pending``)."""
        return self.fires.stop_pending()

    def deciding(self, fire_time: float) -> bool:
        """Whether a fire of ``fire_time`` is queued or being decided here."""
        return self.fires.deciding(fire_time)

    def pending_fires(self) -> int:
        """Fires queued or in progress on the lane."""
        return self.fires.pending_fires()

    def pending_fire_times(self) -> list[float]:
        """The fire times of the fires queued or in progress, in order."""
        return self.fires.pending_fire_times()

    def record_missed(self, fire_time: float, items: tuple[int, ...]) -> None:
        """With misfire off, fires of items no instance ran (their owner gone before
        they started) are recorded as skips by the next owner."""
        self.fires.record(Fire(fire_time), Skipped(SkipReason.OWNER_GONE, items))

    # -- reactions (store event thread: the commands call no store) -----------------

    def on_state(self, state: ConnectionState) -> None:
        """Apply a connection-state change (store event thread)."""
        self._execute(rx.on_state(state))

    def on_event(self, event: WatchEvent) -> None:
        """A change of one of this job's nodes (store event thread): a hint."""
        seen = rx.Seen(
            paths=self.paths,
            me=self._me,
            registered=self.state.registered,
            is_leader=self.leader.is_leader,
            failover=self.state.config.failover,
        )
        self._execute(rx.on_event(seen, event))

    def _execute(self, commands: Iterable[rx.Command]) -> None:
        st = self.state
        for command in commands:
            match command:
                case rx.ElectionSees(state=state):
                    self.services.election.on_state(state)
                case rx.ForgetAssignment():
                    self.trigger.forget_assignment()
                case rx.NoteReshardFlag(deleted=deleted):
                    self.services.sharding.note_flag_event(deleted)
                case rx.Connection(state=state):
                    st.connection = state
                case rx.LoseMembership(why=why):
                    st.phase.lose_membership(why)
                case rx.SuspectMarks():
                    st.suspect_marks()
                case rx.Fence(why=why):
                    self.fence_all()
                    log.warning("%s: %s; running executions are fenced off", self.name, why)
                case rx.RequestRepair():
                    self.request_repair()
                case rx.QueueHint(item=item, queued=True):
                    st.queue_hint.add(item)
                case rx.QueueHint(item=item):
                    st.queue_hint.discard(item)
                case rx.SwitchJob(on=on, at=at):
                    self.settings.switch_job(on, at)
                case rx.SwitchItem(item=item, on=on, at=at):
                    self.settings.switch_item(item, on, at)
                case rx.Work():
                    self.submit(command.key, self._task(command))

    def _task(self, work: rx.Work) -> Callable[[], object]:
        """The lane task a reaction asked for."""
        match work.task:
            case rx.Task.ELECT:
                return self.leader.elect
            case rx.Task.MEMBER_LEFT:
                return lambda: self.leader.member_left(work.arg)
            case rx.Task.CLAIM:
                return self.try_claim
            case rx.Task.RESHARD:
                return lambda: self.sharding.set_necessary(work.arg)
            case rx.Task.RUN_NOW:
                return self.fires.run_now
            case rx.Task.REQUESTS:
                return self.runnow.check
            case rx.Task.RELOAD_CONFIG:
                return self.settings.reload_config

    # -- lifecycle ------------------------------------------------------------------

    def register(self) -> None:
        """Join the job (also after a new session): config, membership, switches,
        election. Raises on failure; the housekeeping pass retries it. Does nothing
        when the job is not UNREGISTERED (nor REGISTERING for the start-up registrar):
        a stopping job is never joined again."""
        st = self.state
        with st.lock:
            moved = st.phase.move({JobPhase.UNREGISTERED: JobPhase.REGISTERING}, "register")
            # Refused: a stop began (a repair pass that raced it must not join the
            # stopping job again), or a registration already ended. The start-up
            # registrar's own move to REGISTERING (registration_pending) goes on.
            if moved is None and st.phase.current is not JobPhase.REGISTERING:
                log.info(
                    "%s: registration not begun: the job is %s here",
                    self.name,
                    st.phase.current.value,
                )
                return
        try:
            config, count_changed = self.configs.sync(st.config)
            self.settings.adopt(config)
            # The job membership carries the metadata WITHOUT the job list (else the
            # registry grows with jobs x jobs). started_at = when it (re-)joined: the
            # leader gives no items of an earlier fire to it (it would not fire it).
            joined_at = time.time()
            member = encode(dataclasses.replace(self._instance, jobs=[], started_at=joined_at))
            node = self._store.put(self.paths.instance(self._me), member, ephemeral=True)
            self.settings.reload_switches()
            self.sharding.set_necessary(
                "count changed" if count_changed else f"instance joined: {self._me}"
            )
            self._joined(node.created_revision, joined_at, "register ok")
        except Exception as exc:
            st.register_error = str(exc)
            st.phase.move(REGISTER_FAILED, f"register failed: {exc}")
            raise
        if st.config.monitor_execution:
            # Marks under our id that no batch here owns would block their items
            # (those of a fire still being decided here are that fire's: see repair).
            self.failover.requeue_own(
                lambda item, mark: (
                    self.batches.owns(item, mark.execution_id) or self.mark_in_hand(mark.fire_time)
                ),
                keep=st.config.failover,
                done=lambda mark: self.batches.ran_here(mark.execution_id),
            )
        self.leader.elect()
        if st.config.failover:
            self.try_claim()

    def adopt_batch_registration(self, revision: int, joined_at: float) -> None:
        """The registrar's batched commit registered this job (``registration.py``):
        it checked the job was absent, so the code's config stands, no switch is
        set, no mark can name us, and the leader node it created is ours."""
        self.settings.no_switches()
        self.state.marks_checked()
        self._joined(revision, joined_at, "register ok (batched)")
        self.election.created()

    def registration_pending(self) -> None:
        """The registrar will register this job soon: a fire meanwhile waits for it."""
        self.state.phase.move({JobPhase.UNREGISTERED: JobPhase.REGISTERING}, "register (batch)")

    def registration_left(self, why: str) -> None:
        """The registrar leaves this job, still registering, to the housekeeping pass
        (``why``); a job it registered, or whose registration failed, stays as it is."""
        st = self.state
        with st.lock:
            if st.phase.move({JobPhase.REGISTERING: JobPhase.UNREGISTERED}, f"left: {why}"):
                st.register_error = why

    def _joined(self, revision: int, joined_at: float, why: str) -> None:
        """Register ok, however it was done: our membership and the phase."""
        st = self.state
        with st.lock:
            st.member_revision = revision
            st.joined_at = joined_at
            st.register_error = None
            st.phase.move(JOINED, why)
        # a new membership: the runs decided here before may have been fenced off
        # with it, and the fires they stood for stand nowhere (runtime/job/coverage.py)
        self.trigger.coverage.forget()

    def _undone(self, items: list[int]) -> None:
        """Runs of ``items`` here ended without a valid completion (Batches)."""
        self.trigger.coverage.undecided(items)

    def retire(self, why: str) -> None:
        """Stop running this job on this instance (the rest of the instance goes on);
        a restart of the instance registers it again."""
        if self.state.stopping:
            return
        log.warning("%s: no longer run on this instance: %s", self.name, why)
        self.fence_all()
        self.begin_stop()
        self.state.phase.lose_membership(f"retired: {why}")
        # and leave it for real: a forced `remove` waits for the members to go
        # before it deletes the rest (a member deleted first would register again)
        self.unregister()
        if self.on_retire is not None:
            self.on_retire(self)

    def register_logged(self) -> None:
        """Register, logging a failure (the next housekeeping pass retries)."""
        try:
            self.register()
        except ShardkeeperError as exc:
            log.warning(
                "%s: registration failed (retried every housekeeping pass): %s", self.name, exc
            )

    def reload(self) -> None:
        """Re-read the switches and the stored config (lane task)."""
        self.settings.reload()

    def config_changed(self, old: JobConfig) -> None:
        """The stored config replaced ``old``: tell the runtime."""
        if self.on_config_change is not None:
            self.on_config_change(self, old)

    def unregister(self) -> None:
        """Leave the job gracefully: the others reshard at their next trigger."""
        self.state.phase.lose_membership("unregister")
        try:
            self.election.resign()
            self._store.delete(self.paths.instance(self._me), recursive=False)
            if self.sharding.live_instances():
                self.sharding.set_necessary(f"instance left: {self._me}")
        except StoreError as exc:
            log.warning("%s: could not deregister cleanly: %s", self.name, exc)

    def begin_stop(self, hard: bool = False, notice_at: float | None = None) -> None:
        """Stop starting items (and, when hard, fence the running ones off). Running
        items are told to stop (``ctx.should_stop()``) from ``notice_at`` (monotonic;
        None: now), as the graceful stop's grace period runs out."""
        st = self.state
        if hard:
            # Fenced first, with the time: an item that returns after this (without
            # looking at ctx.is_valid()) ran while invalid, so it is handed to
            # failover and run again, never counted done. The hard stop alone made
            # it invalid without a fence time, and such a run counted done: its
            # fires were lost (600 s ZooKeeper run, a bulk item that returned 6 ms
            # after the grace period ended).
            self.batches.fence_all("hard stop: the grace period is over")
        with st.lock:
            if not st.stopping:
                st.stop_at = time.time()
                st.stop_notice_at = time.monotonic() if notice_at is None else notice_at
            if hard:
                st.phase.move(HARD_STOP, "hard stop")
            else:
                st.phase.move(STOP, "begin_stop")

    # -- lane plumbing --------------------------------------------------------------

    def submit(self, key: str | None, fn: Callable[[], object]) -> None:
        """Run ``fn`` on this job's lane (merged with a queued task of the same key)."""

        def task() -> None:
            fn()

        self._lanes.submit(self.name, key, task)

    def request_repair(self) -> None:
        """Run a housekeeping pass on the lane soon."""
        self.submit("repair", self.repair)

    def needs_repair(self) -> bool:
        """Whether this job's state is suspect (housekeeping then checks it at every
        tick, not just in its round-robin turn)."""
        st = self.state
        if st.stopping:
            return False
        return (
            not st.registered
            or self._pass_count == 0
            or self.batches.unfinished()
            or self.claim_wanted()
            or self.runnow.pending
        )

    def repair(self) -> list[str]:
        """One housekeeping pass (runs on the lane)."""
        self._pass_count += 1
        done = self.repairs.run()
        done += self.runnow.check()
        if self.state.config.at is not None:
            oneoff = self.oneoff.check()
            if oneoff is not None:
                done.append(f"one-off: {oneoff}")
        return done

    def defer(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` after ``delay``: the items of a fire decided ahead of time start
        at its due time, handed to the workers by the lanes' timer, on a lane of
        their own (not queued behind this job's fires)."""
        self._lanes.submit_after(f"{self.name}/start", None, fn, delay)

    def after_batch(self) -> None:
        """A batch ended (worker thread): a misfire re-run, a claim or the one-off
        record may be due."""
        self.fires.on_batch_done()
        if self.state.config.at is not None:
            # the batch may have completed the one-off job: record it now, not at
            # the next housekeeping pass
            self.submit("oneoff", self.oneoff.check)

    def batch_done(self) -> None:
        """Marks were settled: a misfire re-run or a failover claim may be due."""
        self.fires.on_batch_done()

    def launch(self, batch: Batch) -> None:
        """Hand ``batch`` to the workers."""
        batch.uncounted = self.trigger.coverage.take_uncounted(batch.items)
        self.batches.launch(batch, self._context)

    def local_items(self) -> set[int]:
        """Items of normal batches in progress here (not failover ones)."""
        return self.batches.busy_items(include_failover=False)

    def session(self) -> str:
        """The store session id now."""
        return self._session_now()

    # -- executions -----------------------------------------------------------------

    def _context(self, batch: Batch, item: int) -> ShardingContext:
        cfg = self.state.config
        return ShardingContext(
            job_name=cfg.name,
            item=item,
            item_parameter=cfg.sharding_item_parameters.get(item, ""),
            sharding_total_count=cfg.sharding_total_count,
            job_parameter=cfg.job_parameter,
            fire_time=datetime.fromtimestamp(batch.fire_time, UTC),
            instance_id=self._me,
            execution_id=batch.execution_ids.get(item, ""),
            fencing_token=batch.tokens.get(item, 0),
            is_failover=batch.failover,
            is_misfire=batch.misfire,
            props=dict(cfg.props),
            params=dict(batch.params),
            covers=tuple(datetime.fromtimestamp(t, UTC) for t in batch.covers.get(item, ())),
            covered_before=batch.covered_before.get(item, 0),
            _valid=lambda: item not in batch.timed_out and self.valid(batch),
            # timed out or stopping; never a pending reshard (batches.stop_reason)
            _stop=lambda: self.batches.stop_reason(batch, item),
            _item_state=self.item_states.open(
                item=item,
                fire_time=batch.fire_time,
                execution_id=batch.execution_ids.get(item, ""),
                token=batch.tokens.get(item, 0),
                fence=batch.fences.get(item, ""),
                rerun=batch.failover or batch.misfire,
                # its writes hold only while the membership (of the session it began
                # in) is the one it began under, and while the execution is valid
                member=self.state.membership_check(self.paths.instance(self._me)),
                valid=lambda: self.valid(batch),
            ),
        )

    def valid(self, batch: Batch) -> bool:
        """Whether ``batch``'s items may still run."""
        # Sticky: once the session may have ended (no answered probe for most of a
        # session timeout, another session, LOST), others may run the items.
        if batch.fenced or self.state.hard_stop:
            return False
        if not self._fresh() or (batch.session and batch.session != self.session()):
            self.fence_all()
            return False
        return True

    def fence_all(self) -> None:
        """Fence every execution in progress (ctx.is_valid() turns false for good)."""
        self.batches.fence_all()

    def fence(self, why: str) -> None:
        """Fence every execution in progress, logging ``why`` if any was (the log
        line of Batches.fence_all names it, and so does the items' hand-off)."""
        self.batches.fence_all(why)

    # -- failover -------------------------------------------------------------------

    def mark_in_hand(self, fire_time: float) -> bool:
        """Whether a mark of ours for ``fire_time`` may belong to work in hand here
        though no batch owns it yet: a fire still being decided (a start whose outcome
        was unknown, adopted by its next attempt), or any failover claim between its
        commit and its launch (a registration or repair pass running beside the
        lane's claim moved that fresh mark back to the queue while the claim went on
        to run it: two valid runs at once). Such marks are left to the next pass."""
        with self._claims_lock:
            if self._claims_in_flight:
                return True
        return self.deciding(fire_time)

    def claim_wanted(self) -> bool:
        """Whether a failover claim attempt is worth a registry round trip now."""
        return self.state.config.failover and bool(self.state.queue_hint) and self._can_take_more()

    def _can_take_more(self) -> bool:
        # An orphan is claimed into a free worker slot even while other items of
        # this instance run: waiting for the whole instance to be idle left a killed
        # instance's items unclaimed for as long as the survivors stayed busy.
        return self.idle or self._workers.free() > 0

    def try_claim(self) -> None:
        """Claim and run orphaned items while worker slots are free (lane task); then
        look again while orphans are queued.

        How many at once: the free worker slots, or this instance's share of the
        queue when that is more (a dead instance's thousands of short items are
        taken over in a few commits, not one each; the claimed items wait for a slot
        here like the items of any batch)."""
        st = self.state
        if not st.config.failover or st.skip_reason() is not None or not self._can_take_more():
            return
        membership = st.membership_check(self.paths.instance(self._me))
        session = self.session()
        free = max(1, self._workers.free())

        def share(queued: int) -> int:
            # sized by the queue as listed now: the hint trickles in by watch events
            # under load, and rounds sized by it took a dead instance's thousands of
            # items a few at a time for minutes (600 s chaos on etcd)
            if queued <= free:
                return free
            members = max(1, len(self.sharding.live_instances()))
            return min(MAX_CLAIM, max(free, -(-queued // members)))

        # each claimed run's execution span, opened before the claim commit so that its
        # mark carries the span's trace context; linked to the run it replaces
        spans: dict[int, Span | None] = {}

        def open_span(item: int, entry: FailoverEntry) -> str:
            spans[item] = tracing.start_item(
                st.config.name,
                item,
                self._me,
                entry.fire_time,
                entry.execution_id,
                run="failover",
                replaces=(entry.traceparent,),
            )
            return tracing.traceparent(spans[item])

        with self._claims_lock:
            self._claims_in_flight += 1
        try:
            # a stop may begin while the round reads and commits (seconds on a loaded
            # store): no commit is sent once it has
            claims = self.failover.claim_many(
                self.batches.busy_items(),
                limit=share,
                membership=membership,
                traceparent=open_span,
                proceed=lambda: not st.stopping,
            )
            if claims and st.stopping:
                # ... and what a commit took as the stop began is handed back unrun: a
                # stopping instance claims nothing (600 s ZooKeeper chaos: 161 items
                # claimed 0.47 s into a graceful stop ran, their completion unwritten
                # when the grace ended; failed over, they ran a third time)
                self._hand_back(claims, spans)
                return
            # one batch per fire and run-now request: a batch has one ctx.params
            by_fire: dict[tuple[float, str, tuple[tuple[str, str], ...]], list[Claim]] = {}
            for claim in claims:
                e = claim.entry
                key = (e.fire_time, e.request, tuple(sorted(e.params.items())))
                by_fire.setdefault(key, []).append(claim)
            for (fire_time, _request, _params), group in sorted(by_fire.items()):
                items = [c.item for c in group]
                st.count("failovers", len(group))
                # the fires since each item's last completed run stand with this run,
                # as with a trigger's start; and the earlier fires handed off while
                # this one waited in the queue (its folds)
                gaps = self.trigger.covers_for(items, fire_time)
                covered = {
                    c.item: gaps.get(c.item, Covered()).plus(c.entry.folds)
                    for c in group
                    if c.entry.folds or c.item in gaps
                }
                self.launch(
                    Batch(
                        fire_time=fire_time,
                        items=items,
                        tokens={c.item: c.token for c in group},
                        fences={c.item: c.fence for c in group if c.fence},
                        execution_ids={c.item: c.entry.execution_id for c in group},
                        failover=True,
                        session=session,
                        params=dict(group[0].entry.params),
                        request=group[0].entry.request,
                        taken_from={c.item: c.entry.from_instance for c in group},
                        covers=listed(covered),
                        covered_before=counted(covered),
                        spans={c.item: span for c in group if (span := spans.get(c.item))},
                    )
                )
        finally:
            with self._claims_lock:
                self._claims_in_flight -= 1
        if not claims:
            return
        st.queue_hint.difference_update(c.item for c in claims)
        if st.queue_hint:
            self.submit("claim", self.try_claim)

    def _hand_back(self, claims: list[Claim], spans: dict[int, Span | None]) -> None:
        """Claims committed as this instance's stop began: back to the queue, unrun."""
        for claim in claims:
            tracing.end_item(spans.get(claim.item), FENCED, attempt=0, fencing_token=claim.token)
        try:
            self.failover.hand_back(claims, "claimed as this instance's stop began: handed back")
        except StoreError as exc:
            # our marks stay: the leader queues them again once this instance has left
            log.warning(
                "%s: could not hand back items %s claimed as the stop began (queued "
                "again once this instance has left): %s",
                self.name,
                sorted(c.item for c in claims),
                exc,
            )

    def queued_seen(self, items: Iterable[int]) -> None:
        """The failover queue holds ``items`` now (the repair pass's listing)."""
        self.state.queue_hint = set(items)
