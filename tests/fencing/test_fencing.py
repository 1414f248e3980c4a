"""shardkeeper.fencing on real databases (SQLite and PostgreSQL): the fence row of an
item (fence, fenced, clear_fence) and the token column of fenced_update. A newer token
wins, an older one is refused with FencedWriteError and its transaction's writes are
undone, an equal one passes (the same execution writing again); bad arguments are
refused with a message naming them; without SQLAlchemy, one line names the extra."""

from __future__ import annotations

import re
import textwrap
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import shardkeeper.fencing
from shardkeeper.errors import ConfigError
from shardkeeper.fencing import (
    DEFAULT_FENCE_TABLE,
    FencedWriteError,
    clear_fence,
    create_fence_table,
    fence,
    fence_table,
    fenced,
    fenced_update,
)
from shardkeeper.job import ShardingContext
from shardkeeper.testing.faults import wait_until
from tests.fencing.helpers import ACCOUNTS, DATA, FIRE, METADATA, Ctx, ctx, fire, held, value, write
from tests.fencing.helpers import waiting_on_lock as _waiting_on_lock
from tests.test_packaging import OPTIONAL, _child

pytestmark = pytest.mark.timeout(60)


class Base(DeclarativeBase):
    pass


class Invoice(Base):
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    total: Mapped[int]
    fence_token: Mapped[int | None] = mapped_column(sa.BigInteger)


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    """The test's database with the fence table and the tables written here."""
    create_fence_table(engine)
    METADATA.create_all(engine)
    Base.metadata.create_all(engine)
    return engine


# -- the fence row ---------------------------------------------------------------------------


def test_the_first_claim_creates_the_fence_row(db: sa.Engine) -> None:
    with fenced(db, ctx(10, instance_id="a", execution_id="e10")) as guard:
        assert (guard.token, guard.job_name, guard.item) == (10, "export", 0)
    assert held(db) == (10, "a", "e10")


def test_a_newer_token_wins_and_an_older_one_is_refused(db: sa.Engine) -> None:
    write(db, ctx(10, instance_id="zombie"), "old")
    write(db, ctx(12, instance_id="taker", execution_id="e12"), "new")
    assert (held(db), value(db)) == ((12, "taker", "e12"), "new")
    with pytest.raises(FencedWriteError) as refused:
        write(db, ctx(11, instance_id="zombie"), "late")
    err = refused.value
    assert (err.job_name, err.item, err.token, err.current) == ("export", 0, 11, 12)
    assert err.holder == ("taker", "e12")
    assert str(err) == (
        "write refused: job 'export' item 0 is fenced at token 12 (instance 'taker', "
        "execution 'e12'), newer than this execution's token 11: another execution took "
        "the item over; roll this transaction back"
    )
    # the refused transaction wrote nothing
    assert (held(db), value(db)) == ((12, "taker", "e12"), "new")


def test_an_equal_token_is_re_entrant(db: sa.Engine) -> None:
    write(db, ctx(10), "first")
    write(db, ctx(10), "second")  # a second transaction of the same execution
    with db.begin() as conn:  # and twice in one transaction
        assert fence(conn, ctx(10)) == 10
        assert fence(conn, ctx(10)) == 10
    assert (held(db), value(db)) == ((10, "inst", "exec"), "second")


def test_a_refusal_after_the_writes_undoes_them(db: sa.Engine) -> None:
    """The fence may be claimed last, just before the commit: the transaction's
    earlier writes are undone with it."""
    write(db, ctx(20), "taker")
    with pytest.raises(FencedWriteError), db.begin() as conn:
        conn.execute(sa.update(DATA).where(DATA.c.id == 1).values(value="zombie"))
        fence(conn, ctx(19))
    assert value(db) == "taker"


