"""A real runtime on ZooKeeper records its executions; ``shardkeeper history`` shows them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.history import HistoryReader, HistoryRecorder
from shardkeeper.history.render import COLUMNS
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

JOB = "flaky"
CLI_TIMEOUT = 60


@pytest.fixture
def backend() -> str:
    return "zookeeper"


class Flaky(ShardedJob):
    """Item 1 always raises; the others succeed."""

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise ValueError(f"item {ctx.item} broke [bold]")


#: a registry URL for commands that only need one to name the history's scope (it is
#: parsed, never connected to)
NOWHERE = "zk://127.0.0.1:1/nowhere"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COLUMNS": "250", "SHARDKEEPER_REGISTRY": NOWHERE}
    full_env.pop("SHARDKEEPER_HISTORY_URL", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=CLI_TIMEOUT,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def json_lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ok(result).splitlines()]


def seen(url: str) -> set[tuple[int, str]]:
    with HistoryReader(url) as reader:
        return {(e.item, e.outcome) for e in reader.executions(JOB, limit=500)}


@pytest.fixture
def recorded(registry_url: str, history_url: str) -> Iterator[str]:
    """A runtime ran ``flaky`` (3 items) until every item has a recorded run; yields
    the history URL once the runtime has stopped and the recorder flushed."""
    recorder = HistoryRecorder(history_url)
    rt = Runtime(
        registry_url,
        worker_threads=4,
        coordinator_threads=2,
        shutdown_grace=1.0,
        observers=[recorder],
    )
    rt.add_job(
        Flaky(),
        JobConfig(name=JOB, interval=0.5, sharding_total_count=3, error_handler="raise"),
    )
    rt.start()
    try:
        want = {(0, "ok"), (1, "failed"), (2, "ok")}
        wait_until(lambda: want <= seen(history_url), 30, message=lambda: str(seen(history_url)))
    finally:
        rt.stop_now()
        assert recorder.close(timeout=30)
    yield history_url


def test_history_shows_ok_and_failed_runs_with_the_error(recorded: str) -> None:
    with HistoryReader(recorded) as reader:
        # a fire during start-up may be skipped (not registered yet): leave those out
        rows = [r for r in reader.executions(JOB, limit=500) if r.outcome != "skipped"]
    assert {r.outcome for r in rows if r.item != 1} == {"ok"}
    failed = [r for r in rows if r.item == 1]
    assert failed and {r.outcome for r in failed} == {"failed"}
    first = failed[0]
    assert (first.error_type, first.error_message) == ("ValueError", "item 1 broke [bold]")
    assert "in execute" in first.traceback
    assert first.traceback.rstrip().endswith("ValueError: item 1 broke [bold]")
    assert first.execution_id.startswith(f"{JOB}@") and first.execution_id.endswith("#1")
    assert first.fencing_token > 0 and first.instance
    assert all(r.ended >= r.started for r in rows)


def test_history_command(recorded: str, registry_url: str) -> None:
    env = {"SHARDKEEPER_HISTORY_URL": recorded, "SHARDKEEPER_REGISTRY": registry_url}
    table = ok(cli("history", JOB, env=env))
    header = table.splitlines()[0].split()
    assert header == list(COLUMNS)
    assert "ValueError: item 1 broke [bold]" in table and " ok " in table

    failed = json_lines(cli("history", JOB, "--failed", "--json", env=env))
    assert failed and {(r["item"], r["outcome"]) for r in failed} == {(1, "failed")}
    assert failed[0]["traceback"].rstrip().endswith("ValueError: item 1 broke [bold]")

    everything = json_lines(cli("history", JOB, "--json", "--limit", "500", env=env))
    assert {r["item"] for r in everything if r["outcome"] == "ok"} == {0, 2}
    assert [r["started"] for r in everything] == sorted(
        (r["started"] for r in everything), reverse=True
    )
    assert len(json_lines(cli("history", JOB, "--json", "--limit", "2", env=env))) == 2
    item0 = json_lines(cli("history", JOB, "--item", "0", "--since", "1h", "--json", env=env))
    assert item0 and {r["item"] for r in item0} == {0}
    instance = everything[0]["instance"]
    assert json_lines(cli("history", JOB, "--instance", "nobody", "--json", env=env)) == []
    assert len(json_lines(cli("history", JOB, "--instance", instance, "--json", env=env))) > 0

    detail = ok(cli("history", JOB, "--execution", failed[0]["execution_id"], env=env))
    assert f"--- {failed[0]['execution_id']}" in detail and "Traceback" in detail
    shown = ok(cli("history", JOB, "--failed", "--show-traceback", "--limit", "1", env=env))
    assert shown.count("Traceback (most recent call last)") == 1

    assert "no executions of 'other' match" in ok(cli("history", "other", env=env))


def test_history_command_bad_input() -> None:
    bad = cli("history", JOB, "--history-url", "mysql://u:hunter2@h/db")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.startswith("error: history_url 'mysql://u:***@h/db'")
    assert "hunter2" not in bad.stderr and "Traceback" not in bad.stderr
    since = cli("history", JOB, "--since", "yesterday", "--history-url", "off")
    assert since.returncode == 2 and "duration 'yesterday' is not valid" in since.stderr
    off = cli("history", JOB, "--history-url", "off")
    assert off.returncode == 2 and "history_url is 'off'" in off.stderr


JOB_MODULE = textwrap.dedent(
    """
    from shardkeeper import JobConfig, ShardedJob

    class Flaky(ShardedJob):
        config = JobConfig(name="flaky", interval=0.5, sharding_total_count=2)

        def execute(self, ctx):
            if ctx.item == 1:
                raise RuntimeError("no luck")
    """
)


def test_run_records_history_and_flushes_at_shutdown(registry_url: str, tmp_path: Path) -> None:
    """``shardkeeper run`` with SHARDKEEPER_HISTORY_URL writes history; SIGTERM flushes
    it and the process exits 0."""
    (tmp_path / "flaky_jobs.py").write_text(JOB_MODULE)
    url = f"sqlite:///{tmp_path / 'run-history.db'}"
    env = {**os.environ, "SHARDKEEPER_REGISTRY": registry_url, "SHARDKEEPER_HISTORY_URL": url}
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardkeeper.cli", "run", "flaky_jobs:Flaky", "--grace", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        want = {(0, "ok"), (1, "failed")}
        wait_until(lambda: want <= seen(url), 60, message=lambda: str(seen(url)))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert "execution history: sqlite:///" in err
    with HistoryReader(url) as reader:
        (row,) = reader.executions(JOB, failed_only=True, limit=1)
    assert (row.error_type, row.error_message) == ("RuntimeError", "no luck")


def test_history_command_on_an_unreachable_database(tmp_path: Path) -> None:
    """A database that does not answer is one error line (exit 1), password hidden;
    a file that is not a database likewise."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    down = cli("history", JOB, "--history-url", f"postgresql://u:hunter2@127.0.0.1:{port}/db")
    assert down.returncode == 1, down.stderr
    lines = down.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: cannot read history from postgresql+psycopg://u:***@127.0.0.1:{port}/db: "
    )
    assert "hunter2" not in down.stderr
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a SQLite database, not at all" * 100)
    bad = cli("history", JOB, "--history-url", f"sqlite:///{junk}")
    assert bad.returncode == 1 and bad.stderr.startswith("error: cannot read history from")


