"""max_time_diff_seconds on the real stores: an instance whose clock is shifted past the
limit runs no items, says so (health, readiness, metric, log), its items run on the
other instance, and it comes back once the shift is removed.

The shift is injected through ``Runtime(wall_clock=...)``: the clock the check reads,
not the system clock (the triggers keep the system clock, so the fires themselves stay
aligned and the test isolates the check and the leader's rule)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths, clock_path
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.job.jobstate import SkipReason
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "skewed-job"
P = JobPaths(JOB)
ITEMS = 4
LIMIT = 2
SHIFT = 30.0


class ShiftedClock:
    """``time.time()`` plus a shift the test sets (the instance's clock as seen by the
    clock-skew check)."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.time() + self.shift


class Timed(ShardedJob):
    """Records (start time on the system clock, item) of each execution."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[float, int]] = []

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs.append((time.time(), ctx.item))

    def items_since(self, t: float) -> set[int]:
        with self.lock:
            return {item for at, item in self.runs if at >= t}

    def started_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for at, _ in self.runs if at >= t)


def _config(limit: int = LIMIT) -> JobConfig:
    return JobConfig(
        name=JOB,
        interval=0.5,
        sharding_total_count=ITEMS,
        failover=True,
        max_time_diff_seconds=limit,
    )


@pytest.fixture
def pair(registry_url: str) -> Iterator[tuple[Runtime, Timed, Runtime, Timed, ShiftedClock]]:
    steady_job, shifted_job, clock = Timed(), Timed(), ShiftedClock()
    steady = Runtime(registry_url, worker_threads=4, shutdown_grace=1.0)
    steady.add_job(steady_job, _config())
    shifted = Runtime(registry_url, worker_threads=4, shutdown_grace=1.0, wall_clock=clock)
    shifted.add_job(shifted_job, _config())
    steady.start()
    try:
        shifted.start()
        try:
            yield steady, steady_job, shifted, shifted_job, clock
        finally:
            shifted.stop_now()
    finally:
        steady.stop_now()


def test_a_skewed_instance_runs_nothing_its_items_run_elsewhere_and_it_comes_back(
    pair: tuple[Runtime, Timed, Runtime, Timed, ShiftedClock],
    registry_url: str,
    store: CoordinationStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    steady, steady_job, shifted, shifted_job, clock = pair
    assert steady.clock is not None and shifted.clock is not None
    monitor = shifted.clock  # a name: the narrowing above does not reach into lambdas
    # both in sync: both run items, and both published a small offset
    t0 = time.time()
    wait_until(
        lambda: steady_job.items_since(t0) and shifted_job.items_since(t0),
        30,
        message="both instances run items",
    )
    sample = shifted.clock.sample
    assert sample is not None and abs(sample.offset) <= sample.error + 0.5, sample
    assert store.exists(clock_path(shifted.instance_id))

    # the shifted instance's clock runs SHIFT seconds ahead; measured on the cadence
    shifted.clock.every = 0.3
    caplog.set_level(logging.ERROR, logger="shardkeeper.runtime.clockskew")
    clock.shift = SHIFT
    runner = shifted.runners[JOB]
    wait_until(lambda: JOB in monitor.skewed, 20, message="the shift was not seen")
    skewed_at = time.time()
    assert runner.state.skip_reason() is SkipReason.CLOCK_SKEW
    # the error names the limit and the measured offset (about -SHIFT: the sample's
    # own bound is up to half a second on a loaded machine, so -29.5 is as right as -30)
    named = [
        float(m.group(1))
        for r in caplog.records
        if "max_time_diff_seconds=2" in r.getMessage()
        and (m := re.search(r"off the store's by ([-+]?\d+\.\d+) s", r.getMessage()))
    ]
    assert named and all(v == pytest.approx(-SHIFT, abs=1.5) for v in named), [
        r.getMessage() for r in caplog.records
    ]
    offset = shifted.clock.sample.offset if shifted.clock.sample else 0.0
    assert offset == pytest.approx(-SHIFT, abs=1.5)
    # the mark is committed right after the flag is set (the flag refuses at once)
    wait_until(lambda: store.exists(P.skewed(shifted.instance_id)), 10, message="no mark")

    # the health state, readiness and the metric say so
    with Operations.connect(registry_url) as ops:
        views = {v.instance_id: v for v in ops.instances()}
    view = views[shifted.instance_id]
    assert view.health == "clock_skew" and view.clock_skewed == [JOB]
    assert view.clock_offset is not None and view.clock_offset == pytest.approx(-SHIFT, abs=1.5)
    assert views[steady.instance_id].health == "ok"
    _cli_and_console_show_it(registry_url, store, shifted.instance_id)
    from shardkeeper.metrics import RuntimeMetrics
    from shardkeeper.metrics_http import readiness

    assert any("max_time_diff_seconds=2" in why for why in readiness(shifted))
    assert not any("max_time_diff_seconds" in why for why in readiness(steady))
    from prometheus_client import generate_latest

    text = generate_latest(RuntimeMetrics(shifted).registry).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("shardkeeper_clock_offset_seconds"))
    assert float(line.split()[-1]) == pytest.approx(-SHIFT, abs=1.5)
    assert f'shardkeeper_clock_skewed{{job="{JOB}"}} 1.0' in text

    # every item runs on the steady instance; the skewed one starts nothing
    wait_until(
        lambda: steady_job.items_since(time.time() - 0.6) == set(range(ITEMS)),
        30,
        message="the steady instance never ran every item",
    )
    grace = 0.6  # a batch whose start commit was in flight when the flag was set
    assert shifted_job.started_since(skewed_at + grace) == 0
    assert not shifted.runners[JOB].leader.is_leader

    # the shift removed: back within the limit, items again
    clock.shift = 0.0
    wait_until(lambda: JOB not in monitor.skewed, 20, message="it did not come back")
    back = time.time()
    assert not store.exists(P.skewed(shifted.instance_id))
    wait_until(lambda: shifted_job.items_since(back), 30, message="no items after it came back")
    with Operations.connect(registry_url) as ops:
        view = {v.instance_id: v for v in ops.instances()}[shifted.instance_id]
    assert view.health == "ok" and view.clock_skewed == []


def test_a_skewed_instance_at_start_never_gets_items(registry_url: str) -> None:
    """Measured before it joins: an instance started skewed is left out from its first
    assignment, and the other runs every item."""
    steady_job, shifted_job, clock = Timed(), Timed(), ShiftedClock()
    clock.shift = -SHIFT  # behind the store
    steady = Runtime(registry_url, worker_threads=4, shutdown_grace=1.0)
    steady.add_job(steady_job, _config())
    shifted = Runtime(registry_url, worker_threads=4, shutdown_grace=1.0, wall_clock=clock)
    shifted.add_job(shifted_job, _config())
    with steady, shifted:
        assert shifted.clock is not None and JOB in shifted.clock.skewed
        t0 = time.time()
        wait_until(
            lambda: steady_job.items_since(t0) == set(range(ITEMS)),
            30,
            message="the steady instance never ran every item",
        )
        assert shifted_job.started_since(0) == 0
        sample = shifted.clock.sample
        assert sample is not None and sample.offset == pytest.approx(SHIFT, abs=1.5)


def _cli_and_console_show_it(registry_url: str, store: CoordinationStore, skewed: str) -> None:
    """``shardkeeper instances`` and the console's instance view show the offset and
    the skew."""
    import os
    import subprocess
    import sys

    from fastapi.testclient import TestClient

    from shardkeeper.console import AuthConfig, create_app

    env = {**os.environ, "COLUMNS": "300", "SHARDKEEPER_REGISTRY": registry_url}
    result = subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", "instances"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "CLOCK OFFSET" in result.stdout
    row = next(ln for ln in result.stdout.splitlines() if skewed in ln)
    shown = re.search(r"([+-]\d+\.\d+)s ±(\d+\.\d+) SKEWED \(" + JOB + r"\)", row)
    assert shown, row
    assert float(shown.group(1)) == pytest.approx(-SHIFT, abs=1.5)
    auth = AuthConfig()
    auth.add_user("bob", "viewer", password="bob-password-1")
    app = create_app(Operations(store), auth, refresh_seconds=0)
    with TestClient(app) as client:
        form = client.get("/login").text
        match = re.search(r'name="csrf" value="([^"]+)"', form)
        assert match, "no CSRF token on the login page"
        client.post(
            "/login",
            data={"username": "bob", "password": "bob-password-1", "csrf": match.group(1)},
        )
        page = client.get("/instances")
    assert page.status_code == 200
    assert "Clock offset" in page.text and f"clock skew: {JOB}" in page.text
    row_html = page.text.split(f'<tr id="instance-{skewed}">', 1)[1].split("</tr>", 1)[0]
    cell = re.search(r'<td class="clock">([+-]\d+\.\d+) s ±', row_html)
    assert cell and float(cell.group(1)) == pytest.approx(-SHIFT, abs=1.5), row_html
    assert f"clock skew: {JOB}" in row_html
