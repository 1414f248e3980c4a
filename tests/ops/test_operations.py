"""The operations API against real stores and real in-process runtimes (both backends).

Every test runs one or two :class:`Runtime` instances with a tiny job on a cron that
never fires during a test (1 January, midnight), so that every execution is one the
test asked for through :meth:`Operations.trigger`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import FailoverEntry
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import (
    ConfigError,
    InstanceLookupError,
    JobConfigError,
    JobLookupError,
    OperationRefusedError,
)
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.fire import fires
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

JOB = "tiny"
NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: no spontaneous fire during a test


class TinyJob(ShardedJob):
    """Records each execution; blocks while ``gate`` is clear."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran: list[tuple[int, str]] = []
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.ran.append((ctx.item, ctx.instance_id))
        self.gate.wait(15)

    def items(self) -> list[int]:
        with self.lock:
            return sorted(i for i, _ in self.ran)

    def reset(self) -> None:
        with self.lock:
            self.ran.clear()


def tiny_config(**changes: object) -> JobConfig:
    base: dict[str, object] = {
        "name": JOB,
        "cron": NEVER,
        "sharding_total_count": 4,
        "sharding_item_parameters": "0=a,1=b",
        "sharding_wait_timeout": 5.0,
        "execution_wait_timeout": 5.0,
    }
    return JobConfig.parse(**{**base, **changes})


Start = Callable[..., tuple[Runtime, TinyJob]]


@pytest.fixture
def start(registry_url: str) -> Iterator[Start]:
    """``start(labels=None, **config changes)`` -> a started runtime and its job."""
    runtimes: list[Runtime] = []

    def factory(labels: dict[str, str] | None = None, **changes: object) -> tuple[Runtime, TinyJob]:
        job = TinyJob()
        rt = Runtime(
            registry_url,
            worker_threads=4,
            coordinator_threads=2,
            shutdown_grace=2.0,
            labels=labels,
        )
        rt.add_job(job, tiny_config(**changes))
        runtimes.append(rt)
        rt.start()
        return rt, job

    yield factory
    for rt in runtimes:
        rt.stop_now()


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


def owners(ops: Operations) -> dict[int, str | None]:
    return {i.item: i.owner for i in ops.job(JOB).items}


def wait_leader(ops: Operations) -> str:
    return wait_until(lambda: ops.job(JOB).leader, message="no leader elected")


def run_once(ops: Operations, *jobs: TinyJob, count: int = 4) -> None:
    """Trigger every instance and wait until ``count`` items ran and no mark is left."""
    for job in jobs:
        job.reset()
    ops.trigger(JOB)
    wait_until(
        lambda: sum(len(j.items()) for j in jobs) >= count,
        message=lambda: f"items ran: {[j.items() for j in jobs]}",
    )
    wait_until(
        lambda: all(i.running_on is None for i in ops.job(JOB).items),
        message="running marks were not cleared",
    )


def test_jobs_summary_and_detail(ops: Operations, start: Start) -> None:
    rt, job = start()
    wait_leader(ops)
    [summary] = ops.jobs()
    assert summary.name == JOB
    assert summary.instances == [rt.instance_id]
    assert summary.leader == rt.instance_id
    assert summary.enabled and not summary.failover
    assert summary.sharding_total_count == 4
    assert summary.trigger == f"cron {NEVER!r} (UTC)"
    assert summary.next_fire is not None and summary.next_fire > datetime.now(UTC)
    assert summary.to_dict()["next_fire"].endswith("+00:00")

    detail = ops.job(JOB)
    assert detail.reshard_pending  # the join set the flag; no trigger yet
    assert detail.assignment_generation is None

    run_once(ops, job)
    assert job.items() == [0, 1, 2, 3]
    detail = ops.job(JOB)
    assert not detail.reshard_pending and detail.reshard_reason is None
    assert detail.assignment_generation == 1
    assert [i.owner for i in detail.items] == [rt.instance_id] * 4
    assert [i.parameter for i in detail.items] == ["a", "b", "", ""]
    assert detail.config["sharding_total_count"] == 4
    assert detail.config["job_class"].endswith(":TinyJob")
    data = detail.to_dict()
    assert set(data["items"][0]) == {
        "item",
        "parameter",
        "owner",
        "running_on",
        "execution_id",
        "fire_time",
        "running_as_failover",
        "failover_queued",
        "failover_from",
        "misfire",
        "misfire_fire_time",
        "disabled",
        "last_run",
        "last_duration",
        "last_outcome",
        "last_ok",
        "last_error",
        "last_instance",
        "failures",
        "health",
        "progress",
        "finished",
    }


