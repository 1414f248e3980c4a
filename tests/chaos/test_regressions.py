"""Focused regressions for runtime bugs the chaos checker found (both backends)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import OperationTimeoutError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.jobs.cluster import Cluster

pytestmark = pytest.mark.timeout(120)

JOB = "regress"
P = JobPaths(JOB)


class _Recording(ShardedJob):
    def __init__(self) -> None:
        self.runs: list[tuple[float, int]] = []
        self.lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs.append((time.time(), ctx.item))


def test_marks_left_by_a_failed_completion_commit_are_cleared(
    registry_url: str, store: CoordinationStore
) -> None:
    """A completion commit that times out (outcome unknown, as during a store leader
    election) used to leave the running marks for good: every later trigger of those
    items was skipped as "running elsewhere" and every reshard waited for them.
    Housekeeping now retries the conditional delete."""
    job = _Recording()
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(job, JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True))
    with rt:
        runner = rt.runners[JOB]
        real_finish = runner.execution.finish
        failed: list[float] = []

        def finish_once_failing(items: object, token: int) -> list[int]:
            if not failed:
                failed.append(time.time())
                raise OperationTimeoutError("injected: no answer, the outcome is unknown")
            return real_finish(items, token)  # type: ignore[arg-type]

        runner.execution.finish = finish_once_failing  # type: ignore[method-assign]
        wait_until(lambda: failed, 15, message="no completion commit happened")
        # the marks go away without any reshard or session change, so both items
        # run again at later triggers
        wait_until(
            lambda: {i for t, i in job.runs if t > failed[0] + 1.5} == {0, 1},
            10,
            message=lambda: (
                f"items did not run again after the failed commit: {job.runs}; "
                f"marks: {store.children(P.running_root)}"
            ),
        )


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


def test_graceful_stop_waits_for_a_trigger_that_is_marking_its_items(
    registry_url: str, store: CoordinationStore
) -> None:
    """A graceful stop that came while a trigger was writing its running marks used to
    leave the job at once: the leader failed the items over and the taker ran them
    while this instance still did. Now the stop waits for that trigger's batch, and
    the items run while the instance is still a member."""
    present: list[tuple[int, bool]] = []

    class Probe(ShardedJob):
        def execute(self, ctx: ShardingContext) -> None:
            present.append((ctx.item, store.exists(P.instance(ctx.instance_id))))

    rt = Runtime(registry_url, shutdown_grace=10)
    rt.add_job(Probe(), JobConfig(name=JOB, interval=1, sharding_total_count=2, failover=True))
    rt.start()
    stopper: threading.Thread | None = None
    go = threading.Event()
    try:
        runner = rt.runners[JOB]
        real_start = runner.execution.start
        marking = threading.Event()

        def slow_start(*args: Any, **kwargs: Any) -> Any:
            if not marking.is_set():
                marking.set()
                go.wait(10)  # hold the trigger between its checks and its batch
            return real_start(*args, **kwargs)

        runner.execution.start = slow_start  # type: ignore[method-assign]
        wait_until(marking.is_set, 15, message="no trigger marked items")
        stopper = threading.Thread(target=rt.stop, name="test-stop")
        stopper.start()
        # the stop has begun (no new triggers) while the trigger is still held
        wait_until(lambda: runner.running_count() >= 1 and runner.state.stopping, 5)
        go.set()
        stopper.join(30)
        assert not stopper.is_alive(), "stop did not finish"
    finally:
        go.set()
        rt.stop_now()
        if stopper is not None:
            stopper.join(30)
    assert present and all(ok for _, ok in present), present
    assert not store.children(P.failover_queue), "items were failed over during the stop"
