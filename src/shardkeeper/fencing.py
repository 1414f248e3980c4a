"""Fenced writes to your own database: a zombie's late write is refused (SQLAlchemy 2).

``ctx.fencing_token`` grows with every new execution of an item (a failover or misfire
re-run, the next fire), but it protects nothing unless the system written to checks
it. An instance frozen or cut off past its session timeout is taken over; when it
wakes up, its execution may still write before it next asks ``ctx.is_valid()``. This
module makes the database refuse that write, in the same transaction as the write
itself, so there is no window between a check and the write. Two ways:

* **A fence row per item** (:func:`fenced`, :func:`fence`): a small table
  (:func:`fence_table`, ``shardkeeper_fence`` by default) holds, for each (job, item),
  the newest token that wrote. Claiming the fence in a transaction is one upsert,
  ``INSERT ... ON CONFLICT (job, item) DO UPDATE SET token = :token WHERE token <=
  :token``: it matches nothing when a newer execution claimed it first, and then the
  transaction is refused (:class:`FencedWriteError`) and rolled back with every write
  it made, to any table. It takes the fence row's lock until the commit, so writes of
  two executions of one item never interleave: a newer execution claiming the fence
  waits for an older one's transaction to end.
* **A token column on the rows written** (:func:`fenced_update`): ``UPDATE ... SET
  ..., fence_token = :token WHERE <where> AND (fence_token IS NULL OR fence_token <=
  :token)``. No extra table, and the fence is as fine as the rows.

The same execution may write as often as it likes (an equal token passes: the fence
is re-entrant); an older token is refused; a newer one wins. A token is the store
revision at which the execution's running mark was created, so tokens of one job and
item are comparable only within one coordination store: after moving a job to another
store, or wiping the store's data, clear its fence rows (:func:`clear_fence`).

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
                return  # a newer execution of this item wrote: ours was rolled back

It needs the ``history`` extra (SQLAlchemy); importing this module does not import
SQLAlchemy, calling it does. PostgreSQL and SQLite use their native upsert; any other
database an UPDATE, then an INSERT in a savepoint. An ``AsyncConnection`` or
``AsyncSession`` works through ``run_sync``: ``await session.run_sync(fence, ctx)``.
docs/failover.md (Fenced writes) has the pattern for other targets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar, overload

from shardkeeper._imports import needs_extra
from shardkeeper.errors import ConfigError, ShardkeeperError

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Connection, Engine, MetaData, Table
    from sqlalchemy.engine import Result
    from sqlalchemy.orm import Session
    from sqlalchemy.sql import Executable

__all__ = [
    "DEFAULT_FENCE_TABLE",
    "DEFAULT_TOKEN_COLUMN",
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
#: the token column :func:`fenced_update` expects on the rows it writes
DEFAULT_TOKEN_COLUMN = "fence_token"

#: the dialects whose INSERT ... ON CONFLICT DO UPDATE ... WHERE claims in one statement
_NATIVE_UPSERT = frozenset({"postgresql", "sqlite"})
#: what the extra is named for in the missing-extra error
_WHAT = "shardkeeper.fencing"


class FencingContext(Protocol):
    """What a fenced write needs of an execution: :class:`~shardkeeper.ShardingContext`
    has it. Any object with these attributes does (a child process given the fields of
    its parent's context, a test)."""

    @property
    def job_name(self) -> str: ...
    @property
    def item(self) -> int: ...
    @property
    def fencing_token(self) -> int: ...
    @property
    def instance_id(self) -> str: ...
    @property
    def execution_id(self) -> str: ...


class FencedWriteError(ShardkeeperError):
    """A write refused because a newer execution of the item has written first.

    The transaction that made it must be rolled back (:func:`fenced` on an Engine does
    it): another
    instance took the item over and its writes are the ones that count. ``token`` is
    the refused execution's token, ``current`` the newer one that holds the fence (or
    the newest on the rows, for :func:`fenced_update`), ``holder`` the instance and
    execution that wrote it when known."""

    def __init__(
        self,
        message: str,
        *,
        job_name: str,
        item: int,
        token: int,
        current: int,
        holder: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.job_name = job_name
        self.item = item
        self.token = token
        self.current = current
        self.holder = holder


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


# -- the fence table ----------------------------------------------------------------------


def fence_table(
    metadata: MetaData | None = None,
    *,
    name: str = DEFAULT_FENCE_TABLE,
    schema: str | None = None,
) -> Table:
    """The fence table: one row per (job, item) with the newest token that wrote.

    Pass your ``metadata`` to create it with your own tables (``metadata.create_all``)
    or your migrations (Alembic sees it there); :func:`create_fence_table` creates the
    default one. Columns: ``job`` and ``item`` (the primary key), ``token``, and who
    wrote it (``instance_id``, ``execution_id``, ``updated_at``) for the error message
    and for you."""
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
    is given); returns it."""
    _require()
    table = _default_table() if table is None else _check_fence_table(table)
    table.create(bind, checkfirst=True)
    return table


# -- claiming the fence -------------------------------------------------------------------


def fence(db: Connection | Session, ctx: FencingContext, *, table: Table | None = None) -> int:
    """Claim the fence of ``ctx``'s item in ``db``'s current transaction; return the token.

    The transaction (begun here if none is) now holds the item's fence row at this
    execution's token until it ends: commit it with your writes. Raises
    :class:`FencedWriteError` when a newer execution of the item holds the fence (roll
    the transaction back); an equal token passes, so an execution may claim again."""
    _require()
    job_name, item, token = _check_context(ctx)
    conn = _connection(db)
    table = _default_table() if table is None else _check_fence_table(table)
    row = {
        "job": job_name,
        "item": item,
        "token": token,
        "instance_id": str(ctx.instance_id),
        "execution_id": str(ctx.execution_id),
        "updated_at": datetime.now(UTC),
    }
    c = table.c
    dialect = conn.dialect.name
    if dialect in _NATIVE_UPSERT:
        # One statement: the row is inserted, or updated only if our token is not
        # older. PostgreSQL re-checks the WHERE on the newest committed version after
        # waiting for a concurrent claim, so two claims are ordered by their commits.
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            stmt: Any = pg_insert(table)
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            stmt = sqlite_insert(table)
        stmt = stmt.values(row)
        stmt = stmt.on_conflict_do_update(
            index_elements=[c.job, c.item],
            set_={k: stmt.excluded[k] for k in row if k not in ("job", "item")},
            where=c.token <= stmt.excluded.token,
        )
        if conn.dialect.insert_returning:
            # a row back when claimed, none when the WHERE refused: an INSERT's rowcount
            # is not reliable (psycopg on PostgreSQL reports -1 for this statement)
            claimed = conn.execute(stmt.returning(c.token)).first() is not None
        else:
            claimed = conn.execute(stmt).rowcount > 0  # SQLite before 3.35: exact
    else:
        claimed = _claim_generic(conn, table, row)
    if not claimed:
        _refuse(conn, table, job_name, item, token)
    return token


def _claim_generic(conn: Connection, table: Table, row: dict[str, Any]) -> bool:
    """UPDATE if not older; else INSERT in a savepoint (a concurrent first claim makes
    it fail: then the UPDATE decides again)."""
    import sqlalchemy as sa

    c = table.c
    key = (c.job == row["job"]) & (c.item == row["item"])
    update = (
        sa.update(table)
        .where(key, c.token <= row["token"])
        .values({k: v for k, v in row.items() if k not in ("job", "item")})
    )
    if conn.execute(update).rowcount > 0:
        return True
    if conn.execute(sa.select(c.token).where(key)).first() is not None:
        return False  # a newer token holds it
    try:
        with conn.begin_nested():
            conn.execute(sa.insert(table).values(row))
        return True
    except sa.exc.IntegrityError:
        return conn.execute(update).rowcount > 0


def _refuse(conn: Connection, table: Table, job_name: str, item: int, token: int) -> NoReturn:
    import sqlalchemy as sa

    c = table.c
    held = conn.execute(
        sa.select(c.token, c.instance_id, c.execution_id).where(c.job == job_name, c.item == item)
    ).first()
    current = int(held.token) if held is not None else token
    holder = (str(held.instance_id), str(held.execution_id)) if held is not None else None
    who = f" (instance {holder[0]!r}, execution {holder[1]!r})" if holder else ""
    raise FencedWriteError(
        f"write refused: job {job_name!r} item {item} is fenced at token {current}{who}, "
        f"newer than this execution's token {token}: another execution took the item "
        "over; roll this transaction back",
        job_name=job_name,
        item=item,
        token=token,
        current=current,
        holder=holder,
    )


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
    at its end, rolled back if it raises. Or a Connection or Session: the fence is
    claimed in its transaction (SQLAlchemy begins one on first use), which is yours to
    commit or roll back (``with session.begin(): with fenced(session, ctx): ...``).
    Write through ``guard.db``. The fence is claimed on entry (:func:`fence`): a newer
    execution's fence raises :class:`FencedWriteError` there, before any write. Bad
    arguments are refused at the call, before the block."""
    _require()
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    _check_context(ctx)
    if table is not None:
        _check_fence_table(table)
    if isinstance(db, sa.Engine):
        return _in_engine(db, ctx, table)
    if isinstance(db, Session):
        return _joined(db, ctx, table)
    return _joined(_connection(db), ctx, table)


@contextmanager
def _in_engine(
    engine: Engine, ctx: FencingContext, table: Table | None
) -> Iterator[FenceGuard[Connection]]:
    with engine.begin() as conn:
        token = fence(conn, ctx, table=table)
        yield FenceGuard(conn, token, ctx.job_name, ctx.item)


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


# -- a token column on the rows ------------------------------------------------------------


def fenced_update(
    db: Connection | Session,
    table: Any,
    values: Mapping[str, Any],
    where: ColumnElement[bool] | Mapping[str, Any],
    ctx: FencingContext,
    *,
    token_column: str = DEFAULT_TOKEN_COLUMN,
) -> int:
    """Update the rows of ``table`` matching ``where`` with ``values`` and this
    execution's token, unless a newer token wrote any of them; returns the rows updated.

    ``table`` is a Table or an ORM-mapped class with an integer ``token_column``
    (NULL: never fenced, writable); ``values`` maps column names to new values;
    ``where`` is a SQL condition (``accounts.c.id == 7``) or a mapping of column names to
    values (``{"id": 7}``). One ``UPDATE ... SET ..., fence_token = :token WHERE <where>
    AND (fence_token IS NULL OR fence_token <= :token)``, then one read of the rows of
    ``where`` with a newer token: if there are any, :class:`FencedWriteError` (roll the
    transaction back: the rows with older tokens were updated). 0 when no row
    matches ``where`` (there was nothing to fence: insert it if you meant to)::

        with engine.begin() as conn:
            fenced_update(conn, accounts, {"balance": 42}, {"id": 7}, ctx)
    """
    _require()
    job_name, item, token = _check_context(ctx)
    conn = _connection(db)
    import sqlalchemy as sa

    target = _as_table(table)
    name = target.name
    if token_column not in target.c:
        raise ConfigError(
            f"table {name!r} has no token column {token_column!r} (columns: "
            f"{', '.join(target.c.keys())}); add an integer column (BIGINT, NULL allowed) "
            "or pass token_column="
        )
    if not isinstance(values, Mapping):
        raise ConfigError(f"values {values!r}: give a mapping of column names to new values")
    unknown = [k for k in values if k not in target.c]
    if unknown:
        raise ConfigError(
            f"values for table {name!r} name no column of it: {', '.join(map(repr, unknown))}"
        )
    if token_column in values:
        raise ConfigError(
            f"values for table {name!r} set the token column {token_column!r}: the "
            "execution's token is written there, leave it out"
        )
    condition = _where(target, where)
    col = target.c[token_column]
    updated = conn.execute(
        sa.update(target)
        .where(condition, sa.or_(col.is_(None), col <= token))
        .values({**values, token_column: token})
    ).rowcount
    # Read after the update: rows that were newer are still newer (tokens only grow),
    # so a partial update is always seen, in the same transaction that must undo it.
    newer = conn.execute(sa.select(sa.func.max(col)).where(condition, col > token)).scalar()
    if newer is not None:
        raise FencedWriteError(
            f"write refused: table {name!r} has rows of {_describe(where)} written with "
            f"token {newer}, newer than this execution's token {token} (job {job_name!r} "
            f"item {item}): another execution took the item over; roll this transaction "
            f"back ({updated} older rows were updated in it)",
            job_name=job_name,
            item=item,
            token=token,
            current=int(newer),
        )
    return int(updated)


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


def _describe(where: Any) -> str:
    if isinstance(where, Mapping):
        return ", ".join(f"{k}={v!r}" for k, v in where.items())
    return f"({where})"


# -- checks ---------------------------------------------------------------------------------


def _require() -> None:
    """Import SQLAlchemy, or raise the one-line error naming the extra to install."""
    with needs_extra("history", _WHAT):
        import sqlalchemy
        import sqlalchemy.orm  # noqa: F401


def _check_context(ctx: FencingContext) -> tuple[str, int, int]:
    job_name = getattr(ctx, "job_name", None)
    if not isinstance(job_name, str) or not job_name:
        raise ConfigError(
            f"ctx {ctx!r}: no job_name; give the execution's ShardingContext (or an "
            "object with job_name, item, fencing_token, instance_id and execution_id)"
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
    assert isinstance(item, int)  # checked by _check_item
    return job_name, item, token


def _check_item(item: object, job_name: str) -> None:
    if isinstance(item, bool) or not isinstance(item, int) or item < 0:
        raise ConfigError(f"item {item!r} of job {job_name!r}: an item is an integer >= 0")


def _check_fence_table(table: Table) -> Table:
    import sqlalchemy as sa

    needed = ("job", "item", "token", "instance_id", "execution_id", "updated_at")
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
