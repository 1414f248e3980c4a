"""One failover entry per item: a second fire's hand-off folds the first, never
overwrites it (issue 25, chaos finding).

600 s chaos run on etcd, seed 1946735743: a stopping instance interrupted two runs of
item 1 of the ``long`` job (the misfire re-run of fire 834 and the run of fire 842)
and handed both to failover; the second Put overwrote the first's queue entry, the
taker ran fire 842 only, and fire 834 was never run again nor covered by any run.
Now the later entry folds the earlier one (``FailoverEntry.folds``), the queue write
is conditional on what was read, and the claimed run stands for the folded fire in
``ctx.covers``. On the MemoryStore, both ways of checking groups.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import MAX_FOLDS, FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.results import ItemResult
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import Create
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

P = JobPaths("folds")
ME = "host@1@stopping"


@pytest.fixture(params=[False, True], ids=["together", "apart"])
def store(request: pytest.FixtureRequest) -> Iterator[MemoryStore]:
    server = MemoryServer(groups_apart=request.param)
    s = server.store()
    s.start()
    try:
        yield s
    finally:
        server.shutdown()


def _mark(store: MemoryStore, item: int, fire: float) -> int:
    """Our running mark of ``item`` for ``fire`` with a fence child: its token."""
    mark = RunningMark(ME, fire, f"folds@{fire:.0f}#{item}")
    fence = f"fence-{int(fire):016x}"
    assert store.commit(
        [Create(P.running(item), mark.to_bytes()), Create(f"{P.running(item)}/{fence}")]
    )
    node = store.get(P.running(item))
    assert node is not None
    return node.created_revision


def _hand_off(service: FailoverService, store: MemoryStore, item: int, fire: float) -> list[int]:
    token = _mark(store, item, fire)
    entry = FailoverEntry(fire, f"folds@{fire:.0f}#{item}", ME)
    return service.hand_off({item: (token, entry, f"fence-{int(fire):016x}")}, keep=True)


def test_a_second_fire_handed_off_folds_the_first(store: MemoryStore) -> None:
    service = FailoverService(store, P, ME)
    assert _hand_off(service, store, 1, 834.0) == [1]
    assert _hand_off(service, store, 1, 842.0) == [1]
    node = store.get(P.failover_item(1))
    assert node is not None
    entry = FailoverEntry.from_bytes(node.value)
    assert (entry.fire_time, entry.folds) == (842.0, (834.0,))
    claims = FailoverService(store, P, "host@2@taker").claim_many(limit=5)
    assert [(c.item, c.entry.fire_time, c.entry.folds) for c in claims] == [(1, 842.0, (834.0,))]


def test_an_earlier_fire_handed_off_after_a_later_one_is_folded_too(store: MemoryStore) -> None:
    service = FailoverService(store, P, ME)
    assert _hand_off(service, store, 2, 842.0) == [2]
    assert _hand_off(service, store, 2, 834.0) == [2]
    assert _hand_off(service, store, 2, 842.0) == [2]  # the same fire again: one entry
    node = store.get(P.failover_item(2))
    assert node is not None
    entry = FailoverEntry.from_bytes(node.value)
    assert (entry.fire_time, entry.folds) == (842.0, (834.0,))


def test_the_requeue_of_a_dead_owners_mark_folds_a_waiting_entry(store: MemoryStore) -> None:
    """The leader requeues a dead instance's mark of item 3 (fire 850) while an entry of
    fire 842 waits for it: the queue keeps both fires."""
    waiting = FailoverEntry(842.0, "folds@842#3", "host@9@earlier")
    store.put(P.failover_item(3), waiting.to_bytes())
    dead = RunningMark("host@8@dead", 850.0, "folds@850#3")
    assert store.commit([Create(P.running(3), dead.to_bytes())])
    assert FailoverService(store, P, "host@2@leader").requeue_orphans(live=set()) == [3]
    node = store.get(P.failover_item(3))
    assert node is not None
    entry = FailoverEntry.from_bytes(node.value)
    assert (entry.fire_time, entry.from_instance, entry.folds) == (850.0, "host@8@dead", (842.0,))


def test_fold_keeps_the_newest_folds_and_old_entries_read_as_before() -> None:
    a = FailoverEntry(1000.0, "x@1000#0", "a", 1.0, tuple(float(t) for t in range(MAX_FOLDS)))
    b = FailoverEntry(2000.0, "x@2000#0", "b", 2.0, (1500.0,))
    folded = b.fold(a)
    assert folded.fire_time == 2000.0 and folded.execution_id == "x@2000#0"
    assert len(folded.folds) == MAX_FOLDS and folded.folds[-2:] == (1000.0, 1500.0)
    assert folded.folds == tuple(sorted(folded.folds))
    assert a.fold(b) == folded
    plain = FailoverEntry(5.0, "x@5#0", "c", 6.0)
    assert b"folds" not in plain.to_bytes()
    assert FailoverEntry.from_bytes(plain.to_bytes()) == plain


class Covers(ShardedJob):
    """Records (fire, item, covered fires) of every run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[float, int, tuple[float, ...]]] = []

    def execute(self, ctx: ShardingContext) -> None:
        with self.lock:
            self.runs.append(
                (ctx.fire_time.timestamp(), ctx.item, tuple(t.timestamp() for t in ctx.covers))
            )


