"""The housekeeping thread's lateness: a process starved of CPU says so (review
finding 15, its warning and measure; the process executor is issue 28)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime.fire.skiplog import SkipLog
from shardkeeper.runtime.health.liveness import Liveness
from shardkeeper.runtime.housekeeping import Housekeeper
from shardkeeper.testing.faults import wait_until


def test_a_tick_a_whole_cadence_late_is_recorded_and_warned_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = MemoryServer()
    try:
        store = server.store(session_timeout=3.0)
        liveness = Liveness(store)
        hk = Housekeeper(
            store,
            liveness,
            "host@1@me",
            runners=list,
            started=threading.Event(),
            stopped=threading.Event(),
            stopping=lambda: False,
            reput_instance=lambda: None,
            session_id=lambda: "",
            skips=SkipLog(),
        )
        cadence = liveness.cadence  # 1 s
        with caplog.at_level(logging.WARNING, logger="shardkeeper.runtime.housekeeping"):
            hk.note_wake(100.0, 100.2)  # a little late: normal scheduling
            assert not caplog.records
            hk.note_wake(200.0, 200.0 + 2.5 * cadence)
            hk.note_wake(210.0, 210.0 + 1.5 * cadence)  # within the minute: not again
        assert hk.lateness == pytest.approx(1.5 * cadence)
        assert hk.max_lateness == pytest.approx(2.5 * cadence)
        warnings = [r for r in caplog.records if "starved of CPU" in r.getMessage()]
        assert len(warnings) == 1
        assert "2.50 s late" in warnings[0].getMessage()
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("cpu_share", "says", "not_says"),
    [
        (0.02, ["almost no CPU (2% of a core)", "paused (SIGSTOP"], "CPU-bound items"),
        (1.0, ["starved of CPU", "CPU-bound items"], "paused"),
    ],
    ids=["paused", "busy"],
)
def test_a_late_wake_names_a_pause_when_the_process_used_no_cpu(
    caplog: pytest.LogCaptureFixture, cpu_share: float, says: list[str], not_says: str
) -> None:
    """Review newcomer-2 N25: after a SIGSTOP the warning blamed CPU-bound items. A
    process that used almost no CPU while the thread waited was paused, not busy."""
    server = MemoryServer()
    try:
        store = server.store(session_timeout=3.0)
        liveness = Liveness(store)
        hk = Housekeeper(
            store,
            liveness,
            "host@1@me",
            runners=list,
            started=threading.Event(),
            stopped=threading.Event(),
            stopping=lambda: False,
            reput_instance=lambda: None,
            session_id=lambda: "",
            skips=SkipLog(),
        )
        with caplog.at_level(logging.WARNING, logger="shardkeeper.runtime.housekeeping"):
            hk.note_wake(300.0, 307.84, cpu_share=cpu_share)
        [warning] = [r.getMessage() for r in caplog.records]
        assert "7.84 s late" in warning
        for fragment in says:
            assert fragment in warning, warning
        assert not_says not in warning
    finally:
        server.shutdown()


_PAUSED_CHILD = """
import logging, sys, threading
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime.housekeeping import Housekeeper
from shardkeeper.runtime.health.liveness import Liveness
from shardkeeper.runtime.fire.skiplog import SkipLog

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
store = MemoryServer().store(session_timeout=3.0)
stopped = threading.Event()
hk = Housekeeper(store, Liveness(store), "host@1@me", runners=list,
                 started=threading.Event(), stopped=stopped, stopping=lambda: False,
                 reput_instance=lambda: None, session_id=lambda: "", skips=SkipLog())
hk.start()
print("ready", flush=True)
sys.stdin.read()  # until the test closes it
stopped.set()
"""


def test_a_stopped_process_is_told_it_was_paused(tmp_path: Path) -> None:
    """The real measure: SIGSTOP a process whose housekeeping thread runs every 1 s
    for 3 s; once continued it warns of a pause, not of CPU-bound items."""
    err = tmp_path / "err"

    def warned() -> str | None:
        text = err.read_text()
        return text if "late" in text else None

    with err.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", _PAUSED_CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sink,
            text=True,
        )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready", err.read_text()
        child.send_signal(signal.SIGSTOP)
        resumed_at = time.monotonic() + 3.0
        wait_until(lambda: time.monotonic() >= resumed_at, timeout=10, interval=0.1)
        child.send_signal(signal.SIGCONT)
        text = wait_until(warned, timeout=20, message="no lateness warning after the pause")
        assert "paused (SIGSTOP" in text and "CPU-bound items" not in text, text
    finally:
        child.kill()
        child.wait(10)
        child.stdin.close()
        child.stdout.close()
