"""Fenced writes to your own database: a zombie's late write is refused (SQLAlchemy 2).

``ctx.fencing_token`` grows with every new execution of an item (a failover or misfire
re-run, the next fire), but it protects nothing unless the system written to checks
it. An instance frozen or cut off past its session timeout is taken over; when it
wakes up, its execution may still write before it next asks ``ctx.is_valid()``. This
module makes the database refuse that write, in the same transaction as the write
itself, so there is no window between a check and the write.

**The fence row.** A small table (:func:`fence_table`, ``shardkeeper_fence`` by
default) holds, for each (job, item), the fire time and token of the newest execution
that wrote. :func:`fence` claims it in the caller's transaction with one upsert,
``INSERT ... ON CONFLICT (job, item) DO UPDATE ... WHERE <the stored claim is not
newer>``: it matches nothing when a newer execution claimed it first, and then the
transaction is refused (:class:`FencedWriteError`) and rolled back with every write it
made, to any table. It takes the fence row's lock until the commit, so writes of two
executions of one item never interleave: a newer execution claiming the fence waits
for an older one's transaction to end. :func:`fenced` is the claim as a ``with``
block, :func:`fenced_update` an UPDATE under the claim.

**Newer means a later fire, then a larger token.** A write is accepted only if its
``(ctx.fire_time, ctx.fencing_token)`` is not older than the stored claim's: a later
fire wins whatever its token, and within one fire (fire times less than 1 ms apart,
as everywhere in shardkeeper) the larger token wins. Tokens alone order *executions*,
not fires: a failover run of an older fire that was queued while the survivors were
busy is claimed, and so gets its token, after a newer fire of the item already ran
(docs/failover.md counts these "stale failover runs"); by token it would win and
write the older fire's data over the newer fire's. By (fire, token) it is refused.
This is decided here, in the database, rather than by having a newer fire's start
retire the older fire's queued entry in the coordination store, because (1) the
database sees both values in the same atomic step as the write, whatever path made
the older fire run late (a failover claim, a misfire re-run, a zombie); (2) the
coordination store's failover queue stays the record that every fire ran, which the
runtime's coverage accounting depends on; (3) retiring it would drop the older
fire's run for every job, also for jobs whose fires do not overwrite each other (an
append per fire), which now run every fire at least once. Fire times are the schedule's, the same
on every instance; a run-now request's is the operator's ``at``.

The same execution may write as often as it likes (an equal claim passes: the fence
is re-entrant); an older claim is refused; a newer one wins. A token is the store
revision at which the execution's running mark was created, so tokens of one job and
item are comparable only within one coordination store: after moving a job to another
store, or wiping the store's data, clear its fence rows (:func:`clear_fence`).

**Transactions.** The claim protects only the writes of its own transaction, so a
connection in autocommit is refused with a :class:`~shardkeeper.errors.ConfigError`
(SQLAlchemy's ``isolation_level="AUTOCOMMIT"``, before any SQL; a driver left in
autocommit some other way, after the claim, when the driver says no transaction is
open). At REPEATABLE READ or SERIALIZABLE, PostgreSQL aborts a claim that waited for a
concurrent claim of the same item (SQLSTATE 40001) whichever is newer: a claim in a
transaction it began itself (:func:`fenced` on an Engine, :func:`fence` on a
Connection or Session not yet in a transaction) rolls back and claims again, up to
:data:`CLAIM_ATTEMPTS` times, so the newer execution goes on and the older one gets
:class:`FencedWriteError`; in a transaction of the caller's, the older one gets
:class:`FencedWriteError` and the newer :class:`FenceContentionError`: roll back and
run the transaction again.

Example: a job that exports one region per item, refusing a zombie's late export::

    from sqlalchemy import create_engine, insert
    from shardkeeper import ShardedJob, ShardingContext
    from shardkeeper.fencing import FencedWriteError, create_fence_table, fenced

    engine = create_engine("postgresql+psycopg://app@db/app")
    create_fence_table(engine)  # once: CREATE TABLE IF NOT EXISTS shardkeeper_fence

    class ExportInvoices(ShardedJob):
        def execute(self, ctx: ShardingContext) -> None:
            rows = build_export(ctx.item_parameter, until=ctx.fire_time)
            try:
                with fenced(engine, ctx) as guard:  # BEGIN; claim the item's fence
                    guard.db.execute(insert(exports), rows)
                # COMMIT: the rows and the fence together
            except FencedWriteError:
                return  # a newer execution or fire wrote: ours was rolled back

It needs the ``history`` extra (SQLAlchemy); importing this module does not import
SQLAlchemy, calling it does. PostgreSQL and SQLite use their native upsert; any other
database an UPDATE, then an INSERT in a savepoint. An ``AsyncConnection`` or
``AsyncSession`` works through ``run_sync``: ``await session.run_sync(fence, ctx)``.
A fence table created before the fire column existed needs it added:
``ALTER TABLE shardkeeper_fence ADD COLUMN fire_time_us BIGINT`` (:func:`create_fence_table`
says so); its rows' claims then compare by token until the item's next claim.
docs/failover.md (Fenced writes) has the pattern for other targets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar, overload

from shardkeeper._imports import needs_extra
from shardkeeper.errors import ConfigError, ShardkeeperError

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Connection, Engine, MetaData, Table
    from sqlalchemy.engine import Result
    from sqlalchemy.orm import Session
    from sqlalchemy.sql import Executable

__all__ = [
    "CLAIM_ATTEMPTS",
    "DEFAULT_FENCE_TABLE",
    "DEFAULT_TOKEN_COLUMN",
    "FenceContentionError",
    "FenceGuard",
    "FencedWriteError",
    "FencingContext",
    "clear_fence",
    "create_fence_table",
    "fence",
    "fence_table",
    "fenced",
    "fenced_update",
]

#: the name of the fence table :func:`fence` and :func:`fenced` use unless given one
DEFAULT_FENCE_TABLE = "shardkeeper_fence"
#: the token column :func:`fenced_update` stamps on the rows it writes
DEFAULT_TOKEN_COLUMN = "fence_token"
#: claims at most made in a transaction the claim began itself when PostgreSQL aborts
#: them for a concurrent claim (REPEATABLE READ, SERIALIZABLE): one retry settles a
#: pair; more are for several executions of one item claiming at once
CLAIM_ATTEMPTS = 5

#: the dialects whose INSERT ... ON CONFLICT DO UPDATE ... WHERE claims in one statement
_NATIVE_UPSERT = frozenset({"postgresql", "sqlite"})
#: what the extra is named for in the missing-extra error
_WHAT = "shardkeeper.fencing"
#: the fence row's fire time column: microseconds since the epoch, an integer on every
#: database (a DATETIME may drop the fraction, and SQLite compares them as text)
_FIRE = "fire_time_us"
#: fire times closer than this (microseconds) are one fire: shardkeeper's own rule
#: (1 ms, runtime/job/coverage.py SAME_FIRE), so a fire computed on two instances compares
#: equal even if its float differs in the last bits
_SAME_FIRE_US = 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: PostgreSQL's SQLSTATE for a transaction aborted to keep its snapshot consistent
_SERIALIZATION_FAILURE = "40001"


class FencingContext(Protocol):
    """What a fenced write needs of an execution: :class:`~shardkeeper.ShardingContext`
    has it. Any object with these attributes does (a child process given the fields of
    its parent's context, a test). ``fire_time`` is a timezone-aware datetime."""

    @property
    def job_name(self) -> str: ...
    @property
    def item(self) -> int: ...
    @property
    def fire_time(self) -> datetime: ...
    @property
    def fencing_token(self) -> int: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def execution_id(self) -> str: ...


class FencedWriteError(ShardkeeperError):
    """A write refused because a newer execution of the item has written first.

    Newer is a later fire, or the same fire with a larger token (see the module
    docstring). The transaction that made it must be rolled back (:func:`fenced` on an
    Engine does it): another instance took the item over, or ran a later fire of it,
    and its writes are the ones that count. ``token`` and ``fire_time`` are the refused
    execution's, ``current`` and ``current_fire_time`` the claim that holds the fence
    (``current_fire_time`` None for a row claimed before fence rows had a fire time),
    ``holder`` the instance and execution that wrote it when known."""

    def __init__(
        self,
        message: str,
        *,
        job_name: str,
        item: int,
        token: int,
        current: int,
        holder: tuple[str, str] | None = None,
        fire_time: datetime | None = None,
        current_fire_time: datetime | None = None,
    ) -> None:
        super().__init__(message)
        self.job_name = job_name
        self.item = item
        self.token = token
        self.current = current
        self.holder = holder
        self.fire_time = fire_time
        self.current_fire_time = current_fire_time


class FenceContentionError(ShardkeeperError):
    """The claim met a concurrent claim of the same item and the database aborted the
    transaction (PostgreSQL at REPEATABLE READ or SERIALIZABLE, SQLSTATE 40001), and
    this execution is not the older one: roll the transaction back and run it again.

    Raised only for a transaction the caller began (its earlier work cannot be redone
    here); :func:`fenced` on an Engine, and :func:`fence` on a Connection or Session
    not yet in a transaction, claim again by themselves. The older execution of such a
    pair gets :class:`FencedWriteError`."""

    def __init__(self, message: str, *, job_name: str, item: int, token: int) -> None:
        super().__init__(message)
        self.job_name = job_name
        self.item = item
        self.token = token


DB = TypeVar("DB", "Connection", "Session")


@dataclass(frozen=True)
class FenceGuard(Generic[DB]):
    """The fence of one execution, claimed in the transaction of ``db``.

    Write through ``db`` (``guard.db.execute(...)``, or ``guard.execute(...)``):
    whatever is written there commits with the fence or not at all."""

    #: the Connection or Session whose transaction holds the fence
    db: DB
    #: the execution's fencing token, now the fence's
    token: int
    job_name: str
    item: int

    def execute(
        self, statement: Executable, parameters: Any = None, /, **kwargs: Any
    ) -> Result[Any]:
        """``db.execute(statement, parameters, ...)``: a write inside the fence."""
        return self.db.execute(statement, parameters, **kwargs)


@dataclass(frozen=True)
class _Claim:
    """One execution's claim: who, and its place in the order (fire, then token)."""

    job_name: str
    item: int
    token: int
    fire_us: int
    instance_id: str
    execution_id: str

    def row(self) -> dict[str, Any]:
        return {
            "job": self.job_name,
            "item": self.item,
            "token": self.token,
            _FIRE: self.fire_us,
            "instance_id": self.instance_id,
            "execution_id": self.execution_id,
            "updated_at": datetime.now(UTC),
        }


# -- the fence table ----------------------------------------------------------------------


def fence_table(
    metadata: MetaData | None = None,
    *,
    name: str = DEFAULT_FENCE_TABLE,
    schema: str | None = None,
) -> Table:
    """The fence table: one row per (job, item) with the newest claim that wrote.

    Pass your ``metadata`` to create it with your own tables (``metadata.create_all``)
    or your migrations (Alembic sees it there); :func:`create_fence_table` creates the
    default one. Columns: ``job`` and ``item`` (the primary key), ``token`` and
    ``fire_time_us`` (the claim: the execution's fencing token and fire time in
    microseconds since the epoch; NULL in rows claimed before the column existed), and
    who wrote it (``instance_id``, ``execution_id``, ``updated_at``) for the error
    message and for you."""
    _require()
    import sqlalchemy as sa

    if not isinstance(name, str) or not name:
        raise ConfigError(f"fence table name {name!r}: give a non-empty table name")
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("item", sa.Integer, primary_key=True, autoincrement=False),
        # tokens are store revisions: ZooKeeper zxids are 64-bit
        sa.Column("token", sa.BigInteger, nullable=False),
        # NULL allowed: a table of an earlier release gets the column by a plain ADD COLUMN
        sa.Column(_FIRE, sa.BigInteger, nullable=True),
        sa.Column("instance_id", sa.String(255), nullable=False),
        sa.Column("execution_id", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
    )


_default: Table | None = None


def _default_table() -> Table:
    # one Table object for the process: SQLAlchemy caches statements per Table
    global _default
    if _default is None:
        _default = fence_table()
    return _default


def create_fence_table(bind: Engine | Connection, *, table: Table | None = None) -> Table:
    """Create the fence table if it does not exist (the default one unless ``table``
    is given); returns it. An existing table without the ``fire_time_us`` column (made
    by an earlier release) is refused with the statement that adds it."""
    _require()
    import sqlalchemy as sa

    table = _default_table() if table is None else _check_fence_table(table)
    table.create(bind, checkfirst=True)
    columns = {c["name"] for c in sa.inspect(bind).get_columns(table.name, schema=table.schema)}
    if _FIRE not in columns:
        raise ConfigError(_missing_fire_column(table))
    return table


def _missing_fire_column(table: Table) -> str:
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    return (
        f"fence table {name!r} has no column {_FIRE!r} (fences order by fire time since "
        f"this release): add it with ALTER TABLE {name} ADD COLUMN {_FIRE} BIGINT"
    )


# -- claiming the fence -------------------------------------------------------------------


def fence(db: Connection | Session, ctx: FencingContext, *, table: Table | None = None) -> int:
    """Claim the fence of ``ctx``'s item in ``db``'s current transaction; return the token.

    The transaction (begun here if none is) now holds the item's fence row at this
    execution's fire time and token until it ends: commit it with your writes. Raises
    :class:`FencedWriteError` when a newer execution of the item (a later fire, or the
    same fire with a larger token) holds the fence (roll the transaction back); an
    equal claim passes, so an execution may claim again. A connection in autocommit is
    refused with :class:`~shardkeeper.errors.ConfigError`. At REPEATABLE READ or
    SERIALIZABLE on PostgreSQL, see :class:`FenceContentionError`."""
    _require()
    import sqlalchemy as sa

    claim = _check_context(ctx)
    table = _default_table() if table is None else _check_fence_table(table)
    # Only a transaction begun here may be rolled back and claimed again: the caller's
    # may hold work this call cannot redo.
    owned = not db.in_transaction() if _is_db(db) else False
    conn = _connection(db)
    _refuse_autocommit_option(conn)
    attempts = CLAIM_ATTEMPTS if owned else 1
    for attempt in range(1, attempts + 1):
        try:
            claimed = _claim(conn, table, claim)
            break
        except sa.exc.DBAPIError as exc:
            if _sqlstate(exc) != _SERIALIZATION_FAILURE:
                if _FIRE in str(exc.orig):
                    raise ConfigError(_missing_fire_column(table)) from exc
                raise
            if attempt == attempts:
                _contended(conn, table, claim, exc, attempt)
            # aborted by a concurrent claim that has committed since: a new transaction
            # (a new snapshot) sees it, and decides
            db.rollback()
            conn = _connection(db)
    _refuse_driver_autocommit(conn)
    if not claimed:
        _refuse(conn, table, claim)
    return claim.token


def _is_db(db: object) -> bool:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    return isinstance(db, (sa.Connection, Session))


def _not_older(stored_fire: Any, stored_token: Any, fire: Any, token: Any) -> Any:
    """The SQL condition that the stored claim is not newer than ``(fire, token)``."""
    import sqlalchemy as sa

    return sa.or_(
        stored_fire < fire - _SAME_FIRE_US,  # an older fire: any token
        sa.and_(
            # the same fire (or a row claimed before fire times were kept): by token
            sa.or_(stored_fire.is_(None), stored_fire <= fire + _SAME_FIRE_US),
            stored_token <= token,
        ),
    )


def _newer(held_fire: int | None, held_token: int, claim: _Claim) -> bool:
    """:func:`_not_older`'s complement in Python: does the held claim beat ``claim``?"""
    if held_fire is not None and held_fire < claim.fire_us - _SAME_FIRE_US:
        return False
    if held_fire is not None and held_fire > claim.fire_us + _SAME_FIRE_US:
        return True
    return held_token > claim.token


def _claim(conn: Connection, table: Table, claim: _Claim) -> bool:
    """One claim statement (or the generic sequence); True if the fence is ours."""
    row = claim.row()
    c = table.c
    dialect = conn.dialect.name
    if dialect not in _NATIVE_UPSERT:
        return _claim_generic(conn, table, row)
    # One statement: the row is inserted, or updated only if our claim is not older.
    # PostgreSQL re-checks the WHERE on the newest committed version after waiting for
    # a concurrent claim (READ COMMITTED), so two claims are ordered by their commits.
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt: Any = pg_insert(table)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table)
    stmt = stmt.values(row)
    ex = stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=[c.job, c.item],
        set_={k: ex[k] for k in row if k not in ("job", "item")},
        where=_not_older(c[_FIRE], c.token, ex[_FIRE], ex.token),
    )
    if conn.dialect.insert_returning:
        # a row back when claimed, none when the WHERE refused: an INSERT's rowcount
        # is not reliable (psycopg on PostgreSQL reports -1 for this statement)
        return conn.execute(stmt.returning(c.token)).first() is not None
    return bool(conn.execute(stmt).rowcount > 0)  # SQLite before 3.35: exact


