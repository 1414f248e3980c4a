"""The job page of a 2,000-item job during a fire, in a real browser at 1,400 px
(newcomer review N15, N24): two items run long (one reports progress), two items have
failed, the rest have ended, all in the batches of the same fire.

It fails when the item table is wider than its container (a horizontal scrollbar, the
``disable`` buttons cut off), when a failed item reads ``ok``, when an item that has
ended reads ``running``, or when the summary counts every item both ``ok`` and
``running`` ("2,000 items: 2,000 ok, 2,000 running" while two had failed).
``SHARDKEEPER_BIG_JOB_SCREENSHOT=FILE.png`` saves the page it judges.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from selenium.webdriver.common.by import By

from shardkeeper.config import JobConfig
from shardkeeper.console import AuthConfig, create_app
from shardkeeper.history import HistoryReader
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from tests.console.browser import chromium, live_server
from tests.console.conftest import ALICE, NEVER
from tests.console.test_browser import click, text, until

pytestmark = pytest.mark.timeout(180)

BIG = "big-sync"
COUNT = 2000
SLOW = {5, 1500}
BROKEN = {7, 1999}


@pytest.fixture
def backend() -> str:
    return "etcd"


class BigSync(ShardedJob):
    """Items in SLOW report progress and wait for ``release``; items in BROKEN raise."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item in BROKEN:
            raise KeyError(f"partition {ctx.item} is gone")
        if ctx.item in SLOW:
            ctx.progress(35, 40, "rows copied")
            self.release.wait(120)


@pytest.fixture
def running_fire(
    registry_url: str, store: CoordinationStore, history_url: str
) -> Iterator[Operations]:
    """Two runtimes share ``big-sync``; one fire of it is under way: the SLOW items
    run, every other item has ended (BROKEN ones failed)."""
    ops = Operations(store)
    jobs: list[BigSync] = []
    runtimes: list[Runtime] = []
    try:
        for _ in range(2):
            job = BigSync()
            rt = Runtime(registry_url, worker_threads=8, coordinator_threads=2, shutdown_grace=1)
            rt.add_job(
                job,
                JobConfig.parse(
                    name=BIG,
                    cron=NEVER,
                    sharding_total_count=COUNT,
                    sharding_wait_timeout=20.0,
                    error_handler="log",
                ),
            )
            rt.start()
            jobs.append(job)
            runtimes.append(rt)
        wait_until(lambda: len(ops.job(BIG).instances) == 2, 30, 0.1, "not both members")
        ops.trigger(BIG)

        def fire_under_way() -> bool:
            items = {i.item: i for i in ops.job(BIG).items}
            return (
                all(items[i].last_outcome == "failed" for i in BROKEN)
                and all(items[i].progress is not None for i in SLOW)
                # the quick items are completed on their own (item 8 stands for them)
                and items[8].running_on is None
                and items[8].last_outcome == "ok"
            )

        wait_until(fire_under_way, 90, 0.2, "the failures were not shown while the fire ran")
        yield ops
    finally:
        for job in jobs:
            job.release.set()
        for rt in runtimes:
            rt.stop_now()


@pytest.fixture
def live_app(store: CoordinationStore, auth: AuthConfig, history_url: str) -> Iterator[FastAPI]:
    reader = HistoryReader(history_url)
    yield create_app(Operations(store), auth, history=reader, refresh_seconds=0)
    reader.close()


def test_job_page_of_a_2000_item_fire_at_1400_px(
    running_fire: Operations, live_app: FastAPI, tmp_path: Path
) -> None:
    ops = running_fire
    # the operators' view agrees before the browser looks: status counts the two
    # running items, not 2,000, and says failing at once
    status = next(j for j in ops.status().jobs if j.summary.name == BIG)
    assert status.health == "failing" and set(status.failing_items) == BROKEN
    assert status.running_items == len(SLOW)
    with live_server(live_app) as base, chromium(tmp_path / "profile", (1400, 1000)) as driver:
        driver.get(f"{base}/jobs/{BIG}")
        until(driver, lambda d: d.find_elements(By.ID, "login"), "the login form")
        driver.find_element(By.ID, "username").send_keys(ALICE[0])
        driver.find_element(By.ID, "password").send_keys(ALICE[1])
        click(driver, "login")
        until(driver, lambda d: d.find_elements(By.ID, "item-7"), "the item table")
        shot = os.environ.get("SHARDKEEPER_BIG_JOB_SCREENSHOT")
        if shot:  # to look at the page this test judges
            driver.save_screenshot(shot)
        geometry: dict[str, Any] = driver.execute_script(
            """
            const table = document.querySelector('#item-7').closest('table');
            const box = table.parentElement;
            const edge = box.getBoundingClientRect().right;
            const buttons = Array.from(table.querySelectorAll('button'));
            return {
              tableWidth: table.scrollWidth,
              boxScroll: box.scrollWidth, boxClient: box.clientWidth,
              pageScroll: document.documentElement.scrollWidth,
              pageClient: document.documentElement.clientWidth,
              buttons: buttons.length,
              cut: buttons.filter(b => b.getBoundingClientRect().right > Math.min(
                edge, window.innerWidth)).map(b => b.id),
            };
            """
        )
        assert geometry["buttons"] == 100, geometry  # one disable button per row shown
        assert geometry["boxScroll"] <= geometry["boxClient"], geometry
        assert geometry["pageScroll"] <= geometry["pageClient"], geometry
        assert geometry["cut"] == [], geometry

        for item in (7,):
            row = text(driver, f"#item-{item}")
            assert "failed" in row and "KeyError" in row, row
            assert text(driver, f"#item-{item} .health") == "failing"
        # an item that ended while its batch runs is completed on its own: not running
        # (no mark), its outcome shown
        assert text(driver, "#item-8 .running-on") in ("-", ""), text(driver, "#item-8")
        assert "ok" in text(driver, "#item-8") and "finished" not in text(driver, "#item-8")
        assert text(driver, "#item-8 .health") == "ok"
        assert "35/40" in text(driver, "#item-5 .progress")
        assert "finished" not in text(driver, "#item-5 .running-on")
        summary = text(driver, "#items-summary")
        assert "2 failing" in summary and "1,998 ok" in summary, summary
        assert "2 running" in summary and "2,000 running" not in summary, summary
