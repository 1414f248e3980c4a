"""The process executor (issue 28 section 3): items in worker processes.

Real child processes (forkserver), the runtime on the MemoryStore, and once on a real
ZooKeeper. The jobs (tests/runtime/_procjobs.py) report from the child through files.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.errors import ConfigError, JobConfigError
from shardkeeper.job import JobListener, ShardedJob, ShardingContext
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.ops import Operations
from shardkeeper.registry import open_store
from shardkeeper.runtime import Runtime
from shardkeeper.runtime.execute.procpool import (
    JobNotImportableError,
    ProcessPool,
    job_ref,
    pid_alive,
)
from shardkeeper.testing.faults import wait_until
from tests.runtime._procjobs import Behaves, Failing

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def backend() -> str:
    """The MemoryStore, unless a test asks for a real store."""
    return "memory"


class Records:
    """An observer keeping every execution record."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[ExecutionRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.records.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        pass

    def where(self, **match: object) -> list[ExecutionRecord]:
        with self.lock:
            return [r for r in self.records if all(getattr(r, k) == v for k, v in match.items())]


def _start(
    runtimes: list[Runtime], url: str, cfg: JobConfig, job: type[ShardedJob] = Behaves, **kw: object
) -> tuple[Runtime, Records]:
    seen = Records()
    rt = Runtime(url, shutdown_grace=2, observers=[seen], executor="process", **kw)  # type: ignore[arg-type]
    rt.add_job(job, cfg)
    rt.start()
    runtimes.append(rt)
    return rt, seen


def _pool(rt: Runtime) -> ProcessPool:
    pool = rt.executors.started_pool
    assert pool is not None
    return pool


def _files(tmp_path: Path, prefix: str) -> list[dict[str, object]]:
    found = []
    for path in sorted(tmp_path.glob(f"{prefix}*")):
        if path.suffix != ".tmp":
            found.append(json.loads(path.read_text()))
    return found


def _crash_case(registry_url: str, runtimes: list[Runtime], tmp_path: Path) -> None:
    cfg = JobConfig.parse(
        name="crashy",
        interval=1,
        sharding_total_count=4,
        sharding_item_parameters="0=ok,1=segv,2=exit3,3=sigkill",
        job_parameter=str(tmp_path),
    )
    rt, seen = _start(runtimes, registry_url, cfg)
    wait_until(lambda: len(seen.where(item=0, outcome=Outcome.OK)) >= 2, 30, message="no runs")
    wait_until(lambda: len(seen.where(outcome=Outcome.CRASHED)) >= 6, 30)
    by_item: dict[int, list[ExecutionRecord]] = {}
    for r in seen.where(outcome=Outcome.CRASHED):
        by_item.setdefault(r.item, []).append(r)
    assert set(by_item) == {1, 2, 3}
    assert "signal 11 (SIGSEGV)" in by_item[1][0].error_message
    assert "exit status 3" in by_item[2][0].error_message
    assert "signal 9 (SIGKILL)" in by_item[3][0].error_message
    assert all(r.error_type == "ChildCrashedError" for rs in by_item.values() for r in rs)
    # the instance went on: later fires ran, item 0 in a live child each time
    assert rt.running
    assert _pool(rt).stats.crashed >= 3
    stats = rt.runners["crashy"].stats
    assert stats["failed"] >= 3