def _claim_generic(conn: Connection, table: Table, row: dict[str, Any]) -> bool:
    """UPDATE if not older; else INSERT in a savepoint (a concurrent first claim makes
    it fail: then the UPDATE decides again)."""
    import sqlalchemy as sa

    c = table.c
    key = (c.job == row["job"]) & (c.item == row["item"])
    update = (
        sa.update(table)
        .where(key, _not_older(c[_FIRE], c.token, row[_FIRE], row["token"]))
        .values({k: v for k, v in row.items() if k not in ("job", "item")})
    )
    if conn.execute(update).rowcount > 0:
        return True
    if conn.execute(sa.select(c.token).where(key)).first() is not None:
        return False  # a newer claim holds it
    try:
        with conn.begin_nested():
            conn.execute(sa.insert(table).values(row))
        return True
    except sa.exc.IntegrityError:
        return bool(conn.execute(update).rowcount > 0)


def _held(conn: Connection, table: Table, claim: _Claim) -> Any:
    import sqlalchemy as sa

    c = table.c
    return conn.execute(
        sa.select(c.token, c[_FIRE], c.instance_id, c.execution_id).where(
            c.job == claim.job_name, c.item == claim.item
        )
    ).first()


def _refuse(conn: Connection, table: Table, claim: _Claim) -> NoReturn:
    raise _refusal(claim, _held(conn, table, claim))


