"""Many jobs due at once: J jobs of 2 items on 3 instances, all firing at the same instants.

Per (store, interval, J) case: three instance processes (``python -m bench.many_jobs
--child URL``, each a real :class:`~shardkeeper.runtime.Runtime`) register the same J
jobs of 2 no-op items on a fresh namespace of the store, every job on the same
epoch-anchored trigger (an interval by default, or the equivalent 6-field cron with
``--trigger cron``), so that all J*2 items are due at the same instants. No faults.
Each execution appends one JSON line (job, item, ``ctx.fire_time``, start,
``ctx.is_misfire``, ``ctx.covers``) to its instance's record file.

After a warm-up (the first fire after the last instance joined that ran every item,
or WARM_TIMEOUT), the parent measures N instants. For every (job, fire, item) of
those instants, *lateness* = start of the run of that fire minus the scheduled fire
time (p50/p99/max). A pair with no run of its own fire is *folded* (a later run's
``ctx.covers`` stands for it, misfire on); a pair neither run nor covered is
*missing*; a pair run or covered more than once is a *duplicate*. The case checks
that every (fire, item) ran exactly once (or was folded into exactly one run) and
says so. *Requests per instant*: the requests the three instances' store clients
sent during the window [first fire - interval/2, last fire + interval/2] (N
intervals long; ``round_trips``), divided by N; next to it the same window as the
server counts it (bench/server_counters.py: ZooKeeper's packets include pings).

Baseline, in the same run: every instance process also runs a plain APScheduler 3
``BackgroundScheduler`` (its defaults: 10 threads) holding its third of the same J*2
callbacks (pair (j, i) in process (2j + i) mod 3) on the same trigger, so both see
the same process and machine load at the same instants (as the jitter case does).
A callback is not handed its scheduled time: it is the last multiple of the
interval, exact while the lateness is below one interval (a wrong guess would show
as a duplicate and a missing pair in the baseline's check).

Only the summaries are kept in the JSON (60,000 pairs a case at the largest size).
``python -m bench --only many_jobs [--quick]`` runs the default sizes; ``python -m
bench.many_jobs --jobs 10 --instants 3`` any sizes (``--help``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from bench.common import (
    BACKENDS,
    BenchContext,
    BenchTimeoutError,
    Servers,
    repo_pythonpath,
    summary,
)
from bench.server_counters import server_requests
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext

__all__ = [
    "INSTANCES",
    "ITEMS",
    "Tally",
    "describe",
    "expected_fires",
    "first_measured_fire",
    "full_fire",
    "run",
    "tally",
]

INSTANCES = 3
ITEMS = 2
#: the full bench's sizes; QUICK takes QUICK_JOBS and QUICK_INSTANTS
JOBS = (50, 200, 1000)
INTERVALS = (5.0, 1.0)
#: instants measured per interval: enough for a p99 that is not the maximum
#: (50 jobs x 2 items x 12 instants = 1,200 pairs at 5 s)
INSTANTS = {5.0: 12, 1.0: 30}
QUICK_JOBS = (50,)
QUICK_INSTANTS = {5.0: 3, 1.0: 6}
#: seconds the instances of one case get to start (1,000 jobs on 3 at once)
START_DEADLINE = 300.0
#: the warm-up waits this long at most for a fire that ran every item
WARM_TIMEOUT = 60.0
#: after the window, runs of its fires (and later runs covering them) are awaited
#: this long at most; what has not run by then is counted missing
DRAIN_TIMEOUT = 60.0
#: fire times are matched at this many decimals (ms): a float through JSON and a
#: datetime round trip is not bit-exact
FIRE_DIGITS = 3

Pair = tuple[int, int, float]


# -- the pure part: what the parent computes from the records ---------------------------


def fire_key(t: float) -> float:
    """A fire time as the records are matched on (rounded to the millisecond)."""
    return round(t, FIRE_DIGITS)


def expected_fires(first: float, interval: float, instants: int) -> list[float]:
    """The ``instants`` fire times from ``first`` on, ``interval`` apart."""
    if instants < 1:
        raise ValueError(f"instants must be at least 1, got {instants!r}")
    return [first + k * interval for k in range(instants)]


def first_measured_fire(now: float, interval: float) -> float:
    """The first epoch-anchored fire at least half an interval after ``now``, so that
    the window's opening sample (half an interval before it) is still ahead."""
    return math.ceil((now + interval / 2) / interval) * interval


