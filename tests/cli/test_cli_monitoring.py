"""What operators see of failures and metrics from the command line: ``status``,
``shards`` and ``job`` with last results and health, and ``run --metrics-port``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import free_ports

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, registry: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m shardkeeper.cli ARGS`` on ``registry`` (wide, for the tables)."""
    env = {**os.environ, "COLUMNS": "250", "SHARDKEEPER_REGISTRY": registry}
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


JOB = "flaky"


@pytest.fixture
def backend() -> str:
    return "zookeeper"


class ItemOneRaises(ShardedJob):
    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise KeyError("order 42 is gone")


@pytest.fixture
def failing(registry_url: str, store: CoordinationStore) -> Iterator[Runtime]:
    rt = Runtime(registry_url, shutdown_grace=1)
    rt.add_job(ItemOneRaises(), JobConfig(name=JOB, interval=0.5, sharding_total_count=2))
    rt.start()
    ops = Operations(store)
    wait_until(lambda: ops.status().jobs[0].health == "failing", 15, 0.05, "not failing")
    try:
        yield rt
    finally:
        rt.stop_now()


def test_status_and_shards_show_the_failure(registry_url: str, failing: Runtime) -> None:
    status = ok(cli("status", registry=registry_url))
    assert "HEALTH" in status and "failing" in status
    shards = ok(cli("shards", JOB, registry=registry_url))
    for column in ("LAST RUN", "DURATION", "LAST OK", "LAST ERROR"):
        assert column in shards
    line = next(x for x in shards.splitlines() if x.strip().startswith("1 "))
    assert "KeyError: 'order 42 is gone'" in line
    job = ok(cli("job", JOB, registry=registry_url))
    assert "health" in job and "failing" in job and "KeyError" in job
    data = as_json(cli("status", "--json", registry=registry_url))
    assert data["jobs"][0]["failing_items"] == [1]


def test_status_says_why_nothing_fires(registry_url: str, failing: Runtime) -> None:
    failing.stop()
    status = ok(cli("status", registry=registry_url))
    line = next(x for x in status.splitlines() if x.startswith(JOB))
    assert "- (no instance)" in line and "no-instance" in line and "stale" not in line


JOBS_MODULE = """
from shardkeeper import JobConfig, ShardedJob

class Flaky(ShardedJob):
    config = JobConfig(name="flaky", interval=0.3, sharding_total_count=2)

    def execute(self, ctx):
        if ctx.item == 1:
            raise KeyError("order 42 is gone")
"""


def test_run_serves_metrics_and_probes(registry_url: str, tmp_path: Path) -> None:
    (tmp_path / "flaky_jobs.py").write_text(JOBS_MODULE)
    (port,) = free_ports(1)
    env = {**os.environ, "SHARDKEEPER_REGISTRY": registry_url}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardkeeper.cli",
            "run",
            "flaky_jobs:Flaky",
            "--grace",
            "1",
            "--metrics-port",
            str(port),
            "--history-url",
            "off",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> httpx.Response | None:
        try:
            return httpx.get(base + path, timeout=5)
        except httpx.TransportError:
            return None  # not listening yet

    try:
        wait_until(lambda: (r := get("/readyz")) is not None and r.status_code == 200, 30, 0.1)

        def failed_count() -> float:
            reply = get("/metrics")
            assert reply is not None
            for family in text_string_to_metric_families(reply.text):
                for s in family.samples:
                    if s.name == "shardkeeper_executions_total" and s.labels == {
                        "job": JOB,
                        "outcome": "failed",
                    }:
                        return s.value
            return 0.0

        wait_until(lambda: failed_count() >= 1, 20, 0.1, "no failed execution counted")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert get("/healthz") is None  # the server stopped with the process
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
