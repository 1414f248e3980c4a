"""The process executor: items in worker processes (``executor="process"``).

With the thread executor (the default) an item runs in a thread of the instance,
so user code can take the coordination down with it: a segfault in a C extension,
an out-of-memory kill or ``os._exit`` ends the instance and every job on it, an
item past its ``execution_timeout`` can only be abandoned, and CPU-bound Python
competes for the GIL with the store client's heartbeats. With the process executor
the item runs in a child process (runtime/execute/child.py) while the worker thread of the
instance that runs it waits for the child and answers its requests
(``ctx.is_valid()``, ``ctx.should_stop()``, the forwarded context calls); marks,
fencing and completion commits stay in the parent, unchanged.

* Children are started with ``forkserver`` (``spawn`` where there is none), never
  with a fork of the threaded parent. They are reused item after item; at most as
  many exist as items run at once (each busy child has a worker thread waiting on
  it), and idle ones are kept for the next items.
* A child that dies under an item (a signal, ``os._exit``, the OOM killer) makes
  the attempt ``crashed``, with the exit status in :class:`ChildCrashedError`; the
  item is retried per its ``retries`` and the pool starts a new child for the next
  item. The instance and its other items are not affected. An idle child that died
  is replaced before it is handed an item.
* ``execution_timeout`` kills the child (SIGKILL) with its process group: nothing
  of the item runs on, not even a subprocess it started (one it started in a
  session or group of its own escapes). A child that ends for any reason takes its
  group along.
* Whatever else goes wrong on the way (a context or an answer that does not pickle,
  an exception that cannot be rebuilt here) ends the attempt ``failed`` with an
  error that says so; a child whose state is then unknown is killed and replaced.
* A child lives in a process group of its own and leaves the stop signals to the
  instance: a SIGTERM to the whole group or cgroup (a service manager's stop) starts
  the instance's graceful stop and nothing else (runtime/execute/forkguard.py keeps the
  forkserver alive through it). It dies with the instance: within milliseconds of
  its death, by any signal (runtime/execute/childlink.py).
* Each item's context is its own: a call from a thread an item left behind is
  refused once the item has ended, and never reaches the next item.
* ``max_items_per_child`` and ``max_memory_per_child`` (KiB of resident memory after
  an item) retire a child after the item that reaches them, as Celery's worker
  options of the same names do: leaks in user code stay bounded.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from typing import TYPE_CHECKING, Any, Protocol

from shardkeeper import tracing
from shardkeeper._imports import import_object
from shardkeeper.config import JobConfig
from shardkeeper.config.model import EXECUTORS
from shardkeeper.errors import ConfigError, ShardkeeperError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime.execute.attempts import Attempt
from shardkeeper.runtime.execute.batch import CRASHED
from shardkeeper.runtime.execute.child import JobRef, context_fields, serve
from shardkeeper.runtime.execute.procwire import answer, decode, rebuild

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "CRASHED",
    "EXECUTORS",
    "ChildCrashedError",
    "JobNotImportableError",
    "ProcessPool",
    "RunOnce",
    "check_executor",
    "job_ref",
]

log = logging.getLogger(__name__)

#: seconds a retired or killed child is given to end before it is left to the reaper
_JOIN = 5.0
#: seconds a new child may take to start and say it is ready (spawn imports the
#: package and the main module afresh; a main module without the ``__main__`` guard
#: never gets there)
START_TIMEOUT = 60.0


class RunOnce(Protocol):
    """Runs one attempt of an item (``attempts.run_once`` or a pool's)."""

    def __call__(
        self,
        job: ShardedJob,
        ctx: ShardingContext,
        timeout: float | None,
        on_timeout: Callable[[], None],
        span: Span | None = None,
    ) -> Attempt: ...


class ChildCrashedError(ShardkeeperError):
    """The worker process running an item died under it (a signal, ``os._exit``, an
    out-of-memory kill). ``exitcode`` is its exit status: negative for a signal
    (``-11`` is SIGSEGV, ``-9`` SIGKILL), as :mod:`multiprocessing` reports it."""

    def __init__(self, job: str, item: int, exitcode: int | None) -> None:
        self.job = job
        self.item = item
        self.exitcode = exitcode
        super().__init__(
            f"{job}: the worker process of item {item} died ({describe_exit(exitcode)})"
        )


class JobNotImportableError(ConfigError):
    """A job with ``executor="process"`` whose class a worker process cannot import
    (defined in a function, in an interactive session, ...), or whose instance cannot
    be pickled: the child rebuilds the job from its class or its pickle."""


def describe_exit(exitcode: int | None) -> str:
    """``exit status 3``, ``signal 11 (SIGSEGV)``, or ``exit status unknown``."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "?"
        return f"signal {-exitcode} ({name})"
    return f"exit status {exitcode}"


def check_executor(value: str) -> str:
    """``value`` when it names an executor, else a ConfigError listing the valid ones."""
    if value not in EXECUTORS:
        raise ConfigError(f"executor={value!r} is not one of: {', '.join(EXECUTORS)}")
    return value


def job_ref(name: str, job: ShardedJob | type[ShardedJob]) -> JobRef:
    """How a worker process rebuilds ``job``: from its class when given a class (the
    class is called with no argument there), else from the pickled instance. Raises
    :class:`JobNotImportableError` when the class cannot be imported by its path or
    the instance does not pickle: a child could never run it."""
    cls = job if isinstance(job, type) else type(job)
    path = f"{cls.__module__}:{cls.__qualname__}"
    why = ""
    if "<locals>" in cls.__qualname__:
        why = "it is defined inside a function"
    elif cls.__module__ == "__main__" and not getattr(__import__("__main__"), "__file__", None):
        why = "it is defined in an interactive session or a -c script"
    else:
        try:
            found = import_object(path, "job class")
        except ConfigError as exc:
            found, why = None, str(exc)
        if not why and found is not cls:
            why = f"{path} names another object"
    if why:
        raise JobNotImportableError(
            f"job {name!r} runs with executor='process' but its class {path} cannot be "
            f"imported by a worker process: {why}; define it at the top level of a module"
        )
    if isinstance(job, type):
        return JobRef(name, path)
    try:
        pickled = pickle.dumps(job)
    except Exception as exc:
        raise JobNotImportableError(
            f"job {name!r} runs with executor='process' but its instance cannot be pickled "
            f"for a worker process ({type(exc).__name__}: {exc}); pass the class instead "
            "(the worker process calls it with no argument)"
        ) from None
    return JobRef(name, path, pickled)


def _start_context(method: str | None) -> BaseContext:
    if method is None:
        method = (
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        )
    if method not in ("forkserver", "spawn"):
        # a fork of the threaded parent copies locks held by its other threads
        raise ConfigError(f"process_start_method={method!r} is not one of: forkserver, spawn")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # the forkserver imports shardkeeper once: each child starts with it loaded
        # (a few milliseconds a child instead of the package's import time); forkguard
        # keeps it alive through a stop's signals to the whole group (its docstring)
        ctx.set_forkserver_preload(
            ["shardkeeper.runtime.execute.forkguard", "shardkeeper.runtime.execute.child"]
        )
    return ctx


@dataclass
class _Child:
    process: Any  # multiprocessing's Process of the chosen context
    conn: Connection
    #: the process group the child leads (what its items start is in it), else None
    group: int | None = None
    items: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid


@dataclass
class PoolStats:
    """What a pool did since it started (tests and the bench read it)."""

    started: int = 0
    crashed: int = 0
    killed: int = 0
    recycled: int = 0


class ProcessPool:
    """Worker processes for the items of ``executor="process"`` jobs (module
    docstring). ``idle`` children are kept at most; more are started when more items
    run at once and retired when they come back to a full pool."""

    def __init__(
        self,
        idle: int,
        *,
        max_items_per_child: int = 0,
        max_memory_per_child: int = 0,
        start_method: str | None = None,
    ) -> None:
        if max_items_per_child < 0:
            raise ConfigError(f"max_items_per_child={max_items_per_child!r} must be >= 0")
        if max_memory_per_child < 0:
            raise ConfigError(f"max_memory_per_child={max_memory_per_child!r} must be >= 0 KiB")
        self._mp = _start_context(start_method)
        self.start_method = self._mp.get_start_method()
        self._idle_max = max(1, idle)
        self.max_items_per_child = max_items_per_child
        self.max_memory_per_child = max_memory_per_child
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._busy: set[int] = set()
        self._children: dict[int, _Child] = {}
        self._closed = False
        self._seq = 0
        #: item runs handed out (each item's number on its child's pipe)
        self._runs = 0
        self.stats = PoolStats()
        # multiprocessing joins non-daemon children at exit (they are not daemons so
        # that an item may start processes of its own): end them first
        atexit.register(_shutdown_at_exit, weakref.ref(self))

    # -- inspection ---------------------------------------------------------------

    def pids(self) -> list[int]:
        """The process ids of the live children (busy and idle)."""
        with self._lock:
            return [p for c in self._children.values() if (p := c.pid) is not None]

    def busy_pids(self) -> list[int]:
        """The process ids of the children running an item now."""
        with self._lock:
            return [p for c in self._children.values() if id(c) in self._busy and (p := c.pid)]

    # -- children -----------------------------------------------------------------

    def _start_child(self) -> _Child:
        parent_end, child_end = self._mp.Pipe(duplex=True)
        with self._lock:
            self._seq += 1
            n = self._seq
        process = self._mp.Process(  # type: ignore[attr-defined]
            target=serve,
            args=(child_end, self.start_method == "forkserver"),
            name=f"sk-child-{n}",
            daemon=False,
        )
        process.start()
        child_end.close()  # ours closed: the child's EOF is the instance's death
        ready = multiprocessing.connection.wait([parent_end, process.sentinel], START_TIMEOUT)
        hello: Any = None
        if parent_end in ready:
            with contextlib.suppress(Exception):
                hello = parent_end.recv()
        if not (isinstance(hello, tuple) and len(hello) == 3 and hello[0] == "ready"):
            process.kill()
            process.join(_JOIN)
            parent_end.close()
            raise ShardkeeperError(
                f"a worker process did not start ({describe_exit(process.exitcode)}; a "
                "main module that starts the runtime needs the if __name__ == '__main__' "
                "guard)"
            )
        _ready, pid, group = hello
        child = _Child(process, parent_end, group if group == pid else None)
        with self._lock:
            self.stats.started += 1
            self._children[id(child)] = child
        return child

    def _acquire(self) -> _Child:
        """An idle child that lives, else a new one (marked busy). An idle child that
        died (an OOM kill, an operator's kill) is forgotten, not handed the item."""
        while True:
            with self._lock:
                if self._closed:
                    raise ShardkeeperError("the process pool is shut down")
                child = self._idle.pop() if self._idle else None
                if child is None:
                    break
                self._busy.add(id(child))
            if child.process.exitcode is None:
                return child
            pid, code = child.pid, self._gone(child)
            log.info("worker process %s died while idle (%s): replaced", pid, describe_exit(code))
        child = self._start_child()
        with self._lock:
            self._busy.add(id(child))
        return child

    def _hand(self, number: int, payload: bytes) -> _Child:
        """A child that took the order to run item run ``number``. A child whose pipe
        is broken (it died as it was handed the item) is killed and replaced once."""
        for last in (False, True):
            child = self._acquire()
            try:
                child.conn.send(("run", number, payload))
                return child
            except (OSError, ValueError) as exc:
                pid, code = child.pid, self._kill(child)
                if last:
                    raise
                log.info(
                    "worker process %s could not be reached (%s; %s): the item goes to another",
                    pid,
                    exc,
                    describe_exit(code),
                )
        raise AssertionError("not reached")

    def _release(self, child: _Child, rss_kib: int) -> None:
        child.items += 1
        retire = ""
        if self.max_items_per_child and child.items >= self.max_items_per_child:
            retire = f"{child.items} items"
        elif self.max_memory_per_child and rss_kib > self.max_memory_per_child:
            retire = f"{rss_kib} KiB resident"
        with self._lock:
            self._busy.discard(id(child))
            if not retire and not self._closed and len(self._idle) < self._idle_max:
                self._idle.append(child)
                return
            if retire:
                self.stats.recycled += 1
        if retire:
            log.debug("worker process %s retired after %s", child.pid, retire)
        self._retire(child)

    def _retire(self, child: _Child) -> None:
        """Tell an idle child to exit; reaped off this thread."""
        with contextlib.suppress(OSError):
            child.conn.send(("exit",))
        self._forget(child)
        threading.Thread(
            target=self._reap, args=(child,), name="sk-child-reap", daemon=True
        ).start()

    def _reap(self, child: _Child) -> None:
        child.process.join(_JOIN)
        if child.process.is_alive():
            child.process.kill()
            child.process.join(_JOIN)
        _end_group(child)
        child.conn.close()

    def _kill(self, child: _Child) -> int | None:
        """End a child now (SIGKILL), with what its item started; its exit status."""
        _end_group(child)
        with contextlib.suppress(OSError, ValueError):
            child.process.kill()
        return self._gone(child)

    def _gone(self, child: _Child) -> int | None:
        """A child that is ending or ended: reaped and forgotten, what its items
        started ended too; its exit status."""
        child.process.join(_JOIN)
        code: int | None = child.process.exitcode
        _end_group(child)
        self._forget(child)
        child.conn.close()
        return code

    def _forget(self, child: _Child) -> None:
        with self._lock:
            self._busy.discard(id(child))
            self._children.pop(id(child), None)

    def shutdown(self) -> None:
        """Kill every child (busy ones too: their items are fenced by the stop that
        shuts the pool down) and start no more (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            children = list(self._children.values())
            self._idle.clear()
        for child in children:
            _end_group(child)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                child.process.kill()
        for child in children:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                child.process.join(_JOIN)

    # -- running ------------------------------------------------------------------

    def runner(self, ref: JobRef, *, checkpoint_strict: bool = False) -> RunOnce:
        """The ``run_once`` of a job whose items run here (its job object is ``ref``'s
        rebuild in the child, not the instance's); ``checkpoint_strict`` is the job's
        (what a checkpoint of an item that has ended does in the child)."""

        def run_once(
            job: ShardedJob,
            ctx: ShardingContext,
            timeout: float | None,
            on_timeout: Callable[[], None],
            span: Span | None = None,
        ) -> Attempt:
            return self.run(
                ref, ctx, timeout, on_timeout, span, checkpoint_strict=checkpoint_strict
            )

        return run_once

    def run(
        self,
        ref: JobRef,
        ctx: ShardingContext,
        timeout: float | None,
        on_timeout: Callable[[], None],
        span: Span | None = None,
        *,
        checkpoint_strict: bool = False,
    ) -> Attempt:
        """Run ``ctx``'s item once in a child, within ``timeout`` seconds when given,
        under ``span`` (its execution's: its W3C traceparent is made current in the
        child); this thread answers the child's requests meanwhile. Always an
        Attempt: whatever fails on the way ends it ``failed`` (the child killed and
        replaced when its state is not known), ``crashed`` or ``timed_out``."""
        started = time.time()
        try:
            payload = pickle.dumps(
                (ref, context_fields(ctx), tracing.traceparent(span), checkpoint_strict)
            )
        except Exception as exc:
            error = ShardkeeperError(
                f"{ctx.job_name}: item {ctx.item} cannot be sent to a worker process: its "
                f"context does not pickle ({type(exc).__name__}: {exc})"
            )
            log.warning("%s", error)
            return Attempt("failed", started, time.time(), error)
        with self._lock:
            self._runs += 1
            number = self._runs
        for may_retry in (True, False):
            try:
                child = self._hand(number, payload)
            except (OSError, ValueError, ShardkeeperError) as exc:
                # no child could be started or reached: the attempt failed, the
                # instance goes on (the next attempt starts a new child)
                log.warning("%s: item %d: no worker process: %s", ctx.job_name, ctx.item, exc)
                return Attempt("failed", started, time.time(), exc)
            # counted from here: a new child's start (a loaded machine, a spawn) is
            # the pool's time, not the item's
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                return self._converse(
                    child, number, ctx, deadline, timeout, on_timeout, started, may_retry
                )
            except _NotTaken as gone:
                # it died as it was handed the item (an idle child killed just then):
                # no code of the item ran there
                log.info(
                    "worker process %s died before it took item %d (%s): the item goes to another",
                    gone.pid,
                    ctx.item,
                    describe_exit(gone.exitcode),
                )
            except BaseException as exc:  # a bug or a message that does not decode here
                pid, code = child.pid, self._kill(child)
                error = ShardkeeperError(
                    f"{ctx.job_name}: item {ctx.item}: the exchange with its worker process "
                    f"{pid} failed ({type(exc).__name__}: {exc}); the process was killed "
                    f"({describe_exit(code)})"
                )
                error.__cause__ = exc
                log.warning("%s", error)
                return Attempt("failed", started, time.time(), error)
        raise AssertionError("not reached: the second child's death is reported")

    def _converse(
        self,
        child: _Child,
        number: int,
        ctx: ShardingContext,
        deadline: float | None,
        timeout: float | None,
        on_timeout: Callable[[], None],
        started: float,
        may_retry: bool,
    ) -> Attempt:
        """Answer the child's requests until it reports item run ``number`` done, dies
        or runs past ``deadline``. A child that dies before it said it took the item
        raises :class:`_NotTaken` when ``may_retry``."""
        sentinel = child.process.sentinel
        taken = False
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait([child.conn, sentinel], wait)
            if not ready:
                on_timeout()
                code = self._kill(child)
                with self._lock:
                    self.stats.killed += 1
                log.warning(
                    "%s: item %d timed out after %.1fs: its worker process %s was killed (%s)",
                    ctx.job_name,
                    ctx.item,
                    timeout,
                    child.pid,
                    describe_exit(code),
                )
                return Attempt("timed_out", started, time.time())
            if child.conn in ready:
                try:
                    data = child.conn.recv_bytes()
                except (EOFError, OSError):
                    data = None  # the child died (its sentinel says how)
                if data is not None:
                    message = decode(data)
                    if message[0] == "done":
                        return self._done(child, number, message, started)
                    taken = taken or message[:2] == ("taken", number)
                    self._serve(child, number, ctx, message)
                    continue
            # the child ended without reporting the item done
            pid, code = child.pid, self._gone(child)
            if not taken and may_retry:
                raise _NotTaken(pid, code)
            with self._lock:
                self.stats.crashed += 1
            error = ChildCrashedError(ctx.job_name, ctx.item, code)
            log.warning("%s", error)
            return Attempt(CRASHED, started, time.time(), error)

    def _serve(
        self, child: _Child, number: int, ctx: ShardingContext, message: tuple[Any, ...]
    ) -> None:
        kind = message[0]
        if kind == "log":
            record = logging.makeLogRecord(message[1])
            logging.getLogger(record.name).handle(record)
            return
        if kind != "call":
            return
        _kind, item_run, cid, name, packed = message
        if item_run != number:
            # a call of another item run (the child refuses those itself: defence)
            reply: tuple[Any, ...] = ("refused", cid)
        else:
            reply = answer(ctx, cid, name, packed)
        with contextlib.suppress(OSError):  # a child that is gone shows on its sentinel
            child.conn.send(reply)

    def _done(
        self, child: _Child, number: int, message: tuple[Any, ...], started: float
    ) -> Attempt:
        _kind, item_run, outcome, error, rss_kib = message
        if item_run != number:
            raise ShardkeeperError(f"it reported item run {item_run} done, not {number}")
        if outcome == "ok":
            attempt = Attempt("ok", started, time.time())
        else:
            attempt = Attempt("failed", started, time.time(), rebuild(error))
        self._release(child, int(rss_kib))  # last: the child may serve another item now
        return attempt


class _NotTaken(Exception):
    """A child died before it said it took the item (no code of the item ran)."""

    def __init__(self, pid: int | None, exitcode: int | None) -> None:
        super().__init__(pid, exitcode)
        self.pid = pid
        self.exitcode = exitcode


def _end_group(child: _Child) -> None:
    """SIGKILL what is left of the process group a child leads: what its items
    started (with the child when it still runs). The group is the child's own
    (runtime/execute/child.py); its number is not reused while a member lives."""
    if child.group is None:
        return
    with contextlib.suppress(OSError):
        os.killpg(child.group, signal.SIGKILL)


def _shutdown_at_exit(ref: weakref.ref[ProcessPool]) -> None:
    pool = ref()
    if pool is not None:
        pool.shutdown()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (tests)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Executors:
    """The runtime's choice of executor per job: its config's ``executor``, else the
    runtime's ``default``; the :class:`ProcessPool` is started with the first item
    that needs it (a runtime whose jobs all run on threads starts no process)."""

    def __init__(
        self,
        default: str = "thread",
        *,
        idle: int = 8,
        max_items_per_child: int = 0,
        max_memory_per_child: int = 0,
        start_method: str | None = None,
    ) -> None:
        self.default = check_executor(default)
        if max_items_per_child < 0:
            raise ConfigError(f"max_items_per_child={max_items_per_child!r} must be >= 0")
        if max_memory_per_child < 0:
            raise ConfigError(f"max_memory_per_child={max_memory_per_child!r} must be >= 0 KiB")
        if start_method is not None and start_method not in ("forkserver", "spawn"):
            raise ConfigError(
                f"process_start_method={start_method!r} is not one of: forkserver, spawn"
            )
        self._settings = (idle, max_items_per_child, max_memory_per_child, start_method)
        self._lock = threading.Lock()
        self._pool: ProcessPool | None = None
        self._closed = False
        self._jobs: dict[str, ShardedJob | type[ShardedJob]] = {}
        self._refs: dict[str, JobRef] = {}
        self._refused: set[str] = set()

    def executor_of(self, config: JobConfig) -> str:
        """The executor ``config`` (a JobConfig) runs on here."""
        return config.executor or self.default

    def add(self, name: str, job: ShardedJob | type[ShardedJob], config: JobConfig) -> None:
        """Record a job as :meth:`Runtime.add_job` got it; with the process executor,
        check now that a worker process can rebuild it (JobNotImportableError)."""
        self._jobs[name] = job
        if self.executor_of(config) == "process":
            self._refs[name] = job_ref(name, job)

    def select(self, name: str) -> Callable[[JobConfig], RunOnce]:
        """The ``executor`` of the job ``name``'s batches: the run_once of its config
        now (a config edited in the registry may switch executors)."""
        from shardkeeper.runtime.execute.attempts import run_once

        def choose(config: JobConfig) -> RunOnce:
            if self.executor_of(config) != "process":
                return run_once
            ref = self._ref(name)
            pool = self.pool() if ref is not None else None
            if ref is None or pool is None:
                return run_once
            return pool.runner(ref, checkpoint_strict=config.checkpoint_strict)

        return choose

    def _ref(self, name: str) -> JobRef | None:
        ref = self._refs.get(name)
        if ref is not None or name not in self._jobs:
            return ref
        try:
            ref = self._refs[name] = job_ref(name, self._jobs[name])
        except JobNotImportableError as exc:
            if name not in self._refused:
                self._refused.add(name)
                log.warning("%s; its items run on threads", exc)
            return None
        return ref

    def pool(self) -> ProcessPool | None:
        """The process pool, started on first use (None once shut down)."""
        with self._lock:
            if self._closed:
                return None
            if self._pool is None:
                idle, items, memory, method = self._settings
                self._pool = ProcessPool(
                    idle,
                    max_items_per_child=items,
                    max_memory_per_child=memory,
                    start_method=method,
                )
            return self._pool

    @property
    def started_pool(self) -> ProcessPool | None:
        """The pool if it was started (tests, the bench)."""
        return self._pool

    def shutdown(self) -> None:
        """Kill the worker processes; start none any more."""
        with self._lock:
            self._closed = True
            pool = self._pool
        if pool is not None:
            pool.shutdown()