def full_fire(records: Iterable[dict[str, Any]], pairs: int, since: float) -> float | None:
    """The earliest fire at or after ``since`` that ran ``pairs`` distinct (job, item)
    pairs (its own runs, not counting covers), or None."""
    seen: dict[float, set[tuple[int, int]]] = {}
    for r in records:
        if r["f"] >= since:
            seen.setdefault(fire_key(r["f"]), set()).add((r["j"], r["i"]))
    done = [f for f, got in seen.items() if len(got) >= pairs]
    return min(done) if done else None


@dataclass
class Tally:
    """What the records say about every expected (job, item, fire) pair."""

    #: expected pairs: jobs x items x instants
    pairs: int
    #: pairs with at least one run of their own fire (a misfire re-run counts: it is
    #: the late run of that fire)
    ran: int
    #: pairs with no run of their own fire
    folded: int
    #: of the folded, those a later run's ``ctx.covers`` stands for
    covered: int
    #: of the folded, those no run stands for
    missing: int
    #: pairs run, or covered, more than once
    duplicates: int
    #: runs of measured fires that were misfire re-runs
    misfire_reruns: int
    #: start minus fire time of the first run of each pair that ran (seconds)
    lateness: list[float] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every pair ran or is covered (nothing left to wait for)."""
        return self.missing == 0

    @property
    def once(self) -> bool:
        """Every pair ran exactly once, or was folded into exactly one run."""
        return self.missing == 0 and self.duplicates == 0

    def verdict(self) -> str:
        """The check, in words."""
        if not self.once:
            return (
                f"CHECK FAILED: {self.missing} (fire, item) pairs never ran nor were "
                f"folded, {self.duplicates} ran more than once"
            )
        if self.folded:
            return f"every (fire, item) ran once or was folded once ({self.folded} folded)"
        return "every (fire, item) ran once"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the counts and the lateness summary (not the raw samples)."""
        return {
            "pairs": self.pairs,
            "ran": self.ran,
            "folded": self.folded,
            "covered": self.covered,
            "missing": self.missing,
            "duplicates": self.duplicates,
            "misfire_reruns": self.misfire_reruns,
            "once": self.once,
            "verdict": self.verdict(),
            "lateness": summary(self.lateness),
        }


def tally(
    records: Iterable[dict[str, Any]], jobs: int, items: int, fires: Sequence[float]
) -> Tally:
    """Match ``records`` (one per run: ``j`` job, ``i`` item, ``f`` fire time, ``s``
    start, optional ``m`` misfire re-run and ``c`` covered fire times) against every
    (job, item, fire) of ``jobs`` x ``items`` x ``fires``; records of other fires are
    ignored, except that their covers count."""
    wanted = {fire_key(f) for f in fires}
    runs: Counter[Pair] = Counter()
    covers: Counter[Pair] = Counter()
    first: dict[Pair, float] = {}
    misfire_reruns = 0
    for r in records:
        job, item = int(r["j"]), int(r["i"])
        if not (0 <= job < jobs and 0 <= item < items):
            continue
        key = (job, item, fire_key(r["f"]))
        if key[2] in wanted:
            runs[key] += 1
            late = r["s"] - r["f"]
            if key not in first or late < first[key]:
                first[key] = late
            if r.get("m"):
                misfire_reruns += 1
        for c in r.get("c", ()):
            ck = fire_key(c)
            if ck in wanted:
                covers[(job, item, ck)] += 1
    expected = [(j, i, f) for j in range(jobs) for i in range(items) for f in sorted(wanted)]
    ran = sum(1 for p in expected if runs[p])
    covered = sum(1 for p in expected if not runs[p] and covers[p])
    folded = len(expected) - ran
    return Tally(
        pairs=len(expected),
        ran=ran,
        folded=folded,
        covered=covered,
        missing=folded - covered,
        duplicates=sum(1 for p in expected if runs[p] + covers[p] > 1),
        misfire_reruns=misfire_reruns,
        lateness=list(first.values()),
    )


