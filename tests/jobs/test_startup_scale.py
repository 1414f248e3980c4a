"""Many jobs on one instance: a start-up longer than the session timeout loses nothing.

Issue 15 item 1: with 500 jobs x 2 items, start-up took longer than the session
timeout and the freshness clock was only refreshed by the housekeeping thread,
which started after ``start()`` returned: every execution of the start-up was
fenced, the fenced items kept their marks, and hundreds of (job, item) pairs never
ran again with a healthy store. Here 150 jobs x 2 items every 2 s at a 2 s session
(the reduced case of the finding, on both real stores) must all run, again and
again, after start-up. ``SK_STARTUP_JOBS=500 SK_STARTUP_INTERVAL=5
SK_STARTUP_SESSION=4`` runs the finding's full case.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry import RegistrySettings
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

# CPU-heavy: one xdist worker runs all of these, so they never compete with each other
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cpu-heavy")]

JOBS = int(os.environ.get("SK_STARTUP_JOBS", "150"))
INTERVAL = float(os.environ.get("SK_STARTUP_INTERVAL", "2"))
SESSION = float(os.environ.get("SK_STARTUP_SESSION", "2"))


class Tally(ShardedJob):
    """Counts valid executions per (job, item) with their fire times."""

    runs: dict[tuple[str, int], list[float]] = {}
    invalid = 0
    lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            if not ctx.is_valid():
                Tally.invalid += 1
            self.runs.setdefault((ctx.job_name, ctx.item), []).append(ctx.fire_time.timestamp())


def test_every_item_of_every_job_runs_after_a_long_start_up(registry_url: str) -> None:
    """Every (job, item) runs at fires after start-up, none is left fenced."""
    Tally.runs = {}
    Tally.invalid = 0
    settings = RegistrySettings.from_url(registry_url).model_copy(
        update={"session_timeout": SESSION}
    )
    rt = Runtime(settings, shutdown_grace=2)
    interval = INTERVAL
    for n in range(JOBS):
        rt.add_job(
            Tally(),
            JobConfig(
                name=f"job-{n:04d}",
                interval=interval,
                sharding_total_count=2,
                failover=True,
                misfire=True,
            ),
        )
    t0 = time.monotonic()
    rt.start()
    started = time.time()
    try:
        took = time.monotonic() - t0
        pairs = {(f"job-{n:04d}", i) for n in range(JOBS) for i in range(2)}

        def missing() -> set[tuple[str, int]]:
            with Tally.lock:
                return {p for p in pairs if not any(ft > started for ft in Tally.runs.get(p, []))}

        wait_until(
            lambda: not missing(),
            60,
            message=lambda: (
                f"{len(missing())} of {len(pairs)} pairs never ran after a "
                f"{took:.1f}s start-up, e.g. {sorted(missing())[:5]}"
            ),
        )
        # and they keep running: each pair again at a fire 2 intervals later
        later = time.time() + 2 * interval
        wait_until(
            lambda: all(any(ft > later for ft in Tally.runs.get(p, [])) for p in pairs),
            60,
            message=lambda: "pairs stopped running after their first run",
        )
        fenced = sum(r.stats["fenced"] for r in rt.runners.values())
        print(f"\n{JOBS} jobs: start-up {took:.1f}s, fenced {fenced}, invalid {Tally.invalid}")
    finally:
        rt.stop_now()
