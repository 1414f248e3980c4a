"""``shardkeeper run`` ends on signals even while an ``execute()`` hangs.

Issue 15 item 8: with an item that never returns, the process ignored SIGTERM, a
second SIGTERM and SIGINT (it had already logged "stopped" and left the cluster):
the item's worker thread held the interpreter at exit. Worker threads are daemons
now, and a second signal finishes a graceful stop that waits on a hung item.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardkeeper.coordination.paths import JobPaths, instance_path
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)

HUNG_MODULE = """
import time
from shardkeeper import JobConfig, ShardedJob

class Hung(ShardedJob):
    config = JobConfig(name="hung", interval=0.5, sharding_total_count=1, failover=True)

    def execute(self, ctx):
        print("started", flush=True)
        while True:  # ignores should_stop() and is_valid(): a real hang
            time.sleep(0.1)
"""


def _run(tmp_path: Path, registry_url: str, grace: float) -> subprocess.Popen[str]:
    (tmp_path / "hung_jobs.py").write_text(HUNG_MODULE)
    env = {**os.environ, "SHARDKEEPER_REGISTRY": registry_url}
    return subprocess.Popen(
        [sys.executable, "-m", "shardkeeper.cli", "run", "hung_jobs:Hung", "--grace", str(grace)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _wait_started(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the test timeout
    assert line.strip() == "started", line


def _finish(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.parametrize("signals", [["SIGTERM"], ["SIGTERM", "SIGTERM"], ["SIGINT", "SIGINT"]])
def test_run_exits_while_an_item_hangs(
    registry_url: str, store: CoordinationStore, tmp_path: Path, signals: list[str]
) -> None:
    """One signal: the grace period (1 s) ends the stop; two signals: at once. Either
    way the process exits and its membership is gone."""
    grace = 1.0 if len(signals) == 1 else 60.0
    proc = _run(tmp_path, registry_url, grace)
    try:
        _wait_started(proc)
        members = store.children(JobPaths("hung").instances)
        assert len(members) == 1
        sent = time.monotonic()
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(0.3)  # the fault itself: signals a moment apart, as a person sends them
        code = proc.wait(15)
        took = time.monotonic() - sent
        assert code is not None and took < 15
        wait_until(lambda: not store.exists(instance_path(members[0])), 10)
        assert not store.children(JobPaths("hung").instances)
    finally:
        _finish(proc)