def test_running_and_misfire_marks(ops: Operations, start: Start) -> None:
    rt, job = start()
    wait_leader(ops)
    job.gate.clear()
    ops.trigger(JOB)
    wait_until(
        lambda: all(i.running_on == rt.instance_id for i in ops.job(JOB).items),
        message="items not marked running",
    )
    item = ops.job(JOB).items[0]
    assert item.execution_id is not None and item.execution_id.startswith(f"{JOB}@")
    assert item.fire_time is not None
    [view] = ops.instances()
    assert view.running == {JOB: [0, 1, 2, 3]}

    # a fire of the schedule while the items still run is a misfire; the registry
    # shows it for a run that has gone on for MISFIRE_MARK_AFTER (a shorter one is
    # re-run unmarked). (An operator's run-now is a request of its own: it waits in
    # the store, /jobs/{job}/runnow, and runs once the items end.)
    batches = rt.runners[JOB].batches
    since = batches.running_since(range(4))
    assert since is not None
    wait_until(lambda: time.monotonic() - since >= fires.MISFIRE_MARK_AFTER, 10)
    rt.runners[JOB].on_trigger(datetime.now(UTC))
    wait_until(lambda: all(i.misfire for i in ops.job(JOB).items), message="no misfire marks")
    assert ops.status().jobs[0].misfired_items == 4

    job.gate.set()
    wait_until(
        lambda: all(i.running_on is None and not i.misfire for i in ops.job(JOB).items),
        message="marks not cleared after the misfire re-run",
    )


def test_instances_view(ops: Operations, start: Start) -> None:
    a, job_a = start(labels={"zone": "a"})
    b, job_b = start(labels={"zone": "b"})
    leader = wait_leader(ops)
    run_once(ops, job_a, job_b)
    views = {v.instance_id: v for v in ops.instances()}
    assert set(views) == {a.instance_id, b.instance_id}
    va = views[a.instance_id]
    assert va.pid == os.getpid() and va.host and va.version
    assert va.labels == {"zone": "a"}
    assert va.jobs == [JOB] and va.state == "live"
    assert va.started_at is not None
    assert sorted(views[a.instance_id].items[JOB] + views[b.instance_id].items[JOB]) == [0, 1, 2, 3]
    assert len(va.items[JOB]) == 2
    assert va.disabled == {JOB: False}
    assert views[leader].leader_of == [JOB]
    assert {v.instance_id for v in ops.instances(job=JOB)} == set(views)
    assert set(va.to_dict()) == {
        "instance_id",
        "host",
        "pid",
        "version",
        "started_at",
        "labels",
        "jobs",
        "items",
        "running",
        "disabled",
        "leader_of",
        "state",
        "health",
        "clock_offset",
        "clock_error",
        "clock_at",
        "clock_skewed",
    }
    # no job has max_time_diff_seconds on: no clock sample is taken nor shown
    assert va.clock_offset is None and va.clock_skewed == [] and va.health == "ok"
    with pytest.raises(JobLookupError):
        ops.instances(job="nope")


def test_disable_instance_moves_its_items(ops: Operations, start: Start) -> None:
    a, job_a = start()
    b, job_b = start()
    wait_leader(ops)
    run_once(ops, job_a, job_b)

    assert ops.disable_instance(a.instance_id, JOB) == [JOB]
    detail = ops.job(JOB)
    assert detail.reshard_pending and detail.disabled_instances == [a.instance_id]
    run_once(ops, job_a, job_b)
    assert set(owners(ops).values()) == {b.instance_id}
    assert job_a.items() == [] and job_b.items() == [0, 1, 2, 3]
    assert {v.instance_id: v.disabled[JOB] for v in ops.instances()}[a.instance_id]

    # across all jobs (job=None) and back
    assert ops.enable_instance(a.instance_id) == [JOB]
    assert ops.job(JOB).reshard_pending
    run_once(ops, job_a, job_b)
    assert set(owners(ops).values()) == {a.instance_id, b.instance_id}
    assert ops.enable_instance(a.instance_id) == []  # nothing left to enable

    assert ops.disable_instance(b.instance_id) == [JOB]
    with pytest.raises(InstanceLookupError):
        ops.disable_instance("ghost@1@abc", JOB)
    with pytest.raises(InstanceLookupError):
        ops.enable_instance("ghost@1@abc")