def _refusal(claim: _Claim, held: Any) -> FencedWriteError:
    """The error for ``claim`` refused by the ``held`` row (None: not readable)."""
    job_name, item, token = claim.job_name, claim.item, claim.token
    current = int(held.token) if held is not None else token
    held_fire = held[1] if held is not None else None
    holder = (str(held.instance_id), str(held.execution_id)) if held is not None else None
    who = f" (instance {holder[0]!r}, execution {holder[1]!r})" if holder else ""
    if held_fire is not None and held_fire > claim.fire_us + _SAME_FIRE_US:
        message = (
            f"write refused: job {job_name!r} item {item} is fenced by a run of a later "
            f"fire ({_fmt(held_fire)}, token {current}{who}) than this execution's "
            f"({_fmt(claim.fire_us)}, token {token}): its data is newer than this run's; "
            "roll this transaction back"
        )
    else:
        message = (
            f"write refused: job {job_name!r} item {item} is fenced at token {current}{who}, "
            f"newer than this execution's token {token}: another execution took the item "
            "over; roll this transaction back"
        )
    return FencedWriteError(
        message,
        job_name=job_name,
        item=item,
        token=token,
        current=current,
        holder=holder,
        fire_time=_dt(claim.fire_us),
        current_fire_time=_dt(held_fire) if held_fire is not None else None,
    )


