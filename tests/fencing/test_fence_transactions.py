"""The fence needs a transaction, and holds at every isolation level.

* A connection in autocommit has no transaction to hold the claim and the writes
  together: the claim commits alone, and a zombie's write after it lands after the
  newer execution's. It is refused with a ConfigError: SQLAlchemy's AUTOCOMMIT before
  any SQL, a driver left in autocommit behind SQLAlchemy's back after the claim.
* PostgreSQL at REPEATABLE READ and SERIALIZABLE aborts a claim that waited for a
  concurrent claim (SQLSTATE 40001), whichever is newer. The newer execution must go
  on, the older get FencedWriteError: a transaction the claim began is begun again,
  a caller's gets FenceContentionError (run it again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from shardkeeper.errors import ConfigError
from shardkeeper.fencing import (
    FenceContentionError,
    FencedWriteError,
    create_fence_table,
    fence,
    fenced,
)
from shardkeeper.testing.faults import wait_until
from tests.fencing.helpers import DATA, METADATA, Ctx, ctx, held, value, waiting_on_lock, write

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    create_fence_table(engine)
    METADATA.create_all(engine)
    return engine


def _engine(db_url: str, **kw: Any) -> sa.Engine:
    """Another Engine on the test's database (the conftest's connect arguments)."""
    connect_args = {"timeout": 10.0} if db_url.startswith("sqlite") else {"connect_timeout": 10}
    return sa.create_engine(db_url, connect_args=connect_args, **kw)


@pytest.fixture
def engines() -> Iterator[list[sa.Engine]]:
    made: list[sa.Engine] = []
    yield made
    for e in made:
        e.dispose()


# -- autocommit --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["create_engine", "engine.execution_options"])
def test_an_autocommit_engine_is_refused_at_the_call(
    db: sa.Engine, db_url: str, engines: list[sa.Engine], how: str
) -> None:
    if how == "create_engine":
        auto = _engine(db_url, isolation_level="AUTOCOMMIT")
        engines.append(auto)
    else:
        auto = db.execution_options(isolation_level="AUTOCOMMIT")
    with pytest.raises(ConfigError) as refused:
        fenced(auto, ctx(10))  # at the call, before the block
    message = str(refused.value)
    assert "has isolation_level 'AUTOCOMMIT': each statement commits alone" in message
    assert "READ COMMITTED, REPEATABLE READ, SERIALIZABLE" in message
    assert held(db) is None  # nothing claimed


def test_an_autocommit_connection_or_session_is_refused_before_any_sql(
    db: sa.Engine, db_url: str, engines: list[sa.Engine]
) -> None:
    with db.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        with pytest.raises(ConfigError, match="isolation_level 'AUTOCOMMIT'"):
            fence(auto, ctx(10))
        with pytest.raises(ConfigError, match="isolation_level 'AUTOCOMMIT'"):
            fenced(auto, ctx(10))
    auto_engine = _engine(db_url, isolation_level="AUTOCOMMIT")
    engines.append(auto_engine)
    with Session(auto_engine) as session, pytest.raises(ConfigError, match="AUTOCOMMIT"):
        fence(session, ctx(10))
    assert held(db) is None


def test_the_reviews_zombie_and_taker_on_an_autocommit_engine(
    db: sa.Engine, db_url: str, engines: list[sa.Engine]
) -> None:
    """The review's sequence: the zombie's fenced block is open when the taker writes,
    then the zombie writes. With AUTOCOMMIT the zombie's write landed last; now its
    block is refused and the taker's row stays."""
    auto = _engine(db_url, isolation_level="AUTOCOMMIT")
    engines.append(auto)
    with db.begin() as conn:
        conn.execute(sa.insert(DATA).values(id=1, value="before"))
    try:
        with fenced(auto, ctx(100)) as zombie:
            write(db, ctx(200), "taker")
            zombie.execute(sa.update(DATA).values(value="zombie"))
    except ConfigError:
        write(db, ctx(200), "taker")
    assert (held(db), value(db)) == ((200, "inst", "exec"), "taker")


