"""Assignments of the largest item count fit one store value (issue 15, finding 7).

ZooKeeper refused the first encoding's value (one pair per item) past about 39,000
items, and etcd past about 45,000: the reshard failed every trigger and the job never
ran. These tests reshard 100,000 items on both real stores and read them back.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from shardkeeper.config import MAX_SHARDING_TOTAL_COUNT, JobConfig
from shardkeeper.coordination.model import Assignment, InstanceInfo, encode
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import ShardingService
from shardkeeper.coordination.strategies import ShardingStrategy, round_robin
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry.base import Check, CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

TOTAL = MAX_SHARDING_TOTAL_COUNT
NEVER = "0 0 1 1 *"  # no spontaneous fire during a test
LEADER = "leader@1@000000"

StoreFactory = Callable[..., CoordinationStore]


def scatter(instances: Sequence[str], job_name: str, total: int) -> dict[str, list[int]]:
    """A strategy that spreads items at random (deterministic per job): the largest
    encoding any strategy can produce."""
    rng = random.Random(job_name)
    result: dict[str, list[int]] = {inst: [] for inst in instances}
    for item in range(total):
        result[rng.choice(list(instances))].append(item)
    return result


def members(store: CoordinationStore, paths: JobPaths, count: int) -> list[str]:
    """``count`` membership nodes (persistent: the test plays every instance)."""
    ids = [f"worker-{n:03d}.example@{20_000 + n}@{n:06x}" for n in range(count)]
    for inst in ids:
        info = InstanceInfo(inst, "worker", 1, "test", started_at=time.time() - 60)
        store.put(paths.instance(inst), encode(info))
    return ids


@pytest.mark.parametrize("strategy", [round_robin, scatter], ids=["round_robin", "scatter"])
def test_largest_count_reshards_and_reads_back(
    store: CoordinationStore, store_factory: StoreFactory, strategy: ShardingStrategy
) -> None:
    """100,000 items over 100 instances: the reshard commits (with the previous
    assignment kept in the same value after a fire started) and another client reads
    back exactly the owners that were computed."""
    paths = JobPaths("huge")
    ids = members(store, paths, 100)
    store.put(paths.leader, LEADER.encode())
    service = ShardingService(store, paths, LEADER)
    check = Check(paths.leader, value=LEADER.encode())
    first = service.reshard(strategy, TOTAL, check, 1, fire=time.time())
    assert first is not None, "the reshard was not committed"
    assert sorted(set(first.owners.values())) == ids and len(first.owners) == TOTAL

    # a fire already started: the next reshard keeps the previous owners too (the
    # largest document: two full maps)
    fire = time.time()
    store.put(paths.fired(ids[0]), repr(fire).encode())
    store.put(paths.necessary, b"test")
    second = service.reshard(strategy, TOTAL, check, 2, fire=fire, previous=first)
    assert second is not None and second.previous == first.owners

    other = ShardingService(store_factory(), paths, ids[1])
    read, version = other.read()
    assert read is not None and read == second and version >= 0
    assert read.items_of(ids[5]) == sorted(i for i, o in second.owners.items() if o == ids[5])
    assert other.is_consistent(read, ids, TOTAL)
    assert not store.exists(paths.necessary)


class _Counter(ShardedJob):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: set[int] = set()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.items.add(ctx.item)


# CPU-heavy (100,000 executions): on the worker of the other CPU-heavy tests, and a
# test timeout above its own 120 s wait for the items
@pytest.mark.xdist_group("cpu-heavy")
@pytest.mark.timeout(300)
def test_job_of_the_largest_count_runs_every_item(
    registry_url: str, store: CoordinationStore
) -> None:
    """A real runtime with a 100,000-item job: the reshard at its first trigger is
    stored, every item runs, and the stored assignment gives all items to it."""
    job = _Counter()
    # 100,000 executions keep 4 worker threads busy in this process for seconds: on a
    # loaded machine they starved the store client's heartbeats and a 2 s session
    # expired mid-run (fencing the rest of the fire). The size, not liveness, is what
    # this test is about, so its instance gets a longer session.
    url = registry_url.replace("session_timeout=2&", "session_timeout=15&")
    assert url != registry_url, registry_url
    rt = Runtime(url, worker_threads=4, shutdown_grace=5)
    config = JobConfig.parse(
        name="huge-run", cron=NEVER, sharding_total_count=TOTAL, monitor_execution=False
    )
    rt.add_job(job, config)
    with rt, Operations(store) as ops:
        wait_until(lambda: ops.job("huge-run").leader, 30, message="no leader")
        ops.trigger("huge-run")
        wait_until(
            lambda: len(job.items) == TOTAL,
            120,
            message=lambda: f"{len(job.items)} of {TOTAL} items ran",
        )
        node = store.get(JobPaths("huge-run").sharding)
        assert node is not None
        stored = Assignment.from_bytes(node.value)
        assert stored.items_of(rt.instance_id) == list(range(TOTAL))
        assert len(node.value) < 10_000  # one instance: one range