def _contended(
    conn: Connection, table: Table, claim: _Claim, exc: Exception, attempts: int
) -> NoReturn:
    """The claim was aborted for a concurrent claim (SQLSTATE 40001) and cannot be
    made again here: read the committed fence on a connection of its own (this
    transaction is aborted, and its snapshot predates the other claim) and refuse the
    older side with FencedWriteError, the other with FenceContentionError."""
    import sqlalchemy as sa

    held = None
    try:
        with conn.engine.connect() as peek:
            held = _held(peek, table, claim)
    except sa.exc.SQLAlchemyError:
        held = None  # unreadable now: the retryable error below is still true
    if held is not None and _newer(held[1], int(held.token), claim):
        raise _refusal(claim, held) from exc
    raise FenceContentionError(
        f"fence claim of job {claim.job_name!r} item {claim.item} (token {claim.token}) "
        f"met a concurrent claim and the database aborted the transaction (SQLSTATE "
        f"40001, REPEATABLE READ or SERIALIZABLE isolation; {attempts} attempt(s)): roll "
        "the transaction back and run it again (fenced() on an Engine does it by itself)",
        job_name=claim.job_name,
        item=claim.item,
        token=claim.token,
    ) from exc


def _sqlstate(exc: Any) -> str | None:
    orig = getattr(exc, "orig", None)
    # psycopg 3: sqlstate; psycopg2: pgcode
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(code) if code is not None else None


