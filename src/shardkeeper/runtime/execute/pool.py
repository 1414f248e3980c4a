"""A fixed pool of daemon threads, and per-job serial lanes on top of one.

Why not ``concurrent.futures.ThreadPoolExecutor``: its threads are joined at
interpreter exit, so one ``execute()`` that never returns kept ``shardkeeper run``
alive after a second SIGTERM (it had already left the cluster). These threads are
daemons: a hard stop ends the process whatever user code is doing.

:class:`Lanes` serialises coordination work per job: at most one task of a job is in
flight, tasks queued for a job run in order, and a task submitted under a key that
is already queued is merged into it (a burst of events costs one re-read). So a slow
job, a long bounded wait or a slow store delays only that job's own work, never
another job's triggers, and the thread count stays fixed whatever the job count.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shardkeeper.errors import StoreError

__all__ = ["STALL_WARN_AFTER", "Lanes", "WorkerPool", "guarded"]

log = logging.getLogger(__name__)

Task = Callable[[], None]

#: a lane task running longer than this is reported once, with its thread's stack:
#: everything queued behind it on that job (its fires, its repair pass) waits, and
#: nothing else in the logs would say on what
STALL_WARN_AFTER = 15.0


def guarded(fn: Task, what: str, on_store_error: Callable[[str], None] | None = None) -> None:
    """Run ``fn``; a store failure or a bug in it is logged, never raised: coordination
    work must not kill a thread of the fixed budget. Level-triggered repair makes a
    failed task harmless: the next housekeeping pass finds what is still wrong.
    ``on_store_error(what)`` counts a store failure (metrics)."""
    try:
        fn()
    except StoreError as exc:
        log.warning("%s: registry operation failed (repaired by the next pass): %s", what, exc)
        if on_store_error is not None:
            on_store_error(what)
    except Exception:
        log.exception("%s: coordination task failed", what)


class WorkerPool:
    """``size`` daemon threads running submitted callables: FIFO within a key, round
    robin across keys.

    The runtime submits each item of a batch under its job's name. One FIFO for all
    let a job of many items starve the others: a 10,000-item job firing every 15 s
    queued some 3,300 items on each of 3 instances ahead of a small job's next items,
    which then started 5-6 s after their fire, and a run-now part behind them came
    after its bound (600 s ZooKeeper chaos, seed 20261253). Round robin gives each job
    with queued items its turn: a job's items wait for at most one item of each other
    job per free thread, whatever their number."""

    def __init__(self, size: int, name: str) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        #: keys with queued tasks, in the order of their next turn (one deque each)
        self._queues: OrderedDict[str, deque[Task]] = OrderedDict()
        self._queued = 0
        self._closed = False
        self._busy = 0
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{n}", daemon=True)
            for n in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Task, key: str = "") -> bool:
        """Queue ``fn`` under ``key`` (tasks of one key run in the order submitted;
        keys take turns); False (and not queued) once the pool is shut down."""
        with self._lock:
            if self._closed:
                return False
            tasks = self._queues.get(key)
            if tasks is None:
                tasks = self._queues[key] = deque()
            tasks.append(fn)
            self._queued += 1
            self._ready.notify()
            return True

    @property
    def busy(self) -> int:
        """Threads running a task now."""
        with self._lock:
            return self._busy

    @property
    def size(self) -> int:
        """Threads of the pool."""
        return len(self._threads)

    def free(self) -> int:
        """Threads neither running nor about to run a task (queued tasks count)."""
        with self._lock:
            return len(self._threads) - self._busy - self._queued

    def shutdown(self) -> None:
        """Run nothing more that is queued; running tasks finish on their own (the
        threads are daemons, so they never hold the process up)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queues.clear()
            self._queued = 0
            self._ready.notify_all()

    def _take(self) -> Task | None:
        """The next task (the key whose turn it is), or None once shut down."""
        with self._lock:
            while not self._closed and not self._queued:
                self._ready.wait()
            if self._closed:
                return None
            key, tasks = next(iter(self._queues.items()))
            fn = tasks.popleft()
            self._queued -= 1
            if tasks:
                self._queues.move_to_end(key)  # its next task after the other keys' turn
            else:
                del self._queues[key]
            self._busy += 1
            return fn

    def _loop(self) -> None:
        while True:
            fn = self._take()
            if fn is None:
                return
            try:
                fn()
            except BaseException:  # never lose a thread of the budget
                log.exception("task failed on %s", threading.current_thread().name)
            finally:
                with self._lock:
                    self._busy -= 1


@dataclass
class _Lane:
    tasks: OrderedDict[str, Task] = field(default_factory=OrderedDict)
    active: bool = False
    #: the task running now: (monotonic start, thread ident, key, name), else None
    running: tuple[float, int, str, str] | None = None
    #: the start time of the running task once it was reported stalled
    reported: float | None = None


