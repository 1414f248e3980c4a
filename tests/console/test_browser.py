"""The console in a real browser (headless Chromium through Selenium) against a
running cluster: open the console, see the items, disable an item, see it skipped
in the next fire, trigger, see the new history rows (the page refreshes itself).

Set ``SHARDKEEPER_CONSOLE_SCREENSHOT=docs/img/console-job.png`` to save a
screenshot of the job page there (the one in docs/console.md is made this way).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from shardkeeper.console import AuthConfig, create_app
from shardkeeper.history import HistoryReader
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from tests.console.browser import chromium, live_server
from tests.console.conftest import ALICE, JOB, Start, wait_leader

pytestmark = pytest.mark.timeout(120)
WAIT = 30.0  # seconds any one condition may take


@pytest.fixture
def live_app(store: CoordinationStore, auth: AuthConfig, history_url: str) -> Iterator[FastAPI]:
    """The console with a fast live refresh (what the test waits on)."""
    reader = HistoryReader(history_url)
    yield create_app(Operations(store), auth, history=reader, refresh_seconds=0.5)
    reader.close()


def until(driver: WebDriver, condition: Callable[[WebDriver], object], what: str) -> None:
    """Wait for ``condition`` (a page part may be replaced by a refresh meanwhile)."""
    WebDriverWait(
        driver, WAIT, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]
    ).until(condition, message=f"not seen within {WAIT} s: {what}")


def click(driver: WebDriver, element_id: str) -> None:
    """Click the element ``element_id`` (again if a refresh replaced it first)."""

    def clicked(d: WebDriver) -> bool:
        d.find_element(By.ID, element_id).click()
        return True

    until(driver, clicked, f"#{element_id} clickable")


# Reads run as one script: the live refresh may replace a page part between two
# WebDriver calls, never during one script.
def history_items(driver: WebDriver) -> list[int]:
    """The items of the history rows shown, newest first."""
    items: list[int] = driver.execute_script(
        "return Array.from(document.querySelectorAll('tr.history-row'))"
        ".map(r => Number(r.dataset.item))"
    )
    return items


def text(driver: WebDriver, selector: str) -> str:
    """The text of the first element matching ``selector`` ("" when there is none)."""
    value: str = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent.trim() : ''",
        selector,
    )
    return value


def ids(driver: WebDriver, selector: str) -> list[str]:
    """The ids of the elements matching ``selector``."""
    found: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.id)", selector
    )
    return found


def test_console_in_a_browser(
    live_app: FastAPI, cluster_job: Start, store: CoordinationStore, tmp_path: Path
) -> None:
    ops = Operations(store)
    cluster = cluster_job()
    [rt] = cluster.runtimes
    leader = wait_leader(ops)
    with live_server(live_app) as base, chromium(tmp_path / "profile") as driver:
        driver.get(f"{base}/jobs/{JOB}")
        until(driver, lambda d: d.find_elements(By.ID, "login"), "the login form")
        driver.find_element(By.ID, "username").send_keys(ALICE[0])
        driver.find_element(By.ID, "password").send_keys(ALICE[1])
        click(driver, "login")
        until(driver, lambda d: d.find_elements(By.ID, "job-name"), "the job page after login")
        assert text(driver, "#job-leader") == leader
        assert ids(driver, "#items tbody tr") == ["item-0", "item-1", "item-2"]

        # the first trigger: every item runs, the page shows owners and 3 history rows
        click(driver, "trigger")
        until(driver, lambda d: "triggered" in text(d, "#flash"), "trigger")
        until(driver, lambda d: sorted(history_items(d)) == [0, 1, 2], "3 history rows")
        until(
            driver,
            lambda d: text(d, "#item-0 .owner") == rt.instance_id,
            "item 0's owner",
        )

        # disable item 1: the next fire skips it
        click(driver, "disable-item-1")
        until(
            driver,
            lambda d: text(d, "#item-1 .item-disabled") == "disabled",
            "item 1 disabled",
        )
        driver.find_element(By.ID, "trigger-params").send_keys("batch=42")
        click(driver, "trigger")
        until(driver, lambda d: "1 parameter" in text(d, "#flash"), "trigger")
        # the second fire's runs of items 0 and 2, and item 1's part recorded skipped
        until(driver, lambda d: len(history_items(d)) == 6, "the second fire's history rows")
        assert sorted(history_items(driver)[:3]) == [0, 1, 2]  # newest first
        skipped = "tr.history-row[data-outcome='skipped']"
        assert len(ids(driver, skipped)) == 1
        assert text(driver, f"{skipped}[data-item='1'] .error") == "item disabled by an operator"
        assert cluster.ran() == [0, 0, 1, 2, 2]
        assert [p for i, p in cluster.jobs[0].runs()[3:]] == [{"batch": "42"}] * 2

        target = os.environ.get("SHARDKEEPER_CONSOLE_SCREENSHOT")
        if target:
            driver.execute_script("window.scrollTo(0, 0)")
            assert driver.save_screenshot(target), target
        driver.get(f"{base}/")
        until(driver, lambda d: d.find_elements(By.ID, f"job-{JOB}"), "the overview")
        assert leader in text(driver, f"#job-{JOB}")