def test_disable_items_and_job(ops: Operations, start: Start) -> None:
    _, job = start()
    wait_leader(ops)
    ops.disable_item(JOB, 1)
    assert [i.disabled for i in ops.job(JOB).items] == [False, True, False, False]
    run_once(ops, job, count=3)
    assert job.items() == [0, 2, 3]
    ops.enable_item(JOB, 1)
    assert not any(i.disabled for i in ops.job(JOB).items)

    with pytest.raises(ConfigError, match=r"item 4 .*0\.\.3"):
        ops.disable_item(JOB, 4)
    with pytest.raises(ConfigError, match=r"item -1 .*0\.\.3"):
        ops.enable_item(JOB, -1)

    ops.disable_job(JOB)
    assert not ops.jobs()[0].enabled and ops.jobs()[0].next_fire is None
    assert ops.job(JOB).disabled_by_operator
    assert ops.status().jobs[0].health == "disabled"
    with pytest.raises(OperationRefusedError, match="disabled"):
        ops.trigger(JOB)
    ops.enable_job(JOB)
    assert ops.jobs()[0].enabled

    # a job disabled by its config is enabled by enable_job too
    ops.update_config(JOB, disabled=True)
    assert not ops.jobs()[0].enabled
    ops.enable_job(JOB)
    assert ops.jobs()[0].enabled and not ops.get_config(JOB).disabled

    with pytest.raises(JobLookupError):
        ops.disable_job("nope")
    with pytest.raises(JobLookupError):
        ops.job("no/such")


def test_trigger_one_instance(ops: Operations, start: Start) -> None:
    a, job_a = start()
    b, job_b = start()
    wait_leader(ops)
    run_once(ops, job_a, job_b)
    job_a.reset()
    job_b.reset()
    assert ops.trigger(JOB, instance=b.instance_id) == [b.instance_id]
    wait_until(lambda: len(job_b.items()) == 2, message="b did not run its items")
    assert job_a.items() == []
    with pytest.raises(InstanceLookupError):
        ops.trigger(JOB, instance="ghost@1@abc")
    assert sorted(ops.trigger(JOB)) == sorted([a.instance_id, b.instance_id])


def test_update_config(ops: Operations, start: Start) -> None:
    rt, job = start()
    wait_leader(ops)
    run_once(ops, job)
    new = ops.update_config(JOB, sharding_total_count=6, description="six")
    assert new.sharding_total_count == 6 and ops.get_config(JOB).description == "six"
    detail = ops.job(JOB)
    assert detail.reshard_pending and "count changed" in (detail.reshard_reason or "")
    wait_until(
        lambda: rt.runners[JOB].config.sharding_total_count == 6,
        message="the runtime did not load the new config",
    )
    run_once(ops, job, count=6)
    assert job.items() == [0, 1, 2, 3, 4, 5]
    assert len(ops.job(JOB).items) == 6

    # a change that leaves the count alone does not ask for a reshard
    ops.update_config(JOB, job_parameter="p")
    assert not ops.job(JOB).reshard_pending

    with pytest.raises(ConfigError, match="name"):
        ops.update_config(JOB, name="other")
    with pytest.raises(JobConfigError, match="sharding_total_count"):
        ops.update_config(JOB, sharding_total_count=0)
    with pytest.raises(JobConfigError, match="did you mean"):
        ops.update_config(JOB, sharding_total_cont=3)
    with pytest.raises(JobLookupError):
        ops.update_config("nope", description="x")
    assert ops.get_config(JOB).sharding_total_count == 6


def test_shutdown(ops: Operations, start: Start) -> None:
    rt, _ = start()
    wait_leader(ops)
    assert ops.shutdown(rt.instance_id, wait=15.0)
    assert rt.wait_stopped(15)
    assert ops.instances() == []
    assert ops.dump("/control") == {} or all(not e.value for e in ops.dump("/control").values())
    assert ops.jobs()[0].instances == []
    status = ops.status().jobs[0]
    assert status.health == "no-instance"
    assert status.summary.next_fire is None and status.summary.next_fire_reason == "no instance"
    with pytest.raises(InstanceLookupError):
        ops.shutdown(rt.instance_id)


def test_remove_job(ops: Operations, start: Start) -> None:
    rt, _ = start()
    wait_leader(ops)
    with pytest.raises(OperationRefusedError, match="live instance"):
        ops.remove_job(JOB)
    assert ops.remove_job(JOB, force=True) == [rt.instance_id]
    assert ops.jobs() == []
    with pytest.raises(JobLookupError):
        ops.job(JOB)
    rt.stop_now()
    with pytest.raises(JobLookupError):
        ops.remove_job(JOB)


def test_forced_removal_retires_every_instance_that_ran_the_job(
    ops: Operations, start: Start
) -> None:
    """A forced ``remove`` while three instances run the job: it returns with the
    job gone (the CI once failed it when the instances registered again and
    re-elected a leader while the subtree was deleted, "children kept appearing"),
    each instance stops running the job, and nothing of the job comes back."""
    runtimes = [start(cron=None, interval=0.2)[0] for _ in range(3)]
    wait_leader(ops)
    wait_until(lambda: len(ops.store.children(JobPaths(JOB).instances)) == 3)
    removed = ops.remove_job(JOB, force=True)
    assert sorted(removed) == sorted(rt.instance_id for rt in runtimes)
    assert ops.jobs() == []
    wait_until(
        lambda: all(rt.runners[JOB].state.stopping for rt in runtimes),
        message="an instance still runs the removed job",
    )
    # retired (each one fenced and stopping): none of them wrote the job again
    assert list(ops.dump(JobPaths(JOB).root)) == []
    with pytest.raises(JobLookupError):
        ops.remove_job(JOB)


