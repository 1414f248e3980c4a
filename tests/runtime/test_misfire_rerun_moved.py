"""A misfire re-run never starts an item the assignment has given another instance
since (600 s etcd chaos, job cpu).

A plain misfire re-run is decided long after its fire, behind a run that lasted
several intervals, and its items were the owners the assignment keeps for that fire.
In the chaos run item 3 of job cpu moved to vm@3407 from fire 736, whose run covered
the missed fire 724; vm@1813, its owner at 724, started its re-run of 724 a second
later and ran that fire again, folding 726 and 728 after the new owner's run. Now
the re-run leaves out items that are not this instance's in the current assignment:
their new owner's first run reads the item's last result and covers the fire.

The test makes the condition directly: item 0's first run lasts past several fires
(folded behind it, items 0 and 1 owed a re-run); while it runs a second member
joins (registered as a real instance registers), and the leader reshards item 1 to
it from a later fire. The re-run then runs item 0 only.
"""

from __future__ import annotations

import threading
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import Assignment, InstanceInfo, encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import necessary_value
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)

JOB = "rerunmoved"
P = JobPaths(JOB)
ME = "host@1@aaaa"
#: sorts after ME: the reshard gives it item 1
OTHER = "host@2@bbbb"


class FirstRunLong(ShardedJob):
    """Item 0's first run lasts past several fires; as it begins, OTHER joins the job.
    Records (item, fire, misfire)."""

    def __init__(self, server: MemoryServer) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.runs: list[tuple[int, float, bool]] = []
        self.first: float | None = None
        self.member: CoordinationStore | None = None

    def execute(self, ctx: ShardingContext) -> None:
        ft = ctx.fire_time.timestamp()
        with self.lock:
            first = self.first is None
            if first:
                self.first = ft
        if ctx.item == 0 and first:
            self._join()
            # the leader waits for this run before resharding, up to its bound: the
            # new assignment is committed while it still runs
            wait_until(self._moved, 20, message="item 1 was never resharded to OTHER")
        with self.lock:
            self.runs.append((ctx.item, ft, ctx.is_misfire))

    def _join(self) -> None:
        """OTHER registers in the job as an instance does (its node, the reshard flag)."""
        store = self.server.store(session_timeout=30.0)
        store.start()
        info = InstanceInfo(OTHER, "host", 2, "test", time.time())
        store.put(P.instance(OTHER), encode(info), ephemeral=True)
        store.put(P.necessary, necessary_value(f"instance joined: {OTHER}"))
        self.member = store

    def _moved(self) -> bool:
        store = self.member
        assert store is not None
        node = store.get(P.sharding)
        return node is not None and Assignment.from_bytes(node.value).owners.get(1) == OTHER

    def snapshot(self) -> list[tuple[int, float, bool]]:
        with self.lock:
            return list(self.runs)


def test_a_misfire_rerun_leaves_out_an_item_moved_to_another_instance(
    memory_server: MemoryServer, runtimes: list[Runtime]
) -> None:
    """The re-run of the first fire folded behind item 0's long run runs item 0 only:
    item 1 is OTHER's now (from a later fire), and OTHER's run covers that fire."""
    job = FirstRunLong(memory_server)
    rt = Runtime(memory_server.store(session_timeout=4.0), shutdown_grace=5, instance_id=ME)
    rt.add_job(
        job,
        JobConfig(name=JOB, interval=1, sharding_total_count=2, misfire=True, failover=True),
    )
    rt.start()
    runtimes.append(rt)
    try:
        wait_until(
            lambda: any(m for _item, _ft, m in job.snapshot()),
            45,
            message=lambda: f"no misfire re-run: {job.snapshot()}",
        )
        runs = job.snapshot()
        first = job.first
        assert first is not None
        reruns = [(item, round(ft - first, 2)) for item, ft, m in runs if m]
        assert reruns and all(item == 0 for item, _ft in reruns), runs
    finally:
        if job.member is not None:
            job.member.close()
