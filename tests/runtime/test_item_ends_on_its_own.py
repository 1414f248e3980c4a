"""Each item of a fire ends on its own (issue 36 §2; newcomer review N15): one fire's
items on an instance used to form one batch whose marks were cleared when its slowest
item ended, and a fire due while any of them still ran was folded whole into a misfire
re-run. With a fire every second and item 0 taking 3.5 s once, items 1 and 2 then ran
only when item 0 had ended (every 3.5 s, as misfire re-runs). Now an item that ends is
completed by itself (its mark cleared, its result written) and its next fire starts on
time; only the slow item's fires are folded, into its own re-run, each pair once.
On the real stores, one instance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(90)

JOB = "siblings"
SLOW = 3.5


class OneSlowItem(ShardedJob):
    """Item 0's first run takes SLOW seconds; every other run returns at once. Records
    (item, fire time, start, misfire, covers) of each run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runs: list[tuple[int, float, float, bool, tuple[float, ...]]] = []
        self.slow_done = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        start = time.time()
        with self.lock:
            first_of_0 = ctx.item == 0 and not any(r[0] == 0 for r in self.runs)
            self.runs.append(
                (
                    ctx.item,
                    ctx.fire_time.timestamp(),
                    start,
                    ctx.is_misfire,
                    tuple(c.timestamp() for c in ctx.covers),
                )
            )
        if first_of_0:
            time.sleep(SLOW)  # the item's own long work, not a synchronisation
            self.slow_done.set()


@pytest.fixture
def job(registry_url: str, store: CoordinationStore) -> Iterator[OneSlowItem]:
    job = OneSlowItem()
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(job, JobConfig.parse(name=JOB, interval=1, sharding_total_count=3, misfire=True))
    rt.start()
    try:
        wait_until(lambda: Operations(store).job(JOB).leader, 30, message="no leader")
        yield job
    finally:
        rt.stop_now()


def test_a_slow_item_does_not_hold_its_siblings_next_fires(job: OneSlowItem) -> None:
    wait_until(job.slow_done.is_set, 30, message="item 0's slow run never ended")
    with job.lock:
        slow_fire = next(r[1] for r in job.runs if r[0] == 0)
    slow_end = slow_fire + SLOW
    # two fires more after the slow run: its re-run and the next fire of every item
    wait_until(
        lambda: sum(1 for r in list(job.runs) if r[0] == 0 and r[2] > slow_end) >= 2,
        20,
        message=lambda: f"item 0 ran {[r for r in job.runs if r[0] == 0]}",
    )
    with job.lock:
        runs = list(job.runs)
    inside = [f for f in (slow_fire + k for k in range(1, 4))]
    for item in (1, 2):
        own = {round(r[1]) for r in runs if r[0] == item and not r[3]}
        # each fire while item 0 ran was the sibling's own run, on time
        assert {round(f) for f in inside} <= own, (item, sorted(own), inside)
        late = [r[2] - r[1] for r in runs if r[0] == item and round(r[1]) in own]
        assert max(late) < 0.9, (item, late)
    # item 0's fires while it ran were folded into one later run of its own
    folded = [r for r in runs if r[0] == 0 and r[1] > slow_fire + 0.5]
    stood: list[int] = []
    for r in folded:
        stood += [round(r[1]), *(round(c) for c in r[4])]
    for f in inside:
        assert stood.count(round(f)) == 1, (round(f), sorted(stood), [r for r in runs if r[0] == 0])
    # no (fire, item) pair ran twice, and none was folded where it also ran
    for item in (0, 1, 2):
        fires = [round(r[1]) for r in runs if r[0] == item]
        covered = [round(c) for r in runs if r[0] == item for c in r[4]]
        assert len(fires) == len(set(fires)), (item, sorted(fires))
        assert not set(fires) & set(covered), (item, sorted(set(fires) & set(covered)))