def test_an_interrupted_removal_is_finished_by_a_second_one(
    ops: Operations, store: CoordinationStore, start: Start
) -> None:
    """``remove`` deletes the config before the rest; a removal that failed after
    that (the store went away) leaves the job's root, and a second ``remove``
    still finds the job and finishes it."""
    rt, _ = start()
    wait_leader(ops)
    rt.stop(grace=0)
    store.delete(JobPaths(JOB).config, recursive=False)  # where the first one stopped
    with pytest.raises(JobLookupError):
        ops.job(JOB)
    assert ops.remove_job(JOB) == []
    assert not store.exists(JobPaths(JOB).root)


def test_remove_stopped_job(ops: Operations, start: Start) -> None:
    rt, _ = start()
    wait_leader(ops)
    rt.stop(grace=0)
    assert ops.remove_job(JOB) == []
    assert list(ops.dump(JobPaths(JOB).root)) == []


def test_failover_queue_and_status(ops: Operations, store: CoordinationStore, start: Start) -> None:
    rt, _ = start()
    wait_leader(ops)
    # An orphaned item as the failover service queues it (this job has failover
    # off, so nobody claims it and the test can look at it).
    entry = FailoverEntry(fire_time=1_700_000_000.0, execution_id="x", from_instance="dead@1@x")
    store.put(JobPaths(JOB).failover_item(2), entry.to_bytes())
    item = ops.job(JOB).items[2]
    assert item.failover_queued and item.failover_from == "dead@1@x"
    overview = ops.status()
    assert overview.instances == [rt.instance_id]
    assert overview.namespace == store.namespace
    assert overview.backend in ("zookeeper", "etcd")
    [status] = overview.jobs
    assert status.failover_queued == 1 and status.health == "failover-pending"
    data = overview.to_dict()
    assert set(data) == {"backend", "namespace", "instances", "jobs"}
    assert data["jobs"][0]["name"] == JOB and data["jobs"][0]["health"] == "failover-pending"


def test_dump(ops: Operations, store: CoordinationStore, start: Start) -> None:
    rt, _ = start()
    wait_leader(ops)
    store.put("/jobs/tiny/extra/bin", b"\xff\x00\x01")
    nodes = ops.dump("/jobs/tiny")
    config = nodes["/jobs/tiny/config"]
    assert config.encoding == "utf-8" and config.kind == "persistent"
    assert JobConfig.from_json(config.value).name == JOB
    member = nodes[f"/jobs/tiny/instances/{rt.instance_id}"]
    assert member.kind == "ephemeral"
    binary = nodes["/jobs/tiny/extra/bin"]
    assert binary.encoding == "base64" and binary.value == "/wAB"
    assert set(binary.to_dict()) == {
        "value",
        "encoding",
        "kind",
        "version",
        "revision",
        "created_revision",
    }
    assert f"/instances/{rt.instance_id}" in ops.dump()
    with pytest.raises(ConfigError):
        ops.dump("no-slash")


def test_connect_context_manager(registry_url: str) -> None:
    with Operations.connect(registry_url) as ops:
        assert ops.jobs() == []
        assert ops.instances() == []
        with pytest.raises(JobLookupError):
            ops.get_config(JOB)


def test_trigger_with_one_off_parameters(ops: Operations, registry_url: str) -> None:
    job = RecordingJob()
    rt = Runtime(registry_url, shutdown_grace=2.0)
    rt.add_job(job, tiny_config(sharding_total_count=2))
    rt.start()
    try:
        wait_leader(ops)
        ops.trigger(JOB, params={"region": "eu-west", "dry_run": "1"})
        job.wait_for(lambda runs: len(runs) >= 2, message="the triggered items did not run")
        assert [r.params for r in job.runs[:2]] == [{"region": "eu-west", "dry_run": "1"}] * 2
        ops.trigger(JOB)  # without parameters: none
        job.wait_for(lambda runs: len(runs) >= 4, message="the second trigger did not run")
        assert [r.params for r in job.runs[2:4]] == [{}, {}]
    finally:
        rt.stop_now()
    with pytest.raises(ConfigError, match="'bad name'"):
        ops.trigger(JOB, params={"bad name": "x"})
    with pytest.raises(ConfigError, match="bytes"):
        ops.trigger(JOB, params={"big": "x" * 9000})