# -- autocommit: no transaction to hold the claim and the writes together -----------------


def _autocommit_option(bind: Engine | Connection) -> bool:
    """SQLAlchemy's own AUTOCOMMIT setting of ``bind``: an execution option, else
    ``create_engine(isolation_level=...)`` (kept on the dialect; SQLAlchemy 2 has no
    public accessor for it)."""
    level = bind.get_execution_options().get("isolation_level")
    if level is None:
        level = getattr(bind.dialect, "_on_connect_isolation_level", None)
    return isinstance(level, str) and level.upper() == "AUTOCOMMIT"


_AUTOCOMMIT_HELP = (
    "each statement commits alone, so the fence claim would not cover the writes after "
    "it; give an Engine, Connection or Session with a transactional isolation level "
    "(the database's default, or READ COMMITTED, REPEATABLE READ, SERIALIZABLE: e.g. "
    "engine.execution_options(isolation_level='READ COMMITTED'))"
)


def _refuse_autocommit_option(bind: Engine | Connection) -> None:
    if _autocommit_option(bind):
        raise ConfigError(f"db {bind!r} has isolation_level 'AUTOCOMMIT': {_AUTOCOMMIT_HELP}")


def _refuse_driver_autocommit(conn: Connection) -> None:
    """After the claim: the driver must report an open transaction (a connection put in
    autocommit by the driver's own setting, unseen by SQLAlchemy). Asked of the driver,
    not its setting: a driver in autocommit whose transactions the application begins
    itself (SQLite's BEGIN recipe) is in a transaction here, and passes."""
    setting = _driver_autocommit(conn)
    if setting is not None:
        raise ConfigError(
            f"db {conn!r}: the database connection is in autocommit ({setting}; the claim "
            f"just committed alone): {_AUTOCOMMIT_HELP}"
        )