def describe(backend: str, case: dict[str, Any]) -> str:
    """One line per case: the row of the table, and the check."""
    if "error" in case:
        return (
            f"  many_jobs {backend} interval={case['interval']:g}s J={case['jobs']}: "
            f"FAILED {case['error']}"
        )
    sk, ap = case["shardkeeper"], case["apscheduler"]
    sl, al = sk["lateness"], ap["lateness"]

    def ms(s: dict[str, float], key: str) -> str:
        return f"{s.get(key, math.nan) * 1000:.1f}"

    return (
        f"  many_jobs {backend} interval={case['interval']:g}s J={case['jobs']} "
        f"({case['instants']} instants): shardkeeper p50/p99/max "
        f"{ms(sl, 'median')}/{ms(sl, 'p99')}/{ms(sl, 'max')} ms, folded "
        f"{sk['folded']}/{sk['pairs']}, {case['requests_per_instant']:.1f} requests/instant "
        f"(server counted {case['server_requests_per_instant']:.1f}); APScheduler p50/p99 "
        f"{ms(al, 'median')}/{ms(al, 'p99')} ms; shardkeeper: {sk['verdict']}; "
        f"APScheduler: {ap['verdict']}"
    )


# -- the instance process ---------------------------------------------------------------


def job_name(n: int) -> str:
    """The name of job ``n``."""
    return f"mj-{n:05d}"


def job_config(n: int, interval: float, trigger: str) -> JobConfig:
    """Job ``n``'s configuration: 2 items on the shared trigger."""
    if trigger == "cron":
        whole = int(interval)
        if whole != interval or whole < 1 or 60 % whole:
            raise ValueError(f"--trigger cron needs a whole divisor of 60 s, got {interval!r}")
        expr = "* * * * * *" if whole == 1 else f"*/{whole} * * * * *"
        return JobConfig.parse(name=job_name(n), cron=expr, sharding_total_count=ITEMS)
    return JobConfig.parse(name=job_name(n), interval=interval, sharding_total_count=ITEMS)