class Lanes:
    """Per-job serial execution on a shared :class:`WorkerPool` (module docstring)."""

    def __init__(
        self, pool: WorkerPool, on_store_error: Callable[[str], None] | None = None
    ) -> None:
        self._pool = pool
        #: told the lane of a task that failed on a store error (counted per job)
        self._on_store_error = on_store_error
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}
        self._seq = 0
        # delayed submissions: (due, seq, lane, key, fn), served by one timer thread
        self._timers: list[tuple[float, int, str, str | None, Task]] = []
        self._tick = itertools.count()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._timer = threading.Thread(target=self._timer_loop, name="sk-lanes-timer", daemon=True)
        self._timer.start()

    def submit_after(self, lane: str, key: str | None, fn: Task, delay: float) -> None:
        """Queue ``fn`` on ``lane`` after ``delay`` seconds (no thread waits for it: a
        bounded wait of one job re-submits itself instead of holding a pool thread)."""
        with self._lock:
            if self._closed:
                return
            heapq.heappush(
                self._timers, (time.monotonic() + max(0.0, delay), next(self._tick), lane, key, fn)
            )
            self._wake.notify()

    def close(self) -> None:
        """Stop the timer; queued tasks are dropped with the pool's shutdown."""
        with self._lock:
            self._closed = True
            self._timers.clear()
            self._wake.notify()

    def _timer_loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (
                    not self._timers or self._timers[0][0] > time.monotonic()
                ):
                    timeout = self._timers[0][0] - time.monotonic() if self._timers else None
                    self._wake.wait(timeout)
                if self._closed:
                    return
                _due, _n, lane, key, fn = heapq.heappop(self._timers)
            self.submit(lane, key, fn)

    def submit(self, lane: str, key: str | None, fn: Task) -> None:
        """Queue ``fn`` on ``lane``. With a ``key`` already queued (not yet running) on
        that lane, the newer task replaces the queued one in its place: the work is
        level-triggered, so running it once with the newest state is enough."""
        with self._lock:
            state = self._lanes.setdefault(lane, _Lane())
            if key is None:
                self._seq += 1
                key = f"#{self._seq}"
            state.tasks[key] = fn
            if state.active:
                return
            state.active = True
        if not self._pool.submit(lambda: self._drain(lane)):
            with self._lock:
                state.active = False
                state.tasks.clear()

    def pending(self, lane: str) -> int:
        """Tasks queued (not running) on ``lane``."""
        with self._lock:
            state = self._lanes.get(lane)
            return len(state.tasks) if state else 0

    def report_stalls(self, after: float = STALL_WARN_AFTER) -> list[str]:
        """Log (WARNING, once per task) each lane whose running task has gone on for
        ``after`` seconds, with what is queued behind it and the stack of the thread
        running it; returns the lanes reported now. Called by housekeeping."""
        now = time.monotonic()
        found: list[tuple[str, float, int, str, str, int]] = []
        with self._lock:
            for lane, state in self._lanes.items():
                if state.running is None:
                    continue
                began, ident, key, name = state.running
                if now - began < after or state.reported == began:
                    continue
                state.reported = began
                found.append((lane, now - began, ident, key, name, len(state.tasks)))
        frames = sys._current_frames() if found else {}
        for lane, age, ident, key, name, queued in found:
            frame = frames.get(ident)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(ended)"
            log.warning(
                "%s: coordination task %s (%s) has run for %.1f s; %d queued behind it "
                "(this job's fires and repairs wait); its thread is at:\n%s",
                lane,
                key,
                name,
                age,
                queued,
                stack.rstrip(),
            )
        return [lane for lane, *_ in found]

    def _drain(self, lane: str) -> None:
        # One task per pool slot, then hand the lane back to the pool: a lane with
        # a long queue must not starve the other lanes of the shared threads.
        with self._lock:
            state = self._lanes[lane]
            if not state.tasks:
                state.active = False
                return
            key, fn = state.tasks.popitem(last=False)
            began = time.monotonic()
            state.running = (began, threading.get_ident(), key, _task_name(fn))
        try:
            guarded(fn, lane, self._on_store_error)
        finally:
            with self._lock:
                state.running = None
                if state.reported == began:
                    state.reported = None
                    log.warning(
                        "%s: coordination task %s ended after %.1f s",
                        lane,
                        key,
                        time.monotonic() - began,
                    )
                more = bool(state.tasks)
                if not more:
                    state.active = False
            if more and not self._pool.submit(lambda: self._drain(lane)):
                with self._lock:
                    state.active = False
                    state.tasks.clear()


def _task_name(fn: Task) -> str:
    """What a task is, for a log line: its qualified name (a lambda names the method
    it was written in)."""
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)
