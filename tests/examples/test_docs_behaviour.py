"""What the docs say about behaviour users see is what happens.

Each test names the doc statement it holds to: the getting-started snippet runs as a
script beside ``shardkeeper run`` of the same class, intervals are anchored at the
Unix epoch, the ``raise`` error handler's real effect, ``before_all`` is not a
barrier, a job file is ignored (with a warning) once the job is stored, and
the docs agree about where ``max_time_diff_seconds`` is enforced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardkeeper import ClusterOnceListener, JobConfig, Runtime, ShardedJob, ShardingContext
from shardkeeper.errors import JobLookupError
from shardkeeper.ops import Operations
from shardkeeper.scheduling.triggers import build_trigger
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: fires only when triggered


def _doc(name: str) -> str:
    return (DOCS / name).read_text()


# -- getting started: the snippet is a correct program -----------------------------------


def _getting_started_snippet() -> str:
    text = _doc("getting-started.md")
    match = re.search(
        r"This is `examples/simple_job.py` in short.*?```python\n(.*?)```", text, re.S
    )
    assert match, "no python block after 'This is `examples/simple_job.py` in short'"
    return match.group(1)


@contextlib.contextmanager
def _program(
    cmd: list[str], cwd: Path, output: Path, url: str
) -> Iterator[subprocess.Popen[bytes]]:
    with output.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "SHARDKEEPER_REGISTRY": url},
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.mark.parametrize("backend", ["zookeeper"])
def test_getting_started_snippet_runs_beside_the_cli(registry_url: str, tmp_path: Path) -> None:
    """The snippet as a script and ``shardkeeper run`` of the same class share the
    job (no JobConflictError), both on the URL of ``$SHARDKEEPER_REGISTRY``."""
    code = _getting_started_snippet()
    assert "2181" not in code, "the snippet must take the URL from the environment"
    (tmp_path / "city_report.py").write_text(code)
    script_out, cli_out = tmp_path / "script.txt", tmp_path / "cli.txt"
    cli_cmd = [sys.executable, "-m", "shardkeeper.cli", "run", "examples.simple_job:CityReport"]
    with (
        _program([sys.executable, "city_report.py"], tmp_path, script_out, registry_url) as script,
        _program([*cli_cmd, "--grace", "5"], ROOT, cli_out, registry_url) as cli,
        Operations.connect(registry_url) as ops,
    ):

        def members() -> int:
            try:
                return len(ops.instances("city-report"))
            except JobLookupError:  # neither program has registered the job yet
                return 0

        def outputs() -> str:
            return f"script:\n{script_out.read_text()}\ncli:\n{cli_out.read_text()}"

        wait_until(
            lambda: script.poll() is None and cli.poll() is None and members() == 2,
            30,
            message=lambda: f"both programs run city-report; {outputs()}",
        )
        ops.trigger("city-report")
        wait_until(
            lambda: "city=" in script_out.read_text() and "city=" in cli_out.read_text(),
            30,
            message=lambda: f"both programs ran items; {outputs()}",
        )
        for proc in (script, cli):
            proc.send_signal(signal.SIGTERM)
        assert script.wait(30) == 0 and cli.wait(30) == 0, outputs()
    assert "Traceback" not in script_out.read_text() + cli_out.read_text()


# -- interval anchoring -------------------------------------------------------------------


@pytest.mark.parametrize("interval", [7, 60, 0.5])
def test_intervals_are_anchored_at_the_unix_epoch(interval: float) -> None:
    """configuration.md: fire times are the multiples of the interval since the epoch,
    the first one the next multiple (sooner than one interval after start)."""
    assert "anchored at the Unix epoch" in _doc("configuration.md")
    trigger = build_trigger(JobConfig(name="anchor", interval=interval, sharding_total_count=1))
    now = datetime.now(UTC)
    first = trigger.get_next_fire_time(None, now)
    assert now <= first < datetime.fromtimestamp(now.timestamp() + interval, UTC)
    ticks = first.timestamp() / interval
    assert abs(ticks - round(ticks)) < 1e-6, f"{first} is not a multiple of {interval} s"


# -- jobs in process on an in-process store --------------------------------------------------


class Failing(ShardedJob):
    """Raises on every item."""

    def __init__(self) -> None:
        self.runs = 0

    def execute(self, ctx: ShardingContext) -> None:
        self.runs += 1
        raise RuntimeError("boom")


@pytest.mark.parametrize("backend", ["memory"])
def test_raise_handler_logs_one_line_and_the_job_keeps_firing(
    registry_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """configuration.md, `raise`: the runtime catches the re-raised exception, logs one
    ERROR line without the traceback, and the job keeps firing."""
    assert "error handler raised" in _doc("configuration.md")
    caplog.set_level(logging.ERROR, logger="shardkeeper.runtime.fire.batches")
    job = Failing()
    config = JobConfig(name="raiser", interval=0.2, sharding_total_count=1, error_handler="raise")
    runtime = Runtime(registry_url, worker_threads=2, shutdown_grace=2.0)
    runtime.add_job(job, config)
    with runtime:
        wait_until(lambda: job.runs >= 3, 20, message="the job fired again after failures")
    lines = [r for r in caplog.records if "error handler raised" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.ERROR and r.exc_info is None for r in lines)
    assert "raiser: item 0 failed (boom); error handler raised: RuntimeError('boom')" in (
        lines[0].getMessage()
    )


class HeldBeforeAll(ClusterOnceListener):
    """``before_all`` waits until the test releases it."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        self.entered, self.release = entered, release

    def before_all(self, fire_time: datetime) -> None:
        self.entered.set()
        self.release.wait(30)


