"""A job of 2,000 items stays readable (issue 27 section 7, newcomer step 4.1), on a
real ZooKeeper with two in-process runtimes: ``shardkeeper instances`` prints item
ranges on short lines, ``/api/jobs/{job}`` answers a page of items with the total,
and the console's job page is a summary and 100 rows with page links."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from shardkeeper.config import JobConfig
from shardkeeper.console import AuthConfig, create_app
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations, item_ranges
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import ServerCluster
from tests.console.conftest import BOB, NEVER, VIEWER_TOKEN, bearer, login

pytestmark = pytest.mark.timeout(180)

BIG = "big"
COUNT = 2000
#: store timeouts that a loaded machine meets (see ``registry_url``)
LOADED_OPTIONS: dict[str, float] = {
    "session_timeout": 20.0,
    "connection_timeout": 10.0,
    "operation_timeout": 10.0,
}
#: the terminal width the CLI is run with: every line of its tables fits in it
WIDTH = 160


@pytest.fixture
def backend() -> str:
    return "zookeeper"


@pytest.fixture
def registry_url(server: ServerCluster, namespace: str) -> str:
    """The test's ZooKeeper URL with timeouts of a loaded machine, not FAST_OPTIONS'.

    This test is about reading a big job, not about failover: with the 2 s session and
    operation timeouts of FAST_OPTIONS, a starved 2-core run of the full suite let a
    runtime's commit go unanswered past its gray-link limit (it gave up its session and
    fenced the one triggered fire, which a cron that never fires does not run again),
    or let the test's own reads of 2,000 items time out or lose their session.
    """
    return server.url(namespace, **LOADED_OPTIONS)


class Nothing(ShardedJob):
    """Does nothing: only the assignment matters."""

    def execute(self, ctx: ShardingContext) -> None:
        pass


@pytest.fixture
def big_job(registry_url: str, store: CoordinationStore) -> Iterator[Operations]:
    """Two runtimes sharing ``big`` (2,000 items, a cron that never fires), triggered
    once so that every item has an owner and a last result."""
    ops = Operations(store)
    runtimes: list[Runtime] = []
    try:
        for _ in range(2):
            rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=2)
            rt.add_job(
                Nothing(),
                JobConfig.parse(
                    name=BIG, cron=NEVER, sharding_total_count=COUNT, sharding_wait_timeout=20.0
                ),
            )
            rt.start()
            runtimes.append(rt)
        wait_until(lambda: len(ops.job(BIG).instances) == 2, 30, 0.1, "not both members")
        ops.trigger(BIG)

        def all_done() -> bool:
            items = ops.job(BIG).items
            return len(items) == COUNT and all(
                i.owner and i.last_outcome == "ok" and i.running_on is None for i in items
            )

        wait_until(all_done, 90, 0.2, "the 2,000 items did not all run once")
        yield ops
    finally:
        for rt in runtimes:
            rt.stop_now()


@pytest.fixture
def big_client(big_job: Operations) -> Iterator[TestClient]:
    auth = AuthConfig()
    auth.add_user(BOB[0], "viewer", password=BOB[1])
    auth.add_token("dashboard", "viewer", token=VIEWER_TOKEN)
    app: FastAPI = create_app(big_job, auth, refresh_seconds=0)
    with TestClient(app) as client:
        yield client


def test_item_ranges() -> None:
    assert item_ranges([]) == ""
    assert item_ranges([3]) == "3"
    assert item_ranges(range(1000)) == "0-999"
    assert item_ranges([1500, *range(1000), 1502, 1503, 1503]) == "0-999,1500,1502-1503"


def test_a_big_job_is_readable(
    big_job: Operations, big_client: TestClient, registry_url: str
) -> None:
    # the CLI: each instance's share as ranges, every line within the terminal
    env = {**os.environ, "COLUMNS": str(WIDTH), "SHARDKEEPER_REGISTRY": registry_url}
    shown = subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", "instances"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert max(len(line) for line in shown.stdout.splitlines()) <= WIDTH, shown.stdout
    shares = re.findall(rf"{BIG}: ([0-9,-]+)", shown.stdout)
    assert len(shares) == 2, shown.stdout
    # the two shares are ranges that cover 0..1999 exactly once
    covered: list[int] = []
    for share in shares:
        for part in share.split(","):
            first, _, last = part.partition("-")
            covered.extend(range(int(first), int(last or first) + 1))
    assert sorted(covered) == list(range(COUNT))
    assert len(",".join(shares)) < 40, shares  # not a list of 2,000 numbers
    # --json keeps every item number (a stable schema)
    as_json = subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", "instances", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    views = json.loads(as_json.stdout)["instances"]
    assert sorted(i for v in views for i in v["items"][BIG]) == list(range(COUNT))

    # the REST API: a page of items and the total
    api = big_client.get(f"/api/jobs/{BIG}", headers=bearer(VIEWER_TOKEN))
    assert api.status_code == 200, api.text
    document = api.json()
    assert (document["items_total"], document["items_offset"], document["items_limit"]) == (
        COUNT,
        0,
        100,
    )
    assert [i["item"] for i in document["items"]] == list(range(100))
    assert len(api.content) < 100_000, len(api.content)  # was 894 KB
    last = big_client.get(
        f"/api/jobs/{BIG}", params={"offset": 1950, "limit": 100}, headers=bearer(VIEWER_TOKEN)
    ).json()
    assert [i["item"] for i in last["items"]] == list(range(1950, COUNT))
    too_many = big_client.get(
        f"/api/jobs/{BIG}", params={"limit": 5000}, headers=bearer(VIEWER_TOKEN)
    )
    assert too_many.status_code == 422 and "limit" in too_many.text

    # the console: a summary, 100 rows, page links; the rest one click away
    login(big_client, BOB)
    page = big_client.get(f"/jobs/{BIG}").text
    assert len(re.findall(r'<tr id="item-\d+"', page)) == 100
    summary = re.search(r'<p id="items-summary">(.*?)</p>', page, re.S)
    assert summary and "2,000 items: 2,000 ok" in summary.group(1)
    assert "showing 1-100 of 2,000" in summary.group(1)
    links = re.search(r'<p class="pages" id="items-pages">(.*?)</p>', page, re.S)
    assert links and links.group(1).count("<a ") == 19  # 20 pages, this one not a link
    assert len(page) < 200_000, len(page)
    later = big_client.get(f"/jobs/{BIG}", params={"items_offset": 1900}).text
    rows = re.findall(r'<tr id="item-(\d+)"', later)
    assert rows == [str(i) for i in range(1900, COUNT)]

    # a disabled item is "worth a look": the notable view lists it alone
    big_job.disable_item(BIG, 1234)
    notable = big_client.get(f"/jobs/{BIG}", params={"items": "notable"}).text
    assert re.findall(r'<tr id="item-(\d+)"', notable) == ["1234"]
    assert "1 disabled" in notable

    bad = big_client.get(f"/jobs/{BIG}", params={"items_limit": "lots"})
    assert bad.status_code == 422 and "items_limit &#39;lots&#39;" in bad.text

    instances_page = big_client.get("/instances").text
    for share in shares:
        assert f"{BIG}</a>: {share}" in instances_page
