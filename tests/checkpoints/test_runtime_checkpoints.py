"""Checkpoints and progress through whole runtimes (issue 28 sections 1 and 2).

* On the MemoryStore, step by step: an instance cut off mid-item (its connection
  dropped, its session expired) is taken over; the successor resumes from the last
  accepted checkpoint and the zombie's late checkpoint is refused, its state intact.
* On the MemoryStore, ZooKeeper and etcd: ``checkpoint_carry`` hands each fire the
  previous run's last state, and the last of many coalesced checkpoints is written
  with the completion; a DataflowJob resumes from its fetch position; the progress of
  a running item is shown by ``shardkeeper shards``.

Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.checkpoints import CheckpointReader
from shardkeeper.coordination.model import FailoverEntry
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import DataflowJob, ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["memory", "zookeeper", "etcd"], ids=["memory", "zk", "etcd"])
def backend(request: pytest.FixtureRequest) -> str:
    """Every store: the in-process reference and the real servers."""
    return str(request.param)


def _seed_entry(store: Any, job: str, item: int, fire: float) -> str:
    """A queued failover entry of ``item`` for ``fire`` (the first instance claims it)."""
    eid = f"{job}@{round(fire * 1000)}#{item}"
    store.put(JobPaths(job).failover_item(item), FailoverEntry(fire, eid, "host@9@gone").to_bytes())
    return eid


class Steps(ShardedJob):
    """Steps 1..5 from its resume state, one checkpoint each; the first run stops
    after step 3 until the test releases it, then tries to go on (as a zombie)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[str, bool, Any]] = []
        self.answers: list[tuple[str, int, bool]] = []
        self.at3 = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            first = not self.runs
            self.runs.append((ctx.instance_id, ctx.resumed, ctx.resume_state))
        start = int(ctx.state or 0)
        for step in range(start + 1, 6):
            answer = ctx.checkpoint(step)
            ctx.progress(step, 5)
            with self.lock:
                self.answers.append((ctx.instance_id, step, answer))
            if first and step == 3:
                self.at3.set()
                assert self.release.wait(60)
            if not answer:
                return
        self.done.set()


def test_a_cut_off_instance_is_taken_over_and_its_late_checkpoint_refused(
    memory_server: MemoryServer,
) -> None:
    job = Steps()
    cfg = JobConfig(
        name="steps",
        cron="0 0 0 1 1 ?",
        sharding_total_count=1,
        failover=True,
        checkpoint_interval=0,
    )
    seed = memory_server.store("ns")
    seed.start()
    fire = float(int(time.time()) - 30)
    eid = _seed_entry(seed, "steps", 0, fire)
    a_store = memory_server.store("ns")
    a = Runtime(a_store, shutdown_grace=1)
    a.add_job(job, cfg)
    a.start()
    b: Runtime | None = None
    try:
        assert job.at3.wait(30), "the first run never reached step 3"
        b = Runtime(memory_server.store("ns"), shutdown_grace=1)
        b.add_job(job, cfg)
        b.start()
        # A is cut off: its session expires while it cannot hear of it
        assert isinstance(a_store, MemoryStore)
        a_store.suspend()
        a_store.expire()
        wait_until(job.done.is_set, 30, message="the successor never completed the item")
        with job.lock:
            assert job.runs[0][1:] == (False, None)
            assert job.runs[1][0] == b.instance_id and job.runs[1][1:] == (True, 3)
        # the zombie wakes up: its next checkpoint is refused by the store
        a_store.resume()
        job.release.set()
        wait_until(
            lambda: any(i == a.instance_id and s == 4 for i, s, _ok in job.answers),
            30,
            message="the zombie never tried step 4",
        )
        with job.lock:
            zombie = [(s, ok) for i, s, ok in job.answers if i == a.instance_id]
            successor = [(s, ok) for i, s, ok in job.answers if i == b.instance_id]
        assert zombie == [(1, True), (2, True), (3, True), (4, False)]
        assert successor == [(4, True), (5, True)]
        doc = CheckpointReader(seed, JobPaths("steps")).read(0, fire)
        assert doc is not None and doc.state == 5 and doc.execution_id == eid
        wait_until(
            lambda: a.runners["steps"].stats.get("checkpoints_refused", 0) >= 1,
            10,
            message="the refusal was not counted",
        )
    finally:
        job.release.set()
        a.stop_now()
        if b is not None:
            b.stop_now()
        seed.close()