def _driver_autocommit(kind: str) -> Callable[[Any, Any], None]:
    """A connect hook putting the driver's connection in autocommit behind SQLAlchemy."""

    def hook(dbapi_conn: Any, _record: Any) -> None:
        if kind == "sqlite":
            dbapi_conn.isolation_level = None
        else:
            dbapi_conn.autocommit = True

    return hook


def test_a_driver_in_autocommit_is_refused_and_the_sqlite_begin_recipe_is_not(
    db: sa.Engine, db_url: str, db_kind: str, engines: list[sa.Engine]
) -> None:
    """A driver in autocommit that SQLAlchemy does not know of: the driver says no
    transaction is open after the claim, and the write is refused before it is made.
    SQLAlchemy's recipe for SQLite (the driver in autocommit, BEGIN sent on begin) has
    a transaction: it fences."""
    raw = _engine(db_url)
    engines.append(raw)
    sa.event.listen(raw, "connect", _driver_autocommit(db_kind))
    with pytest.raises(ConfigError) as refused, fenced(raw, ctx(10)) as guard:
        guard.execute(sa.insert(DATA).values(id=1, value="unfenced"))
    assert "the database connection is in autocommit" in str(refused.value)
    assert value(db) is None
    if db_kind != "sqlite":
        return
    recipe = _engine(db_url)
    engines.append(recipe)
    sa.event.listen(recipe, "connect", _driver_autocommit("sqlite"))
    sa.event.listen(recipe, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
    write(recipe, ctx(20), "fenced")
    with pytest.raises(FencedWriteError):
        write(recipe, ctx(19), "older")
    assert (held(db), value(db)) == ((20, "inst", "exec"), "fenced")


# -- REPEATABLE READ and SERIALIZABLE on PostgreSQL --------------------------------------------


def _contend(db: sa.Engine, how: str, iso: sa.Engine, c: Ctx) -> str:
    """The contender's claim and write, ``how``: its outcome."""
    try:
        if how == "fenced(engine)":
            with fenced(iso, c) as guard:
                guard.execute(sa.update(DATA).values(value=f"token {c.fencing_token}"))
            return "claimed"
        with iso.connect() as conn:
            if how == "caller's transaction":
                conn.begin()
                conn.execute(sa.select(DATA.c.value)).all()  # its snapshot: before the commit
            fence(conn, c)
            conn.execute(sa.update(DATA).values(value=f"token {c.fencing_token}"))
            conn.commit()
        return "claimed"
    except (FencedWriteError, FenceContentionError) as exc:
        return type(exc).__name__
    except sa.exc.DBAPIError as exc:
        return type(exc.orig).__name__


@pytest.mark.parametrize("db_kind", ["postgresql"], ids=["pg"])
@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
@pytest.mark.parametrize("first", ["older", "newer"])
@pytest.mark.parametrize(
    "how", ["fenced(engine)", "fence(fresh connection)", "caller's transaction"]
)
def test_a_contended_claim_at_snapshot_isolation(
    db: sa.Engine, level: str, first: str, how: str
) -> None:
    """The first claimer holds the fence; the other claims (waits), the first commits.
    The older of the two gets FencedWriteError; the newer claims (by itself, or on the
    caller's retry after FenceContentionError); the fence ends at the newer token."""
    with db.begin() as conn:
        conn.execute(sa.insert(DATA).values(id=1, value="before"))
    older, newer = ctx(100), ctx(200)
    holder, contender = (older, newer) if first == "older" else (newer, older)
    iso = db.execution_options(isolation_level=level)
    outcome: list[str] = []
    with db.connect() as conn:
        conn.begin()
        fence(conn, holder)
        conn.execute(sa.update(DATA).values(value=f"token {holder.fencing_token}"))
        thread = threading.Thread(
            target=lambda: outcome.append(_contend(db, how, iso, contender)), daemon=True
        )
        thread.start()
        wait_until(lambda: waiting_on_lock(db), 20, message="the second claim never waited")
        conn.commit()
    thread.join(20)
    assert not thread.is_alive()
    if contender is older:
        assert outcome == ["FencedWriteError"]
    elif how == "caller's transaction":
        assert outcome == ["FenceContentionError"]
        assert _contend(db, how, iso, contender) == "claimed"  # the caller runs it again
    else:
        assert outcome == ["claimed"]
    assert (held(db), value(db)) == ((200, "inst", "exec"), "token 200")