def test_a_crashed_child_is_recorded_with_its_exit_status_and_the_instance_goes_on(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    _crash_case(registry_url, runtimes, tmp_path)


@pytest.mark.parametrize("backend", ["zookeeper"], ids=["zk"])
def test_crashes_on_real_zookeeper(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    _crash_case(registry_url, runtimes, tmp_path)


def test_a_crashed_item_is_retried_in_a_new_child(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="retry",
        interval=2,
        sharding_total_count=1,
        sharding_item_parameters="0=crash_once",
        job_parameter=str(tmp_path),
        retries=1,
        retry_backoff=0,
    )
    rt, seen = _start(runtimes, registry_url, cfg)
    ok = wait_until(lambda: seen.where(outcome=Outcome.OK), 30, message="no success")
    attempts = sorted(seen.where(fire_time=ok[0].fire_time), key=lambda r: r.attempt)
    assert [(r.attempt, r.outcome) for r in attempts] == [(1, Outcome.CRASHED), (2, Outcome.OK)]
    assert "exit status 3" in attempts[0].error_message
    crashed_pid = int(next(tmp_path.glob("crashed-*")).read_text())
    ran = _files(tmp_path, "ok-")
    assert ran and all(r["pid"] != crashed_pid for r in ran)
    assert rt.runners["retry"].stats["retries"] >= 1


def test_a_crashed_item_is_handed_to_failover(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="handoff",
        interval=2,
        sharding_total_count=2,
        sharding_item_parameters="0=crash_once,1=ok",
        job_parameter=str(tmp_path),
        failover=True,
    )
    _rt, seen = _start(runtimes, registry_url, cfg)
    rerun = wait_until(
        lambda: seen.where(item=0, outcome=Outcome.OK, failover=True), 30, message="no failover"
    )
    first = seen.where(item=0, fire_time=rerun[0].fire_time, failover=False)
    assert [r.outcome for r in first] == [Outcome.CRASHED]
    assert seen.where(item=1, fire_time=rerun[0].fire_time, outcome=Outcome.OK)


def test_the_execution_timeout_kills_the_child(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="slow",
        interval=2,
        sharding_total_count=2,
        sharding_item_parameters="0=sleep,1=ok",
        job_parameter=str(tmp_path),
        execution_timeout=1,
    )
    rt, seen = _start(runtimes, registry_url, cfg)
    late = wait_until(lambda: seen.where(item=0, outcome=Outcome.TIMED_OUT), 30)
    assert late[0].ended - late[0].started < 5
    pid = int(str(wait_until(lambda: _files(tmp_path, "sleeping-0"), 10)[0]["pid"]))
    wait_until(lambda: not pid_alive(pid), 10, message=f"child {pid} still runs")
    assert seen.where(item=1, outcome=Outcome.OK)
    assert _pool(rt).stats.killed >= 1


def test_children_are_recycled_after_max_items_per_child(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="recycle",
        interval=0.5,
        sharding_total_count=1,
        sharding_item_parameters="0=pid",
        job_parameter=str(tmp_path),
    )
    rt, seen = _start(runtimes, registry_url, cfg, worker_threads=1, max_items_per_child=2)
    wait_until(lambda: len(seen.where(outcome=Outcome.OK)) >= 6, 30)
    runs = sorted(_files(tmp_path, "ok-"), key=lambda r: str(r["fire_time"]))
    pids = [r["pid"] for r in runs]
    assert len(set(pids)) >= 3
    assert all(pids.count(p) <= 2 for p in set(pids))
    assert _pool(rt).stats.recycled >= 2


def test_is_valid_turns_false_in_the_child_after_fencing(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="fenced",
        interval=3600,
        sharding_total_count=1,
        sharding_item_parameters="0=wait_fenced",
        job_parameter=str(tmp_path),
    )
    rt, _seen = _start(runtimes, registry_url, cfg)
    admin = open_store(registry_url)
    admin.start()
    try:
        Operations(admin).trigger("fenced")
    finally:
        admin.close()
    running = wait_until(lambda: _files(tmp_path, "running-0"), 30)[0]
    assert running["valid"] is True
    rt.runners["fenced"].fence_all()
    seen = wait_until(lambda: _files(tmp_path, "fenced-0"), 30)[0]
    assert seen["valid_after"] is False
    assert seen["should_stop"] is True
    assert seen["stop_reason"] == "fenced"


class Contexts(JobListener):
    """Keeps the contexts of the listener calls (they run in the parent)."""

    def __init__(self) -> None:
        self.before: list[ShardingContext] = []
        self.after: list[ShardingContext] = []

    def before_job(self, contexts: Sequence[ShardingContext]) -> None:
        self.before.extend(contexts)

    def after_job(self, contexts: Sequence[ShardingContext]) -> None:
        self.after.extend(contexts)


def test_params_and_the_context_reach_the_child(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="params",
        interval=3600,
        sharding_total_count=2,
        sharding_item_parameters="0=pid,1=pid",
        job_parameter=str(tmp_path),
        props={"region": "eu"},
    )
    seen = Records()
    listener = Contexts()
    rt = Runtime(registry_url, shutdown_grace=2, observers=[seen], executor="process")
    rt.add_job(Behaves, cfg, listeners=[listener])
    rt.start()
    runtimes.append(rt)
    admin = open_store(registry_url)
    admin.start()
    try:
        Operations(admin).trigger("params", params={"day": "2026-12-01"})
    finally:
        admin.close()
    runs = wait_until(lambda: len(_files(tmp_path, "ok-")) >= 2 and _files(tmp_path, "ok-"), 30)
    for run in runs:
        assert run["params"] == {"day": "2026-12-01"}
        assert run["props"] == {"region": "eu"}
        assert run["item_parameter"] == "pid"
        assert run["valid"] is True
        assert int(str(run["fencing_token"])) > 0
        assert run["instance_id"] == rt.instance_id
        assert run["pid"] != __import__("os").getpid()
    wait_until(lambda: len(listener.after) >= 2, 10)
    assert {c.item for c in listener.before} == {0, 1}


def test_an_exception_in_the_child_is_reported_with_its_type_and_traceback(
    registry_url: str, runtimes: list[Runtime], tmp_path: Path
) -> None:
    cfg = JobConfig.parse(
        name="raises",
        interval=2,
        sharding_total_count=2,
        sharding_item_parameters="0=abc",
        job_parameter=str(tmp_path),
    )
    rt, seen = _start(runtimes, registry_url, cfg, job=Failing)
    wait_until(lambda: seen.where(item=0) and seen.where(item=1), 30)
    plain = seen.where(item=0)[0]
    assert plain.outcome is Outcome.FAILED
    assert plain.error_type == "KeyError"
    assert "missing abc" in plain.error_message
    assert "_procjobs.py" in plain.traceback  # the child's frames
    odd = seen.where(item=1)[0]
    assert odd.outcome is Outcome.FAILED
    assert "RuntimeError" in odd.error_message and "with a lock" in odd.error_message
    assert rt.running


def test_settings_are_checked() -> None:
    class Local(ShardedJob):
        def execute(self, ctx: ShardingContext) -> None:
            pass

    cfg = JobConfig(name="local", interval=1, sharding_total_count=1, executor="process")
    rt = Runtime("memory://unused/ns")
    with pytest.raises(JobConfigError, match="defined inside the function"):
        rt.add_job(Local, cfg)
    # refused with the thread executor too: the job_class it would be stored under
    # is no import path, which every other instance refuses to read
    with pytest.raises(JobConfigError, match="no other instance can import it"):
        rt.add_job(Local, cfg.model_copy(update={"executor": "thread"}))
    # named by an import path it is the user's word: the process executor still
    # refuses what a worker process cannot import
    with pytest.raises(JobNotImportableError, match="defined inside a function"):
        rt.add_job(Local, cfg.model_copy(update={"job_class": "tests.x:Local"}))
    with pytest.raises(JobConfigError, match="executor='fork' is not one of: thread, process"):
        JobConfig(name="x", interval=1, sharding_total_count=1, executor="fork")
    with pytest.raises(ConfigError, match="executor='fork' is not one of: thread, process"):
        Runtime("memory://unused/ns", executor="fork")
    with pytest.raises(ConfigError, match="max_items_per_child"):
        Runtime("memory://unused/ns", max_items_per_child=-1)


def test_children_are_recycled_past_max_memory_per_child(tmp_path: Path) -> None:
    ctx = ShardingContext(
        job_name="mem",
        item=0,
        item_parameter="pid",
        sharding_total_count=1,
        job_parameter=str(tmp_path),
        fire_time=datetime.now(UTC),
        instance_id="test",
        execution_id="mem@0#0",
    )
    pool = ProcessPool(1, max_memory_per_child=1)  # 1 KiB: every child is over it
    try:
        ref = job_ref("mem", Behaves)
        for _ in range(3):
            assert pool.run(ref, ctx, 30.0, lambda: None).outcome == "ok"
        assert pool.stats.started == 3
        assert pool.stats.recycled == 3
    finally:
        pool.shutdown()
    assert not pool.pids()
