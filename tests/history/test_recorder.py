"""HistoryRecorder and HistoryReader on real SQLite and real PostgreSQL."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from sqlalchemy import func, inspect, select

from shardkeeper.errors import ConfigError
from shardkeeper.history import (
    HistoryQuery,
    HistoryReader,
    HistoryRecorder,
    Retention,
    apply_retention,
    default_path,
    parse_since,
    resolve_url,
)
from shardkeeper.history.engine import open_engine
from shardkeeper.history.schema import executions
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.postgres import PostgresServer

pytestmark = pytest.mark.timeout(90)


def record(
    item: int,
    *,
    job: str = "orders",
    instance: str = "inst-1",
    age: float = 0.0,
    outcome: Outcome = Outcome.OK,
    fire: float | None = None,
    **extra: Any,
) -> ExecutionRecord:
    started = time.time() - age
    fire_time = started if fire is None else fire
    return ExecutionRecord(
        job=job,
        item=item,
        fire_time=fire_time,
        execution_id=f"{job}@{round(fire_time * 1000)}#{item}",
        instance=instance,
        started=started,
        ended=started + 0.25,
        outcome=outcome,
        **extra,
    )


def count_rows(url: str) -> int:
    resolved = resolve_url(url)
    assert resolved is not None
    engine = open_engine(resolved)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(executions)).scalar_one())
    finally:
        engine.dispose()


def test_records_are_written_and_each_filter_selects_them(history_url: str) -> None:
    """Every field round-trips; job, item, instance, failed, since, execution id and
    limit each select exactly the rows they should, newest first."""
    rec = HistoryRecorder(history_url)
    failed = record(
        1,
        age=60,
        outcome=Outcome.FAILED,
        error_type="ValueError",
        error_message="item 1 broke",
        traceback="Traceback (most recent call last):\n  ...\nValueError: item 1 broke\n",
        fencing_token=42,
        failover=True,
    )
    recs = [
        record(0, age=7200),  # two hours ago
        record(0, age=120, instance="inst-2"),
        failed,
        record(2, age=30, outcome=Outcome.TIMED_OUT, misfire=True),
        record(3, age=10, outcome=Outcome.FENCED),
        record(0, job="billing", age=5),
    ]
    for r in recs:
        rec.on_execution(r)
    now = time.time()
    rec.on_skip(SkipRecord(job="orders", fire_time=now - 1, instance="inst-1", reason="disabled"))
    rec.on_skip(
        SkipRecord(job="orders", fire_time=now - 2, instance="inst-2", reason="late", items=(4, 5))
    )
    assert rec.close(timeout=30)
    assert rec.stats().written == len(recs) + 3
    assert rec.stats().dropped == rec.stats().errors == 0

    with HistoryReader(history_url) as reader:
        rows = reader.executions("orders", limit=100)
        assert [(r.item, r.outcome) for r in rows] == [
            (-1, "skipped"),
            (5, "skipped"),  # same start time: the later row first
            (4, "skipped"),
            (3, "fenced"),
            (2, "timed_out"),
            (1, "failed"),
            (0, "ok"),
            (0, "ok"),
        ]
        assert [r.started for r in rows] == sorted((r.started for r in rows), reverse=True)
        skip = rows[0]
        assert skip.error_message == "disabled" and skip.duration == 0
        assert skip.execution_id.endswith("#-1")

        (got,) = reader.executions("orders", item=1)
        assert got.execution_id == failed.execution_id
        assert (got.error_type, got.error_message) == ("ValueError", "item 1 broke")
        assert got.traceback.endswith("ValueError: item 1 broke\n")
        assert (got.fencing_token, got.failover, got.misfire) == (42, True, False)
        assert got.duration == pytest.approx(0.25)
        assert got.to_dict()["outcome"] == "failed"

        assert {r.item for r in reader.executions("orders", instance="inst-2")} == {0, 4, 5}
        assert [r.outcome for r in reader.executions("orders", failed_only=True)] == [
            "timed_out",
            "failed",
        ]
        assert reader.executions("orders", failed_only=True, item=2)[0].misfire
        assert {r.item for r in reader.executions("orders", since=parse_since("90s"))} == {
            -1,
            1,
            2,
            3,
            4,
            5,
        }
        assert len(reader.executions("orders", since=parse_since("3h"))) == 8
        assert [r.item for r in reader.executions("orders", limit=2)] == [-1, 5]
        assert [r.item for r in reader.executions("billing")] == [0]
        assert reader.query(HistoryQuery(execution_id=failed.execution_id))[0].item == 1
        assert reader.executions("nothing") == []


def test_schema_is_created_on_first_use_with_its_indexes(history_url: str) -> None:
    resolved = resolve_url(history_url)
    assert resolved is not None
    with HistoryReader(history_url) as reader:
        assert reader.executions("orders") == []  # no table yet: empty, not an error
    rec = HistoryRecorder(history_url)
    rec.on_execution(record(0))
    assert rec.close(timeout=30)
    engine = open_engine(resolved)
    try:
        found = inspect(engine).get_indexes("executions")
        indexes = {ix["name"]: ix["column_names"] for ix in found}
    finally:
        engine.dispose()
    assert indexes["ix_executions_job_started"] == ["job", "started"]
    assert indexes["ix_executions_outcome"] == ["outcome"]


def test_reading_a_missing_sqlite_file_does_not_create_it(tmp_path: Any) -> None:
    path = tmp_path / "nested" / "history.db"
    with HistoryReader(f"sqlite:///{path}") as reader:
        assert reader.executions("orders") == []
    assert not path.exists() and not path.parent.exists()


def test_retention_by_age_and_by_rows_runs_in_the_writer(history_url: str) -> None:
    """Rows older than retention_days go, then the oldest beyond max_rows; the writer
    thread applies it on its own every retention_interval."""
    rec = HistoryRecorder(
        history_url, retention=Retention(days=1, max_rows=5), retention_interval=0.05
    )
    try:
        for item in range(3):
            rec.on_execution(record(item, age=3 * 86_400))  # three days old
        for item in range(10, 18):
            rec.on_execution(record(item, age=100 - item))
        wait_until(lambda: rec.stats().written == 11, 30, message=lambda: str(rec.stats()))
        wait_until(lambda: count_rows(history_url) == 5, 30, message=lambda: str(rec.stats()))
        assert rec.stats().deleted == 6
    finally:
        assert rec.close(timeout=30)
    with HistoryReader(history_url) as reader:
        assert [r.item for r in reader.executions("orders")] == [17, 16, 15, 14, 13]


def test_apply_retention_limits(history_url: str) -> None:
    """Each limit alone, and no limit keeps everything."""
    rec = HistoryRecorder(history_url, retention=Retention(days=None, max_rows=None))
    for item in range(4):
        rec.on_execution(record(item, age=item * 86_400))  # 0, 1, 2, 3 days old
    assert rec.close(timeout=30)
    resolved = resolve_url(history_url)
    assert resolved is not None
    engine = open_engine(resolved)
    try:
        assert apply_retention(engine, Retention(days=None, max_rows=None)) == 0
        assert apply_retention(engine, Retention(days=2.5, max_rows=None)) == 1
        assert apply_retention(engine, Retention(days=None, max_rows=2)) == 1
        assert apply_retention(engine, Retention(days=None, max_rows=2)) == 0
    finally:
        engine.dispose()
    with HistoryReader(history_url) as reader:
        # max_rows keeps the last rows written (items 1 and 2; item 0 was written first)
        assert sorted(r.item for r in reader.executions("orders")) == [1, 2]
    with pytest.raises(ConfigError, match=r"retention_days=0 must be > 0"):
        Retention(days=0)
    with pytest.raises(ConfigError, match=r"max_rows=0 must be >= 1"):
        Retention(max_rows=0)


class HeldRecorder(HistoryRecorder):
    """A recorder whose writer blocks inside its first write until released."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        super().__init__(*args, **kwargs)

    def write_batch(self, rows: list[dict[str, Any]]) -> None:
        self.entered.set()
        self.gate.wait(60)  # released by the test (bounded: never hangs the suite)
        super().write_batch(rows)


