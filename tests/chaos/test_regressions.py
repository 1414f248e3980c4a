"""Focused regressions for runtime bugs the chaos checker found (both backends).

The regressions that need a forced interleaving (a failed completion commit, a
graceful stop racing a trigger's start commit) replay it on the MemoryStore's step
hooks: tests/runtime/test_self_repair.py and tests/runtime/test_lifecycle.py.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.coordination.paths import JobPaths
from shardkeeper.testing.faults import wait_until
from tests.jobs.cluster import Cluster

pytestmark = pytest.mark.timeout(120)

JOB = "regress"
P = JobPaths(JOB)


@pytest.fixture
def workers(registry_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(
        url=registry_url,
        workdir=tmp_path,
        defaults={"job": JOB, "interval": 1, "failover": True, "count": 2, "work": 0.3},
    )
    try:
        yield c
    finally:
        for inst in c.instances:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGCONT)
        c.stop()


def test_executions_after_a_new_session_are_not_fenced(workers: Cluster) -> None:
    """An instance frozen past its session timeout re-registers when it wakes. Its
    executions under the NEW session used to be told ctx.is_valid() == False until
    the next housekeeping probe, because the last contact dated from before the
    freeze (nobody had taken those executions over)."""
    frozen, _other = workers.start(), workers.start()

    def own_runs() -> list[dict[str, Any]]:
        return [r for r in workers.records("end") if r["instance"] == frozen.instance_id]

    wait_until(lambda: own_runs(), 20, message=lambda: "never ran\n" + workers.logs())
    frozen.proc.send_signal(signal.SIGSTOP)
    time.sleep(3.5)  # the fault itself: frozen past the 2 s session timeout
    frozen.proc.send_signal(signal.SIGCONT)
    thawed = time.time()

    def fresh() -> list[dict[str, Any]]:
        # executions of triggers that fired after waking: under the new session
        return [r for r in own_runs() if r["fire"] > thawed]

    wait_until(
        lambda: len(fresh()) >= 2, 20, message=lambda: "no runs after waking\n" + workers.logs()
    )
    assert all(r["valid"] is True for r in fresh()), f"{fresh()}\n{workers.logs()}"