def test_skipped_triggers_are_recorded(
    registry_url: str, history_url: str, store: CoordinationStore
) -> None:
    """A disabled job's fires are skipped: each is a row with outcome skipped, item -1
    (the whole fire) and the reason."""
    recorder = HistoryRecorder(history_url)
    rt = Runtime(registry_url, worker_threads=2, coordinator_threads=2, observers=[recorder])
    rt.add_job(Flaky(), JobConfig(name=JOB, interval=0.5, sharding_total_count=3))
    rt.start()
    try:
        wait_until(lambda: (0, "ok") in seen(history_url), 30)
        Operations(store).disable_job(JOB)

        def disabled_skips() -> bool:
            # a fire skipped for another reason (during start-up, say) may come first
            with HistoryReader(history_url) as reader:
                rows = reader.executions(JOB, limit=500)
            return any(r.error_message == "job disabled" for r in rows)

        wait_until(disabled_skips, 30, message="no skip recorded for the disabled job")
    finally:
        rt.stop_now()
        assert recorder.close(timeout=30)
    with HistoryReader(history_url) as reader:
        rows = reader.executions(JOB, limit=500)
    # (a fire during start-up may also be skipped, for another reason)
    disabled = [r for r in rows if r.error_message == "job disabled"]
    assert disabled and {(r.item, r.outcome) for r in disabled} == {(-1, "skipped")}
    assert all(r.instance == rt.instance_id and r.duration == 0 for r in disabled)
