"""The audit trail's table in the history database, on SQLite and on PostgreSQL: written
and read back as the tools write it, filtered by namespace, job and time."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkeeper.errors import ConfigError
from shardkeeper.history import HistoryUnavailableError
from shardkeeper.history.audit import AuditTable
from shardkeeper.ops.audit import AuditEntry, new_entry_id


def entry(at: float, action: str, *, job: str | None = "j", namespace: str = "ns") -> AuditEntry:
    return AuditEntry(
        id=new_entry_id(at),
        at=at,
        who="alice",
        via="console",
        host="10.0.0.7",
        action=action,
        outcome="ok",
        job=job,
        item=3 if action.endswith("item") else None,
        details={"changes": {"retries": {"before": 0, "after": 2}}, "asked": ["i@1@a"]},
        namespace=namespace,
    )


def test_entries_are_written_and_read_back(history_url: str) -> None:
    written = [
        entry(1000.0, "disable-item"),
        entry(1001.0, "config-set"),
        entry(1002.0, "shutdown", job=None),
        entry(1003.0, "trigger", namespace="other"),
    ]
    table = AuditTable(history_url)
    try:
        assert table.read("ns") == []  # nothing written yet: no table, no error
        for e in written:
            table.write(e)
        assert table.read("ns") == [written[2], written[1], written[0]]
        assert table.read("ns", "j") == [written[1], written[0]]
        assert table.read("ns", "j", since=1001.0) == [written[1]]
        assert table.read("ns", limit=1) == [written[2]]
        assert table.read("other") == [written[3]]
        assert table.read("ns", "j")[1].details["changes"]["retries"]["after"] == 2
    finally:
        table.close()
    # a second tool finds the table there
    again = AuditTable(history_url)
    try:
        again.write(entry(1004.0, "enable-job"))
        assert [e.action for e in again.read("ns", "j")] == [
            "enable-job",
            "config-set",
            "disable-item",
        ]
    finally:
        again.close()


def test_an_entry_is_written_once(history_url: str) -> None:
    table = AuditTable(history_url)
    try:
        e = entry(1000.0, "disable-job")
        table.write(e)
        with pytest.raises(HistoryUnavailableError, match="cannot write the audit trail"):
            table.write(e)
        assert table.read("ns") == [e]
    finally:
        table.close()


def test_reading_creates_nothing_and_off_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "none" / "history.db"
    table = AuditTable(f"sqlite:///{path}")
    assert table.read("ns") == []
    assert not path.parent.exists()
    with pytest.raises(ConfigError, match="'off'"):
        AuditTable("off")