@pytest.mark.parametrize("backend", ["memory"])
def test_before_all_is_not_a_barrier(registry_url: str) -> None:
    """concepts.md: while ``before_all`` runs on one instance, the other instance's
    items do not wait for it."""
    assert "**not a barrier**" in _doc("concepts.md")
    entered, release = threading.Event(), threading.Event()
    config = JobConfig(name="once", cron=NEVER, sharding_total_count=2)
    runtimes, jobs = [], []
    for _ in range(2):
        job = RecordingJob()
        runtime = Runtime(registry_url, worker_threads=2, shutdown_grace=2.0)
        runtime.add_job(job, config, listeners=[HeldBeforeAll(entered, release)])
        runtimes.append(runtime)
        jobs.append(job)
    try:
        for runtime in runtimes:
            runtime.start()
        with Operations.connect(registry_url) as ops:
            wait_until(lambda: len(ops.instances("once")) == 2, 20, message="2 instances")
            ops.trigger("once")
        wait_until(entered.is_set, 20, message="before_all was called")
        # one instance is held inside before_all; the other one's item finishes anyway
        wait_until(
            lambda: any(job.runs for job in jobs),
            20,
            message=lambda: f"no item ran while before_all was held: {[j.items() for j in jobs]}",
        )
        assert not release.is_set()
        release.set()
        wait_until(lambda: sorted(jobs[0].items() + jobs[1].items()) == [0, 1], 20)
    finally:
        release.set()
        for runtime in runtimes:
            runtime.stop()


@pytest.mark.parametrize("backend", ["memory"])
def test_a_stored_job_wins_over_a_changed_job_file_with_a_warning(
    registry_url: str, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """configuration.md, "Who writes the stored config" 2: once a job is stored, an
    edited job file is ignored without ``overwrite``, and the instance says so."""
    assert "editing `examples/jobs.yaml` and\n   restarting does NOT change it" in _doc(
        "configuration.md"
    )
    first = JobConfig(name="filed", cron=NEVER, sharding_total_count=2)
    edited = first.model_copy(update={"sharding_total_count": 3, "description": "edited"})
    caplog.set_level(logging.WARNING, logger="shardkeeper.coordination.config_service")
    for config in (first, edited):
        runtime = Runtime(registry_url, worker_threads=2, shutdown_grace=1.0)
        runtime.add_job(RecordingJob(), config)
        with runtime:
            pass
    with Operations.connect(registry_url) as ops:
        stored = ops.stored_config("filed").config
    assert stored is not None and stored.sharding_total_count == 2
    warnings = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "differs in description, sharding_total_count" in warnings[0]
    assert "shardkeeper config set|replace" in warnings[0]


# -- ElasticJob parity lists agree ---------------------------------------------------------


def test_max_time_diff_seconds_is_listed_where_it_is_enforced() -> None:
    """The clock-skew check is enforced (tests/runtime/test_clock_skew_stores.py):
    configuration.md points to its rule in failover.md, and comparison.md lists it
    under what is better, no longer under what is missing."""
    assert "failover.md#clock-skew" in _doc("configuration.md")
    assert "\n## Clock skew\n" in _doc("failover.md")
    comparison = _doc("comparison.md")
    better = comparison.split("## What is better", 1)[1].split("\n## ", 1)[0]
    missing = comparison.split("## What is missing", 1)[1]
    assert "max_time_diff_seconds" in better
    assert "max_time_diff_seconds" not in missing


def test_no_example_hard_codes_the_local_registry_port() -> None:
    """``registry up`` picks a free port: the examples take the URL it prints."""
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert "127.0.0.1:2181" not in path.read_text(), path.name
