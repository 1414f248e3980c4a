"""The process executor's worker processes and signals (issue 35 section 3; core review
findings 1 and 8, newcomer review N11).

* A SIGTERM to the instance's whole process group (``kill -TERM -- -PGID``; systemd's
  default stop sends it to every process of the unit) starts the instance's graceful
  stop and nothing else: the forkserver and the worker processes survive it, and a
  running item finishes ``ok`` (the forkserver used to die, and the kernel killed
  every child with it: every running item ``crashed``).
* What an item starts has the default signal dispositions (the child's ignoring of
  SIGTERM/SIGINT used to be inherited across exec: ``terminate()`` did nothing), and
  the execution timeout ends the item's own subprocesses with its worker process.
* A worker process dies with its instance: ``kill -9`` of the instance ends its
  worker and what the item started within a bound (they used to run on,
  unsupervised, until the item returned).

Real processes: the instance is a process of its own (tests/runtime/_procinstance.py)
on a real ZooKeeper.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.job import ShardingContext
from shardkeeper.runtime.execute.procpool import ProcessPool, job_ref
from shardkeeper.testing.faults import wait_until
from tests.runtime._procitems import HangsWithAHelper, TerminatesItsHelper, running

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
_COMMAND = (sys.executable, "-m", "tests.runtime._procinstance")
#: the bound on a worker process outliving its killed instance (seconds)
ORPHAN_BOUND = 5.0


@pytest.fixture
def backend() -> str:
    """A real store: the instance is a process of its own."""
    return "zookeeper"


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _records(directory: Path) -> list[dict[str, Any]]:
    path = directory / "records"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Instance:
    """An instance process (tests/runtime/_procinstance.py) in its own session, so
    that its process group is its own; killed with its group at teardown."""

    def __init__(self, url: str, directory: Path, param: str, grace: float) -> None:
        self.directory = directory
        self.errlog = directory / "stderr"
        with self.errlog.open("w") as err:
            self.proc = subprocess.Popen(
                [*_COMMAND, url, str(directory), param, str(grace)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def log(self) -> str:
        """The tail of the instance's stderr and its records (assertion messages)."""
        return f"{self.errlog.read_text()[-4000:]}\nrecords: {_records(self.directory)}"

    def started(self) -> dict[str, Any]:
        """What the item wrote as it started (its worker's pid, its helper's)."""
        return wait_until(
            lambda: _json(self.directory / "started-0"),
            60,
            message=lambda: "the item never started\n" + self.log(),
        )

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def instances(registry_url: str, tmp_path: Path) -> Iterator[list[Instance]]:
    started: list[Instance] = []
    yield started
    for instance in started:
        instance.end()


def test_a_group_sigterm_lets_the_running_item_finish_ok(
    registry_url: str, instances: list[Instance], tmp_path: Path
) -> None:
    """Finding 1: SIGTERM to the instance's process group (and to its worker process,
    which leads a group of its own) while an item runs; the item is released after
    the signal and must end ok, the instance exit 0."""
    instance = Instance(registry_url, tmp_path, "", grace=30)
    instances.append(instance)
    worker = int(instance.started()["pid"])
    os.killpg(instance.proc.pid, signal.SIGTERM)
    os.kill(worker, signal.SIGTERM)  # and to the worker, as systemd's cgroup-wide stop does
    # the graceful stop has begun (it waits for the item); the worker lives on
    wait_until(
        lambda: "graceful stop" in instance.errlog.read_text(),
        30,
        message=lambda: "no stop began\n" + instance.log(),
    )
    assert running(worker), "the worker process died of the group's SIGTERM\n" + instance.log()
    (tmp_path / "release").write_text("")
    assert instance.proc.wait(60) == 0, instance.log()
    assert [(r["item"], r["outcome"]) for r in _records(tmp_path)] == [(0, "ok")], instance.log()
    assert _json(tmp_path / "finished-0") is not None


def test_a_killed_instance_takes_its_worker_and_the_items_subprocesses_along(
    registry_url: str, instances: list[Instance], tmp_path: Path
) -> None:
    """N11: kill -9 of the instance (not of its group) while a process-executor item
    runs (one that never asks its context anything, with a subprocess of its own):
    both are gone within ORPHAN_BOUND seconds, and the item never finishes."""
    instance = Instance(registry_url, tmp_path, "helper", grace=30)
    instances.append(instance)
    started = instance.started()
    worker, helper = int(started["pid"]), int(started["helper"])
    assert running(worker) and running(helper)
    killed = time.monotonic()
    os.kill(instance.proc.pid, signal.SIGKILL)
    instance.proc.wait(10)
    wait_until(
        lambda: not running(worker) and not running(helper),
        ORPHAN_BOUND,
        message=lambda: (
            f"worker {worker} running: {running(worker)}, its subprocess {helper} "
            f"running: {running(helper)}, {time.monotonic() - killed:.1f} s after the kill"
        ),
    )
    (tmp_path / "release").write_text("")  # an orphan would finish now: none may
    assert not (tmp_path / "finished-0").exists()


def _ctx(tmp_path: Path, job: str) -> ShardingContext:
    return ShardingContext(
        job_name=job,
        item=0,
        item_parameter="",
        sharding_total_count=1,
        job_parameter=str(tmp_path),
        fire_time=datetime.now(UTC),
        instance_id="test",
        execution_id=f"{job}@0#0",
    )


@pytest.fixture
def pool() -> Iterator[ProcessPool]:
    """A pool of one child (forkserver)."""
    made = ProcessPool(1, start_method="forkserver")
    yield made
    made.shutdown()


@pytest.fixture
def spawned() -> Iterator[ProcessPool]:
    """A pool of one child started with spawn (its parent is the instance)."""
    made = ProcessPool(1, start_method="spawn")
    yield made
    made.shutdown()


def test_what_an_item_starts_has_the_default_signal_dispositions(
    pool: ProcessPool, tmp_path: Path
) -> None:
    """Finding 8 (a): an item's subprocess ignores neither SIGTERM nor SIGINT, and
    ``terminate()`` ends it. And a process another library forks from the forkserver
    the pool started (which ignores SIGTERM: forkguard) ends on SIGTERM too."""
    attempt = pool.run(job_ref("terms", TerminatesItsHelper), _ctx(tmp_path, "terms"), 60, _no)
    other = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(60,))
    other.start()
    other.terminate()
    other.join(10)
    assert other.exitcode == -signal.SIGTERM
    helper = _json(tmp_path / "helper")
    assert helper is not None
    ignored = int(str(helper["sigign"]), 16)
    assert not ignored & (1 << (signal.SIGTERM - 1)), f"SigIgn {helper['sigign']}"
    assert not ignored & (1 << (signal.SIGINT - 1)), f"SigIgn {helper['sigign']}"
    assert attempt.outcome == "ok", attempt.error


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_the_execution_timeout_ends_the_items_subprocesses_too(
    method: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Finding 8 (b): a timed-out item's worker process and the subprocess it started
    are both gone once the attempt is ``timed_out``."""
    pool: ProcessPool = request.getfixturevalue("pool" if method == "forkserver" else "spawned")
    attempt = pool.run(job_ref("hangs", HangsWithAHelper), _ctx(tmp_path, "hangs"), 2, _no)
    assert attempt.outcome == "timed_out"
    seen = _json(tmp_path / "hanging")
    assert seen is not None
    worker, helper = int(seen["pid"]), int(seen["helper"])
    wait_until(
        lambda: not running(worker) and not running(helper),
        5,
        message=lambda: f"worker running: {running(worker)}, subprocess: {running(helper)}",
    )


def _no() -> None:
    pass
