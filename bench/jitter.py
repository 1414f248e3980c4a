"""Trigger jitter: actual start minus scheduled fire time, shardkeeper vs plain APScheduler.

In one process and at the same time, a shardkeeper runtime runs a one-item no-op
job on an interval trigger, and a plain APScheduler 3 ``BackgroundScheduler`` runs
a no-op function on the very same trigger (built by ``build_trigger`` from the
same config: epoch-anchored, so both fire at the same instants). Each records
``time.time()`` at the start of its call minus the scheduled fire time.
shardkeeper's figure includes what happens between the fire and the item: the
hand-off to the coordinator pool, the assignment read and the marking commit.
APScheduler does not pass the scheduled time to the function; with an
epoch-anchored interval it is the last multiple of the interval, which is exact
as long as the lateness is below one interval (it is, by orders of magnitude).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.schedulers.background import BackgroundScheduler

from bench.common import BACKENDS, BenchContext, Servers, summary
from bench.jitter_trace import JitterTrace
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime
from shardkeeper.scheduling.scheduler import build_trigger

INTERVAL = 0.2
#: fires per store of the full bench: enough for a p99 that is not the maximum (the
#: 5th largest of 500); QUICK takes QUICK_FIRES
FULL_FIRES = 500
QUICK_FIRES = 50
#: the start-up stretch left out of the figures (the first reshard): not steady state
WARM_UP = 1.0
#: a fire later than this counts as late in the trace's attribution (ms)
TRACE_LATE_MS = 5.0


class LatenessJob(ShardedJob):
    """Records how late each execution started against its scheduled fire time."""

    def __init__(self, on_start: Callable[[float, float], None] | None = None) -> None:
        self.samples: list[tuple[float, float]] = []  # (fire time, lateness)
        self._lock = threading.Lock()
        self._on_start = on_start

    def execute(self, ctx: ShardingContext) -> None:
        """Record the lateness; do nothing else."""
        now = time.time()
        fire = ctx.fire_time.timestamp()
        with self._lock:
            self.samples.append((fire, now - fire))
        if self._on_start is not None:
            self._on_start(fire, now)


def measure(
    ctx: BenchContext,
    backend: str,
    fires: int,
    interval: float = INTERVAL,
    *,
    trace: bool = False,
) -> dict[str, Any]:
    """Run both side by side until ``fires`` steady-state fires are due (after
    WARM_UP), then compare. ``trace``: record where each late fire waited
    (bench/jitter_trace.py) and the etcd server's disk histograms."""
    if fires < 1:
        raise ValueError(f"fires must be at least 1, got {fires!r}")
    if not interval > 0:
        raise ValueError(f"interval must be above 0 s, got {interval!r}")
    cfg = JobConfig.parse(name="jitter", interval=interval, sharding_total_count=1)
    tracer = JitterTrace() if trace else None
    job = LatenessJob(tracer.started if tracer is not None else None)
    plain: list[tuple[float, float]] = []
    plain_lock = threading.Lock()

    def plain_fn() -> None:
        now = time.time()
        scheduled = math.floor(now / interval) * interval
        with plain_lock:
            plain.append((scheduled, now - scheduled))

    scheduler = BackgroundScheduler(timezone=ZoneInfo("UTC"), daemon=True)
    # Every due fire runs, however late: APScheduler's default misfire grace (1 s) and
    # coalescing would drop fires of a stalled process from the baseline's count (seen:
    # 7 of 10 on a loaded CI machine), and the count must match shardkeeper's.
    scheduler.add_job(
        plain_fn,
        trigger=build_trigger(cfg),
        coalesce=False,
        misfire_grace_time=None,
        max_instances=10,
    )
    url = ctx.url(backend, "jitter")
    rt = Runtime(tracer.store(url) if tracer is not None else url)
    rt.add_job(job, cfg, listeners=[tracer.listener()] if tracer is not None else [])
    duration = WARM_UP + fires * interval + interval / 2
    load_before = os.getloadavg()
    try:
        rt.start()
        if tracer is not None:
            host, port = ctx.servers.get(backend).hosts[0]
            endpoint = f"http://{host}:{port}" if backend == "etcd" else None
            tracer.attach(rt, cfg.name, endpoint)
        scheduler.start()
        began = time.time()
        time.sleep(duration)
    finally:
        scheduler.shutdown(wait=False)
        if tracer is not None:
            tracer.detach()
        rt.stop(grace=1.0)
    load_after = os.getloadavg()
    warm = began + WARM_UP
    sk = [late for fire, late in job.samples if fire >= warm]
    ap = [late for fire, late in plain if fire >= warm]
    sk_sum, ap_sum = summary(sk), summary(ap)
    result: dict[str, Any] = {
        "interval": interval,
        "duration": duration,
        "fires": fires,
        "load_before": list(load_before),
        "load_after": list(load_after),
        "shardkeeper": sk_sum,
        "apscheduler": ap_sum,
        "ratio_p50": sk_sum["median"] / ap_sum["median"] if ap and sk else math.nan,
        "ratio_p99": sk_sum["p99"] / ap_sum["p99"] if ap and sk else math.nan,
        "paired": paired(job.samples, plain, warm),
        "raw_shardkeeper": sk,
        "raw_apscheduler": ap,
    }
    if tracer is not None:
        by_fire = {round(fire, 3): late for fire, late in plain}
        result["trace"] = tracer.summary(TRACE_LATE_MS, by_fire, warm)
    return result


