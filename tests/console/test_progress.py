"""The job page's item table shows a running item's progress (issue 28 section 2):
percent (with a bar), done/total, the note, the rate and the ETA, from
``ItemView.progress``; on a paged table, and gone once the item completes. On the
MemoryStore and a real ZooKeeper, with an in-process runtime."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.console.conftest import BOB, NEVER, VIEWER_TOKEN, bearer, login

pytestmark = pytest.mark.timeout(90)

SLOW = "copy"


@pytest.fixture(params=["memory", "zookeeper"], ids=["mem", "zk"])
def backend(request: pytest.FixtureRequest) -> str:
    """The in-process reference store and a real one."""
    return str(request.param)


class Halfway(ShardedJob):
    """Item 0 reports twice (0, then 500 of 1000: a rate), then waits for the test;
    the other items return at once."""

    def __init__(self) -> None:
        self.reported = threading.Event()
        self.release = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item != 0:
            return
        ctx.progress(0, 1000, "starting")
        # some time between the two reports, so that they give a rate (not a sync)
        threading.Event().wait(0.05)
        ctx.progress(500, 1000, "rows copied")
        self.reported.set()
        assert self.release.wait(60)


@pytest.fixture
def running(registry_url: str, store: CoordinationStore) -> Iterator[Halfway]:
    """A runtime of ``copy`` (3 items) whose item 0 is running, half done."""
    job = Halfway()
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=2)
    rt.add_job(
        job,
        JobConfig(name=SLOW, cron=NEVER, sharding_total_count=3, checkpoint_interval=0),
    )
    rt.start()
    try:
        ops = Operations(store)
        wait_until(lambda: ops.job(SLOW).leader, message="no leader elected")
        ops.trigger(SLOW)
        assert job.reported.wait(30), "item 0 never reported its progress"
        yield job
    finally:
        job.release.set()
        rt.stop_now()


def _row(page: str, item: int) -> str:
    match = re.search(rf'<tr id="item-{item}"[^>]*>(.*?)</tr>', page, re.S)
    assert match, f"no row of item {item}"
    return match.group(1)


def _cell(row: str) -> str:
    match = re.search(r'<td class="progress">(.*?)</td>', row, re.S)
    assert match, row
    return match.group(1)


def test_the_item_table_shows_progress_rate_and_eta(
    client: TestClient, running: Halfway, store: CoordinationStore
) -> None:
    login(client, BOB)
    url = f"/jobs/{SLOW}?items_limit=2"

    def shown() -> str | None:
        cell = _cell(_row(client.get(url).text, 0))
        return cell if "500/1000" in cell else None

    cell = wait_until(shown, 30, message="the progress never showed")
    assert '<progress max="100" value="50.0">' in cell
    assert '<span class="progress-amount">50.0% (500/1000)</span>' in cell
    assert "rows copied" in cell
    rate = re.search(r'<span class="progress-rate">([^<]*)</span>', cell)
    eta = re.search(r'<span class="progress-eta">([^<]*)</span>', cell)
    assert rate and re.fullmatch(r"[0-9.e+]+/s", rate.group(1)), cell
    assert eta and re.fullmatch(r"\d+s|\d+m\d\ds|\d+h\d\dm", eta.group(1)), cell

    # the table is still paged: 2 rows of 3, the others a link away
    page = client.get(url).text
    assert 'id="items-pages"' in page and 'id="item-2"' not in page
    assert _cell(_row(page, 1)) == "-"
    # and the running item is one worth a look
    notable = client.get(f"/jobs/{SLOW}?items=notable").text
    assert "500/1000" in _cell(_row(notable, 0))

    # the REST API answers the same report
    api = client.get(f"/api/jobs/{SLOW}", headers=bearer(VIEWER_TOKEN)).json()
    progress = next(i for i in api["items"] if i["item"] == 0)["progress"]
    assert (progress["done"], progress["total"], progress["percent"]) == (500, 1000, 50.0)

    # once the item completes its report is gone from the table
    running.release.set()
    ops = Operations(store)
    wait_until(
        lambda: all(i.running_on is None for i in ops.job(SLOW).items),
        30,
        message="item 0 never completed",
    )
    assert _cell(_row(client.get(url).text, 0)) == "-"
