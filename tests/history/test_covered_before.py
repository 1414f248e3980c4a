"""The fires a run stood for without listing them (``ctx.covered_before``, core review
2026-12 finding 14) in the history, and a table of an older release gaining the
column, on real SQLite and real PostgreSQL."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import MetaData, Table, inspect

from shardkeeper.history import HistoryQuery, HistoryReader, HistoryRecorder, resolve_url
from shardkeeper.history.engine import open_engine
from shardkeeper.history.schema import ensure_schema, executions
from shardkeeper.observe import ExecutionRecord, Outcome

pytestmark = pytest.mark.timeout(90)


def _run(item: int, fire: float, covered_before: int = 0) -> ExecutionRecord:
    return ExecutionRecord(
        job="orders",
        item=item,
        fire_time=fire,
        execution_id=f"orders@{round(fire * 1000)}#{item}",
        instance="inst-1",
        started=fire,
        ended=fire + 0.1,
        outcome=Outcome.OK,
        covers=tuple(fire - 100 + k for k in range(100)),
        covered_before=covered_before,
    )


def test_the_unlisted_count_is_kept_in_the_history(history_url: str) -> None:
    url = resolve_url(history_url)
    assert url is not None
    engine = open_engine(url)
    try:
        # a table of the release before the column
        Table(
            "executions",
            MetaData(),
            *(c._copy() for c in executions.columns if c.name != "covered_before"),
        ).metadata.create_all(engine)
        ensure_schema(engine)
        assert "covered_before" in {c["name"] for c in inspect(engine).get_columns("executions")}
    finally:
        engine.dispose()
    rec = HistoryRecorder(history_url)
    now = float(int(time.time()))
    rec.on_execution(_run(3, now, covered_before=50))
    rec.on_execution(_run(4, now))
    assert rec.close(timeout=30)
    with HistoryReader(history_url) as reader:
        rows = {e.item: e for e in reader.query(HistoryQuery(job="orders"))}
    assert (rows[3].covered_before, len(rows[3].covered)) == (50, 100)
    assert rows[4].covered_before == 0
    assert rows[3].to_dict()["covered_before"] == 50
