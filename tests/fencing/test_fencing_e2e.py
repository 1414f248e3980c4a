"""A frozen owner's late write is refused after the take-over, across processes.

Two instances (fenced_worker.py) of a one-item job with failover on, on a real
ZooKeeper, writing to a real database (PostgreSQL, and a SQLite file) through
:func:`shardkeeper.fencing.fenced`. The item's owner is frozen with SIGSTOP mid-item,
before its write; its session expires, the survivor takes the item over and writes
with a newer fencing token (its failover re-run, or its run of the next fire when the
reshard that follows the expiry comes first: the re-run then waits for it). The owner
is then thawed and released: its write, with the older token, comes after the
take-over, as a zombie's does, and the database refuses it; the survivor's row stays.
"""

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
import sqlalchemy as sa

from shardkeeper.fencing import create_fence_table, fence_table
from shardkeeper.testing.faults import wait_until
from tests.fencing.fenced_worker import METADATA, REPORT

pytestmark = pytest.mark.timeout(120)

WORKER = str(Path(__file__).with_name("fenced_worker.py"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    instance_id: str
    runs: Path
    errlog: Path


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` so far (a line being written is skipped)."""
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
def workers(
    registry_url: str, db_url: str, engine: sa.Engine, tmp_path: Path
) -> Iterator[tuple[list[Worker], Path]]:
    """Two started instances, and the release file the item's first run waits for."""
    METADATA.create_all(engine)
    create_fence_table(engine)
    release = tmp_path / "release"
    started: list[Worker] = []

    def start() -> Worker:
        n = len(started)
        runs, errlog = tmp_path / f"runs-{n}", tmp_path / f"worker-{n}"
        err = open(errlog, "w")  # noqa: SIM115 - the child owns it for its lifetime
        args = [sys.executable, WORKER, "--url", registry_url, "--db", db_url]
        proc = subprocess.Popen(
            [*args, "--runs", str(runs), "--release", str(release)],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
        )
        assert proc.stdout is not None
        buf = ""
        deadline = time.monotonic() + 30
        while "READY " not in buf:
            assert time.monotonic() < deadline, f"worker not ready: {errlog.read_text()}"
            assert proc.poll() is None, f"worker ended: {buf}\n{errlog.read_text()}"
            if select.select([proc.stdout.fileno()], [], [], 0.1)[0]:
                buf += os.read(proc.stdout.fileno(), 4096).decode(errors="replace")
        worker = Worker(proc, buf.split("READY ", 1)[1].split()[0], runs, errlog)
        started.append(worker)
        return worker

    try:
        yield [start(), start()], release
    finally:
        release.touch()  # no run left waiting for it
        for w in started:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
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
def test_a_frozen_owners_late_write_is_refused_after_the_take_over(
    workers: tuple[list[Worker], Path], engine: sa.Engine
) -> None:
    (first, second), release = workers
    by_id = {first.instance_id: first, second.instance_id: second}

    def logs() -> str:
        return "\n".join(
            f"== {w.errlog.name}\n{w.errlog.read_text()[-3000:]}\n{lines(w.runs)}"
            for w in (first, second)
        )

    def events(w: Worker, event: str, **match: Any) -> list[dict[str, Any]]:
        return [
            r
            for r in lines(w.runs)
            if r["event"] == event and all(r[k] == v for k, v in match.items())
        ]

    # the owner's run started and waits for the release: freeze it there
    run = wait_until(
        lambda: next((r for w in (first, second) for r in events(w, "start")), None),
        30,
        message=lambda: "the item never ran\n" + logs(),
    )
    owner = by_id[run["instance"]]
    survivor = second if owner is first else first
    owner.proc.send_signal(signal.SIGSTOP)

    # its session expires; the survivor runs the item with a newer token and writes
    taken = wait_until(
        lambda: events(survivor, "write", accepted=True),
        40,
        message=lambda: "no take-over\n" + logs(),
    )[0]
    assert taken["token"] > run["token"], (run, taken)

    # the zombie wakes up and writes with its old token: refused
    owner.proc.send_signal(signal.SIGCONT)
    release.touch()
    late = wait_until(
        lambda: events(owner, "write", token=run["token"]),
        30,
        message=lambda: "the thawed owner never wrote\n" + logs(),
    )[0]
    assert late["accepted"] is False, late
    # refused by the survivor's failover re-run (same fire, newer token) or by its run
    # of a later fire, whichever wrote last
    assert late["error"].startswith("write refused: job 'fenced-report' item 0 is fenced"), late
    assert (
        f"newer than this execution's token {run['token']}:" in late["error"]
        or f"token {run['token']}): its data is newer than this run's" in late["error"]
    ), late

    # the database holds the survivor's write, or a still newer one: never the zombie's
    with engine.connect() as conn:
        row = conn.execute(sa.select(REPORT).where(REPORT.c.item == 0)).one()
        fence = fence_table()
        held = conn.execute(sa.select(fence.c.token).where(fence.c.item == 0)).scalar_one()
    assert row.token >= taken["token"] and row.token != run["token"], (row, taken)
    assert held >= taken["token"], (held, taken)