@pytest.mark.timeout(60)
def test_the_claimed_run_stands_for_the_folded_fires(memory_server: MemoryServer) -> None:
    """A queued entry with folds: the instance that claims it runs its fire, and
    ``ctx.covers`` names the folded ones (the history and the checker count them)."""
    job = Covers()
    paths = JobPaths("claimed")
    seed = memory_server.store("ns")
    seed.start()
    fire = float(int(time.time()) - 30)
    entry = FailoverEntry(
        fire, f"claimed@{fire:.0f}#0", "host@8@gone", folds=(fire - 20, fire - 10)
    )
    seed.put(paths.failover_item(0), entry.to_bytes())
    rt = Runtime(memory_server.store("ns"), shutdown_grace=1)
    rt.add_job(
        job,
        JobConfig(name="claimed", cron="0 0 0 1 1 ?", sharding_total_count=1, failover=True),
    )
    rt.start()
    try:
        wait_until(lambda: bool(job.runs), 20, message="the queued entry was never claimed")
        with job.lock:
            assert job.runs[0] == (fire, 0, (fire - 20, fire - 10))
    finally:
        rt.stop_now()
        seed.close()


@pytest.mark.timeout(60)
def test_a_claimed_run_covers_the_fires_since_the_items_last_completed_run(
    memory_server: MemoryServer,
) -> None:
    """An hourly job's item completed at H-5; its owner died in the run of H-1 (the
    entry queued for failover) and nobody ran H-4, H-3 and H-2. The run that claims
    H-1 stands for them too, as a trigger's start would: before, the claim marked the
    item decided at H-1 with no covers, and those fires stayed lost (600 s chaos on
    etcd: a dead owner's fires of the long job)."""
    job = Covers()
    paths = JobPaths("hourly")
    hour = 3600.0
    # not within a few seconds of an hour boundary: the job's own fire must not come
    wait_until(lambda: 5 < time.time() % hour < hour - 10, hour, message="clock")
    h = time.time() // hour * hour
    seed = memory_server.store("ns2")
    seed.start()
    seed.put(
        paths.result(0),
        ItemResult("ok", h - 5 * hour, h - 5 * hour, h - 5 * hour + 1, "host@8@gone").to_bytes(),
    )
    entry = FailoverEntry(h - hour, f"hourly@{h - hour:.0f}#0", "host@8@gone")
    seed.put(paths.failover_item(0), entry.to_bytes())
    rt = Runtime(memory_server.store("ns2"), shutdown_grace=1)
    config = JobConfig(
        name="hourly", cron="0 0 * * * ?", sharding_total_count=1, failover=True, misfire=True
    )
    rt.add_job(job, config)
    rt.start()
    try:
        wait_until(lambda: bool(job.runs), 20, message="the queued entry was never claimed")
        with job.lock:
            assert job.runs[0] == (h - hour, 0, (h - 4 * hour, h - 3 * hour, h - 2 * hour))
    finally:
        rt.stop_now()
        seed.close()


class _Gate(Covers):
    """Covers, whose first run waits for the test's word."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.first = True

    def execute(self, ctx: ShardingContext) -> None:
        super().execute(ctx)
        if self.first:
            self.first = False
            assert self.release.wait(30)


@pytest.mark.timeout(60)
def test_a_claim_after_a_run_here_was_taken_over_covers_from_the_last_completed_run(
    memory_server: MemoryServer,
) -> None:
    """An hourly item last completed at H-5. This instance claims H-3 (covering H-4),
    but its run is taken over elsewhere: its completion writes nothing, and H-4 and
    H-3 stand nowhere. Then it claims H-1, queued by another instance with no folds:
    that run covers H-4, H-3 and H-2. Before, this instance remembered it had decided
    H-3 and covered H-2 only (600 s chaos on etcd: a long item's fires, whose run here
    was fenced and handed over by another instance, were lost)."""
    job = _Gate()
    paths = JobPaths("undone")
    hour = 3600.0
    wait_until(lambda: 5 < time.time() % hour < hour - 10, hour, message="clock")
    h = time.time() // hour * hour
    seed = memory_server.store("ns3")
    seed.start()
    other = "host@9@other"
    seed.put(paths.result(0), ItemResult("ok", h - 5 * hour, 0.0, 1.0, other).to_bytes())
    seed.put(
        paths.failover_item(0),
        FailoverEntry(h - 3 * hour, f"undone@{h - 3 * hour:.0f}#0", "host@8@gone").to_bytes(),
    )
    rt = Runtime(memory_server.store("ns3"), shutdown_grace=1)
    config = JobConfig(
        name="undone", cron="0 0 * * * ?", sharding_total_count=1, failover=True, misfire=True
    )
    rt.add_job(job, config)
    rt.start()
    try:
        wait_until(lambda: bool(job.runs), 20, message="the first entry was never claimed")
        assert job.runs[0] == (h - 3 * hour, 0, (h - 4 * hour,))
        # taken over elsewhere while it ran: another (live) instance's mark and fence
        seed.put(paths.instance(other), b"{}", ephemeral=True)
        seed.delete(paths.running(0), recursive=True)
        mark = RunningMark(other, h - 3 * hour, f"undone@{h - 3 * hour:.0f}#0", failover=True)
        assert seed.commit(
            [Create(paths.running(0), mark.to_bytes()), Create(f"{paths.running(0)}/fence-x")]
        )
        job.release.set()
        # the other instance's run was cut off too and its item queued for a later fire
        wait_until(lambda: not _busy(rt), 20, message="the taken-over run never ended here")
        seed.delete(paths.running(0), recursive=True)
        seed.put(
            paths.failover_item(0),
            FailoverEntry(h - hour, f"undone@{h - hour:.0f}#0", other).to_bytes(),
        )
        wait_until(lambda: len(job.runs) >= 2, 20, message="the second entry was never claimed")
        with job.lock:
            assert job.runs[1] == (h - hour, 0, (h - 4 * hour, h - 3 * hour, h - 2 * hour))
    finally:
        rt.stop_now()
        seed.close()


def _busy(rt: Runtime) -> bool:
    """Whether any job of ``rt`` has a batch in hand."""
    return any(r.batches.busy_items() for r in rt.runners.values())
