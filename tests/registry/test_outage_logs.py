"""While the store is down, the store clients' retry lines come at the skip summary's
cadence (one per 30 s), not several a second (issue 27 section 7; newcomer review
2026-12, D17: kazoo's ``Connection dropped`` about twice a second, the etcd watch an
INFO line five times a second).

Each backend test stops a server of its own, waits for the first retry line (a
condition), then counts lines over a bounded observation window: the window is what
is measured, not a synchronisation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkeeper.registry import open_store
from shardkeeper.registry.logthrottle import LogThrottle, RetryLogFilter
from shardkeeper.registry.zookeeper import session as zk_session
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import EtcdCluster, ServerCluster, ZooKeeperCluster

pytestmark = pytest.mark.timeout(180)

#: seconds of outage counted: several retries of both clients (kazoo ~0.5 s, the
#: etcd watch recovery 0.2 s), well inside one 30 s window
OBSERVE = 4.0


def observe(seconds: float) -> None:
    """Let ``seconds`` pass (the measuring window, bounded)."""
    began = time.monotonic()
    wait_until(lambda: time.monotonic() - began >= seconds, seconds + 10, message="clock")


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerCluster]:
    cls = ZooKeeperCluster if request.param == "zookeeper" else EtcdCluster
    cluster = cls(size=1, base_dir=tmp_path / "store")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


# -- the counting, on a clock of its own --------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_throttle_logs_the_first_then_one_per_window_with_the_count() -> None:
    clock = FakeClock()
    throttle = LogThrottle(window=30, clock=clock)
    assert throttle.admit("k") == 0  # news
    for _ in range(59):  # twice a second for 29.5 s
        clock.now += 0.5
        assert throttle.admit("k") is None
    assert throttle.held("k") == 59
    clock.now += 0.5
    assert throttle.admit("k") == 59  # the window is over: logged, with the count
    assert "59 more like it not logged" in throttle.suffix(59)
    clock.now += 0.5
    assert throttle.admit("k") is None
    assert throttle.admit("other") == 0  # kinds are counted apart
    clock.now += 31  # a quiet window: the next one is news again
    assert throttle.admit("k") == 1


def test_filter_throttles_only_its_messages(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    logger = logging.getLogger("shardkeeper.tests.retrylog")
    log_filter = RetryLogFilter(["dropped: %s"], LogThrottle(window=30, clock=clock))
    logger.addFilter(log_filter)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            for i in range(10):
                clock.now += 0.5
                logger.warning("dropped: %s", i)
                logger.warning("something else %s", i)
            clock.now += 30
            logger.warning("dropped: %s", "last")
    finally:
        logger.removeFilter(log_filter)
    lines = [r.getMessage() for r in caplog.records]
    assert lines.count("something else 3") == 1 and len(lines) == 10 + 2
    assert "dropped: 0" in lines
    assert "dropped: last (9 more like it not logged; one line per 30s while it repeats)" in lines


# -- the real clients ----------------------------------------------------------------


@pytest.mark.parametrize("own_cluster", ["zookeeper"], indirect=True)
def test_kazoo_reconnect_lines_while_zookeeper_is_down(
    own_cluster: ServerCluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a fresh count: another test of this process may have used the 30 s window
    throttle = LogThrottle()
    monkeypatch.setattr(zk_session.KAZOO_RETRY_FILTER, "throttle", throttle)
    store = open_store(own_cluster.url("outage", session_timeout=60))
    store.start()
    try:
        caplog.set_level(logging.INFO, logger="kazoo")
        own_cluster.stop()

        def retry_lines() -> list[str]:
            return [
                r.msg
                for r in caplog.records
                if r.name.startswith("kazoo") and r.msg in zk_session.KAZOO_RETRY_MESSAGES
            ]

        wait_until(retry_lines, 30, message="kazoo never noticed the outage")
        observe(OBSERVE)
        logged = retry_lines()
        held = sum(throttle.held(m) for m in zk_session.KAZOO_RETRY_MESSAGES)
    finally:
        store.close()
    # kazoo kept trying (about two attempts a second, each a line or two before)...
    assert held >= OBSERVE, f"only {held} retry lines held back in {OBSERVE}s"
    # ...and each kind of line was logged once, when the outage began
    assert logged and all(logged.count(m) == 1 for m in logged), logged


@pytest.mark.parametrize("own_cluster", ["etcd"], indirect=True)
def test_etcd_watch_recovery_lines_while_etcd_is_down(
    own_cluster: ServerCluster, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(own_cluster.url("outage", session_timeout=60, operation_timeout=1))
    store.start()
    try:
        events: list[object] = []
        store.watch("/w", events.append)
        caplog.set_level(logging.DEBUG, logger="shardkeeper.registry.etcd")
        own_cluster.stop()

        def retries(level: int) -> int:
            return sum(
                "not resumed yet" in r.getMessage() and r.levelno == level for r in caplog.records
            )

        wait_until(lambda: retries(logging.INFO), 30, message="no watch recovery line")
        info_before, debug_before = retries(logging.INFO), retries(logging.DEBUG)
        observe(OBSERVE)
        info = retries(logging.INFO) - info_before
        debug = retries(logging.DEBUG) - debug_before
        chatter = [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.INFO and r.name.startswith("shardkeeper.registry.etcd")
        ]
    finally:
        store.close()
    # the recovery kept trying (every 0.2 s, each attempt bounded by the 1 s
    # operation timeout), at DEBUG...
    assert debug >= 2, f"{debug} attempts at DEBUG in {OBSERVE}s"
    # ...and said so at INFO once, when it began
    assert info == 0, chatter
    assert retries(logging.INFO) == 1