class Cursor(ShardedJob):
    """Goes on from the previous run's cursor, three steps a run, checkpointing each
    (within a long interval: only the first is written at once, the rest coalesced)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[Any] = []

    def execute(self, ctx: ShardingContext) -> None:
        start = ctx.last_state
        with self.lock:
            self.starts.append(start)
        for k in range(1, 4):
            assert ctx.checkpoint((start or 0) + k)
            ctx.progress(k, 3)


def test_last_state_carries_the_cursor_across_fires(registry_url: str) -> None:
    job = Cursor()
    rt = Runtime(registry_url, shutdown_grace=1)
    rt.add_job(
        job,
        JobConfig(
            name="cursor",
            cron="* * * * * ?",
            sharding_total_count=1,
            checkpoint_carry=True,
            checkpoint_interval=3600,
        ),
    )
    rt.start()
    try:
        wait_until(lambda: len(job.starts) >= 3, 30, message="three fires never ran")
    finally:
        rt.stop_now()
    with job.lock:
        assert job.starts[:3] == [None, 3, 6]


class Rows(DataflowJob):
    """Fetches rows after its position, two at a time, from a list of ten; the first
    run is stopped (fenced) after its second round, the resumed one goes on."""

    streaming = True
    rows = list(range(1, 11))

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fetched: list[tuple[bool, Sequence[int]]] = []
        self.fail_after = 2

    def fetch_data(self, ctx: ShardingContext) -> Sequence[int]:
        after = ctx.state or 0
        batch = [r for r in self.rows if r > after][:2]
        with self.lock:
            self.fetched.append((ctx.resumed, batch))
            if ctx.is_failover and not ctx.resumed and len(self.fetched) > self.fail_after:
                raise RuntimeError("cut off")  # ends the first run half-way
        return batch

    def process_data(self, ctx: ShardingContext, data: Sequence[int]) -> None:
        pass

    def position_after(self, ctx: ShardingContext, data: Sequence[int]) -> int:
        return data[-1]


def test_a_dataflow_job_checkpoints_its_fetch_position(memory_server: MemoryServer) -> None:
    """The fetch position after each round is the checkpoint; a failover re-run of the
    same fire starts from it."""
    job = Rows()
    store = memory_server.store("ns")
    store.start()
    fire = float(int(time.time()) - 30)
    _seed_entry(store, "rows", 0, fire)
    rt = Runtime(memory_server.store("ns"), shutdown_grace=1)
    rt.add_job(
        job,
        JobConfig(
            name="rows",
            cron="0 0 0 1 1 ?",
            sharding_total_count=1,
            failover=True,
            checkpoint_interval=0,
        ),
    )
    rt.start()
    try:
        wait_until(lambda: len(job.fetched) >= 3, 30, message="the first run never fetched")
        # the first run failed after two rounds (positions 2 and 4 checkpointed); the
        # item is queued again for the same fire, as a cut-off instance's would be
        # the fetch raised before the attempt's end is written: wait for the end mark
        reader = CheckpointReader(store, JobPaths("rows"))
        wait_until(
            lambda: (d := reader.read(0, fire)) is not None and d.ended != "",
            30,
            message="the failed run's checkpoint never got its end mark",
        )
        doc = reader.read(0, fire)
        assert doc is not None and doc.state == 4 and doc.ended == "failed"
        _seed_entry(store, "rows", 0, fire)
        wait_until(
            lambda: any(resumed and not batch for resumed, batch in job.fetched),
            30,
            message="the resumed run never reached the end",
        )
    finally:
        rt.stop_now()
        store.close()
    with job.lock:
        resumed = [batch for was, batch in job.fetched if was]
    assert resumed == [[5, 6], [7, 8], [9, 10], []]


class Slow(ShardedJob):
    """Reports half its progress, then waits for the test."""

    def __init__(self) -> None:
        self.reported = threading.Event()
        self.release = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        ctx.progress(0, 1000, "starting")
        ctx.progress(500, 1000, "rows copied")
        self.reported.set()
        assert self.release.wait(60)


def _cli(*args: str, registry: str) -> str:
    env = {**os.environ, "COLUMNS": "250", "SHARDKEEPER_REGISTRY": registry}
    done = subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], indirect=True)
def test_shards_shows_the_progress_of_a_running_item(registry_url: str) -> None:
    """(The real stores only: the command runs in a process of its own.)"""
    job = Slow()
    rt = Runtime(registry_url, shutdown_grace=1)
    rt.add_job(
        job,
        JobConfig(name="slow", cron="* * * * * ?", sharding_total_count=1, checkpoint_interval=0),
    )
    rt.start()
    try:
        assert job.reported.wait(30)

        def shown() -> dict[str, Any] | None:
            items = json.loads(_cli("shards", "slow", "--json", registry=registry_url))["items"]
            return items[0]["progress"]  # type: ignore[no-any-return]

        wait_until(lambda: (shown() or {}).get("done") == 500, 30, message="no progress shown")
        progress = shown()
        assert progress is not None
        assert progress["percent"] == 50.0 and progress["total"] == 1000
        assert progress["note"] == "rows copied" and progress["rate"] is not None
        table = _cli("shards", "slow", registry=registry_url)
        assert "PROGRESS" in table and "50.0% (500/1000) rows copied" in table and "ETA" in table
        progress_metric = rt.runners["slow"].item_states.running_progress()
        assert [p.done for p in progress_metric] == [500]
    finally:
        job.release.set()
        rt.stop_now()


class Breaks(ShardedJob):
    """Reports progress, then fails."""

    def execute(self, ctx: ShardingContext) -> None:
        ctx.progress(7, 10, "rows")
        raise RuntimeError("boom")


def test_the_history_keeps_the_last_progress_of_a_failed_run(
    memory_server: MemoryServer, tmp_path: Any
) -> None:
    from shardkeeper.history import HistoryReader, HistoryRecorder

    url = f"sqlite:///{tmp_path}/history.db"
    recorder = HistoryRecorder(url)
    rt = Runtime(memory_server.store("ns"), shutdown_grace=1, observers=[recorder])
    rt.add_job(
        Breaks(),
        JobConfig(name="breaks", cron="* * * * * ?", sharding_total_count=1, checkpoint_interval=0),
    )
    rt.start()

    def failed() -> list[Any]:
        with HistoryReader(url) as reader:
            return [e for e in reader.executions("breaks", limit=50) if e.outcome == "failed"]

    try:
        wait_until(lambda: bool(failed()), 30, message="no failed run recorded")
    finally:
        rt.stop_now()
        assert recorder.close(timeout=30)
    progress = json.loads(failed()[0].progress)
    assert (progress["done"], progress["total"], progress["note"]) == (7, 10, "rows")