def test_a_full_queue_drops_and_counts_and_never_blocks(
    history_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With the writer held inside a write, the queue fills; further records return
    at once, are counted as dropped, and one warning is logged per interval. Released,
    the writer writes what was queued."""
    rec = HeldRecorder(history_url, queue_size=3, batch_size=1, warn_interval=3600)
    try:
        rec.on_execution(record(0))
        assert rec.entered.wait(30), "the writer never started a write"
        for item in (1, 2, 3):  # fill the queue (the writer holds item 0)
            rec.on_execution(record(item))
        assert rec.stats().queued == 3
        with caplog.at_level(logging.WARNING, logger="shardkeeper.history"):
            began = time.monotonic()
            for item in range(100, 150):
                rec.on_execution(record(item))
            elapsed = time.monotonic() - began
        # a put that blocked would wait for the 60 s gate
        assert elapsed < 5, f"50 records on a full queue took {elapsed:.1f}s"
        assert rec.stats().dropped == 50
        warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
    finally:
        rec.gate.set()
        assert rec.close(timeout=30)
    assert rec.stats().written == 4
    assert count_rows(history_url) == 4


def test_close_reports_records_it_could_not_write(history_url: str) -> None:
    """A close that times out while the writer is stuck says so (and returns)."""
    rec = HeldRecorder(history_url, queue_size=5, batch_size=1)
    rec.on_execution(record(0))
    assert rec.entered.wait(30)
    rec.on_execution(record(1))
    try:
        assert rec.close(timeout=0.2) is False
        rec.on_execution(record(2))  # after close: dropped, no error
        assert rec.stats().dropped == 1
    finally:
        rec.gate.set()


def test_database_down_then_back(caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL stops while records keep coming: nothing raises in the caller, the
    errors are counted and logged (without the password), and once the server is back
    the held batch and later records are written."""
    with PostgresServer() as pg:
        url = pg.create_database("outage").replace("postgres@", "postgres:s3cret@")
        rec = HistoryRecorder(url, retry_interval=0.1, batch_size=10)
        try:
            rec.on_execution(record(0))
            wait_until(lambda: rec.stats().written == 1, 30)
            pg.stop()
            with caplog.at_level(logging.WARNING, logger="shardkeeper.history"):
                rec.on_execution(record(1))  # returns: queued
                rec.on_skip(SkipRecord("orders", time.time(), "inst-1", "late"))
                wait_until(lambda: rec.stats().errors >= 2, 30, message=lambda: str(rec.stats()))
            assert rec.stats().written == 1
            logged = "\n".join(r.getMessage() for r in caplog.records)
            assert "write failed" in logged and "s3cret" not in logged
            assert "postgres:***@" in logged
            pg.start()
            wait_until(lambda: rec.stats().written == 3, 30, message=lambda: str(rec.stats()))
            rec.on_execution(record(2))
        finally:
            assert rec.close(timeout=30)
        assert rec.stats().written == 4
        with HistoryReader(url) as reader:
            assert sorted(r.item for r in reader.executions("orders")) == [-1, 0, 1, 2]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("mysql://admin:hunter2@db/history", "'mysql://admin:***@db/history'"),
        ("sqlite://", "'sqlite://'"),
        ("sqlite:///:memory:", "'sqlite:///:memory:'"),
        ("history.db", "'history.db'"),
        ("postgresql:///history", "'postgresql:///history'"),
        ("postgresql+psycopg2://u:pw@h/db", "'postgresql+psycopg2://u:***@h/db'"),
    ],
)
def test_a_bad_url_is_a_clear_error(value: str, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        HistoryRecorder(value)
    text = str(err.value)
    assert named in text, text
    assert "hunter2" not in text
    assert "'off', 'default' (the default file), sqlite:///PATH" in text
    assert "postgresql://USER:PASSWORD@HOST" in text


def test_default_names_the_default_file() -> None:
    """``default`` (any case) is the default file: what ``run`` records to when asked
    for it by name (unset, ``run`` records nothing)."""
    url = resolve_url(" Default ")
    assert url is not None and url.database == str(default_path())


def test_an_unusable_sqlite_directory_is_a_clear_error(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as err:
        HistoryRecorder(f"sqlite:///{blocker / 'sub' / 'history.db'}")
    assert f"history file '{blocker / 'sub' / 'history.db'}'" in str(err.value)
    assert "cannot create its directory" in str(err.value) and "'off'" in str(err.value)


def test_url_forms(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_path() == tmp_path / "shardkeeper" / "history.db"
    default = resolve_url(None)
    assert default is not None and default.database == str(default_path())
    assert resolve_url("") == default
    assert resolve_url("off") is None and resolve_url(" OFF ") is None
    assert HistoryRecorder.from_url("off") is None
    for form in ("postgres://u:p@h:5433/db", "postgresql://u:p@h:5433/db"):
        pg = resolve_url(form)
        assert pg is not None and pg.drivername == "postgresql+psycopg"
        assert (pg.host, pg.port, pg.database, pg.password) == ("h", 5433, "db", "p")
    with pytest.raises(ConfigError, match=r"duration '1x' is not valid.*30s, 15m, 1h, 2d"):
        parse_since("1x")
    assert parse_since("15m") == 900 and parse_since("2d") == 172_800
