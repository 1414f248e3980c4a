"""Batched start-up (runtime/registration.py): every job registered as one by one would.

On both real stores: new jobs join in a few batch commits (config, membership, a
leader each), jobs already stored join one by one (the stored config wins, with the
drift warning), and every item of every job runs. A second instance joins the same
jobs one by one and the first stays leader (the election is create-if-absent).

Half-failed batches: a job created by someone else between the listing and the
commit (memory store: the commit is held meanwhile) joins one by one with what was
stored; a batch commit whose reply is lost (applied or not) leaves its jobs to
housekeeping, which registers each; a session expiry in the middle of the batches
loses nothing; an invalid stored config refuses the start before any batch is
written. No timing is asserted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import decode_document
from shardkeeper.coordination.model import InstanceInfo
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import JobConfigError, OperationTimeoutError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry import CoordinationStore, batching, open_store
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import expire_session, wait_until

pytestmark = pytest.mark.timeout(180)

ITEMS = 2


class Tally(ShardedJob):
    """Records the (job, item) pairs that ran."""

    def __init__(self) -> None:
        self.ran: set[tuple[str, int]] = set()
        self.lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.ran.add((ctx.job_name, ctx.item))

    def missing(self, names: list[str]) -> set[tuple[str, int]]:
        with self.lock:
            return {(n, i) for n in names for i in range(ITEMS)} - self.ran


def _config(name: str, interval: float = 0.5, **extra: object) -> JobConfig:
    fields: dict[str, object] = {
        "name": name,
        "interval": interval,
        "sharding_total_count": ITEMS,
        **extra,
    }
    return JobConfig.parse(**fields)


def _runtime(
    registry: str | CoordinationStore, names: list[str], job: Tally, interval: float = 0.5
) -> Runtime:
    rt = Runtime(registry, shutdown_grace=1)
    for name in names:
        rt.add_job(job, _config(name, interval))
    return rt


def _assert_registered(rt: Runtime, admin: CoordinationStore, names: list[str]) -> None:
    """Config, membership and leader of every job, in the store and in the runner."""
    me = rt.instance_id
    for name in names:
        p = JobPaths(name)
        runner = rt.runners[name]
        assert runner.state.registered, name
        stored = admin.get(p.config)
        assert stored is not None, f"{name}: no stored config"
        doc = decode_document(stored.value)
        assert doc.config == runner.config, name
        member = admin.get(p.instance(me))
        assert member is not None and member.ephemeral, f"{name}: no membership"
        assert member.created_revision == runner.state.member_revision, name
        assert InstanceInfo.from_bytes(member.value).instance_id == me
        leader = admin.get(p.leader)
        assert leader is not None and leader.value == me.encode(), f"{name}: leader"
        assert runner.election.is_leader, name


def _wait_all_ran(job: Tally, names: list[str], timeout: float = 60) -> None:
    wait_until(
        lambda: not job.missing(names),
        timeout,
        message=lambda: f"never ran: {sorted(job.missing(names))[:6]}",
    )


def test_large_config_documents_are_batched_within_the_request_limit(registry_url: str) -> None:
    """30 jobs with 100 KB of description each (3 MB of config documents) still join in
    batch commits: as many jobs a commit as the store's byte limit allows (several
    commits on ZooKeeper's 1 MB and etcd's 1.4 MB), where a batch cut by the operation
    count alone would be refused by the store and left to housekeeping."""
    names = [f"fat-{n:02d}" for n in range(30)]
    job = Tally()
    rt = Runtime(registry_url, shutdown_grace=1)
    for name in names:
        rt.add_job(job, _config(name, description="d" * 100_000))
    rt.start()
    try:
        assert rt.registrar is not None
        stats = rt.registrar.stats
        assert stats["batched"] == len(names)
        assert stats["one_by_one"] == 0
        budget = batching.max_commit_bytes(rt.store)
        if budget is not None:
            assert stats["batch_commits"] >= -(-len(names) * 100_000 // budget)
        with open_store(registry_url) as admin:
            _assert_registered(rt, admin, names)
        _wait_all_ran(job, names)
    finally:
        rt.stop()


def test_batched_start_up_registers_every_job(
    registry_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """60 new jobs (a few batch commits) and 2 stored ones (one by one, stored config
    wins); every item runs; a second instance joins them one by one, the first stays
    leader of every job."""
    new = [f"new-{n:03d}" for n in range(60)]
    known = ["known-a", "known-b"]
    # stored earlier with 3 items: the registry's copy wins over the code's 2
    earlier = Runtime(registry_url, shutdown_grace=0)
    for name in known:
        earlier.add_job(Tally(), _config(name, sharding_total_count=3))
    earlier.start()
    earlier.stop()
    job = Tally()
    caplog.set_level(logging.WARNING, logger="shardkeeper.coordination.config_service")
    rt = _runtime(registry_url, known + new, job)
    rt.start()
    second: Runtime | None = None
    try:
        with open_store(registry_url) as admin:
            assert rt.registrar is not None
            stats = rt.registrar.stats
            assert stats["one_by_one"] == len(known)
            assert stats["batched"] == len(new)
            # the namespace is not empty (no single first batch): 60 jobs in batches of
            # limit // 6 (two compares for each of a job's 3 absence checks): 21 jobs
            # a commit on etcd (3 commits), 682 on ZooKeeper (1 commit)
            per_batch = batching.max_ops_per_commit(rt.store) // 6
            assert stats["batch_commits"] == -(-len(new) // per_batch)
            for name in known:
                assert rt.runners[name].config.sharding_total_count == 3
            assert "the stored config is used" in caplog.text
            _assert_registered(rt, admin, known + new)
            # items run, with the stored item count for the known jobs
            wait_until(
                lambda: not job.missing(new) and {("known-a", 2), ("known-b", 2)} <= job.ran,
                60,
                message=lambda: f"never ran: {sorted(job.missing(new))[:6]}",
            )
            # a second instance: every job is stored now, so it joins one by one
            other = Tally()
            second = _runtime(registry_url, new[:5], other)
            second.start()
            assert second.registrar is not None
            assert second.registrar.stats["one_by_one"] == 5
            assert second.registrar.stats["batched"] == 0
            for name in new[:5]:
                leader = admin.get(JobPaths(name).leader)
                assert leader is not None and leader.value == rt.instance_id.encode()
                assert not second.runners[name].election.is_leader
                assert admin.children(JobPaths(name).instances) == sorted(
                    [rt.instance_id, second.instance_id]
                )
    finally:
        if second is not None:
            second.stop_now()
        rt.stop_now()


def test_invalid_stored_config_refuses_the_start_before_any_batch(registry_url: str) -> None:
    """A stored job that can never run refuses the start, and the new jobs of the
    same instance were not written (the stored ones register first)."""
    bad = JobPaths("broken")
    with open_store(registry_url) as admin:
        admin.put(bad.config, b'{"name": "broken", "sharding_total_count": 0}')
        rt = _runtime(registry_url, ["broken", "fresh-1", "fresh-2"], Tally())
        with pytest.raises(JobConfigError, match="broken"):
            rt.start()
        assert not rt.running
        assert admin.children("/jobs") == ["broken"]
        node = admin.get(bad.config)
        assert node is not None and b'"sharding_total_count": 0' in node.value


def _memory_runtime(
    server: MemoryServer, names: list[str], job: Tally
) -> tuple[Runtime, MemoryStore]:
    store = server.store()
    return _runtime(store, names, job), store


def test_a_job_created_meanwhile_joins_one_by_one(memory_server: MemoryServer) -> None:
    """An operator disables one job while the batch commit is on its way: the commit
    fails (the job is no longer absent), the job joins one by one and sees the
    switch, the others of the batch join in a retried batch."""
    names = [f"j-{n}" for n in range(5)]
    admin = memory_server.store()
    admin.start()
    admin.put("/jobs/other/config", b"{}")  # /jobs exists: one batch for all five
    job = Tally()
    rt, _store = _memory_runtime(memory_server, names, job)
    held = memory_server.pause("commit", path=JobPaths("j-2").instances)
    starter = threading.Thread(target=rt.start, name="test-start")
    starter.start()
    try:
        assert held.wait_reached(10), "the batch commit never came"
        admin.put(JobPaths("j-2").disabled_job, b"")
        held.release()
        starter.join(30)
        assert not starter.is_alive()
        assert rt.registrar is not None
        assert rt.registrar.stats["batched"] == 4
        assert rt.registrar.stats["one_by_one"] == 1
        assert rt.runners["j-2"].state.disabled_job
        _assert_registered(rt, admin, names)
        enabled = [n for n in names if n != "j-2"]
        _wait_all_ran(job, enabled)
        assert not any(n == "j-2" for n, _ in job.ran), "a disabled job ran"
    finally:
        held.release()
        rt.stop_now()
        admin.close()


@pytest.mark.parametrize("applied", [False, True], ids=["lost-request", "lost-reply"])
def test_a_failed_batch_commit_is_registered_by_housekeeping(
    memory_server: MemoryServer, applied: bool
) -> None:
    """A batch commit that raises (applied or not: the outcome is unknown) leaves its
    jobs unregistered; start() still returns, the next batches register, and the
    housekeeping pass registers the jobs of the failed one (one leader each, a
    membership each, every item runs)."""
    names = [f"k-{n:02d}" for n in range(30)]
    admin = memory_server.store()
    admin.start()
    admin.put("/jobs/other/config", b"{}")
    job = Tally()
    rt, store = _memory_runtime(memory_server, names, job)
    store.start()
    store.fail_next("commit", error=OperationTimeoutError, applied=applied)
    rt.start()
    try:
        assert rt.registrar is not None
        first = names[:21]  # the first batch: 21 jobs
        assert rt.registrar.stats["batched"] == len(names) - len(first)
        assert all(not rt.runners[n].state.registered for n in first)
        assert all(rt.runners[n].state.registered for n in names[21:])
        wait_until(
            lambda: all(r.state.registered for r in rt.runners.values()),
            30,
            message="housekeeping did not register the jobs of the failed batch",
        )
        _assert_registered(rt, admin, names)
        _wait_all_ran(job, names)
    finally:
        rt.stop_now()
        admin.close()


def test_a_session_expiry_during_the_batches_loses_nothing(registry_url: str) -> None:
    """The session expires while batches are being committed (real stores: the
    server ends it): the ephemeral nodes of the earlier batches are gone, yet every
    job ends up registered with a leader and runs."""
    names = [f"s-{n:03d}" for n in range(200)]  # 10 batches
    job = Tally()
    rt = _runtime(registry_url, names, job, interval=3)
    expired: list[str] = []

    def expire_mid_batch(stop: Callable[[], bool]) -> None:
        wait_until(
            lambda: stop() or (rt.registrar is not None and rt.registrar.stats["batched"] > 0),
            60,
        )
        if not stop():
            expired.append(expire_session(rt.store, wait=False))

    done = threading.Event()
    killer = threading.Thread(target=expire_mid_batch, args=(done.is_set,), name="test-expire")
    killer.start()
    try:
        rt.start()
        killer.join(60)
        assert expired, "the session was not expired"
        with open_store(registry_url) as admin:
            wait_until(
                lambda: all(
                    r.state.registered and r.election.is_leader for r in rt.runners.values()
                ),
                90,
                message=lambda: (
                    f"{sum(not r.state.registered for r in rt.runners.values())} unregistered"
                ),
            )
            _assert_registered(rt, admin, names)
        _wait_all_ran(job, names, timeout=90)
    finally:
        done.set()
        killer.join(60)
        rt.stop_now()
