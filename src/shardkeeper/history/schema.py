"""The history schema: one ``executions`` table, created on first use.

Each row carries its ``scope``: the registry and namespace it was recorded in
(``zk://host:2181/my-app``, :meth:`RegistrySettings.identity
<shardkeeper.registry.url.RegistrySettings.identity>`), since one database (the
default file of a machine, one PostgreSQL) may serve several deployments. Rows of a
table created before the column existed get ``''`` (:data:`LEGACY_SCOPE`): their
deployment is unknown.

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

__all__ = ["COLUMNS", "LEGACY_SCOPE", "ensure_schema", "executions", "metadata"]

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
    # the registry and namespace of the run (LEGACY_SCOPE: recorded before scoping)
    # a server default too: an instance of an older release, writing no scope into a
    # table a newer one created, still writes (its rows read as legacy)
    Column("scope", String(1000), nullable=False, default="", server_default=""),
    # the last ctx.progress report (JSON) of a run that failed, timed out or was
    # fenced; a server default for older writers, as scope
    Column("progress", Text, nullable=False, default="", server_default=""),
    # how many fires, older than those in covers, the run stood for without listing
    # them (ctx.covered_before: a gap of more than 100 fires); a server default for
    # older writers, as scope
    Column("covered_before", Integer, nullable=False, default=0, server_default="0"),
    # a failover run: the instance whose cut-off run it took over ("" otherwise)
    Column("taken_over_from", String(255), nullable=False, default="", server_default=""),
    # the checkpoint a re-run resumed from (number, writer, time, state's start)
    Column("resumed_from", Text, nullable=False, default="", server_default=""),
    # the instance that recorded a run it did not run itself (the leader that found a
    # dead instance's run cut off), "" when the run's own instance did
    Column("reported_by", String(255), nullable=False, default="", server_default=""),
    # the CLI's queries: one job newest first; failures; retention by age; one execution
    Index("ix_executions_job_started", "job", "started"),
    Index("ix_executions_outcome", "outcome"),
    Index("ix_executions_started", "started"),
    Index("ix_executions_execution_id", "execution_id"),
    # every reader filters on the scope first (history/query.py)
    Index("ix_executions_scope_job_started", "scope", "job", "started"),
)

#: the scope of rows recorded before rows had one (or by a recorder fed records that
#: name none): which deployment they came from is not known
LEGACY_SCOPE = ""

#: the columns a row carries (all but the generated id)
COLUMNS: tuple[str, ...] = tuple(c.name for c in executions.columns if c.name != "id")

#: columns added after the first release: name -> the DDL that adds one to an older
#: table (a table created before them is brought up to date by ensure_schema)
ADDED_COLUMNS: dict[str, str] = {
    "covers": "ALTER TABLE executions ADD COLUMN covers TEXT NOT NULL DEFAULT ''",
    # old rows get LEGACY_SCOPE
    "scope": "ALTER TABLE executions ADD COLUMN scope VARCHAR(1000) NOT NULL DEFAULT ''",
    "progress": "ALTER TABLE executions ADD COLUMN progress TEXT NOT NULL DEFAULT ''",
    "covered_before": "ALTER TABLE executions ADD COLUMN covered_before INTEGER NOT NULL DEFAULT 0",
    "taken_over_from": (
        "ALTER TABLE executions ADD COLUMN taken_over_from VARCHAR(255) NOT NULL DEFAULT ''"
    ),
    "resumed_from": "ALTER TABLE executions ADD COLUMN resumed_from TEXT NOT NULL DEFAULT ''",
    "reported_by": "ALTER TABLE executions ADD COLUMN reported_by VARCHAR(255) NOT NULL DEFAULT ''",
}

#: indexes added after the first release, created on an older table once its columns
#: exist (IF NOT EXISTS: SQLite and PostgreSQL both have it, and two instances may race)
ADDED_INDEXES: tuple[str, ...] = (
    "CREATE INDEX IF NOT EXISTS ix_executions_scope_job_started "
    "ON executions (scope, job, started)",
)


def ensure_schema(engine: Engine) -> None:
    """Create the table and its indexes if missing, and bring a table of an older
    release up to date (its added columns and indexes). Two instances creating it at
    the same time is fine: the loser's error is ignored when the table then exists."""
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
    for ddl in ADDED_INDEXES:
        try:
            with engine.begin() as conn:
                conn.execute(text(ddl))
        except SQLAlchemyError:
            # PostgreSQL's IF NOT EXISTS can still fail when two sessions create it at
            # once; the index exists then, which is all that is needed
            names = {i["name"] for i in inspect(engine).get_indexes(executions.name)}
            if "ix_executions_scope_job_started" not in names:
                raise
