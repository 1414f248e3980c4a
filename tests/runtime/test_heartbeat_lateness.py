"""The housekeeping thread's lateness: a process starved of CPU says so (review
finding 15, its warning and measure; the process executor is issue 28)."""

from __future__ import annotations

import logging
import threading

import pytest

from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime.housekeeping import Housekeeper
from shardkeeper.runtime.liveness import Liveness
from shardkeeper.runtime.skiplog import SkipLog


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