def test_the_generic_claim_of_other_databases(
    db: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Databases without the native upsert: an UPDATE, else an INSERT in a savepoint;
    the same rules."""
    monkeypatch.setattr(shardkeeper.fencing, "_NATIVE_UPSERT", frozenset())
    write(db, ctx(10), "first")  # the INSERT
    write(db, ctx(10), "again")  # the UPDATE, equal token
    write(db, ctx(12, instance_id="taker"), "taker")
    with pytest.raises(FencedWriteError) as refused:
        write(db, ctx(11), "late")
    assert (refused.value.current, refused.value.holder) == (12, ("taker", "exec"))
    assert (held(db), value(db)) == ((12, "taker", "exec"), "taker")


def test_items_and_jobs_have_fences_of_their_own(db: sa.Engine) -> None:
    write(db, ctx(50, item=0), "item 0")
    with fenced(db, ctx(10, item=1)):
        pass
    with fenced(db, ctx(10, item=0, job_name="other")):
        pass
    assert held(db, 0) == (50, "inst", "exec")
    assert held(db, 1) == (10, "inst", "exec")
    assert held(db, 0, "other") == (10, "inst", "exec")


def test_fenced_on_a_connection_claims_in_its_transaction(db: sa.Engine) -> None:
    """With a Connection the transaction is the caller's: commit keeps fence and
    write, rollback drops both."""
    with db.connect() as conn:
        with fenced(conn, ctx(10)) as guard:
            assert guard.db is conn
            guard.execute(sa.insert(DATA).values(id=1, value="committed"))
        assert conn.in_transaction()  # not ended by the block
        conn.commit()
        with conn.begin(), fenced(conn, ctx(11)) as guard:
            guard.execute(sa.update(DATA).values(value="rolled back"))
            conn.rollback()
    assert (held(db), value(db)) == ((10, "inst", "exec"), "committed")


def test_an_error_in_the_block_rolls_back_fence_and_writes(db: sa.Engine) -> None:
    write(db, ctx(10), "before")
    with pytest.raises(RuntimeError, match="boom"), fenced(db, ctx(11)) as guard:
        guard.execute(sa.update(DATA).values(value="during"))
        raise RuntimeError("boom")
    assert (held(db), value(db)) == ((10, "inst", "exec"), "before")


def test_fenced_with_an_orm_session(db: sa.Engine) -> None:
    with Session(db) as session:
        with session.begin(), fenced(session, ctx(10)) as guard:
            assert guard.db is session
            session.add(Invoice(id=1, total=100))
        with session.begin(), fenced(session, ctx(12)):
            session.get_one(Invoice, 1).total = 120
        with pytest.raises(FencedWriteError), session.begin(), fenced(session, ctx(11)):
            session.get_one(Invoice, 1).total = 110  # never flushed: refused on entry
        assert session.get_one(Invoice, 1).total == 120
        session.rollback()
        # fence() alone, in the session's autobegun transaction
        session.get_one(Invoice, 1).total = 130
        assert fence(session, ctx(12)) == 12
        session.commit()
    assert held(db) == (12, "inst", "exec")
    with Session(db) as session:
        assert session.get_one(Invoice, 1).total == 130


def test_clear_fence_lets_tokens_start_again(db: sa.Engine) -> None:
    """After a move to another store, tokens count from 1 again."""
    write(db, ctx(5000, item=0), "old store")
    write(db, ctx(5000, item=1), "old store")
    with db.begin() as conn:
        assert clear_fence(conn, "export", [1]) == 1
    assert held(db, 1) is None
    assert held(db, 0) is not None
    with db.begin() as conn:
        assert clear_fence(conn, "export") == 1
    write(db, ctx(3), "new store")
    assert held(db) == (3, "inst", "exec")


def test_a_fence_table_of_your_own_metadata(db: sa.Engine) -> None:
    metadata = sa.MetaData()
    mine = fence_table(metadata, name="my_fences")
    metadata.create_all(db)
    with fenced(db, ctx(10), table=mine):
        pass
    with pytest.raises(FencedWriteError), fenced(db, ctx(9), table=mine):
        pass
    assert held(db) is None  # the default table was not used
    assert create_fence_table(db, table=mine) is mine


def test_a_sharding_context_is_a_fencing_context(db: sa.Engine) -> None:
    sc = ShardingContext(
        job_name="export",
        item=2,
        item_parameter="",
        sharding_total_count=4,
        job_parameter="",
        fire_time=datetime.now(UTC),
        instance_id="host@1",
        execution_id="export@1#2",
        fencing_token=77,
    )
    with fenced(db, sc) as guard:
        assert guard.token == 77
    assert held(db, 2) == (77, "host@1", "export@1#2")


# SQLite has one writer at a time: no two write transactions are ever open together
@pytest.mark.parametrize("db_kind", ["postgresql"], ids=["pg"])
def test_concurrent_claims_are_ordered_by_their_commits(db: sa.Engine) -> None:
    """PostgreSQL: an older execution's open fenced transaction makes a newer one's
    claim wait; once it commits, the newer one claims and writes over it, and the
    older token is refused from then on."""
    done: list[str] = []
    with db.connect() as zombie:
        zombie.begin()
        fence(zombie, ctx(10))
        zombie.execute(sa.insert(DATA).values(id=1, value="zombie"))

        def taker() -> None:
            write(db, ctx(12), "taker")
            done.append("taker")

        thread = threading.Thread(target=taker, daemon=True)
        thread.start()

        wait_until(lambda: _waiting_on_lock(db), 20, message="the newer claim never waited")
        assert done == []
        zombie.commit()
    thread.join(20)
    assert done == ["taker"]
    assert (held(db), value(db)) == ((12, "inst", "exec"), "taker")
    with pytest.raises(FencedWriteError):
        write(db, ctx(10), "zombie again")


# -- the token column ------------------------------------------------------------------------


@pytest.fixture
def accounts(db: sa.Engine) -> sa.Engine:
    with db.begin() as conn:
        conn.execute(
            sa.insert(ACCOUNTS),
            [
                {"id": 1, "region": "eu", "balance": 0, "fence_token": None},
                {"id": 2, "region": "eu", "balance": 0, "fence_token": None},
                {"id": 3, "region": "us", "balance": 0, "fence_token": None},
            ],
        )
    return db


def balances(engine: sa.Engine) -> dict[int, tuple[int, int | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(ACCOUNTS).order_by(ACCOUNTS.c.id)).all()
    return {r.id: (r.balance, r.fence_token) for r in rows}


def test_fenced_update_newer_wins_older_refused_equal_passes(accounts: sa.Engine) -> None:
    with accounts.begin() as conn:
        assert fenced_update(conn, ACCOUNTS, {"balance": 10}, {"id": 1}, ctx(10)) == 1
    with accounts.begin() as conn:
        assert fenced_update(conn, ACCOUNTS, {"balance": 12}, {"id": 1}, ctx(12)) == 1
    with accounts.begin() as conn:  # the same execution again
        assert fenced_update(conn, ACCOUNTS, {"balance": 13}, {"id": 1}, ctx(12)) == 1
    with pytest.raises(FencedWriteError) as refused, accounts.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"balance": 11}, {"id": 1}, ctx(11))
    assert (refused.value.token, refused.value.current) == (11, 12)
    assert str(refused.value).startswith("write refused: job 'export' item 0 is fenced at token 12")
    assert balances(accounts)[1] == (13, 12)
    assert held(accounts) == (12, "inst", "exec")  # the claim is the item's fence row


def test_fenced_update_is_refused_before_it_writes_a_row(accounts: sa.Engine) -> None:
    with accounts.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"balance": 5}, {"id": 2}, ctx(20))
    region = ACCOUNTS.c.region == "eu"
    with pytest.raises(FencedWriteError), accounts.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"balance": 7}, region, ctx(15))
    assert balances(accounts) == {1: (0, None), 2: (5, 20), 3: (0, None)}
    with accounts.begin() as conn:
        assert fenced_update(conn, ACCOUNTS, {"balance": 9}, region, ctx(21)) == 2
    assert balances(accounts) == {1: (9, 21), 2: (9, 21), 3: (0, None)}


@pytest.mark.parametrize("newer_did", ["moved the row out of where", "deleted the row"])
def test_fenced_update_refuses_a_zombie_whose_rows_a_newer_execution_changed(
    accounts: sa.Engine, newer_did: str
) -> None:
    """The review's finding 7: the newer execution set the column ``where`` names (a
    status the job changes), or deleted the row; the zombie's same update matched
    nothing and returned 0, and its insert after it was accepted. The claim is the
    item's, not the rows': refused whether they still match or not."""
    pending = {"id": 1, "region": "eu"}  # region stands for a status: eu = pending
    with accounts.begin() as conn:
        if newer_did == "deleted the row":
            fence(conn, ctx(200))
            conn.execute(sa.delete(ACCOUNTS).where(ACCOUNTS.c.id == 1))
        else:
            n = fenced_update(conn, ACCOUNTS, {"region": "done", "balance": 2}, pending, ctx(200))
            assert n == 1
    before = balances(accounts)
    with pytest.raises(FencedWriteError) as refused, accounts.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"region": "done", "balance": 1}, pending, ctx(100))
        conn.execute(sa.insert(ACCOUNTS).values(id=4, region="done", balance=1))
    assert (refused.value.token, refused.value.current) == (100, 200)
    assert balances(accounts) == before  # neither the update nor the insert


def test_fenced_update_of_no_row_is_zero_and_holds_the_fence(accounts: sa.Engine) -> None:
    """0 for the execution that holds the fence: the insert it then makes in the
    transaction is fenced with it, and an older execution's is refused."""
    with accounts.begin() as conn:
        assert fenced_update(conn, ACCOUNTS, {"balance": 1}, {"id": 99}, ctx(10)) == 0
        conn.execute(sa.insert(ACCOUNTS).values(id=99, region="eu", balance=1, fence_token=10))
    assert held(accounts) == (10, "inst", "exec")
    with pytest.raises(FencedWriteError), accounts.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"balance": 2}, {"id": 98}, ctx(9))
    assert 98 not in balances(accounts)