def _driver_autocommit(conn: Connection) -> str | None:
    """What shows the driver's connection in autocommit after a write, or None (in a
    transaction, or not known for this driver)."""
    driver = conn.connection.driver_connection
    status = getattr(getattr(driver, "info", None), "transaction_status", None)
    if status is not None:
        # psycopg 3 and psycopg2: 0 is IDLE, no transaction open after our write
        if int(status) == 0:
            return f"{type(driver).__module__} reports no open transaction after a write"
        return None
    in_transaction = getattr(driver, "in_transaction", None)
    if isinstance(in_transaction, bool):  # sqlite3, aiosqlite
        if not in_transaction:
            return "sqlite3 reports no open transaction after a write (isolation_level=None)"
        return None
    dbapi = conn.connection.dbapi_connection
    if dbapi is None:
        return None
    try:
        auto = conn.dialect.detect_autocommit_setting(dbapi)
    except NotImplementedError:
        return None
    return "the driver's autocommit setting is on" if auto else None


@overload
def fenced(
    db: Engine | Connection, ctx: FencingContext, *, table: Table | None = None
) -> AbstractContextManager[FenceGuard[Connection]]: ...
@overload
def fenced(
    db: Session, ctx: FencingContext, *, table: Table | None = None
) -> AbstractContextManager[FenceGuard[Session]]: ...
def fenced(
    db: Engine | Connection | Session, ctx: FencingContext, *, table: Table | None = None
) -> AbstractContextManager[FenceGuard[Connection]] | AbstractContextManager[FenceGuard[Session]]:
    """``with fenced(db, ctx) as guard:`` a transaction that holds the item's fence.

    ``db`` is an Engine: a connection and a transaction of the block's own, committed
    at its end, rolled back if it raises (at REPEATABLE READ or SERIALIZABLE, a claim
    aborted for a concurrent one is claimed again in a new transaction). Or a
    Connection or Session: the fence is claimed in its transaction (SQLAlchemy begins
    one on first use), which is yours to commit or roll back (``with session.begin():
    with fenced(session, ctx): ...``). Write through ``guard.db``. The fence is claimed
    on entry (:func:`fence`): a newer execution's fence raises
    :class:`FencedWriteError` there, before any write. Bad arguments (an AUTOCOMMIT
    engine among them) are refused at the call, before the block."""
    _require()
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    _check_context(ctx)
    if table is not None:
        _check_fence_table(table)
    if isinstance(db, sa.Engine):
        _refuse_autocommit_option(db)
        return _in_engine(db, ctx, table)
    if isinstance(db, Session):
        return _joined(db, ctx, table)
    conn = _connection(db)
    _refuse_autocommit_option(conn)
    return _joined(conn, ctx, table)


