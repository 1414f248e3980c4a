"""The opt-in trace of the jitter bench: where each late fire waited.

``python -m bench.jitter --trace`` (or ``measure(..., trace=True)``) records, for
every fire of the shardkeeper job, the moments of its path, relative to its due
time:

* ``queued``: the scheduler handed the fire to the runner (``on_trigger``; a
  regular fire comes ``FIRE_LEAD`` early);
* ``step``: the job's lane began deciding it (``TriggerFlow.step``; a gap from
  ``queued`` is other work ahead on the lane, e.g. a repair pass);
* ``launched``: the start commit had returned and the batch was handed on
  (``JobListener.before_job``);
* ``started``: the item began (the lateness itself).

Next to it: every store request the process made (method, thread, duration, and
the runtime module that asked: trigger, repair, housekeeping, ...), the lease
keep-alives of an etcd store, the garbage collector's pauses, the store's log lines
(member moves, watch restores, suspensions) and, on etcd, the server's own disk
histograms (``etcd_disk_wal_fsync_duration_seconds``,
``etcd_disk_backend_commit_duration_seconds``) read from its ``/metrics`` every
``METRICS_EVERY`` seconds, so that a slow commit can be set against the server's
slow fsyncs of the same moment.

The hooks are the bench's own: a subclass of the store class that times the
contract's methods, a wrapper around the runner's ``on_trigger`` and its trigger
flow's ``step`` (instance attributes, set after start), and a job listener. Nothing
of this is in the package: the runtime runs unchanged.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import re
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardkeeper.job import JobListener, ShardingContext
from shardkeeper.registry import open_store
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.url import RegistrySettings
from shardkeeper.runtime import Runtime

__all__ = [
    "DISK_HISTOGRAMS",
    "METRICS_EVERY",
    "FireTrace",
    "JitterTrace",
    "ServerDisk",
    "traced_store",
]

#: the contract's request methods, timed by the traced store
TIMED = (
    "get",
    "exists",
    "children",
    "get_tree",
    "put",
    "create",
    "delete",
    "commit",
    "commit_groups",
)
#: etcd's disk histograms the trace reads (seconds)
DISK_HISTOGRAMS = (
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_disk_backend_commit_duration_seconds",
)
#: seconds between two reads of the server's /metrics
METRICS_EVERY = 0.5
#: the runtime modules a request is attributed to (the innermost one on the stack)
ORIGINS = re.compile(r"shardkeeper[/\\](?:runtime|coordination)(?:[/\\]\w+)?[/\\](\w+)\.py$")
#: modules every request passes through (the commit-health wrapper): not an origin
PASS_THROUGH = frozenset({"commitwatch"})


def _origin() -> str:
    """The innermost runtime/coordination module on the caller's stack (who asked)."""
    frame = sys._getframe(2)
    found: list[str] = []
    while frame is not None and len(found) < 3:
        match = ORIGINS.search(frame.f_code.co_filename)
        if (
            match
            and match.group(1) not in PASS_THROUGH
            and (not found or found[-1] != match.group(1))
        ):
            found.append(match.group(1))
        frame = frame.f_back  # type: ignore[assignment]
    return "/".join(found) or "?"


@dataclass
class Call:
    """One store request: what, from where, when (wall time) and how long."""

    method: str
    thread: str
    origin: str
    began: float
    seconds: float


