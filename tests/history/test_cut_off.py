"""The history of a run cut off by ``kill -9`` (newcomer review N12): two real instance
processes on etcd record into one SQLite history; the owner of the only item is
killed mid-run, after a checkpoint. Then the history holds

* a row for the cut-off attempt: outcome ``crashed``, on the dead instance, recorded
  by the instance that found its orphaned mark (``reported_by``, the new leader);
* the failover row of the survivor, naming the instance it took over from and the
  checkpoint it resumed from (number, writer, state);

and ``shardkeeper history`` shows both (``--json``: lists and nulls, never a string
standing for nothing). Before, the cut-off attempt left no row at all and the
failover row said only ``failover``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkeeper.history import HistoryEntry, HistoryReader
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until
from tests.history.test_end_to_end import cli, json_lines, ok

pytestmark = pytest.mark.timeout(120)

JOB = "cut"

WORKER = textwrap.dedent(
    """
    import sys, time
    from shardkeeper.config import JobConfig
    from shardkeeper.history import HistoryRecorder
    from shardkeeper.job import ShardedJob
    from shardkeeper.runtime import Runtime

    class Steps(ShardedJob):
        # six steps of 0.4 s, a checkpoint after each; resumes where it stopped
        def execute(self, ctx):
            state = ctx.resume_state or {"next": 0}
            step = state["next"]
            print(f"START {ctx.is_failover} {step}", flush=True)
            while step < 6:
                time.sleep(0.4)
                step += 1
                ctx.checkpoint({"next": step})
                print(f"STEP {step}", flush=True)
            print("DONE", flush=True)

    url, history = sys.argv[1], sys.argv[2]
    recorder = HistoryRecorder(history)
    rt = Runtime(url, shutdown_grace=1.0, observers=[recorder])
    rt.add_job(Steps(), JobConfig(
        name="cut", cron="0 0 1 1 *", sharding_total_count=1, failover=True,
        checkpoint_interval=0,
    ))
    rt.start()
    print(f"READY {rt.instance_id}", flush=True)
    rt.run_forever(install_signal_handlers=True)
    recorder.close(timeout=10)
    """
)


@pytest.fixture
def backend() -> str:
    return "etcd"


class Proc:
    def __init__(self, script: Path, url: str, history: str, out: Path) -> None:
        self.out = out
        self.handle = out.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), url, history],
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        wait_until(lambda: "READY " in self.text() or self.proc.poll() is not None, 30)
        assert self.proc.poll() is None, self.text()
        self.instance_id = self.text().split("READY ", 1)[1].split()[0]

    def text(self) -> str:
        return self.out.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.handle.close()


@pytest.fixture
def procs(tmp_path: Path, registry_url: str) -> Iterator[list[Proc]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    history = f"sqlite:///{tmp_path / 'history.db'}"
    started = [Proc(script, registry_url, history, tmp_path / f"out-{n}.txt") for n in range(2)]
    yield started
    for p in started:
        p.stop()


def rows(history: str) -> list[HistoryEntry]:
    with HistoryReader(history) as reader:
        return [r for r in reader.executions(JOB, limit=100) if r.outcome != "skipped"]


def test_a_killed_run_has_a_row_and_the_failover_row_says_whence(
    procs: list[Proc], tmp_path: Path, registry_url: str, store: CoordinationStore
) -> None:
    history = f"sqlite:///{tmp_path / 'history.db'}"
    ops = Operations(store)
    wait_until(lambda: ops.job(JOB).leader and len(ops.job(JOB).instances) == 2, 30)
    ops.trigger(JOB)
    # the owner runs the item; kill it once it has checkpointed step 2
    wait_until(lambda: any("STEP 2" in p.text() for p in procs), 30, message="no step 2")
    dead = next(p for p in procs if "STEP 2" in p.text())
    survivor = next(p for p in procs if p is not dead)
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait(10)
    wait_until(lambda: "DONE" in survivor.text(), 40, message=lambda: survivor.text())
    assert "START True 2" in survivor.text() or "START True 3" in survivor.text()

    def both() -> bool:
        outcomes = {r.outcome for r in rows(history)}
        return {"crashed", "ok"} <= outcomes

    wait_until(both, 30, message=lambda: str(rows(history)))
    found = rows(history)
    cut = next(r for r in found if r.outcome == "crashed")
    assert cut.instance == dead.instance_id
    assert cut.reported_by == survivor.instance_id
    assert dead.instance_id in cut.error_message and "failover" in cut.error_message
    again = next(r for r in found if r.outcome == "ok")
    assert again.failover and again.instance == survivor.instance_id
    assert again.execution_id == cut.execution_id
    assert again.taken_over_from == dead.instance_id
    assert again.resumed_from.startswith("checkpoint ")
    assert f"of {dead.instance_id}" in again.resumed_from and '"next"' in again.resumed_from
    assert cut.started <= cut.ended <= again.started + 5

    # the command line shows both, and --json has lists and nulls
    env = {"SHARDKEEPER_HISTORY_URL": history, "SHARDKEEPER_REGISTRY": registry_url}
    table = ok(cli("history", JOB, env=env))
    assert f"taken over from {dead.instance_id}" in table
    assert "resumed from checkpoint" in table and "crashed" in table
    assert f"reported by {survivor.instance_id}" in table
    lines = {r["outcome"]: r for r in json_lines(cli("history", JOB, "--json", env=env))}
    assert lines["ok"]["covers"] == [] and lines["ok"]["progress"] is None
    assert lines["ok"]["taken_over_from"] == dead.instance_id
    assert lines["crashed"]["reported_by"] == survivor.instance_id
    assert lines["crashed"]["taken_over_from"] is None
    failed = json_lines(cli("history", JOB, "--failed", "--json", env=env))
    assert [r["outcome"] for r in failed] == ["crashed"]
