"""Items that end while their batch still runs show as ended (newcomer review N15):
one fire's items on an instance are one batch whose running marks were cleared when
its slowest item ended, so before, ``shards``, ``status`` and the console showed every
item running, and a failure only once the slow sibling ended. Now each item is
completed as it ends (its mark cleared and its result written, coalesced, conditional
on its mark: issue 36 §2), and readers show it ended with its outcome. On the
reference MemoryStore, with ``shardkeeper shards`` run in this process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shardkeeper import cli
from shardkeeper.cli import inspect as cli_inspect
from shardkeeper.cli.render import make_console
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

JOB = "batch"
NEVER = "0 0 1 1 *"


@pytest.fixture
def backend() -> str:
    return "memory"


class SlowSibling(ShardedJob):
    """Item 0 waits for ``release``; item 1 raises; item 2 returns."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 0:
            self.release.wait(30)
        elif ctx.item == 1:
            raise RuntimeError("item 1 broke")


@pytest.fixture
def fire(registry_url: str, store: CoordinationStore) -> Iterator[SlowSibling]:
    job = SlowSibling()
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(
        job, JobConfig.parse(name=JOB, cron=NEVER, sharding_total_count=3, error_handler="log")
    )
    rt.start()
    ops = Operations(store)
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    ops.trigger(JOB)
    try:
        yield job
    finally:
        job.release.set()
        rt.stop_now()


def test_a_failure_shows_while_its_slow_sibling_runs(
    fire: SlowSibling,
    store: CoordinationStore,
    registry_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the table console is made at import with the width of the process's terminal
    # (COLUMNS of an xdist worker may be ~50, folding "(finished failed)" over lines):
    # render on the console a pipe gets, so the text checked is the terminal-free one
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(cli_inspect, "out", make_console())
    ops = Operations(store)

    wait_until(
        lambda: ops.job(JOB).items[1].last_outcome == "failed",
        timeout=10,
        message=lambda: str(ops.job(JOB).items),
    )
    detail = ops.job(JOB)
    slow, broken, _fine = detail.items
    assert slow.running and not slow.finished and slow.running_on is not None
    # completed on its own: no mark left, its outcome the failure
    wait_until(lambda: ops.job(JOB).items[1].running_on is None, timeout=10)
    broken = ops.job(JOB).items[1]
    assert not broken.running and broken.health == "failing"
    wait_until(
        lambda: (
            ops.job(JOB).items[2].running_on is None and ops.job(JOB).items[2].last_outcome == "ok"
        ),
        timeout=10,
    )
    status = next(j for j in ops.status().jobs if j.summary.name == JOB)
    assert status.health == "failing" and status.failing_items == [1]
    assert status.running_items == 1

    assert cli.main(["shards", JOB, "--json", "--registry", registry_url]) == 0
    data = json.loads(capsys.readouterr().out)
    by_item = {i["item"]: i for i in data["items"]}
    assert [bool(by_item[i]["running_on"]) for i in (0, 1, 2)] == [True, False, False]
    assert by_item[1]["last_outcome"] == "failed" and by_item[2]["last_outcome"] == "ok"
    assert cli.main(["shards", JOB, "--registry", registry_url]) == 0
    table = capsys.readouterr().out
    assert "item 1 broke" in table or "failed" in table, table

    # once the slow item ends, the batch completes: no mark is left, results stay
    fire.release.set()
    wait_until(lambda: all(i.running_on is None for i in ops.job(JOB).items), timeout=10)
    assert [i.last_outcome for i in ops.job(JOB).items] == ["ok", "failed", "ok"]
    assert not any(i.finished for i in ops.job(JOB).items)


def test_a_quick_batch_writes_no_result_early(
    registry_url: str, store: CoordinationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items of a few milliseconds: the batch completes before any item's own
    completion is due, and its one completion call settles every item, as before (no
    commit more)."""
    from shardkeeper.coordination.execution import ExecutionService

    calls: list[list[int]] = []
    original = ExecutionService.finish

    def counting(self: ExecutionService, items: Any, *args: Any, **kwargs: Any) -> list[int]:
        calls.append(sorted(items))
        return original(self, items, *args, **kwargs)

    monkeypatch.setattr(ExecutionService, "finish", counting)
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=1.0)
    rt.add_job(Quick(), JobConfig.parse(name=JOB, cron=NEVER, sharding_total_count=20))
    rt.start()
    try:
        ops = Operations(store)
        wait_until(lambda: ops.job(JOB).leader, message="no leader")
        ops.trigger(JOB)
        wait_until(
            lambda: all(i.last_outcome == "ok" and not i.running_on for i in ops.job(JOB).items),
            timeout=10,
        )
    finally:
        rt.stop_now()
    assert calls == [list(range(20))]


class Quick(ShardedJob):
    """5 ms an item: 20 items on 4 threads are done in some 25 ms."""

    def execute(self, ctx: ShardingContext) -> None:
        time.sleep(0.005)  # the item's own work, not a synchronisation