class CallLog:
    """Every timed store request of the run (appended from any thread)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.keepalives: list[tuple[float, float]] = []  # (began, seconds)
        self._lock = threading.Lock()

    def add(self, call: Call) -> None:
        """Record one request."""
        with self._lock:
            self.calls.append(call)

    def add_keepalive(self, began: float, seconds: float) -> None:
        """Record one lease refresh."""
        with self._lock:
            self.keepalives.append((began, seconds))


def _timed(cls: type, name: str, log: CallLog) -> Callable[..., Any]:
    """``cls``'s override of ``name`` that times the base class's method."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.time()
        t0 = time.perf_counter()
        try:
            return getattr(super(cls, self), name)(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - t0
            if name == "_keep_alive":
                log.add_keepalive(began, seconds)
            else:
                thread = threading.current_thread().name
                log.add(Call(name, thread, _origin(), began, seconds))

    method.__name__ = name
    return method


def traced_store(url: str, log: CallLog) -> CoordinationStore:
    """A store for ``url`` whose requests (and etcd lease keep-alives) go to ``log``."""
    base = type(open_store(url))
    traced = type(f"Traced{base.__name__}", (base,), {})
    # _keep_alive: etcd's lease refresh on the session thread (a private method of
    # the backend, timed here only; absent on ZooKeeper)
    for name in (*TIMED, "_keep_alive"):
        if hasattr(base, name):
            setattr(traced, name, _timed(traced, name, log))
    store: CoordinationStore = traced(RegistrySettings.from_env(url))
    return store


@dataclass
class FireTrace:
    """The moments of one fire's path (wall times; 0: not seen)."""

    fire_time: float
    queued: float = 0.0
    steps: list[float] = field(default_factory=list)
    launched: float = 0.0
    started: float = 0.0


class _Listener(JobListener):
    def __init__(self, on_launch: Callable[[float, float], None]) -> None:
        self._on_launch = on_launch

    def before_job(self, contexts: Sequence[ShardingContext]) -> None:
        now = time.time()
        for ctx in contexts[:1]:
            self._on_launch(ctx.fire_time.timestamp(), now)


class ServerDisk:
    """etcd's disk histograms read from ``/metrics`` every ``METRICS_EVERY`` s."""

    def __init__(self, endpoint: str) -> None:
        self._url = endpoint.rstrip("/") + "/metrics"
        #: (wall time, {histogram: {le: cumulative count}})
        self.samples: list[tuple[float, dict[str, dict[float, float]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-etcd-metrics", daemon=True)

    def read(self) -> dict[str, dict[float, float]]:
        """The histograms' cumulative bucket counts now (``inf`` is the total)."""
        with urllib.request.urlopen(self._url, timeout=2.0) as resp:
            text = resp.read().decode()
        out: dict[str, dict[float, float]] = {name: {} for name in DISK_HISTOGRAMS}
        for line in text.splitlines():
            for name in DISK_HISTOGRAMS:
                if line.startswith(name + "_bucket{"):
                    le = line.split('le="', 1)[1].split('"', 1)[0]
                    out[name][float(le)] = float(line.rsplit(" ", 1)[1])
                elif line.startswith(name + "_sum "):
                    out[name][-1.0] = float(line.rsplit(" ", 1)[1])  # the sum, in s
        return out

    def start(self) -> None:
        """First read now, then every METRICS_EVERY s until :meth:`stop`."""
        self.samples.append((time.time(), self.read()))
        self._thread.start()

    def stop(self) -> None:
        """Last read now."""
        self._stop.set()
        self._thread.join(5.0)
        with contextlib.suppress(OSError):
            self.samples.append((time.time(), self.read()))

    def _loop(self) -> None:
        while not self._stop.wait(METRICS_EVERY):
            with contextlib.suppress(OSError):
                self.samples.append((time.time(), self.read()))

    def slow_between(self, since: float, until: float, name: str, over: float) -> float:
        """How many observations of ``name`` above ``over`` s the server recorded in
        the reads' window around [since, until] (widened to the reads either side)."""
        before = [s for s in self.samples if s[0] <= since]
        after = [s for s in self.samples if s[0] >= until]
        if not before or not after:
            return float("nan")
        return _over(after[0][1][name], over) - _over(before[-1][1][name], over)

    def totals(self) -> dict[str, dict[str, float]]:
        """Per histogram over the whole run: count, sum (s), and the count above
        8, 16, 32, 64, 128 and 256 ms."""
        if len(self.samples) < 2:
            return {}
        first, last = self.samples[0][1], self.samples[-1][1]
        out: dict[str, dict[str, float]] = {}
        for name in DISK_HISTOGRAMS:
            a, b = first[name], last[name]
            row = {
                "count": b.get(float("inf"), 0.0) - a.get(float("inf"), 0.0),
                "sum_s": b.get(-1.0, 0.0) - a.get(-1.0, 0.0),
            }
            for ms in (8, 16, 32, 64, 128, 256):
                row[f"over_{ms}ms"] = _over(b, ms / 1000) - _over(a, ms / 1000)
            out[name] = row
        return out


def _over(buckets: dict[float, float], seconds: float) -> float:
    """Observations above ``seconds`` in cumulative ``buckets``, by the first bucket
    bound at or above it (etcd's bounds double from 1 ms); past the largest finite
    bound, those above that bound (as many at most)."""
    total = buckets.get(float("inf"), 0.0)
    finite = sorted(le for le in buckets if 0 <= le < float("inf"))
    if not finite:
        return 0.0
    above = [le for le in finite if le >= seconds]
    return total - buckets[above[0] if above else finite[-1]]


class JitterTrace:
    """Everything the trace records for one run (module docstring)."""

    def __init__(self) -> None:
        self.calls = CallLog()
        self.fires: dict[float, FireTrace] = {}
        self.gc_pauses: list[tuple[float, float, int]] = []  # (began, seconds, generation)
        self.log_lines: list[tuple[float, str, str]] = []  # (time, logger, message)
        self.disk: ServerDisk | None = None
        self._lock = threading.Lock()
        self._gc_began = 0.0
        self._handler: logging.Handler | None = None
        self._log_was: tuple[int, bool] = (logging.NOTSET, True)

    # -- hooks ------------------------------------------------------------------------

    def store(self, url: str) -> CoordinationStore:
        """The traced store the runtime is to use."""
        return traced_store(url, self.calls)

    def listener(self) -> JobListener:
        """The job listener that records each launch."""
        return _Listener(self._launched)

    def attach(self, rt: Runtime, job_name: str, etcd_endpoint: str | None) -> None:
        """Wrap the started runtime's fire path; start the GC, log and server probes."""
        runner = rt.runners[job_name]
        on_trigger = runner.on_trigger
        step = runner.trigger.step

        def traced_trigger(fire_time: Any) -> None:
            self._fire(fire_time.timestamp()).queued = time.time()
            on_trigger(fire_time)

        def traced_step(fire: Any) -> Any:
            self._fire(fire.fire_time).steps.append(time.time())
            return step(fire)

        runner.on_trigger = traced_trigger  # type: ignore[method-assign]
        runner.trigger.step = traced_step  # type: ignore[method-assign]
        gc.callbacks.append(self._gc)
        self._handler = _Capture(self.log_lines)
        # the store's INFO lines (member moves, watch restores) are kept here, not
        # printed: the bench's own logging shows errors only
        logger = logging.getLogger("shardkeeper")
        self._log_was = (logger.level, logger.propagate)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(self._handler)
        if etcd_endpoint is not None:
            self.disk = ServerDisk(etcd_endpoint)
            self.disk.start()

    def detach(self) -> None:
        """Stop the probes (the runtime is stopped by its owner)."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._gc)
        if self._handler is not None:
            logger = logging.getLogger("shardkeeper")
            logger.removeHandler(self._handler)
            logger.setLevel(self._log_was[0])
            logger.propagate = self._log_was[1]
        if self.disk is not None:
            self.disk.stop()

    def started(self, fire_time: float, at: float) -> None:
        """The job's item of ``fire_time`` began at ``at``."""
        self._fire(fire_time).started = at

    def _fire(self, fire_time: float) -> FireTrace:
        key = round(fire_time, 6)
        with self._lock:
            found = self.fires.get(key)
            if found is None:
                found = self.fires[key] = FireTrace(fire_time)
            return found

    def _launched(self, fire_time: float, at: float) -> None:
        self._fire(fire_time).launched = at

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
            self._gc_wall = time.time()
        elif self._gc_began:
            self.gc_pauses.append(
                (self._gc_wall, time.perf_counter() - self._gc_began, int(info["generation"]))
            )

    _gc_wall = 0.0

    # -- analysis -----------------------------------------------------------------------

    def explain(
        self, late_ms: float, plain: dict[float, float], warm: float
    ) -> list[dict[str, Any]]:
        """One row per fire (after ``warm``) that started more than ``late_ms`` late:
        its moments, the requests that overlapped its decision, what the server's
        disk did meanwhile, GC pauses and log lines near it, and the lateness of the
        plain APScheduler job at the same instant (``plain``: fire time -> lateness)."""
        rows: list[dict[str, Any]] = []
        for ft, fire in sorted(self.fires.items()):
            if ft < warm or not fire.started or (fire.started - ft) * 1000 <= late_ms:
                continue
            since = (fire.queued or ft - 0.05) - 0.005
            until = fire.started
            calls = [
                {
                    "method": c.method,
                    "origin": c.origin,
                    "thread": c.thread,
                    "at_ms": round((c.began - ft) * 1000, 1),
                    "ms": round(c.seconds * 1000, 1),
                }
                for c in self.calls.calls
                if c.began < until and c.began + c.seconds > since
            ]
            row: dict[str, Any] = {
                "fire_time": ft,
                "late_ms": round((fire.started - ft) * 1000, 1),
                "plain_late_ms": _near(plain, ft),
                "queued_ms": _rel(fire.queued, ft),
                "steps_ms": [_rel(s, ft) for s in fire.steps],
                "launched_ms": _rel(fire.launched, ft),
                "calls": calls,
                "keepalives": [
                    {"at_ms": round((b - ft) * 1000, 1), "ms": round(s * 1000, 1)}
                    for b, s in self.calls.keepalives
                    if b < until and b + s > since
                ],
                "gc": [
                    {"at_ms": round((b - ft) * 1000, 1), "ms": round(s * 1000, 1), "gen": g}
                    for b, s, g in self.gc_pauses
                    if b < until and b + s > since
                ],
                "logs": [
                    f"{round((t - ft) * 1000, 1)} ms {name}: {msg}"
                    for t, name, msg in self.log_lines
                    if since - 1.0 <= t <= until
                ],
                "cause": self._cause(fire, ft, plain),
            }
            if self.disk is not None:
                row["server_slow"] = {
                    name.split("_")[2]: self.disk.slow_between(since, until, name, 0.016)
                    for name in DISK_HISTOGRAMS
                }
            rows.append(row)
        return rows

    def _cause(self, fire: FireTrace, ft: float, plain: dict[float, float]) -> str:
        """Which stretch of the path held the fire (the longest of them past due)."""
        if not fire.queued:
            return "not traced"
        if fire.queued > ft:
            return "scheduler delivered it late"
        first_step = fire.steps[0] if fire.steps else 0.0
        if first_step and first_step - fire.queued > 0.01:
            return "lane busy before the decision"
        if fire.launched and fire.launched > ft:
            return "decision (store requests) past due"
        p = _near(plain, ft)
        if p is not None and p > (fire.started - ft) * 1000 / 2:
            return "process or machine (APScheduler late too)"
        return "hand-off after the decision (timer, worker)"

    def summary(self, late_ms: float, plain: dict[float, float], warm: float) -> dict[str, Any]:
        """Counts of late fires by cause, request durations by method and origin,
        keep-alive durations, GC pauses, and the server's disk totals."""
        rows = self.explain(late_ms, plain, warm)
        causes: dict[str, int] = {}
        for row in rows:
            causes[row["cause"]] = causes.get(row["cause"], 0) + 1
        by_kind: dict[str, list[float]] = {}
        for c in self.calls.calls:
            if c.began >= warm:
                by_kind.setdefault(f"{c.method} ({c.origin})", []).append(c.seconds)
        requests = {
            kind: {
                "n": len(xs),
                "p50_ms": round(sorted(xs)[len(xs) // 2] * 1000, 2),
                "max_ms": round(max(xs) * 1000, 2),
                "over_25ms": sum(1 for x in xs if x > 0.025),
            }
            for kind, xs in sorted(by_kind.items())
        }
        keep = [s for b, s in self.calls.keepalives if b >= warm]
        gcs: dict[int, list[float]] = {}
        for b, s, g in self.gc_pauses:
            if b >= warm:
                gcs.setdefault(g, []).append(s)
        return {
            "late_ms": late_ms,
            "late_fires": len(rows),
            "causes": causes,
            "requests": requests,
            "keepalives": {
                "n": len(keep),
                "max_ms": round(max(keep) * 1000, 2) if keep else None,
            },
            "gc": {
                f"generation {g}": {"n": len(xs), "max_ms": round(max(xs) * 1000, 2)}
                for g, xs in sorted(gcs.items())
            },
            "server_disk": self.disk.totals() if self.disk is not None else {},
            "rows": rows,
        }


def _rel(at: float, ft: float) -> float | None:
    return round((at - ft) * 1000, 1) if at else None


def _near(plain: dict[float, float], ft: float) -> float | None:
    """The plain job's lateness (ms) at fire time ``ft`` (same epoch grid)."""
    value = plain.get(round(ft, 3))
    return round(value * 1000, 1) if value is not None else None


class _Capture(logging.Handler):
    def __init__(self, out: list[tuple[float, str, str]]) -> None:
        super().__init__(logging.INFO)
        self._out = out

    def emit(self, record: logging.LogRecord) -> None:
        self._out.append((record.created, record.name, record.getMessage()))
