"""The fires a run stood for (``ctx.covers``) in the history, and an older table
brought up to date, on real SQLite and real PostgreSQL."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import MetaData, Table, inspect, text

from shardkeeper.history import HistoryQuery, HistoryReader, HistoryRecorder, resolve_url
from shardkeeper.history.engine import open_engine
from shardkeeper.history.schema import ensure_schema, executions
from shardkeeper.observe import ExecutionRecord, Outcome

pytestmark = pytest.mark.timeout(90)


def _old_table() -> Table:
    """The executions table as releases before the covers column created it."""
    return Table(
        "executions",
        MetaData(),
        *(c._copy() for c in executions.columns if c.name not in ("covers", "scope")),
    )


def _run(item: int, fire: float, covers: tuple[float, ...] = ()) -> ExecutionRecord:
    return ExecutionRecord(
        job="orders",
        item=item,
        fire_time=fire,
        execution_id=f"orders@{round(fire * 1000)}#{item}",
        instance="inst-1",
        started=fire,
        ended=fire + 0.1,
        outcome=Outcome.OK,
        covers=covers,
    )


def test_a_run_that_stood_for_earlier_fires_says_so_in_the_history(history_url: str) -> None:
    rec = HistoryRecorder(history_url)
    now = float(int(time.time()))
    rec.on_execution(_run(3, now, covers=(now - 16, now - 8)))
    rec.on_execution(_run(4, now))
    assert rec.close(timeout=30)
    with HistoryReader(history_url) as reader:
        rows = {e.item: e for e in reader.query(HistoryQuery(job="orders"))}
    assert rows[3].covered == (now - 16, now - 8)
    assert rows[4].covered == ()
    assert rows[3].to_dict()["covers"]


def test_a_table_of_an_older_release_gains_the_column_and_keeps_its_rows(
    history_url: str,
) -> None:
    url = resolve_url(history_url)
    assert url is not None
    engine = open_engine(url)
    try:
        old = _old_table()
        old.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO executions (job, item, fire_time, execution_id, instance, "
                    "started, ended, duration, outcome, failover, misfire, fencing_token, "
                    "error_type, error_message, traceback) VALUES ('orders', 1, 1.0, 'x', "
                    "'i', 1.0, 2.0, 1.0, 'ok', false, false, 0, '', '', '')"
                )
            )
        with HistoryReader(history_url) as reader:  # reads the old table as it is
            assert [e.item for e in reader.query(HistoryQuery(job="orders"))] == [1]
        ensure_schema(engine)
        ensure_schema(engine)  # twice: nothing more to do
        assert "covers" in {c["name"] for c in inspect(engine).get_columns("executions")}
    finally:
        engine.dispose()
    rec = HistoryRecorder(history_url)
    rec.on_execution(_run(2, 100.0, covers=(92.0,)))
    assert rec.close(timeout=30)
    with HistoryReader(history_url) as reader:
        rows = {e.item: e for e in reader.query(HistoryQuery(job="orders"))}
    assert rows[1].covered == () and rows[2].covered == (92.0,)
