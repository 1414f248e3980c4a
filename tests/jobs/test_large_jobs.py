"""Jobs whose items exceed one commit's operation limit, and misfire off."""

from __future__ import annotations

from collections import Counter

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry import open_store
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.etcd import EtcdStore
from shardkeeper.registry.zookeeper import ZooKeeperStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

COUNT = 300  # > 2 x 128: the running marks span three commits
#: the commit limit the runtime is given here (etcd's default; ZooKeeper takes 4,096
#: and would mark these 300 items in one commit)
LIMIT = 128


def _per_fire(job: RecordingJob) -> Counter[float]:
    """Executions per fire time, in the order the fires first ran."""
    return Counter(r.fire_time for r in job.runs)


def _run_chunked(capped: CoordinationStore, store: CoordinationStore, name: str) -> None:
    """Run a job of COUNT items on ``capped`` (a store given a small commit limit)
    until two whole fires ran: the marks span several chunks (each with its own
    fencing token), every fire in between runs every item, and no mark is left."""
    job = RecordingJob()
    rt = Runtime(capped, shutdown_grace=5)
    rt.add_job(job, JobConfig(name=name, interval=1, sharding_total_count=COUNT))
    with rt:
        wait_until(
            lambda: sum(1 for n in _per_fire(job).values() if n == COUNT) >= 2,
            30,
            message=lambda: f"runs per fire: {dict(_per_fire(job))}",
        )
        tokens = {r.item: r.fencing_token for r in job.runs}  # each item's latest
        assert len(set(tokens.values())) >= 3  # one token per chunk
        assert all(n == COUNT for n in list(_per_fire(job).values())[1:-1])
    assert store.children(JobPaths(name).running_root) == []


def test_items_beyond_one_commit_all_run_and_leave_no_marks(
    registry_url: str, store: CoordinationStore
) -> None:
    """300 items on one instance at 128 operations a commit: every trigger runs all of
    them (marks written in chunks), and completion clears every mark."""
    capped = open_store(registry_url)
    assert isinstance(capped, ZooKeeperStore | EtcdStore), "the limits set are the real stores'"
    capped.max_ops_per_commit = LIMIT
    capped.max_groups_per_commit = None  # plain commits, not etcd's nested transactions
    _run_chunked(capped, store, "big")


def test_a_batch_beyond_128_operations_is_one_start_commit_at_the_default_limits(
    registry_url: str, store: CoordinationStore
) -> None:
    """At each store's default limits (etcd: 128 operations a transaction), the 300
    marks of a fire go in one start commit: every item of a fire has the same fencing
    token (on etcd, each item's mark is a transaction nested in one request)."""
    job = RecordingJob()
    rt = Runtime(open_store(registry_url), shutdown_grace=5)
    rt.add_job(job, JobConfig(name="flat", interval=1, sharding_total_count=COUNT))
    with rt:
        wait_until(
            lambda: sum(1 for n in _per_fire(job).values() if n == COUNT) >= 2,
            30,
            message=lambda: f"runs per fire: {dict(_per_fire(job))}",
        )
        whole = [ft for ft, n in _per_fire(job).items() if n == COUNT]
        for ft in whole:
            tokens = {r.fencing_token for r in job.runs if r.fire_time == ft}
            assert len(tokens) == 1, f"fire {ft}: {len(tokens)} start commits"
    assert store.children(JobPaths("flat").running_root) == []


def test_marks_beyond_one_commits_bytes_are_cut_by_size(
    registry_url: str, store: CoordinationStore
) -> None:
    """A store whose byte limit holds fewer marks than its operation limit: the start
    and completion are cut by size, every item of every trigger runs, no mark is left."""
    capped = open_store(registry_url)
    assert isinstance(capped, ZooKeeperStore | EtcdStore), "the limits set are the real stores'"
    capped.max_commit_bytes = 20_000  # about 80 marks a commit
    _run_chunked(capped, store, "wide")


def test_job_with_misfire_off_runs(registry_url: str) -> None:
    """misfire=False is a valid configuration that schedules and runs."""
    job = RecordingJob()
    rt = Runtime(registry_url, shutdown_grace=2)
    rt.add_job(job, JobConfig(name="nomis", interval=1, sharding_total_count=2, misfire=False))
    with rt:
        job.wait_for(lambda runs: len(runs) >= 4, 20, message="job never ran")
