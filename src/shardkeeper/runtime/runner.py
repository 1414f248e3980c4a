"""One job on one instance: the trigger flow, events, failover claims and batches.

The runner owns no threads. The runtime calls :meth:`JobRunner.on_trigger` on its
coordinator pool, hands registry events to :meth:`JobRunner.on_event` on the store's
event thread (which only updates local state and schedules work), and runs items on
its shared worker pool. The flow at each trigger (docs/concepts.md):

1. a trigger that finds this instance's previous items still running is a misfire:
   the items are marked and run once more when the batch ends;
2. the leader reshards if the flag is set (waiting, bounded, until no item runs);
3. the instance reads the assignment and marks its enabled items running in one
   commit that checks no reshard is pending and the assignment is unchanged; if a
   reshard is pending it waits (bounded) for it, otherwise it skips the trigger
   with one log line;
4. the items run on the worker pool; when all are done one commit clears the marks
   (conditional on the fencing token), then a misfire re-run or a failover claim.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.election import LeaderElection
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import Assignment, InstanceInfo, encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import ShardingService
from shardkeeper.coordination.strategies import ShardingStrategy, resolve_strategy
from shardkeeper.coordination.waiting import ChangeSignal
from shardkeeper.errorhandlers import ErrorHandler, resolve_error_handler
from shardkeeper.errors import StoreError
from shardkeeper.job import ClusterOnceListener, JobListener, ShardedJob, ShardingContext
from shardkeeper.registry.base import ConnectionState, CoordinationStore, EventKind, WatchEvent

__all__ = ["Batch", "JobRunner"]

log = logging.getLogger(__name__)

Submit = Callable[[Callable[[], None]], None]


@dataclass
class Batch:
    """The items this instance runs for one trigger (or one failover claim)."""

    fire_time: float
    items: list[int]
    #: fencing token of each item (one per commit: a large batch spans several)
    tokens: dict[int, int]
    contexts: dict[int, ShardingContext]
    failover: bool = False
    misfire: bool = False
    fenced: bool = False
    pending: deque[int] = field(default_factory=deque)
    running: int = 0
    done: int = 0
    outcomes: dict[int, str] = field(default_factory=dict)


def execution_id(job: str, fire_time: float, item: int) -> str:
    """Stable id of (job, fire time, item): the same for every re-run of it."""
    return f"{job}@{round(fire_time * 1000)}#{item}"


class JobRunner:
    """Coordinates one job for this instance (see module docstring)."""

    def __init__(
        self,
        *,
        store: CoordinationStore,
        job: ShardedJob,
        config: JobConfig,
        instance: InstanceInfo,
        workers: Executor,
        submit: Submit,
        listeners: list[JobListener] | None = None,
        liveness: Callable[[], bool] | None = None,
    ) -> None:
        self.job = job
        self.config = config
        self.paths = JobPaths(config.name)
        self._store = store
        self._instance = instance
        self._me = instance.instance_id
        self._workers = workers
        self._submit = submit
        self.election = LeaderElection(store, self.paths, self._me)
        self.sharding = ShardingService(store, self.paths, self._me)
        self.execution = ExecutionService(store, self.paths, self._me)
        self.failover = FailoverService(store, self.paths, self._me)
        self.configs = ConfigService(store, self.paths)
        self.signal = ChangeSignal()
        self._strategy: ShardingStrategy = resolve_strategy(config.sharding_strategy)
        self._on_error: ErrorHandler = resolve_error_handler(config.error_handler)
        self._listeners = listeners or []
        self._liveness = liveness or (lambda: True)
        self._lock = threading.RLock()
        self._batches: list[Batch] = []
        self._misfire_at: float | None = None
        self._disabled_job = False
        self._disabled_items: set[int] = set()
        self._queue_hint: set[int] = set()
        #: (items, token) of finished batches whose marks a failed commit left behind
        self._unfinished: list[tuple[list[int], int]] = []
        #: triggers and claims between their check of _stopping and their batch
        self._starting = 0
        self._registered = False
        self._joined = False  # registered at least once (for log messages)
        self._suspended = False
        self._stopping = False
        self._hard_stop = False
        self._last_reconcile = time.monotonic()
        #: set by the runtime: reschedules the trigger when the config changed
        self.on_config_change: Callable[[JobRunner, JobConfig], None] | None = None
        #: counters for tests and benchmarks
        self.stats: dict[str, int] = {
            "triggers": 0,
            "executed": 0,
            "failed": 0,
            "skipped": 0,
            "misfires": 0,
            "failovers": 0,
            "fenced": 0,
            "reshards": 0,
        }

    # -- lifecycle ----------------------------------------------------------------

    def register(self) -> None:
        """Join the job (also after a new session): config, membership, flags, election."""
        self.config, count_changed = self.configs.sync(self.config)
        self._strategy = resolve_strategy(self.config.sharding_strategy)
        self._on_error = resolve_error_handler(self.config.error_handler)
        # The job membership carries the metadata WITHOUT the job list: with it, the
        # registry would grow with jobs x jobs (the list lives in /instances/{id}).
        # started_at = when it (re-)joined: the leader gives no items of a fire that
        # came before to an instance that joined after it (it would not fire it).
        member = encode(dataclasses.replace(self._instance, jobs=[], started_at=time.time()))
        self._store.put(self.paths.instance(self._me), member, ephemeral=True)
        self._reload_switches()
        self.sharding.set_necessary(
            "count changed" if count_changed else f"instance joined: {self._me}"
        )
        self._registered = True
        self._joined = True
        self._suspended = False
        if self.config.monitor_execution:
            # Marks left under our id by an earlier session that no batch here owns
            # any more would block their items forever: hand them to failover.
            with self._lock:
                active = {i for b in self._batches for i in b.items}
            self.failover.requeue_own(active, keep=self.config.failover)
        self._elect()
        if self.config.failover:
            self.try_claim()

    def unregister(self) -> None:
        """Leave the job gracefully: the others reshard at their next trigger."""
        self._registered = False
        try:
            self.election.resign()
            self._store.delete(self.paths.instance(self._me), recursive=False)
            if self.sharding.live_instances():
                self.sharding.set_necessary(f"instance left: {self._me}")
        except StoreError as exc:
            log.warning("%s: could not deregister cleanly: %s", self.config.name, exc)

    def begin_stop(self, hard: bool = False) -> None:
        """Stop starting items (and, when hard, fence the running ones off)."""
        with self._lock:  # see _guard_start
            self._stopping = True
        if hard:
            self._hard_stop = True
        self.signal.notify()

    def running_count(self) -> int:
        """Items of this job executing now on this instance (a trigger or claim that
        is still marking its items counts as one)."""
        with self._lock:
            return self._starting + sum(b.running + len(b.pending) for b in self._batches)

    def _guard_start(self) -> bool:
        """Count a trigger or claim in flight, unless stopping (then False).

        A graceful stop waits until running_count() is 0 and then leaves the job.
        Without this, a trigger that had passed its checks but not yet launched its
        batch was invisible to it: the instance left while its marks were being
        written, the leader failed the items over, and the taker ran them while this
        instance still did (an overlap with both sides valid, found by the chaos
        checker). Checked and counted under the lock begin_stop takes.
        """
        with self._lock:
            if self._stopping:
                return False
            self._starting += 1
            return True

    def _end_start(self) -> None:
        with self._lock:
            self._starting -= 1

    @property
    def idle(self) -> bool:
        """No batch of this job in progress here."""
        with self._lock:
            return not self._batches

    def _can_start(self) -> bool:
        return (
            self._registered
            and not self._suspended
            and not self._stopping
            and not self._disabled_job
            and not self.config.disabled
        )

    # -- connection states --------------------------------------------------------

    def on_state(self, state: ConnectionState) -> None:
        """Apply a connection-state change (store event thread)."""
        self.election.on_state(state)
        if state is ConnectionState.SUSPENDED:
            self._suspended = True
        elif state is ConnectionState.RECONNECTED:
            self._suspended = False
        elif state is ConnectionState.LOST:
            # Our ephemeral nodes are gone; others may take our items: fence them off.
            self._registered = False
            self.fence_all()
            log.warning("%s: session lost; running executions are fenced off", self.config.name)
        self.signal.notify()

    # -- events -------------------------------------------------------------------

    def on_event(self, rest: list[str], event: WatchEvent) -> None:
        """A change under ``/jobs/{job}/`` (``rest`` = the path segments after it)."""
        self.signal.notify()
        if event.kind is EventKind.RESYNC:
            self._submit(self._reload_switches)
            return
        head = rest[0] if rest else ""
        deleted = event.kind is EventKind.DELETED
        if head == "instances" and len(rest) == 2:
            if deleted and rest[1] != self._me and self.election.is_leader:
                self._submit(lambda: self._member_left(rest[1]))
        elif head == "leader" and deleted and self._registered:
            self._submit(self._elect)
        # No events come from running/, misfire/ or once/ (the runtime's watch leaves
        # them out): a claim that found an item's old mark still in place is retried
        # by the housekeeping loop (claim_wanted), not when that mark goes.
        elif head == "failover" and len(rest) == 3 and rest[2].isdigit():
            if deleted:
                self._queue_hint.discard(int(rest[2]))
            else:
                self._queue_hint.add(int(rest[2]))
                if self.config.failover:
                    self._submit(self.try_claim)
        elif head == "disabled" and len(rest) >= 2:
            self._on_switch(rest, deleted)
        elif head == "trigger" and len(rest) == 2 and rest[1] == self._me and not deleted:
            self._submit(self._run_now)
        elif head == "config" and not deleted:
            self._submit(self._reload_config)

    def _on_switch(self, rest: list[str], deleted: bool) -> None:
        if rest[1] == "job":
            self._disabled_job = not deleted
        elif rest[1] == "items" and len(rest) == 3 and rest[2].isdigit():
            if deleted:
                self._disabled_items.discard(int(rest[2]))
            else:
                self._disabled_items.add(int(rest[2]))
        elif rest[1] == "instances" and self.election.is_leader:
            self._submit(lambda: self.sharding.set_necessary("instance switched"))

    def _reload_switches(self) -> None:
        self._disabled_job = self._store.exists(self.paths.disabled_job)
        self._disabled_items = {
            int(n) for n in self._store.children(self.paths.disabled_items) if n.isdigit()
        }
        self._queue_hint = set(self.failover.queued())

    def _reload_config(self) -> None:
        stored = self.configs.load()
        if stored is None or stored == self.config:
            return
        old = self.config
        self.config = stored
        self._strategy = resolve_strategy(stored.sharding_strategy)
        self._on_error = resolve_error_handler(stored.error_handler)
        log.info("%s: configuration changed in the registry", stored.name)
        if old.sharding_total_count != stored.sharding_total_count and self.election.is_leader:
            self.sharding.set_necessary("count changed")
        if self.on_config_change is not None:
            self.on_config_change(self, old)

    def _elect(self) -> None:
        if not self._registered or self._stopping:
            return
        if self.election.try_acquire():
            self.take_over()

    def take_over(self) -> None:
        """What a new leader does: repair state a dead leader may have left behind."""
        live = self.sharding.live_instances()
        if self.config.failover:
            self.failover.requeue_orphans(set(live))
        self.reconcile()

    def reconcile(self) -> None:
        """Leader's check: set the flag if the assignment does not fit live instances."""
        self._last_reconcile = time.monotonic()
        if not self.election.is_leader:
            return
        assignment, _ = self.sharding.read()
        enabled = self.sharding.enabled_instances()
        if not self.sharding.is_consistent(assignment, enabled, self.config.sharding_total_count):
            self.sharding.set_necessary("reconcile: assignment does not fit live instances")

    def reconcile_due(self) -> bool:
        """Whether the periodic reconcile check should run now."""
        interval = self.config.reconcile_interval
        return interval > 0 and time.monotonic() - self._last_reconcile >= interval

    def _member_left(self, instance_id: str) -> None:
        log.info("%s: instance %s left", self.config.name, instance_id)
        if self.config.failover:
            self.failover.requeue_orphans(set(self.sharding.live_instances()))
        self.sharding.set_necessary(f"instance left: {instance_id}")

    # -- triggers -----------------------------------------------------------------

    def _run_now(self) -> None:
        self._store.delete(self.paths.trigger(self._me), recursive=False)
        self.on_trigger(datetime.now(UTC))

    def on_trigger(self, fire_time: datetime) -> None:
        """A trigger fired (coordinator pool)."""
        self.stats["triggers"] += 1
        if not self._can_start():
            self.stats["skipped"] += 1
            if self._suspended or (self._joined and not self._registered and not self._stopping):
                log.warning(
                    "%s: trigger at %s skipped: not connected to the store",
                    self.config.name,
                    _fmt(fire_time.timestamp()),
                )
            return
        ft = fire_time.timestamp()
        with self._lock:
            busy = [i for b in self._batches if not b.failover for i in b.items]
            if busy:
                if self.config.misfire:
                    if self._misfire_at is None:
                        self._misfire_at = ft
                    self.stats["misfires"] += 1
                else:
                    self.stats["skipped"] += 1
        if busy:
            if self.config.misfire:
                self.execution.mark_misfire(busy, ft)
            return
        self._run_trigger(ft, misfire=False)

    def _run_trigger(self, ft: float, *, misfire: bool) -> None:
        if not self._guard_start():
            return
        try:
            self._start_trigger(ft, misfire=misfire)
        finally:
            self._end_start()

    def _start_trigger(self, ft: float, *, misfire: bool) -> None:
        cfg = self.config
        deadline = time.monotonic() + cfg.sharding_wait_timeout
        for _attempt in range(4):
            if self.election.is_leader and self.sharding.is_necessary():
                self._reshard_as_leader(ft)
            assignment, version = self.sharding.read()
            if assignment is None or assignment.total != cfg.sharding_total_count:
                if self.election.is_leader:
                    self.sharding.set_necessary("no assignment for the current count")
                    continue
                if not self._wait_resharded(deadline):
                    return
                continue
            items = [
                i
                for i in assignment.items_of(self._me, ft)
                if i not in self._disabled_items and i < cfg.sharding_total_count
            ]
            if not items:
                # An instance without items in the old assignment must still wait for a
                # pending reshard: the new assignment may give it items for this trigger.
                if not self.election.is_leader and self.sharding.is_necessary():
                    if not self._wait_resharded(deadline):
                        return
                    continue
                # The flag may have been cleared by a reshard committed between our
                # read and the check (a joiner's first trigger): read again then.
                if self.sharding.read()[1] != version:
                    continue
                return
            ids = {i: execution_id(cfg.name, ft, i) for i in items}
            result = self.execution.start(
                items,
                fire_time=ft,
                execution_ids=ids,
                assignment_version=version,
                persistent=cfg.failover,
                monitor=cfg.monitor_execution,
            )
            if result.marked:
                if misfire:
                    self.execution.clear_misfire(list(result.marked))
                self._launch(ft, list(result.marked), result.tokens, ids, misfire=misfire)
                return
            if result.reason == "reshard":
                if not self._wait_resharded(deadline):
                    return
            elif result.reason == "running":
                if self._defer_as_misfire(ft, items):
                    return
                elsewhere = set(self.execution.running_items())
                if not set(items) - elsewhere:
                    log.info(
                        "%s: items %s still run elsewhere; trigger at %s skipped",
                        cfg.name,
                        items,
                        _fmt(ft),
                    )
                    self.stats["skipped"] += 1
                    return
                items_left = [i for i in items if i not in elsewhere]
                result2 = self.execution.start(
                    items_left,
                    fire_time=ft,
                    execution_ids=ids,
                    assignment_version=version,
                    persistent=cfg.failover,
                    monitor=cfg.monitor_execution,
                )
                if result2.marked:
                    self._launch(ft, list(result2.marked), result2.tokens, ids, misfire=misfire)
                    return
            if time.monotonic() > deadline:
                break
        log.warning("%s: trigger at %s skipped: assignment kept changing", cfg.name, _fmt(ft))
        self.stats["skipped"] += 1

    def _defer_as_misfire(self, ft: float, items: list[int]) -> bool:
        """Whether this trigger's items are held by an earlier batch of this instance;
        if so the trigger is recorded as a misfire (run once more when that batch ends).

        Two triggers of one instance that waited for the same reshard (say after a
        death) proceed together: the earlier one marks the items, and the later one
        would otherwise find them "running elsewhere" and be skipped: a lost fire.
        """
        if not self.config.misfire:
            return False
        with self._lock:
            # under the lock _complete uses: a batch still listed has not yet taken
            # the pending misfire time, so it will see ours
            # (marks a failed completion commit left count as ours until retried)
            local = {i for b in self._batches if not b.failover for i in b.items}
            local |= {i for done, _ in self._unfinished for i in done}
            local &= set(items)
            if not local:
                return False
            if self._misfire_at is None or ft < self._misfire_at:
                self._misfire_at = ft
            self.stats["misfires"] += 1
        self.execution.mark_misfire(sorted(local), ft)
        return True

    def _wait_resharded(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        ok = remaining > 0 and self.signal.wait_for(
            lambda: self._stopping or not self.sharding.is_necessary(), remaining
        )
        if not ok or self._stopping:
            log.warning(
                "%s: trigger skipped: resharding did not finish within %.1fs (leader: %s)",
                self.config.name,
                self.config.sharding_wait_timeout,
                self.election.current_leader(),
            )
            self.stats["skipped"] += 1
            return False
        return True

    def _reshard_as_leader(self, ft: float) -> None:
        cfg = self.config
        if cfg.monitor_execution:
            quiet = self.signal.wait_for(
                lambda: self._stopping or not self.execution.any_running(),
                cfg.execution_wait_timeout,
            )
            if not quiet or self._stopping:
                log.warning(
                    "%s: reshard postponed: items still running after %.1fs",
                    cfg.name,
                    cfg.execution_wait_timeout,
                )
                return
        for _attempt in range(3):  # the flag may be set again while we compute
            flag = self._store.get(self.paths.necessary)
            if flag is None:
                return
            current, _ = self.sharding.read()
            generation = (current.generation + 1) if current else 1
            if self.sharding.reshard(
                self._strategy,
                cfg.sharding_total_count,
                self.election.leader_check(),
                generation,
                fire=ft,
                previous=current,
                flag_version=flag.version,
            ):
                self.stats["reshards"] += 1
                return
            if not self.election.is_leader:
                return

    # -- running items ------------------------------------------------------------

    def _context(
        self,
        ft: float,
        item: int,
        exec_id: str,
        token: int,
        batch: Batch,
        *,
        failover: bool,
        misfire: bool,
    ) -> ShardingContext:
        cfg = self.config
        return ShardingContext(
            job_name=cfg.name,
            item=item,
            item_parameter=cfg.sharding_item_parameters.get(item, ""),
            sharding_total_count=cfg.sharding_total_count,
            job_parameter=cfg.job_parameter,
            fire_time=datetime.fromtimestamp(ft, UTC),
            instance_id=self._me,
            execution_id=exec_id,
            fencing_token=token,
            is_failover=failover,
            is_misfire=misfire,
            props=dict(cfg.props),
            _valid=lambda: self._still_valid(batch),
            _stop=lambda: self._stopping or self._store_reshard_hint(),
        )

    def _still_valid(self, batch: Batch) -> bool:
        # Sticky: once the session may have expired (no contact with the store for a
        # session timeout, e.g. the process was frozen), others may run the items.
        if not batch.fenced and not self._liveness():
            self.fence_all()
        return not batch.fenced and not self._hard_stop

    def fence_all(self) -> None:
        """Mark every execution in progress as fenced off (ctx.is_valid() -> False)."""
        with self._lock:
            fenced = [b for b in self._batches if not b.fenced]
            for batch in fenced:
                batch.fenced = True
                self.stats["fenced"] += len(batch.items)
        if fenced:
            log.warning(
                "%s: executions of items %s fenced off (session may be lost)",
                self.config.name,
                sorted(i for b in fenced for i in b.items),
            )

    def _store_reshard_hint(self) -> bool:
        try:
            return self.sharding.is_necessary()
        except StoreError:
            return False

    def _launch(
        self,
        ft: float,
        items: list[int],
        tokens: dict[int, int],
        ids: dict[int, str],
        *,
        misfire: bool = False,
        failover: bool = False,
    ) -> None:
        batch = Batch(
            fire_time=ft,
            items=items,
            tokens=tokens,
            contexts={},
            failover=failover,
            misfire=misfire,
        )
        for item in items:
            batch.contexts[item] = self._context(
                ft, item, ids[item], tokens.get(item, 0), batch, failover=failover, misfire=misfire
            )
        batch.pending.extend(items)
        with self._lock:
            self._batches.append(batch)
        contexts = [batch.contexts[i] for i in items]
        self._call_listeners("before", contexts, ft)
        limit = self.config.max_threads or len(items)
        with self._lock:
            first = [batch.pending.popleft() for _ in range(min(limit, len(batch.pending)))]
            batch.running += len(first)
        for item in first:
            self._workers.submit(self._run_item, batch, item)

    def _run_item(self, batch: Batch, item: int) -> None:
        ctx = batch.contexts[item]
        outcome = "ok"
        if batch.fenced or self._hard_stop:
            outcome = "fenced"
        else:
            try:
                self.job.run_item(ctx)
            except BaseException as exc:  # user code: never let it kill the instance
                outcome = "failed"
                self.stats["failed"] += 1
                try:
                    self._on_error(self.config.name, item, exc)
                except BaseException as handler_exc:
                    log.error(
                        "%s: item %d failed (%s); error handler raised: %r",
                        self.config.name,
                        item,
                        exc,
                        handler_exc,
                    )
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    outcome = "failed"
        self.stats["executed"] += 1
        nxt: int | None = None
        with self._lock:
            batch.outcomes[item] = outcome
            batch.running -= 1
            batch.done += 1
            if batch.pending and not self._hard_stop:
                nxt = batch.pending.popleft()
                batch.running += 1
            complete = batch.running == 0 and (not batch.pending or self._hard_stop)
        if nxt is not None:
            self._workers.submit(self._run_item, batch, nxt)
        elif complete:
            self._complete(batch)

    def _complete(self, batch: Batch) -> None:
        # Only items that ran are cleared; the marks of items a hard stop never
        # started stay, so failover re-runs them.
        ran = [i for i in batch.items if batch.outcomes.get(i) in ("ok", "failed")]
        groups = _by_token(ran, batch.tokens) if self.config.monitor_execution else {}
        try:
            while groups:
                token, items = next(iter(groups.items()))
                self.stats["fenced"] += len(self.execution.finish(items, token))
                del groups[token]
        except StoreError as exc:
            # The marks stay, and nothing else would clear them while this session
            # lives: they would block every reshard (the leader waits for running
            # items) and this instance's own next triggers. Housekeeping retries.
            log.warning("%s: could not clear running marks (will retry): %s", self.config.name, exc)
            with self._lock:
                self._unfinished.extend((items, token) for token, items in groups.items())
        finally:
            with self._lock:
                if batch in self._batches:
                    self._batches.remove(batch)
                idle = not self._batches
                # a misfire waits for the last batch (e.g. a failover run) to end
                misfire_at: float | None = None
                if idle:
                    misfire_at, self._misfire_at = self._misfire_at, None
            self.signal.notify()
        self._call_listeners("after", [batch.contexts[i] for i in batch.items], batch.fire_time)
        if not idle or not self._can_start():
            return
        if misfire_at is not None and self.config.misfire:
            self._submit(lambda: self._run_trigger(misfire_at, misfire=True))
        elif self.config.failover:
            self._submit(self.try_claim)

    def finish_pending(self) -> bool:
        """Whether running marks of finished batches still wait to be cleared."""
        with self._lock:
            return bool(self._unfinished)

    def retry_finish(self) -> None:
        """Clear the marks a failed completion commit left (housekeeping). The delete
        is conditional on the token, so a retry after a commit whose outcome was
        unknown but did apply only finds the mark gone (and logs it as taken over)."""
        with self._lock:
            pending = list(self._unfinished)
        for entry in pending:
            self.execution.finish(*entry)  # a StoreError leaves it pending
            with self._lock:
                # listed until cleared: a trigger meanwhile counts these marks as ours
                if entry in self._unfinished:
                    self._unfinished.remove(entry)
        if not pending:
            return
        log.info(
            "%s: running marks of items %s cleared after a retry",
            self.config.name,
            sorted(i for items, _ in pending for i in items),
        )
        self.signal.notify()
        # a misfire recorded while the marks blocked the items can run now
        with self._lock:
            misfire_at: float | None = None
            if not self._batches and not self._unfinished:
                misfire_at, self._misfire_at = self._misfire_at, None
        if misfire_at is not None and self.config.misfire and self._can_start():
            self._submit(lambda: self._run_trigger(misfire_at, misfire=True))

    def _call_listeners(self, when: str, contexts: list[ShardingContext], ft: float) -> None:
        for listener in self._listeners:
            try:
                if when == "before":
                    listener.before_job(contexts)
                    if isinstance(listener, ClusterOnceListener) and self._once(ft, "before"):
                        listener.before_all(datetime.fromtimestamp(ft, UTC))
                else:
                    listener.after_job(contexts)
                    if (
                        isinstance(listener, ClusterOnceListener)
                        and not self.execution.any_running()
                        and self._once(ft, "after")
                    ):
                        listener.after_all(datetime.fromtimestamp(ft, UTC))
            except Exception:
                log.exception("%s: listener %r failed", self.config.name, listener)

    def _once(self, ft: float, phase: str) -> bool:
        marker = f"{round(ft * 1000)}-{phase}"
        return self._store.create(self.paths.once(marker), self._me.encode()) is not None

    def prune_once_markers(self, keep_seconds: float = 3600.0) -> None:
        """Leader housekeeping: forget cluster-once markers older than ``keep_seconds``."""
        cutoff = (time.time() - keep_seconds) * 1000
        for name in self._store.children(self.paths.once_root):
            stamp = name.split("-", 1)[0]
            if stamp.isdigit() and int(stamp) < cutoff:
                self._store.delete(self.paths.once(name), recursive=False)

    # -- failover -----------------------------------------------------------------

    def claim_wanted(self) -> bool:
        """Whether a failover claim attempt is worth a registry round trip now."""
        return self.config.failover and bool(self._queue_hint) and self.idle

    def try_claim(self) -> None:
        """Claim and run one orphaned item if this instance is idle."""
        if not self.config.failover or not self._can_start() or not self.idle:
            return
        if not self._guard_start():
            return
        try:
            claim = self.failover.claim()
            if claim is None:
                return
            self.stats["failovers"] += 1
            self._launch(
                claim.entry.fire_time,
                [claim.item],
                {claim.item: claim.token},
                {claim.item: claim.entry.execution_id},
                failover=True,
            )
        finally:
            self._end_start()

    # -- inspection ---------------------------------------------------------------

    def assignment(self) -> Assignment | None:
        """The stored assignment (a registry read)."""
        return self.sharding.read()[0]


def _by_token(items: list[int], tokens: dict[int, int]) -> dict[int, list[int]]:
    """Items grouped by their fencing token (items without a mark are left out)."""
    groups: dict[int, list[int]] = {}
    for item in items:
        token = tokens.get(item, 0)
        if token:
            groups.setdefault(token, []).append(item)
    return groups


def _fmt(ft: float) -> str:
    return datetime.fromtimestamp(ft, UTC).isoformat(timespec="milliseconds")