def paired(
    sk: list[tuple[float, float]], plain: list[tuple[float, float]], warm: float
) -> dict[str, Any]:
    """The two jobs fire at the same instants: how many of shardkeeper's fires late
    by more than 5, 10, 25 and 100 ms had the plain job late by at least half as much
    at the same instant (the process or the machine held both), and how many had it
    on time (the wait was shardkeeper's own path)."""
    by_fire = {round(fire, 3): late for fire, late in plain}
    out: dict[str, Any] = {}
    for ms in (5, 10, 25, 100):
        late = [(f, x) for f, x in sk if f >= warm and x * 1000 > ms]
        both = sum(1 for f, x in late if by_fire.get(round(f, 3), 0.0) >= x / 2)
        out[f"over_{ms}ms"] = {"n": len(late), "apscheduler_late_too": both}
    return out


def run(ctx: BenchContext, backend: str) -> dict[str, Any]:
    """QUICK_FIRES (quick) or FULL_FIRES fires per store."""
    result = measure(ctx, backend, QUICK_FIRES if ctx.quick else FULL_FIRES)
    ctx.log(describe(backend, result))
    return result


def describe(backend: str, result: dict[str, Any]) -> str:
    """One line per store: both jobs' p50/p95/p99/max and the load."""

    def ms(s: dict[str, float]) -> str:
        return " / ".join(
            f"{s.get(k, math.nan) * 1000:.1f}" for k in ("median", "p95", "p99", "max")
        )

    sk, ap = result["shardkeeper"], result["apscheduler"]
    load = result.get("load_before", [math.nan])[0], result.get("load_after", [math.nan])[0]
    return (
        f"  jitter {backend}: {sk.get('n', 0)} fires; p50/p95/p99/max ms: shardkeeper "
        f"{ms(sk)}; APScheduler alone {ms(ap)} (load {load[0]:.2f} -> {load[1]:.2f})"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.jitter``: the jitter bench alone, optionally traced."""
    p = argparse.ArgumentParser(prog="python -m bench.jitter", description=__doc__)
    p.add_argument("--fires", type=int, default=FULL_FIRES, help="steady-state fires per store")
    p.add_argument("--backend", action="append", choices=list(BACKENDS), help="repeatable")
    p.add_argument("--trace", action="store_true", help="record where late fires waited")
    p.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="BENCHMARK",
        help="run this benchmark first on the same server, as the full bench does (repeatable)",
    )
    p.add_argument("--quick", action="store_true", help="the --after benchmarks in QUICK mode")
    p.add_argument("--out", default=".bench/jitter-alone.json", help="JSON result file")
    args = p.parse_args(argv)
    if args.fires < 1:
        p.error(f"--fires must be at least 1, got {args.fires}")
    from bench.__main__ import BENCHMARKS  # imported here: bench.__main__ imports us

    unknown = [name for name in args.after if name not in BENCHMARKS or name == "jitter"]
    if unknown:
        p.error(f"--after {unknown[0]!r}: not one of {sorted(set(BENCHMARKS) - {'jitter'})}")
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="shardkeeper-jitter-"))
    servers = Servers(workdir / "servers")
    ctx = BenchContext(quick=args.quick, servers=servers, workdir=workdir)
    results: dict[str, Any] = {}
    try:
        for backend in args.backend or list(BACKENDS):
            for name in args.after:
                print(f"  {name} on {backend} first ...", flush=True)
                BENCHMARKS[name](ctx, backend)
            results[backend] = measure(ctx, backend, args.fires, trace=args.trace)
            print(describe(backend, results[backend]), flush=True)
            trace = results[backend].get("trace")
            if trace is not None:
                print(f"    late fires (> {trace['late_ms']:g} ms) by cause: {trace['causes']}")
                print(f"    server disk: {json.dumps(trace['server_disk'])}")
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"backends": results}, indent=2, sort_keys=True))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
