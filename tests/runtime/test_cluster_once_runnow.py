"""ClusterOnceListener and run-now requests: the request is the trigger the owners share.

Each owner runs its part of a run-now request at its own clock's time (its own fire
time, for the fence's ordering), so a cluster-once marker named after the fire time
was a different marker on each owner: ``before_all`` ran on every instance of the
request (two instances each held in it, no item ran: the docs test of "not a
barrier"). The marker is the request's now; a scheduled fire's stays its fire time.
"""

from __future__ import annotations

import threading
from datetime import datetime

import pytest

from shardkeeper import ClusterOnceListener, JobConfig, Runtime
from shardkeeper.ops import Operations
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: fires only when triggered
JOB = "once-rn"


class Counting(ClusterOnceListener):
    """Counts the cluster-once calls of every instance it is given to."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.before: list[datetime] = []
        self.after: list[datetime] = []

    def before_all(self, fire_time: datetime) -> None:
        with self.lock:
            self.before.append(fire_time)

    def after_all(self, fire_time: datetime) -> None:
        with self.lock:
            self.after.append(fire_time)


@pytest.mark.parametrize("backend", ["memory"])
def test_before_all_runs_once_per_run_now_request(registry_url: str) -> None:
    """Two instances, one item each, two run-now requests: ``before_all`` is called
    once per request across both instances (twice per request before), ``after_all``
    at most once per request."""
    listener = Counting()
    config = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2)
    jobs = [RecordingJob(), RecordingJob()]
    runtimes = [Runtime(registry_url, worker_threads=2, shutdown_grace=2.0) for _ in jobs]
    for runtime, job in zip(runtimes, jobs, strict=True):
        runtime.add_job(job, config, listeners=[listener])
    try:
        for runtime in runtimes:
            runtime.start()
        with Operations.connect(registry_url) as ops:
            wait_until(lambda: len(ops.instances(JOB)) == 2, 20, message="2 instances")
            for n in (1, 2):
                ops.trigger(JOB)

                def ran(n: int = n) -> bool:
                    return sorted(jobs[0].items() + jobs[1].items()) == sorted([0, 1] * n)

                wait_until(ran, 20, message=lambda: f"runs: {[j.items() for j in jobs]}")
                # each instance decided before_all before its item ran
                assert all(job.items() for job in jobs), "one instance ran both items"
                with listener.lock:
                    assert len(listener.before) == n, listener.before
    finally:
        for runtime in runtimes:
            runtime.stop()
    with listener.lock:
        assert len(listener.before) == 2 and len(listener.after) <= 2, (
            listener.before,
            listener.after,
        )
