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

import math
import threading
import time
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.schedulers.background import BackgroundScheduler

from bench.common import BenchContext, summary
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime
from shardkeeper.scheduling.scheduler import build_trigger

INTERVAL = 0.2


class LatenessJob(ShardedJob):
    """Records how late each execution started against its scheduled fire time."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (fire time, lateness)
        self._lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        """Record the lateness; do nothing else."""
        now = time.time()
        fire = ctx.fire_time.timestamp()
        with self._lock:
            self.samples.append((fire, now - fire))


def measure(
    ctx: BenchContext, backend: str, duration: float, interval: float = INTERVAL
) -> dict[str, Any]:
    """Run both side by side for ``duration`` seconds."""
    cfg = JobConfig.parse(name="jitter", interval=interval, sharding_total_count=1)
    job = LatenessJob()
    plain: list[tuple[float, float]] = []
    plain_lock = threading.Lock()

    def plain_fn() -> None:
        now = time.time()
        scheduled = math.floor(now / interval) * interval
        with plain_lock:
            plain.append((scheduled, now - scheduled))

    scheduler = BackgroundScheduler(timezone=ZoneInfo("UTC"), daemon=True)
    scheduler.add_job(plain_fn, trigger=build_trigger(cfg), coalesce=True, max_instances=10)
    rt = Runtime(ctx.url(backend, "jitter"))
    rt.add_job(job, cfg)
    try:
        rt.start()
        scheduler.start()
        began = time.time()
        time.sleep(duration)
    finally:
        scheduler.shutdown(wait=False)
        rt.stop(grace=1.0)
    # the first second carries start-up (the first reshard): not steady state
    warm = began + 1.0
    sk = [late for fire, late in job.samples if fire >= warm]
    ap = [late for fire, late in plain if fire >= warm]
    return {
        "interval": interval,
        "duration": duration,
        "shardkeeper": summary(sk),
        "apscheduler": summary(ap),
        "ratio_p50": summary(sk)["median"] / summary(ap)["median"] if ap and sk else math.nan,
        "ratio_p99": summary(sk)["p99"] / summary(ap)["p99"] if ap and sk else math.nan,
        "raw_shardkeeper": sk,
        "raw_apscheduler": ap,
    }


def run(ctx: BenchContext, backend: str) -> dict[str, Any]:
    """Jitter over 10 s (quick) or 60 s."""
    result = measure(ctx, backend, 10.0 if ctx.quick else 60.0)
    ctx.log(
        f"  jitter {backend}: shardkeeper p50 {result['shardkeeper']['median'] * 1000:.1f} ms "
        f"p99 {result['shardkeeper']['p99'] * 1000:.1f} ms; APScheduler p50 "
        f"{result['apscheduler']['median'] * 1000:.1f} ms p99 "
        f"{result['apscheduler']['p99'] * 1000:.1f} ms"
    )
    return result
