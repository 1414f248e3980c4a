"""What a newcomer missed in the console (issue 27 section 7), through a TestClient
against real stores and in-process runtimes: a failed history row opens its
traceback and "failed N in a row" links to the item's failed runs; a refused config
save says so at the top of the page, naming each bad value, with the typed values
kept; an owner that is no longer a live instance of the job is marked gone; every
time shown carries its zone."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from shardkeeper.errors import StoreAuthError
from shardkeeper.history import HistoryRecorder
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.console.conftest import ALICE, BOB, JOB, Start, csrf_of, login, rec_config, wait_leader

pytestmark = pytest.mark.timeout(90)

#: a time as the console shows it, and what follows it
TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(.{0,6})")


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


class FailsOnItemOne(ShardedJob):
    """Item 1 raises ``KeyError: 'us'`` on every run; the others succeed."""

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            regions: dict[str, int] = {}
            regions["us"] += 1  # the line the traceback shows


@pytest.fixture
def failing(registry_url: str, history_url: str) -> Iterator[Runtime]:
    """A runtime of ``rec`` whose item 1 always fails, recording history."""
    recorder = HistoryRecorder(history_url)
    rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, observers=[recorder])
    rt.add_job(FailsOnItemOne(), rec_config())
    rt.start()
    yield rt
    rt.stop_now()
    recorder.close(timeout=10)


def row_of(page: str, item: int) -> str:
    match = re.search(rf'<tr id="item-{item}"[^>]*>(.*?)</tr>', page, re.S)
    assert match, f"no row of item {item}"
    return match.group(1)


def test_a_failed_run_opens_its_traceback_and_the_streak_links_to_failed_runs(
    client: TestClient, failing: Runtime, ops: Operations
) -> None:
    wait_leader(ops)
    for fires in (1, 2):
        ops.trigger(JOB)
        wait_until(
            lambda: (
                ops.job(JOB).items[1].failures == fires  # noqa: B023
                and all(i.running_on is None for i in ops.job(JOB).items)
            ),
            message=lambda: str(ops.job(JOB).items[1]),
        )
    login(client, BOB)

    def history(query: str) -> list[str]:
        page = client.get(f"/jobs/{JOB}{query}").text
        return re.findall(r'<tr class="history-row.*?</tr>', page, re.S)

    wait_until(lambda: len(history("")) == 6, message=lambda: str(history("")))
    page = client.get(f"/jobs/{JOB}").text
    link = re.search(r'<a class="failed-runs" href="([^"]+)"[^>]*>([^<]*)</a>', row_of(page, 1))
    assert link, row_of(page, 1)
    assert link.group(2) == "(2 in a row)"
    target = html.unescape(link.group(1))
    assert target == f"/jobs/{JOB}?item=1&failed=1#history"
    assert "failed-runs" not in row_of(page, 0)  # a healthy item links nowhere

    failed = history(target.split("#")[0].removeprefix(f"/jobs/{JOB}"))
    assert len(failed) == 2
    for row in failed:
        assert 'data-item="1"' in row and 'data-outcome="failed"' in row
        shown = re.search(
            r'<details class="traceback"[^>]*>\s*<summary>traceback</summary>'
            r"\s*<pre>(.*?)</pre>",
            row,
            re.S,
        )
        assert shown, row
        traceback = html.unescape(shown.group(1))
        assert traceback.startswith("Traceback (most recent call last):")
        assert 'regions["us"] += 1' in traceback and traceback.rstrip().endswith("KeyError: 'us'")
    # an ok run has no traceback to open
    ok = [r for r in history("?item=0") if 'data-outcome="ok"' in r]
    assert ok and all("<details" not in r for r in ok)
    # one execution's page opens it at once
    execution = re.search(r"<code>([^<]+)</code>", failed[0])
    assert execution
    one = history(f"?execution={quote(html.unescape(execution.group(1)), safe='')}")
    assert len(one) == 1 and re.search(r'<details class="traceback"[^>]* open>', one[0])


def test_every_time_shown_names_its_zone(
    client: TestClient, failing: Runtime, ops: Operations
) -> None:
    wait_leader(ops)
    ops.trigger(JOB)
    wait_until(lambda: all(i.last_run for i in ops.job(JOB).items), message="every item ran")
    login(client, ALICE)
    token = csrf_of(client.get(f"/jobs/{JOB}").text)
    assert client.post(f"/jobs/{JOB}/disable", data={"csrf": token}).status_code == 200
    wait_until(
        lambda: len(re.findall(r"history-row", client.get(f"/jobs/{JOB}").text)) == 3,
        message="3 history rows",
    )
    for url, least in ((f"/jobs/{JOB}", 3 + 3 + 1), ("/instances", 1), ("/audit", 1)):
        times = TIME.findall(client.get(url).text)
        # the item table's last runs, the history's starts, the config's write ...
        assert len(times) >= least, (url, times)
        assert all(after.startswith(" UTC") for after in times), (url, times)


def test_a_refused_config_save_says_so_at_the_top(
    client: TestClient,
    cluster_job: Start,
    ops: Operations,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster_job()
    wait_leader(ops)
    login(client, ALICE)
    token = csrf_of(client.get(f"/jobs/{JOB}").text)
    url = f"/jobs/{JOB}/config"

    def notice(page: str) -> str:
        """The notice's text; it comes before the page's heading."""
        match = re.search(
            r'<div class="alert alert-error" id="config-notice"[^>]*>(.*?)</div>', page, re.S
        )
        assert match, "no notice"
        assert page.index('id="config-notice"') < page.index("<h1>")
        return " ".join(html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).split())

    bad = client.post(
        url, data={"csrf": token, "sharding_total_count": "many", "cron": "61 * * * *"}
    )
    assert bad.status_code == 422
    text = notice(bad.text)
    assert "Configuration not saved" in text
    assert re.search(r'sharding_total_count = "many": .*many.*valid integer', text), text
    assert re.search(r'cron = "61 \* \* \* \*": .*61', text), text
    assert 'id="cfg-sharding_total_count" value="many"' in bad.text  # the input is kept
    assert ops.job(JOB).config["sharding_total_count"] == 3

    # refused by the store: the same notice, the typed values kept, nothing written
    def refuse(*_: object, **__: object) -> None:
        raise StoreAuthError("permission denied: the registry user may not write /jobs/rec")

    monkeypatch.setattr(Operations, "edit_config", refuse)
    refused = client.post(url, data={"csrf": token, "description": "nightly"})
    assert refused.status_code == 503
    assert "the registry refused the write: permission denied" in notice(refused.text)
    assert 'id="cfg-description" value="nightly"' in refused.text
    monkeypatch.undo()
    assert ops.job(JOB).config.get("description", "") == ""

    good = client.post(url, data={"csrf": token, "description": "nightly"})
    assert good.status_code == 200 and 'id="config-notice"' not in good.text


def test_an_owner_that_is_gone_is_marked(
    client: TestClient, cluster_job: Start, ops: Operations
) -> None:
    a, b = cluster_job(2).runtimes
    wait_until(lambda: len(ops.job(JOB).instances) == 2, message="both instances joined")
    ops.trigger(JOB)
    wait_until(
        lambda: {i.owner for i in ops.job(JOB).items} == {a.instance_id, b.instance_id},
        message=lambda: str([i.owner for i in ops.job(JOB).items]),
    )
    login(client, BOB)
    page = client.get(f"/jobs/{JOB}").text
    assert "instance-gone" not in page and "badge-gone" not in page

    b.stop_now()
    wait_until(lambda: b.instance_id not in ops.job(JOB).instances, message="b left")
    detail = ops.job(JOB)
    gone = [i.item for i in detail.items if i.owner == b.instance_id]
    kept = [i.item for i in detail.items if i.owner == a.instance_id]
    assert gone and kept  # no reshard before the next trigger: b still owns items
    page = client.get(f"/jobs/{JOB}").text
    for item in gone:
        owner = re.search(r'<td class="owner">(.*?)</td>', row_of(page, item), re.S)
        assert owner and 'class="instance instance-gone"' in owner.group(1)
        assert b.instance_id in owner.group(1) and ">gone</span>" in owner.group(1)
    for item in kept:
        owner = re.search(r'<td class="owner">(.*?)</td>', row_of(page, item), re.S)
        assert owner and "gone" not in owner.group(1) and a.instance_id in owner.group(1)