@contextmanager
def _in_engine(
    engine: Engine, ctx: FencingContext, table: Table | None
) -> Iterator[FenceGuard[Connection]]:
    with engine.connect() as conn:
        # not in a transaction yet: fence() begins it, and may begin it again
        token = fence(conn, ctx, table=table)
        try:
            yield FenceGuard(conn, token, ctx.job_name, ctx.item)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


@contextmanager
def _joined(db: DB, ctx: FencingContext, table: Table | None) -> Iterator[FenceGuard[DB]]:
    # the caller's transaction: SQLAlchemy begins one on first use, the caller ends it
    yield FenceGuard(db, fence(db, ctx, table=table), ctx.job_name, ctx.item)


def clear_fence(
    db: Connection | Session,
    job_name: str,
    items: list[int] | None = None,
    *,
    table: Table | None = None,
) -> int:
    """Delete the fence rows of ``job_name`` (of ``items`` only, if given), in ``db``'s
    transaction; returns how many. For when tokens restart: the job moved to another
    store, or the store's data was wiped (its revisions count from 1 again)."""
    _require()
    if not isinstance(job_name, str) or not job_name:
        raise ConfigError(f"job_name {job_name!r}: give the job's name")
    for i in items or ():
        _check_item(i, job_name)
    conn = _connection(db)
    table = _default_table() if table is None else _check_fence_table(table)
    import sqlalchemy as sa

    stmt = sa.delete(table).where(table.c.job == job_name)
    if items is not None:
        stmt = stmt.where(table.c.item.in_(items))
    return int(conn.execute(stmt).rowcount)


# -- an UPDATE under the fence -------------------------------------------------------------


def fenced_update(
    db: Connection | Session,
    table: Any,
    values: Mapping[str, Any],
    where: ColumnElement[bool] | Mapping[str, Any],
    ctx: FencingContext,
    *,
    token_column: str | None = DEFAULT_TOKEN_COLUMN,
    fences: Table | None = None,
) -> int:
    """Claim the item's fence, then update the rows of ``table`` matching ``where``
    with ``values`` (and this execution's token in ``token_column``); returns the rows
    updated.

    The fence is the item's row of the fence table (``fences``, the default
    ``shardkeeper_fence`` unless given: create it once with :func:`create_fence_table`),
    claimed as :func:`fence` claims it, so a zombie is refused
    (:class:`FencedWriteError`, before any row is written: roll the transaction back)
    whether the rows it means still match ``where`` or not: a newer execution may have
    changed them out of ``where`` (a status the job sets) or deleted them. 0 means no
    row matches ``where`` *for the execution that holds the fence*: what else this
    transaction writes (an insert of the missing row) is fenced with it until it ends.

    ``table`` is a Table or an ORM-mapped class; ``values`` maps column names to new
    values; ``where`` is a SQL condition (``accounts.c.id == 7``) or a mapping of column
    names to values (``{"id": 7}``). ``token_column`` (an integer column, BIGINT) gets
    the writer's token, a record of which execution wrote each row; ``None`` writes
    none. The fence is the item's, not the rows': rows that two items' executions both
    write are not ordered between them::

        with engine.begin() as conn:
            if fenced_update(conn, accounts, {"balance": 42}, {"id": 7}, ctx) == 0:
                conn.execute(insert(accounts).values(id=7, balance=42))  # fenced too
    """
    _require()
    claim = _check_context(ctx)
    import sqlalchemy as sa

    target = _as_table(table)
    name = target.name
    if token_column is not None and token_column not in target.c:
        raise ConfigError(
            f"table {name!r} has no token column {token_column!r} (columns: "
            f"{', '.join(target.c.keys())}); add an integer column (BIGINT, NULL allowed), "
            "pass token_column= naming one, or token_column=None to write no token"
        )
    if not isinstance(values, Mapping):
        raise ConfigError(f"values {values!r}: give a mapping of column names to new values")
    unknown = [k for k in values if k not in target.c]
    if unknown:
        raise ConfigError(
            f"values for table {name!r} name no column of it: {', '.join(map(repr, unknown))}"
        )
    if token_column is not None and token_column in values:
        raise ConfigError(
            f"values for table {name!r} set the token column {token_column!r}: the "
            "execution's token is written there, leave it out"
        )
    condition = _where(target, where)
    fence(db, ctx, table=fences)
    stamp = {token_column: claim.token} if token_column is not None else {}
    conn = _connection(db)
    return int(
        conn.execute(sa.update(target).where(condition).values({**values, **stamp})).rowcount
    )


