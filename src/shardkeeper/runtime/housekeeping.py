"""The housekeeping thread of a runtime: the liveness probe and the repair sweep.

It ticks every T/3 (T = the session timeout). Each tick probes the store with one
read of the instance node: an answer under the current session feeds the freshness
clock (runtime/health/liveness.py: on stores whose session any answered request renews; on
etcd the clock follows the lease keep-alives instead), and executions are fenced when
the clock goes stale. The runtime also asks for a probe at once (:meth:`Housekeeper.probe`)
when the store reports a (re)connection.
The probe goes on during start-up and during a graceful stop (executions started
then must stay valid). Once the runtime has started, and while it is not stopping,
the tick also re-creates the instance node if it is gone and queues the
level-triggered repair pass (runtime/runner/repair.py) of the jobs due: every job whose
state is suspect at once, the others round-robin so that each is checked at least
once per sweep (3 T, at least 5 s). A tick whose probe was answered also gives the
clock monitor its turn (runtime/clockskew.py: ``max_time_diff_seconds``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from shardkeeper.coordination.paths import instance_path
from shardkeeper.errors import StoreError
from shardkeeper.registry.base import ConnectionState, CoordinationStore
from shardkeeper.runtime.fire.skiplog import SkipLog
from shardkeeper.runtime.health.liveness import Liveness
from shardkeeper.runtime.runner.runner import JobRunner

__all__ = ["Housekeeper"]

log = logging.getLogger(__name__)

#: below this share of one core used while the housekeeping thread waited, a late
#: wake-up is a pause of the process (or other processes' load), not its own threads
PAUSED_CPU_SHARE = 0.25
#: seconds between two warnings that the process is starved of CPU
STARVED_WARN_EVERY = 60.0
#: ticks between two prunings of the cluster-once markers (about 40 min at T = 4 s)
_PRUNE_TICKS = 1800


class Housekeeper:
    """Runs the housekeeping ticks of one runtime on a daemon thread (see module
    docstring). The callables are the runtime's views of its own state."""

    def __init__(
        self,
        store: CoordinationStore,
        liveness: Liveness,
        instance_id: str,
        *,
        runners: Callable[[], list[JobRunner]],
        started: threading.Event,
        stopped: threading.Event,
        stopping: Callable[[], bool],
        reput_instance: Callable[[], None],
        session_id: Callable[[], str],
        skips: SkipLog,
        clock: Callable[[], None] | None = None,
        stalls: Callable[[], object] | None = None,
    ) -> None:
        self._store = store
        self._liveness = liveness
        self._instance_path = instance_path(instance_id)
        self._me = instance_id
        self._runners = runners
        self._started = started
        self._stopped = stopped
        self._stopping = stopping
        self._reput_instance = reput_instance
        self._session_id = session_id
        self._skips = skips
        #: the clock monitor's tick (runtime/clockskew.py): it measures when due
        self._clock = clock
        #: reports the coordination lanes stuck on one task (Lanes.report_stalls)
        self._stalls = stalls
        self._rr = 0  # round-robin position of the sweep
        self._thread: threading.Thread | None = None
        #: set by halt(): the loop ends even before the runtime's ``stopped`` is set
        self._halted = threading.Event()
        #: seconds the last tick woke after it was due (the process's starvation)
        self.lateness = 0.0
        #: the largest lateness since the runtime started
        self.max_lateness = 0.0
        self._warned_at = -math.inf

    def start(self) -> None:
        """Start the thread (it ends at :meth:`halt`, or by its next tick after ``stopped``)."""
        self._thread = threading.Thread(target=self._loop, name="sk-housekeeping", daemon=True)
        self._thread.start()

    def halt(self, timeout: float) -> None:
        """End the loop and wait up to ``timeout`` for a tick in flight to return.
        The runtime calls it before closing the store: a tick still probing when the
        client closed its channel failed with the client's own error and printed a
        traceback on every Ctrl-C that fell inside a probe."""
        self._halted.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _over(self) -> bool:
        return self._halted.is_set() or self._stopped.is_set()

    def _loop(self) -> None:
        tick = 0
        due = time.monotonic() + self._liveness.cadence
        while True:
            slept_at, cpu_at = time.monotonic(), time.process_time()
            if self._halted.wait(max(0.0, due - slept_at)) or self._over():
                break
            woke = time.monotonic()
            # the CPU this process used while the thread waited tells a starved
            # process (its own threads busy) from a paused one (SIGSTOP, a VM freeze)
            share = (time.process_time() - cpu_at) / max(woke - slept_at, 1e-6)
            self.note_wake(due, woke, cpu_share=share)
            tick += 1
            try:
                self.tick(tick)
            except Exception:  # a tick must never end the loop
                log.exception("housekeeping tick failed")
            # counted from the tick's end, as before: a slow store lengthens the
            # tick, not the lateness (which measures the wake-up alone)
            due = time.monotonic() + self._liveness.cadence

    def note_wake(self, due: float, woke: float, *, cpu_share: float | None = None) -> None:
        """Record how late a tick woke. The store client's threads (kazoo's pings,
        etcd's keep-alives) compete with item threads for the GIL like this one: a
        tick a whole cadence late (T/3) means they may be late too, and a session can
        be lost with no fault of the network. Warned at most once a minute.

        ``cpu_share``: the CPU this process used while the thread waited, in cores.
        Under :data:`PAUSED_CPU_SHARE` the process was not starved by its own work but
        paused (SIGSTOP, a debugger, a VM or container freeze, a suspended machine) or
        starved by other processes of the host, and the warning says that instead."""
        late = max(0.0, woke - due)
        self.lateness = late
        self.max_lateness = max(self.max_lateness, late)
        cadence = self._liveness.cadence
        if late > cadence and woke - self._warned_at >= STARVED_WARN_EVERY:
            self._warned_at = woke
            if cpu_share is not None and cpu_share < PAUSED_CPU_SHARE:
                log.warning(
                    "%s: the housekeeping thread woke %.2f s late (it runs every %.2f s) "
                    "while this process used almost no CPU (%.0f%% of a core): the process "
                    "was paused (SIGSTOP, a debugger, a VM or container freeze, a "
                    "suspended machine) or the host's other processes took the CPU. The "
                    "store client's heartbeats were late too (session_timeout %.1f s): "
                    "its session may have expired and its items been taken over",
                    self._me,
                    late,
                    cadence,
                    100 * cpu_share,
                    self._store.session_timeout,
                )
                return
            log.warning(
                "%s: the housekeeping thread woke %.2f s late (it runs every %.2f s): "
                "this process is starved of CPU, and the store client's heartbeats may be "
                "late too (session_timeout %.1f s). CPU-bound items in threads cause "
                "this: see docs/failover.md, 'A fully busy cluster'",
                self._me,
                late,
                cadence,
                self._store.session_timeout,
            )

    def tick(self, tick: int) -> None:
        """One tick: probe, fence if stale, then (started, not stopping) repairs."""
        if self._stalls is not None:
            self._stalls()  # first: also while the store does not answer, or stopping
        present = self._probe()
        runners = self._runners()
        if not self._liveness.fresh():
            for runner in runners:
                runner.fence_all()
        if self._stopping():
            return  # leaving: no repairs, no re-creating the instance node
        if not self._started.is_set():
            # start() is still registering every job: a repair pass would register
            # the jobs it has not reached yet one by one, racing its batches
            return
        if present is False:
            self._reput_instance()
        if present is None:
            return  # the store does not answer: repairs would only fail
        if self._clock is not None:
            self._clock()  # a sample every CLOCK_EVERY at most, never on a fire's path
        active = [r for r in runners if not r.state.stopping]
        if not active:
            return
        sweep = max(3 * self._store.session_timeout, 5.0)
        per_tick = max(1, math.ceil(len(active) * self._liveness.cadence / sweep))
        chosen = {id(r): r for r in active if r.needs_repair()}
        for n in range(per_tick):
            r = active[(self._rr + n) % len(active)]
            chosen[id(r)] = r
        self._rr = (self._rr + per_tick) % len(active)
        for runner in chosen.values():
            runner.request_repair()
            if runner.leader.reconcile_due():
                runner.submit("reconcile", runner.leader.reconcile)
            if tick % _PRUNE_TICKS == 0:
                runner.submit("prune", runner.leader.prune_once_markers)
        self._skips.flush()

    def probe(self) -> None:
        """Probe now, from any thread. The runtime asks after a (re)connection: an
        answered probe proves the session alive from its own send time, whereas the
        time the event is delivered can lie well after the reconnection was seen
        (and after the link dropped again)."""
        try:
            self._probe()
        except Exception:  # a probe on a borrowed thread must not take it down
            log.exception("liveness probe failed")

    def _probe(self) -> bool | None:
        """Whether the instance node exists (None: no answer); an answer under the
        session the probe went out in is contact for the freshness clock."""
        sent = self._liveness.now()
        if self._store.state not in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
            return None
        session = self._session_id()
        try:
            present = self._store.exists(self._instance_path)
        except StoreError:
            return None
        if self._session_id() == session:
            self._liveness.contact(sent)
        return present
