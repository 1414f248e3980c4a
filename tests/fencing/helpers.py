"""What the fencing tests share: a stand-in execution context, the tables written, and
readers of the fence row and the data."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from shardkeeper.fencing import fence_table, fenced

#: the fire the stand-in contexts run unless told (a whole second, as schedules give)
FIRE = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)


def fire(seconds: float) -> datetime:
    """The fire ``seconds`` after :data:`FIRE`."""
    return FIRE + timedelta(seconds=seconds)


@dataclass(frozen=True)
class Ctx:
    """The fields of a ShardingContext a fenced write reads."""

    fencing_token: int
    item: int = 0
    job_name: str = "export"
    instance_id: str = "inst"
    execution_id: str = "exec"
    fire_time: datetime = field(default=FIRE)


def ctx(token: int, **kw: object) -> Ctx:
    return Ctx(token, **kw)  # type: ignore[arg-type]


METADATA = sa.MetaData()
DATA = sa.Table(
    "data",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("value", sa.String(50), nullable=True),
)
ACCOUNTS = sa.Table(
    "accounts",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("region", sa.String(20), nullable=False),
    sa.Column("balance", sa.Integer, nullable=False),
    sa.Column("fence_token", sa.BigInteger, nullable=True),
)


def held(engine: sa.Engine, item: int = 0, job: str = "export") -> tuple[int, str, str] | None:
    """The fence row of (job, item): token, instance, execution."""
    t = fence_table()
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(t.c.token, t.c.instance_id, t.c.execution_id).where(
                t.c.job == job, t.c.item == item
            )
        ).first()
    return None if row is None else (row.token, row.instance_id, row.execution_id)


def value(engine: sa.Engine, id_: int = 1) -> str | None:
    with engine.connect() as conn:
        return conn.execute(sa.select(DATA.c.value).where(DATA.c.id == id_)).scalar()


def write(engine: sa.Engine, c: Ctx, text: str) -> None:
    """One fenced transaction: the item's fence, then the data row."""
    with fenced(engine, c) as guard:
        guard.execute(sa.delete(DATA).where(DATA.c.id == 1))
        guard.execute(sa.insert(DATA).values(id=1, value=text))


def waiting_on_lock(engine: sa.Engine) -> bool:
    """PostgreSQL: some session of this database waits for a lock."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar()
        )
