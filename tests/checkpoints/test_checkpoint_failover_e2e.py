"""A killed instance's long item resumes elsewhere from its last accepted checkpoint,
across processes on a real store (issue 28 section 1).

Two instances (checkpoint_worker.py) of a one-item job with failover on. The first
run of the item checkpoints a step every 20 ms; once several are accepted, its
instance is killed with SIGKILL (its whole process group: with the process executor,
its worker processes too). The survivor's failover re-run of the same fire starts
with ``ctx.resumed`` and ``ctx.resume_state`` = the last checkpoint the store
accepted, goes on from there, and its completion writes its last state.

The kill may land between the store's acceptance of a checkpoint and the dead run's
``ok`` line for it: the last accepted checkpoint is then the last ``try`` (one step
after the last ``ok``). Anything else (an older state, a newer one never tried) fails.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.coordination.checkpoints import CheckpointDoc, CheckpointReader
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.checkpoints.checkpoint_worker import STEPS

pytestmark = pytest.mark.timeout(120)

WORKER = str(Path(__file__).with_name("checkpoint_worker.py"))
ROOT = Path(__file__).resolve().parents[2]
JOB = "stepping"
#: accepted checkpoints of the long run before the kill
BEFORE_KILL = 5


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    instance_id: str
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
def start_workers(
    registry_url: str, tmp_path: Path
) -> Iterator[Callable[[str], tuple[list[Worker], Path]]]:
    """``start_workers(executor)``: two started instances and their runs file."""
    runs = tmp_path / "runs"
    started: list[Worker] = []

    def start(executor: str) -> Worker:
        errlog = tmp_path / f"worker-{len(started)}"
        err = open(errlog, "w")  # noqa: SIM115 - the child owns it for its lifetime
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
            "SK_TEST_RUNS": str(runs),
            "SK_TEST_HOLD": str(tmp_path / "hold"),
        }
        proc = subprocess.Popen(
            [sys.executable, WORKER, "--url", registry_url, "--job", JOB, "--executor", executor],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,  # its own process group: the kill takes its children
            cwd=ROOT,
            env=env,
        )
        assert proc.stdout is not None
        buf = ""
        deadline = time.monotonic() + 30
        while "READY " not in buf:
            assert time.monotonic() < deadline, f"worker not ready: {errlog.read_text()}"
            assert proc.poll() is None, f"worker ended: {buf}\n{errlog.read_text()}"
            if select.select([proc.stdout.fileno()], [], [], 0.1)[0]:
                buf += os.read(proc.stdout.fileno(), 4096).decode(errors="replace")
        worker = Worker(proc, buf.split("READY ", 1)[1].split()[0], errlog)
        started.append(worker)
        return worker

    def both(executor: str) -> tuple[list[Worker], Path]:
        return [start(executor), start(executor)], runs

    try:
        yield both
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in started:
            try:
                w.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait(10)
            if w.proc.stdout:
                w.proc.stdout.close()


@pytest.mark.parametrize(
    ("backend", "executor"),
    [("zookeeper", "thread"), ("etcd", "thread"), ("zookeeper", "process")],
    ids=["zk-thread", "etcd-thread", "zk-process"],
)
def test_a_killed_instances_item_resumes_from_its_last_accepted_checkpoint(
    start_workers: Callable[[str], tuple[list[Worker], Path]],
    store: CoordinationStore,
    executor: str,
) -> None:
    workers, runs = start_workers(executor)
    by_id = {w.instance_id: w for w in workers}

    def logs() -> str:
        tails = "\n".join(f"== {w.errlog.name}\n{w.errlog.read_text()[-3000:]}" for w in workers)
        return f"{tails}\n== runs\n{lines(runs)[-20:]}"

    def events(event: str, **match: Any) -> list[dict[str, Any]]:
        return [
            r
            for r in lines(runs)
            if r["event"] == event and all(r[k] == v for k, v in match.items())
        ]

    # the long run (the one that tries steps), once it has a few of them stored
    first = wait_until(
        lambda: next(iter(events("try")), None),
        30,
        message=lambda: "the item never ran\n" + logs(),
    )
    mine = {"instance": first["instance"], "execution_id": first["execution_id"]}
    wait_until(
        lambda: len(events("ok", **mine)) >= BEFORE_KILL,
        30,
        message=lambda: "the long run stored no checkpoints\n" + logs(),
    )
    victim = by_id[first["instance"]]
    survivor = next(w for w in workers if w is not victim)
    os.killpg(victim.proc.pid, signal.SIGKILL)  # the instance and its worker processes
    victim.proc.wait(10)

    tried = [r["step"] for r in events("try", **mine)]
    accepted = [r["step"] for r in events("ok", **mine)]
    assert not events("refused", **mine), "the long run was refused before the kill"
    assert accepted == list(range(1, len(accepted) + 1)) and tried[: len(accepted)] == accepted

    # the survivor's re-run of that same fire
    rerun = wait_until(
        lambda: next(
            iter(
                events(
                    "start",
                    instance=survivor.instance_id,
                    execution_id=first["execution_id"],
                )
            ),
            None,
        ),
        40,
        message=lambda: "the survivor never re-ran the fire\n" + logs(),
    )
    assert rerun["failover"] is True and rerun["fire_ms"] == first["fire_ms"]
    assert rerun["token"] > first["token"]
    assert rerun["resumed"] is True, rerun
    last_ok, last_try = accepted[-1], tried[-1]
    if rerun["state"] != last_ok:
        # the kill fell between the store's acceptance of the last try and its line
        assert last_try == last_ok + 1 and rerun["state"] == last_try, (accepted, tried, rerun)

    # it goes on from there, and its completion writes its last state
    resumed = {"instance": survivor.instance_id, "execution_id": first["execution_id"]}
    done = wait_until(
        lambda: next(iter(events("done", **resumed)), None),
        30,
        message=lambda: "the re-run never ended\n" + logs(),
    )
    steps = [r["step"] for r in events("ok", **resumed)]
    assert steps == list(range(rerun["state"] + 1, rerun["state"] + STEPS + 1))
    assert done["state"] == rerun["state"] + STEPS
    reader = CheckpointReader(store, JobPaths(JOB))

    def ended() -> CheckpointDoc | None:
        doc = reader.read(0, first["fire_ms"] / 1000)
        return doc if doc is not None and doc.ended else None

    doc = wait_until(ended, 30, message=lambda: "no last state written\n" + logs())
    assert (doc.state, doc.ended) == (done["state"], "ok")
    assert doc.execution_id == first["execution_id"] and doc.instance == survivor.instance_id