class RecordingJob(ShardedJob):
    """Appends one JSON line per run to a record file; does nothing else.

    One ``os.write`` on an ``O_APPEND`` descriptor per line: the instance's runs, on
    several threads, never interleave within a line.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def execute(self, ctx: ShardingContext) -> None:
        """Record the start first, then what the run stands for."""
        start = time.time()
        rec: dict[str, Any] = {
            "j": int(ctx.job_name.rsplit("-", 1)[1]),
            "i": ctx.item,
            "f": ctx.fire_time.timestamp(),
            "s": start,
        }
        if ctx.is_misfire:
            rec["m"] = True
        if ctx.covers:
            rec["c"] = [t.timestamp() for t in ctx.covers]
        os.write(self._fd, (json.dumps(rec) + "\n").encode())


def _plain_call(fd: int, job: int, item: int, interval: float) -> None:
    """An APScheduler callback: its lateness against the last multiple of the interval."""
    now = time.time()
    fire = math.floor(now / interval) * interval
    line = json.dumps({"j": job, "i": item, "f": fire, "s": now})
    os.write(fd, (line + "\n").encode())


def child(
    url: str,
    jobs: int,
    interval: float,
    trigger: str,
    index: int,
    records: Path,
    plain_records: Path,
) -> int:
    """One instance: J jobs on a Runtime, its third of the J*2 plain callbacks on an
    APScheduler of its own; answers ``COUNT`` on stdin until ``STOP`` or EOF."""
    from apscheduler.schedulers.background import BackgroundScheduler

    from shardkeeper.registry.counting import request_count
    from shardkeeper.runtime import Runtime
    from shardkeeper.scheduling.scheduler import build_trigger

    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    fd = os.open(records, flags, 0o644)
    plain_fd = os.open(plain_records, flags, 0o644)
    rt = Runtime(url)
    job = RecordingJob(fd)
    configs = [job_config(n, interval, trigger) for n in range(jobs)]
    for cfg in configs:
        rt.add_job(job, cfg)
    scheduler = BackgroundScheduler(timezone=ZoneInfo("UTC"), daemon=True)
    plain_trigger = build_trigger(configs[0])
    for n in range(jobs):
        for item in range(ITEMS):
            if (ITEMS * n + item) % INSTANCES != index:
                continue
            # every due fire runs, however late, as in the jitter case: APScheduler's
            # default grace and coalescing would drop fires from the baseline's count
            scheduler.add_job(
                _plain_call,
                trigger=plain_trigger,
                args=(plain_fd, n, item, interval),
                coalesce=False,
                misfire_grace_time=None,
                max_instances=10,
            )
    try:
        rt.start()
    except Exception as exc:  # one line for the parent to read
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 3
    scheduler.start()
    print(f"READY {rt.instance_id} {time.time():.6f}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "COUNT":
            print(f"COUNT {time.time():.6f} {request_count(rt.store)}", flush=True)
        elif command == "STOP":
            break
    os._exit(0)  # the parent kills us anyway; a graceful stop is not measured


# -- the parent -------------------------------------------------------------------------


@dataclass
class Instance:
    """One instance process and what it printed so far."""

    proc: subprocess.Popen[bytes]
    log: Path
    records: Path
    plain_records: Path
    buf: str = ""

    @classmethod
    def start(
        cls, url: str, jobs: int, interval: float, trigger: str, index: int, scratch: Path
    ) -> Instance:
        """Launch instance ``index`` (not waiting for it)."""
        records = scratch / f"sk-{index}.jsonl"
        plain = scratch / f"aps-{index}.jsonl"
        log = scratch / f"child-{index}.log"
        args = [
            *(sys.executable, "-m", "bench.many_jobs", "--child", url),
            *("--jobs", str(jobs), "--interval", str(interval), "--trigger", trigger),
            *("--index", str(index), "--records", str(records), "--plain-records", str(plain)),
        ]
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": repo_pythonpath()},
            )
        return cls(proc, log, records, plain)

    def read_tag(self, tag: str, deadline: float) -> str:
        """The rest of the next line that starts with ``tag`` (bounded by ``deadline``)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while True:
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                if line.startswith("ERROR "):
                    raise RuntimeError(f"many_jobs instance: {line[6:]}")
                if line.startswith(tag):
                    return line[len(tag) :]
            if time.monotonic() >= deadline:
                break
            if select.select([fd], [], [], 0.2)[0]:
                chunk = os.read(fd, 65536).decode(errors="replace")
                if not chunk:  # end of file: the process has exited
                    break
                self.buf += chunk
        raise BenchTimeoutError(
            f"many_jobs instance: no {tag.strip()} line in time (exit {self.proc.poll()}): "
            f"{self.log_tail()}"
        )

    def count(self, timeout: float = 30.0) -> int:
        """The requests its store client has sent so far."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"COUNT\n")
        self.proc.stdin.flush()
        return int(self.read_tag("COUNT ", time.monotonic() + timeout).split()[1])

    def log_tail(self, lines: int = 5) -> str:
        """The end of its stderr, for error messages."""
        with contextlib.suppress(OSError):
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def kill(self) -> None:
        """kill -9 its process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class Tail:
    """The complete JSON lines appended to some files since the last read."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)
        self.offsets = [0] * len(self.paths)
        self.records: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        """Every record so far (new lines appended to :attr:`records`)."""
        for n, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[n])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written waits
            self.offsets[n] += end
            for line in data[:end].splitlines():
                with contextlib.suppress(ValueError):
                    self.records.append(json.loads(line))
        return self.records


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def case(
    ctx: BenchContext,
    backend: str,
    jobs: int,
    interval: float,
    instants: int,
    trigger: str = "interval",
) -> dict[str, Any]:
    """One (store, interval, J) case; the figures of the module doc."""
    cluster = ctx.servers.get(backend)
    url = ctx.url(backend, f"many{jobs}x{interval:g}")
    scratch = ctx.scratch(f"many-jobs-{backend}")
    pairs_per_fire = jobs * ITEMS
    instances: list[Instance] = []
    load_before = os.getloadavg()
    try:
        for k in range(INSTANCES):
            instances.append(Instance.start(url, jobs, interval, trigger, k, scratch))
        deadline = time.monotonic() + START_DEADLINE
        ready_at = max(float(i.read_tag("READY ", deadline).split()[1]) for i in instances)
        sk = Tail([i.records for i in instances])
        plain = Tail([i.plain_records for i in instances])
        # warm: a fire decided after the last join ran every item (the reshards are
        # done), or give up waiting and measure anyway (say so)
        warm_deadline = time.monotonic() + max(WARM_TIMEOUT, 4 * interval)
        warm_fire: float | None = None
        while warm_fire is None and time.monotonic() < warm_deadline:
            warm_fire = full_fire(sk.read(), pairs_per_fire, ready_at)
            if warm_fire is None:
                time.sleep(min(0.5, interval / 2))
        first = first_measured_fire(time.time(), interval)
        fires = expected_fires(first, interval, instants)
        _sleep_until(first - interval / 2)
        server_a = server_requests(cluster)
        counts_a = [i.count() for i in instances]
        _sleep_until(fires[-1] + interval / 2)
        server_b = server_requests(cluster)
        counts_b = [i.count() for i in instances]
        # the runs of the window's fires, and later runs that fold them, may still come
        drain_deadline = time.monotonic() + max(DRAIN_TIMEOUT, 5 * interval)
        while True:
            sk_tally = tally(sk.read(), jobs, ITEMS, fires)
            plain_tally = tally(plain.read(), jobs, ITEMS, fires)
            if sk_tally.complete and plain_tally.complete:
                break
            if time.monotonic() >= drain_deadline:
                break
            time.sleep(min(1.0, interval))
    finally:
        for i in instances:
            i.kill()
    load_after = os.getloadavg()
    # the last lines written before the kill
    sk_tally = tally(sk.read(), jobs, ITEMS, fires)
    plain_tally = tally(plain.read(), jobs, ITEMS, fires)
    requests = sum(counts_b) - sum(counts_a)
    server = server_b - server_a if server_a >= 0 and server_b >= 0 else math.nan
    result: dict[str, Any] = {
        "jobs": jobs,
        "items": ITEMS,
        "instances": INSTANCES,
        "interval": interval,
        "trigger": trigger,
        "instants": instants,
        "first_fire": first,
        "warm_full_fire": warm_fire is not None,
        "requests": requests,
        "requests_per_instant": requests / instants,
        "server_requests_per_instant": server / instants,
        "shardkeeper": sk_tally.as_dict(),
        "apscheduler": {**plain_tally.as_dict(), "processes": INSTANCES},
        "load_before": list(load_before),
        "load_after": list(load_after),
    }
    ctx.log(describe(backend, result))
    if warm_fire is None:
        ctx.log(
            f"    (no fire ran every item within the warm-up; measured from {first:.0f} anyway)"
        )
    return result


def run(
    ctx: BenchContext,
    backend: str,
    *,
    jobs: Sequence[int] | None = None,
    intervals: Sequence[float] | None = None,
    instants: int | None = None,
    trigger: str = "interval",
) -> dict[str, Any]:
    """Every (interval, J) case on ``backend``: JOBS and INTERVALS with INSTANTS each
    (QUICK: QUICK_JOBS, QUICK_INSTANTS); ``instants`` sets the count for every
    interval. A case that fails is recorded and the larger J of its interval skipped."""
    sizes = tuple(jobs) if jobs else (QUICK_JOBS if ctx.quick else JOBS)
    counts = QUICK_INSTANTS if ctx.quick else INSTANTS
    cases: list[dict[str, Any]] = []
    for interval in intervals or INTERVALS:
        n = instants or counts.get(interval) or INSTANTS[1.0]
        failed = False
        for j in sorted(sizes):
            if failed:
                cases.append(
                    {"jobs": j, "interval": interval, "error": "skipped: a smaller J failed"}
                )
                continue
            try:
                cases.append(case(ctx, backend, j, interval, n, trigger))
            except Exception as exc:
                failed = True
                bad = {"jobs": j, "interval": interval, "error": f"{type(exc).__name__}: {exc}"}
                ctx.log(describe(backend, bad))
                cases.append(bad)
    return {"cases": cases, "items": ITEMS, "instances": INSTANCES, "trigger": trigger}


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.many_jobs``: the case alone, any sizes (and the instances'
    entry point, ``--child``)."""
    p = argparse.ArgumentParser(prog="python -m bench.many_jobs", description=__doc__)
    p.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--records", help=argparse.SUPPRESS)
    p.add_argument("--plain-records", help=argparse.SUPPRESS)
    p.add_argument("--jobs", type=int, action="append", help="J (repeatable; default 50 200 1000)")
    p.add_argument(
        "--interval", type=float, action="append", help="seconds (repeatable; default 5 1)"
    )
    p.add_argument("--instants", type=int, help="instants measured (default 12 at 5 s, 30 at 1 s)")
    p.add_argument("--trigger", choices=("interval", "cron"), default="interval")
    p.add_argument("--backend", action="append", choices=list(BACKENDS), help="repeatable")
    p.add_argument("--quick", action="store_true", help="J=50, 3 instants at 5 s, 6 at 1 s")
    p.add_argument("--out", default=".bench/many_jobs.json", help="JSON result file")
    args = p.parse_args(argv)
    if args.child:
        if args.records is None or args.plain_records is None:
            p.error("--child needs --records and --plain-records")
        (interval,) = args.interval or (1.0,)
        return child(
            args.child,
            (args.jobs or [1])[0],
            interval,
            args.trigger,
            args.index,
            Path(args.records),
            Path(args.plain_records),
        )
    if args.instants is not None and args.instants < 1:
        p.error(f"--instants must be at least 1, got {args.instants}")
    if any(j < 1 for j in args.jobs or ()):
        p.error("--jobs must be at least 1")
    if any(not i > 0 for i in args.interval or ()):
        p.error("--interval must be above 0 s")
    from bench.__main__ import environment  # imported here: bench.__main__ imports us

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="shardkeeper-many-jobs-"))
    servers = Servers(workdir / "servers")
    log: Callable[[str], None] = lambda m: print(m, flush=True)  # noqa: E731
    ctx = BenchContext(quick=args.quick, servers=servers, workdir=workdir, log=log)
    doc: dict[str, Any] = {
        "benchmark": "many_jobs",
        "quick": args.quick,
        "environment": environment(),
        "backends": {},
    }
    try:
        for backend in args.backend or list(BACKENDS):
            began = time.monotonic()
            log(f"[many_jobs] {backend} ...")
            doc["backends"][backend] = run(
                ctx,
                backend,
                jobs=args.jobs,
                intervals=args.interval,
                instants=args.instants,
                trigger=args.trigger,
            )
            doc["backends"][backend]["seconds"] = time.monotonic() - began
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, sort_keys=True))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
