"""A failover re-run links to the span of the run it replaces, across processes on a
real ZooKeeper: two traced instances (traced_worker.py, each exporting its spans to a
JSON-lines file), the owner of running items killed with SIGKILL, and the survivor's
re-run of each of them carries a span Link to the dead run's item span, whose trace
context only the registry (the running mark, then the failover entry) carried."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

WORKER = str(Path(__file__).with_name("traced_worker.py"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    instance_id: str
    spans: Path
    runs: Path
    errlog: Path


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` so far (a line torn by the kill is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@pytest.fixture
def workers(registry_url: str, tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []

    def start() -> Worker:
        n = len(started)
        spans, runs, errlog = (tmp_path / f"{kind}-{n}" for kind in ("spans", "runs", "worker"))
        err = open(errlog, "w")  # noqa: SIM115 - the child owns it for its lifetime
        args = [sys.executable, WORKER, "--url", registry_url]
        proc = subprocess.Popen(
            [*args, "--spans", str(spans), "--runs", str(runs)],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        buf = ""
        deadline = time.monotonic() + 30
        while "READY " not in buf:
            assert time.monotonic() < deadline, f"worker not ready: {errlog.read_text()}"
            assert proc.poll() is None, f"worker ended: {buf}\n{errlog.read_text()}"
            if select.select([proc.stdout.fileno()], [], [], 0.1)[0]:
                buf += os.read(proc.stdout.fileno(), 4096).decode(errors="replace")
        worker = Worker(proc, buf.split("READY ", 1)[1].split()[0], spans, runs, errlog)
        started.append(worker)
        return worker

    try:
        yield [start(), start()]
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in started:
            try:
                w.proc.wait(20)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(10)
            if w.proc.stdout:
                w.proc.stdout.close()


@pytest.mark.parametrize("backend", ["zookeeper"])
def test_a_killed_owners_item_rerun_elsewhere_links_to_the_dead_run(
    workers: list[Worker],
) -> None:
    victim, survivor = workers

    def logs() -> str:
        return "\n".join(f"== {w.errlog.name}\n{w.errlog.read_text()[-3000:]}" for w in workers)

    dead_runs = wait_until(
        lambda: [r for r in lines(victim.runs) if not r["failover"]],
        30,
        message=lambda: "the victim ran nothing\n" + logs(),
    )
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    dead_runs = [r for r in lines(victim.runs) if not r["failover"]]

    def taken_over() -> dict[str, dict[str, Any]] | None:
        reruns = {
            s["attributes"]["shardkeeper.execution_id"]: s
            for s in lines(survivor.spans)
            if s["name"] == "shardkeeper.item" and s["attributes"]["shardkeeper.run"] == "failover"
        }
        return reruns if all(r["execution_id"] in reruns for r in dead_runs) else None

    reruns = wait_until(
        taken_over, 40, message=lambda: f"not re-run: {dead_runs}\n{lines(survivor.spans)}"
    )
    fires = {s["span_id"]: s for s in lines(victim.spans) if s["name"] == "shardkeeper.fire"}
    for dead in dead_runs:
        rerun = reruns[dead["execution_id"]]
        attributes = rerun["attributes"]
        assert attributes["shardkeeper.instance"] == survivor.instance_id
        assert attributes["shardkeeper.item"] == dead["item"]
        assert attributes["shardkeeper.outcome"] == "ok"
        assert attributes["shardkeeper.fencing_token"] > 0
        # a trace of its own, linked to the dead run's item span
        assert rerun["parent"] is None
        assert rerun["trace_id"] != dead["trace_id"]
        assert {
            "trace_id": dead["trace_id"],
            "span_id": dead["span_id"],
            "attributes": {"shardkeeper.link": "failover"},
        } in rerun["links"], (dead, rerun)
        # the dead run's trace began with its fire's decision (exported before the kill)
        assert any(
            f["trace_id"] == dead["trace_id"]
            and f["attributes"]["shardkeeper.outcome"] == "launched"
            for f in fires.values()
        ), (dead, fires)