def test_fenced_update_without_a_token_column(accounts: sa.Engine) -> None:
    with accounts.begin() as conn:
        n = fenced_update(conn, DATA, {"value": "x"}, {"id": 1}, ctx(10), token_column=None)
        assert n == 0
    assert held(accounts) == (10, "inst", "exec")


def test_fenced_update_of_an_orm_class_in_a_session(db: sa.Engine) -> None:
    with Session(db) as session, session.begin():
        session.add(Invoice(id=1, total=1))
    with Session(db) as session, session.begin():
        assert fenced_update(session, Invoice, {"total": 2}, Invoice.id == 1, ctx(8)) == 1
    with Session(db) as session:
        with pytest.raises(FencedWriteError):
            fenced_update(session, Invoice, {"total": 3}, {"id": 1}, ctx(7))
        session.rollback()
        assert (session.get_one(Invoice, 1).total, session.get_one(Invoice, 1).fence_token) == (
            2,
            8,
        )


# -- bad input -------------------------------------------------------------------------------


@pytest.fixture
def conn() -> Iterator[sa.Connection]:
    engine = sa.create_engine("sqlite://")
    METADATA.create_all(engine)
    with engine.connect() as c:
        yield c
    engine.dispose()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (ctx(0), "fencing_token=0 of job 'export' item 0: a fenced write needs the "),
        (ctx(True), "fencing_token=True of job 'export' item 0"),  # type: ignore[arg-type]
        (ctx(-5), "fencing_token=-5 of job"),
        (ctx(5, item=-1), "item -1 of job 'export': an item is an integer >= 0"),
        (ctx(5, item="3"), "item '3' of job 'export'"),
        (ctx(5, job_name=""), "ctx Ctx(fencing_token=5, item=0, job_name='', "),
        (object(), "ctx <object object at 0x"),
        (ctx(5, fire_time=None), "fire_time=None of job 'export' item 0: a fenced write orders"),
        (
            ctx(5, fire_time=datetime(2026, 12, 7)),  # naive: refused
            "fire_time=datetime.datetime(2026, 12, 7, 0, 0) of job 'export' item 0: a fenced",
        ),
    ],
)
def test_a_bad_context_is_refused_naming_the_value(
    conn: sa.Connection, bad: Ctx, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        fence(conn, bad)
    with pytest.raises(ConfigError, match=re.escape(message)):
        fenced(conn, bad)  # refused at the call, before any block
    with pytest.raises(ConfigError, match=re.escape(message)):
        fenced_update(conn, ACCOUNTS, {"balance": 1}, {"id": 1}, bad)


def test_monitor_execution_off_is_named(conn: sa.Connection) -> None:
    with pytest.raises(ConfigError, match="monitor_execution off: turn it on"):
        fence(conn, ctx(0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"table": DATA},
            "table 'data' has no token column 'fence_token' (columns: id, value); add an "
            "integer column",
        ),
        ({"values": {"nope": 1}}, "values for table 'accounts' name no column of it: 'nope'"),
        (
            {"values": {"fence_token": 1}},
            "values for table 'accounts' set the token column 'fence_token'",
        ),
        ({"values": [("balance", 1)]}, "values [('balance', 1)]: give a mapping"),
        ({"where": {"idd": 1}}, "where for table 'accounts' names no column of it: 'idd'"),
        ({"where": {}}, "where {} for table 'accounts': name the rows to update"),
        ({"where": "id = 1"}, "where 'id = 1': give a SQL condition"),
        ({"table": "accounts"}, "table 'accounts': give a sqlalchemy Table or an ORM-mapped"),
        ({"token_column": "tok"}, "table 'accounts' has no token column 'tok'"),
    ],
)
def test_fenced_update_bad_arguments_are_named(
    conn: sa.Connection, kwargs: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {
        "table": ACCOUNTS,
        "values": {"balance": 1},
        "where": {"id": 1},
        "ctx": ctx(5),
    }
    args.update(kwargs)
    with pytest.raises(ConfigError) as err:
        fenced_update(conn, **args)  # type: ignore[arg-type]
    assert str(err.value).startswith(message), str(err.value)


def test_other_bad_arguments_are_named(conn: sa.Connection) -> None:
    with pytest.raises(ConfigError, match=r"^db 'sqlite://': give a sqlalchemy Connection"):
        fence("sqlite://", ctx(5))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^fence table Table\('data'"):
        fence(conn, ctx(5), table=DATA)
    with pytest.raises(ConfigError, match=r"^fence table name '': give a non-empty"):
        fence_table(name="")
    with pytest.raises(ConfigError, match=r"^job_name None: give the job's name"):
        clear_fence(conn, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^item -2 of job 'export'"):
        clear_fence(conn, "export", [-2])
    assert fence_table().name == DEFAULT_FENCE_TABLE


# -- without the extra -----------------------------------------------------------------------

WITHOUT_SQLALCHEMY = """
import shardkeeper.fencing as fencing
from shardkeeper import ConfigError
out = {"loaded": loaded("sqlalchemy")}
try:
    fencing.fence(None, None)
except ConfigError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def test_without_sqlalchemy_one_line_names_the_extra() -> None:
    """Importing the module needs no SQLAlchemy; using it names the extra."""
    out = _child(WITHOUT_SQLALCHEMY, OPTIONAL)
    assert out == {
        "loaded": [],
        "error": "shardkeeper.fencing needs the 'history' extra (sqlalchemy is not "
        "installed): pip install 'shardkeeper[history]'",
    }


# -- the module's example --------------------------------------------------------------------


def test_the_module_docstring_example_runs(tmp_path: Path) -> None:
    """The example of shardkeeper.fencing's docstring, as written, on a SQLite file: a
    newer execution's export is kept, an older one's is refused and undone, and so is
    a stale failover run's: an older fire, though claimed later with a larger token."""
    doc = shardkeeper.fencing.__doc__ or ""
    match = re.search(r"late export::\n\n((?:    .*\n|\n)+)", doc)
    assert match, "no example in shardkeeper.fencing's docstring"
    code = textwrap.dedent(match.group(1))
    url = "postgresql+psycopg://app@db/app"
    assert url in code
    code = code.replace(url, f"sqlite:///{tmp_path / 'example.db'}")
    exports = sa.Table(
        "exports",
        sa.MetaData(),
        sa.Column("region", sa.String(20)),
        sa.Column("token", sa.Integer),
    )
    running = {"token": 0}  # the token of the run building its export
    namespace: dict[str, Any] = {
        "exports": exports,
        "build_export": lambda region, until: [{"region": region, "token": running["token"]}],
    }
    exec(compile(code, "shardkeeper.fencing example", "exec"), namespace)
    engine: sa.Engine = namespace["engine"]
    exports.create(engine)
    job = namespace["ExportInvoices"]()

    def run(at: int, fire_time: datetime) -> None:
        running["token"] = at
        sc = ShardingContext(
            job_name="export-invoices",
            item=0,
            item_parameter="eu",
            sharding_total_count=1,
            job_parameter="",
            fire_time=fire_time,
            instance_id=f"vm@{at}",
            execution_id="export-invoices@1#0",
            fencing_token=at,
        )
        job.execute(sc)

    # fire F1's run (12); a zombie of F1 (11); F0's stale failover run, claimed after
    # F1 ran (21: a larger token, an older fire); fire F2's run (30)
    for token, fire_time in ((12, fire(60)), (11, fire(60)), (21, FIRE), (30, fire(120))):
        run(token, fire_time)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(exports.c.region, exports.c.token)).all()
    assert sorted(rows) == [("eu", 12), ("eu", 30)]
    engine.dispose()
