"""The history schema: one ``executions`` table, created on first use.

Times are epoch seconds (UTC) as double precision; ``duration`` is stored so that SQL
queries can sort and aggregate on it without arithmetic. A skipped trigger is a row
with outcome ``skipped`` (item -1 when the skip concerns the whole fire); its reason
is in ``error_message``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

__all__ = ["COLUMNS", "ensure_schema", "executions", "metadata"]

metadata = MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY, not a BIGINT one.
_ID = BigInteger().with_variant(Integer(), "sqlite")

executions = Table(
    "executions",
    metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("job", String(255), nullable=False),
    Column("item", Integer, nullable=False),
    Column("fire_time", Float, nullable=False),
    Column("execution_id", String(300), nullable=False),
    Column("instance", String(255), nullable=False),
    Column("started", Float, nullable=False),
    Column("ended", Float, nullable=False),
    Column("duration", Float, nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("failover", Boolean, nullable=False, default=False),
    Column("misfire", Boolean, nullable=False, default=False),
    Column("fencing_token", BigInteger, nullable=False, default=0),
    Column("error_type", String(255), nullable=False, default=""),
    Column("error_message", Text, nullable=False, default=""),
    Column("traceback", Text, nullable=False, default=""),
    # the earlier fire times this run stood for (ctx.covers), comma-separated
    Column("covers", Text, nullable=False, default=""),
    # the CLI's queries: one job newest first; failures; retention by age; one execution
    Index("ix_executions_job_started", "job", "started"),
    Index("ix_executions_outcome", "outcome"),
    Index("ix_executions_started", "started"),
    Index("ix_executions_execution_id", "execution_id"),
)

#: the columns a row carries (all but the generated id)
COLUMNS: tuple[str, ...] = tuple(c.name for c in executions.columns if c.name != "id")

#: columns added after the first release: name -> the DDL that adds one to an older
#: table (a table created before them is brought up to date by ensure_schema)
ADDED_COLUMNS: dict[str, str] = {
    "covers": "ALTER TABLE executions ADD COLUMN covers TEXT NOT NULL DEFAULT ''",
}


def ensure_schema(engine: Engine) -> None:
    """Create the table and its indexes if missing. Two instances creating it at the
    same time is fine: the loser's error is ignored when the table then exists."""
    from sqlalchemy import inspect, text

    try:
        metadata.create_all(engine, checkfirst=True)
    except SQLAlchemyError:
        if not inspect(engine).has_table(executions.name):
            raise
    have = {c["name"] for c in inspect(engine).get_columns(executions.name)}
    for name, ddl in ADDED_COLUMNS.items():
        if name in have:
            continue
        try:
            with engine.begin() as conn:
                conn.execute(text(ddl))
        except SQLAlchemyError:
            # another instance added it at the same moment
            if name not in {c["name"] for c in inspect(engine).get_columns(executions.name)}:
                raise