def _as_table(table: Any) -> Table:
    import sqlalchemy as sa

    if isinstance(table, sa.Table):
        return table
    mapper = sa.inspect(table, raiseerr=False)
    local = getattr(mapper, "local_table", None)
    if isinstance(local, sa.Table):
        return local
    raise ConfigError(f"table {table!r}: give a sqlalchemy Table or an ORM-mapped class")


def _where(table: Table, where: Any) -> ColumnElement[bool]:
    import sqlalchemy as sa

    if isinstance(where, Mapping):
        if not where:
            raise ConfigError(
                f"where {{}} for table {table.name!r}: name the rows to update (a fenced "
                "update of every row is almost certainly a mistake; use sqlalchemy.true())"
            )
        unknown = [k for k in where if k not in table.c]
        if unknown:
            raise ConfigError(
                f"where for table {table.name!r} names no column of it: "
                f"{', '.join(map(repr, unknown))}"
            )
        return sa.and_(*(table.c[k] == v for k, v in where.items()))
    if isinstance(where, sa.ColumnElement):
        return where
    raise ConfigError(
        f"where {where!r}: give a SQL condition (table.c.id == 7) or a mapping of column "
        "names to values"
    )


# -- checks ---------------------------------------------------------------------------------


def _require() -> None:
    """Import SQLAlchemy, or raise the one-line error naming the extra to install."""
    with needs_extra("history", _WHAT):
        import sqlalchemy
        import sqlalchemy.orm  # noqa: F401


def _check_context(ctx: FencingContext) -> _Claim:
    job_name = getattr(ctx, "job_name", None)
    if not isinstance(job_name, str) or not job_name:
        raise ConfigError(
            f"ctx {ctx!r}: no job_name; give the execution's ShardingContext (or an "
            "object with job_name, item, fire_time, fencing_token, instance_id and "
            "execution_id)"
        )
    item = getattr(ctx, "item", None)
    _check_item(item, job_name)
    token = getattr(ctx, "fencing_token", None)
    if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
        raise ConfigError(
            f"fencing_token={token!r} of job {job_name!r} item {item}: a fenced write "
            "needs the execution's token, a positive integer (an execution has none, 0, "
            "when its job runs with monitor_execution off: turn it on)"
        )
    fire_time = getattr(ctx, "fire_time", None)
    if not isinstance(fire_time, datetime) or fire_time.utcoffset() is None:
        raise ConfigError(
            f"fire_time={fire_time!r} of job {job_name!r} item {item}: a fenced write "
            "orders executions by fire time, then token: give the execution's fire time, "
            "a timezone-aware datetime (ctx.fire_time of a ShardingContext is one)"
        )
    assert isinstance(item, int)  # checked by _check_item
    return _Claim(
        job_name=job_name,
        item=item,
        token=token,
        # exact integer arithmetic: no float rounding between instances
        fire_us=(fire_time - _EPOCH) // timedelta(microseconds=1),
        instance_id=str(getattr(ctx, "instance_id", "")),
        execution_id=str(getattr(ctx, "execution_id", "")),
    )


def _fmt(fire_us: int) -> str:
    return f"fire {_dt(fire_us).isoformat(timespec='milliseconds')}"


def _dt(fire_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=fire_us)


def _check_item(item: object, job_name: str) -> None:
    if isinstance(item, bool) or not isinstance(item, int) or item < 0:
        raise ConfigError(f"item {item!r} of job {job_name!r}: an item is an integer >= 0")


def _check_fence_table(table: Table) -> Table:
    import sqlalchemy as sa

    needed = ("job", "item", "token", _FIRE, "instance_id", "execution_id", "updated_at")
    if not isinstance(table, sa.Table) or any(name not in table.c for name in needed):
        raise ConfigError(
            f"fence table {table!r}: give the table fence_table() builds (columns "
            f"{', '.join(needed)})"
        )
    return table


def _connection(db: object) -> Connection:
    """The Connection to run on: ``db`` itself, or a Session's (in its transaction)."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    if isinstance(db, sa.Connection):
        return db
    if isinstance(db, Session):
        return db.connection()
    raise ConfigError(
        f"db {db!r}: give a sqlalchemy Connection or Session (fenced() takes an Engine too)"
    )
