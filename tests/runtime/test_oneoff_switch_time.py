"""A one-off job's fire due before an operator's switch is not dropped by it, as a
fire of the schedule due before a disable is not (JobState.item_disabled): the
leader's catch-up of an item switched off after ``at`` runs it at once, at a fire
time before the switch, while the switch is on. Before, an item (or the job)
switched off after ``at`` was not caught up until the enable: its owed fire waited
for an operator's switch that does not concern it (and with ``misfire`` off, an
enable after the 60 s grace recorded it skipped)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.oneoff import DoneRecord
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer, MemoryStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "onceswitch"
P = JobPaths(JOB)


class Recorder(ShardedJob):
    """Records (item, fire time) of every execution."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, float]] = []
        self._lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        """Record the run."""
        with self._lock:
            self.runs.append((ctx.item, ctx.fire_time.timestamp()))


@pytest.fixture
def admin(memory_server: MemoryServer) -> Iterator[MemoryStore]:
    store = memory_server.store()
    store.start()
    try:
        yield store
    finally:
        store.close()


def _done(admin: MemoryStore) -> DoneRecord | None:
    node = admin.get(P.done)
    return DoneRecord.from_bytes(node.value, node.path) if node is not None else None


@pytest.mark.parametrize("switch", ["item", "job"])
def test_a_switch_set_after_a_missed_one_off_fire_does_not_hold_its_catch_up(
    memory_server: MemoryServer, admin: MemoryStore, runtimes: list[Runtime], switch: str
) -> None:
    """Nobody was up at ``at`` (an hour ago). The first instance up joins, then an
    operator disables item 1 (or the job), before the leader's catch-up (it waits
    sharding_wait_timeout + 1 s after it leads). The items not switched off are
    caught up as always; the fire of those switched off was due long before the
    switch: they are caught up too, at a time between the join and the switch,
    and the job is done while the switch is on."""
    at = time.time() - 3600
    job = Recorder()
    cfg = JobConfig.parse(
        name=JOB,
        at=datetime.fromtimestamp(at, UTC),
        sharding_total_count=2,
        sharding_wait_timeout=2.0,
    )
    rt = Runtime(memory_server.store(), shutdown_grace=1)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered, 10)
    joined = runner.state.joined_at
    # the switch's time as stored (the store's clock): a little after the join
    switched = max(time.time(), joined + 0.1)
    path = P.disabled_item(1) if switch == "item" else P.disabled_job
    admin.put(path, json.dumps({"at": switched}).encode())

    def off() -> bool:
        st = runner.state
        return 1 in st.disabled_items if switch == "item" else st.disabled_job

    wait_until(off, 10, message="the disable was not seen")
    assert job.runs == [], "caught up before the switch was seen: the test proves nothing"
    wait_until(
        lambda: _done(admin),
        20,
        message=lambda: f"never done; runs {job.runs}",
    )
    assert sorted(item for item, _f in job.runs) == [0, 1]
    held = [f for item, f in job.runs if item == 1 or switch == "job"]
    assert held and all(joined - 1e-3 <= fire < switched for fire in held)
    assert off()  # they ran while the switch was on
