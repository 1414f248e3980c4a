"""The fence orders executions by fire, then token (SQLite and PostgreSQL).

A failover run of an older fire that waited in the queue while the survivors were busy
is claimed after a newer fire of the item ran, so its token is the larger: by token
alone its write of the older fire's data would be accepted over the newer fire's. The
fence row keeps the fire time of the claim, and a write is accepted only if its (fire
time, token) is not older than the stored one's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from shardkeeper.coordination.execution import ExecutionService, new_fence
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.model import FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import ConfigError
from shardkeeper.fencing import (
    FencedWriteError,
    create_fence_table,
    fence,
    fence_table,
    fenced_update,
)
from shardkeeper.job import ShardingContext
from shardkeeper.registry.base import CoordinationStore, Create
from tests.fencing.helpers import ACCOUNTS, DATA, FIRE, METADATA, ctx, fire, held, value, write

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db(engine: sa.Engine) -> sa.Engine:
    create_fence_table(engine)
    METADATA.create_all(engine)
    return engine


def test_a_stale_run_of_an_older_fire_is_refused_despite_its_larger_token(
    db: sa.Engine,
) -> None:
    write(db, ctx(12, fire_time=fire(60), instance_id="B"), "fire 1")
    with pytest.raises(FencedWriteError) as refused:
        write(db, ctx(21, fire_time=FIRE, instance_id="C"), "fire 0, failed over late")
    err = refused.value
    assert (err.token, err.current, err.holder) == (21, 12, ("B", "exec"))
    assert (err.fire_time, err.current_fire_time) == (FIRE, fire(60))
    assert str(err) == (
        "write refused: job 'export' item 0 is fenced by a run of a later fire (fire "
        "2026-12-07T04:01:00.000+00:00, token 12 (instance 'B', execution 'exec')) than "
        "this execution's (fire 2026-12-07T04:00:00.000+00:00, token 21): its data is "
        "newer than this run's; roll this transaction back"
    )
    assert (held(db), value(db)) == ((12, "B", "exec"), "fire 1")
    # a later fire wins whatever its token; within it, the larger token
    write(db, ctx(30, fire_time=fire(120)), "fire 2")
    with pytest.raises(FencedWriteError, match="fenced at token 30"):
        write(db, ctx(29, fire_time=fire(120)), "fire 2, a zombie")
    write(db, ctx(31, fire_time=fire(120), instance_id="taker"), "fire 2, taken over")
    assert (held(db), value(db)) == ((31, "taker", "exec"), "fire 2, taken over")
    # One fire computed on two instances may differ in its float's last bits: fire
    # times less than 1 ms apart are one fire, ordered by token, so neither a zombie
    # slightly 'later' wins nor a taker slightly 'earlier' loses.
    late = fire(120) + timedelta(microseconds=900)
    with pytest.raises(FencedWriteError, match="fenced at token 31"):
        write(db, ctx(30, fire_time=late), "fire 2, a zombie a little later")
    write(db, ctx(31, fire_time=fire(120) - timedelta(microseconds=900)), "fire 2 again")
    assert value(db) == "fire 2 again"


def test_fenced_update_orders_by_fire_too(db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.execute(sa.insert(ACCOUNTS).values(id=1, region="eu", balance=0))
    with db.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"balance": 1}, {"id": 1}, ctx(12, fire_time=fire(60)))
    with pytest.raises(FencedWriteError, match="a later fire"), db.begin() as conn:
        fenced_update(conn, ACCOUNTS, {"balance": 0}, {"id": 1}, ctx(21, fire_time=FIRE))
    with db.connect() as conn:
        assert conn.execute(sa.select(ACCOUNTS.c.balance, ACCOUNTS.c.fence_token)).one() == (
            1,
            12,
        )


def test_a_fence_table_of_an_earlier_release_is_named_and_then_compares_by_token(
    db: sa.Engine,
) -> None:
    """A table without the fire column: create_fence_table names the statement that
    adds it; its old rows (NULL fire) compare by token until the item's next claim."""
    old = sa.Table(
        "old_fence",
        sa.MetaData(),
        sa.Column("job", sa.String(200), primary_key=True),
        sa.Column("item", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("instance_id", sa.String(255), nullable=False),
        sa.Column("execution_id", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    old.create(db)
    with db.begin() as conn:
        conn.execute(
            sa.insert(old).values(
                job="export",
                item=0,
                token=50,
                instance_id="old",
                execution_id="e",
                updated_at=datetime.now(UTC),
            )
        )
    mine = fence_table(sa.MetaData(), name="old_fence")
    with pytest.raises(ConfigError) as missing:
        create_fence_table(db, table=mine)
    assert str(missing.value) == (
        "fence table 'old_fence' has no column 'fire_time_us' (fences order by fire time "
        "since this release): add it with ALTER TABLE old_fence ADD COLUMN fire_time_us BIGINT"
    )
    with pytest.raises(ConfigError, match="ADD COLUMN fire_time_us"), db.begin() as conn:
        fence(conn, ctx(60), table=mine)  # not migrated: the claim names it too
    with db.begin() as conn:
        conn.execute(sa.text("ALTER TABLE old_fence ADD COLUMN fire_time_us BIGINT"))
    assert create_fence_table(db, table=mine) is mine
    with pytest.raises(FencedWriteError, match="fenced at token 50"), db.begin() as conn:
        fence(conn, ctx(49, fire_time=fire(60)), table=mine)  # by token: older
    with db.begin() as conn:
        assert fence(conn, ctx(51), table=mine) == 51
    with pytest.raises(FencedWriteError, match="a later fire"), db.begin() as conn:
        fence(conn, ctx(60, fire_time=fire(-60)), table=mine)  # now by fire


# -- the stale failover run, made by the coordination layer ---------------------------------

P = JobPaths("export")
F0 = 1_796_100_000.0


def _sc(job: str, fire_time: float, token: int, instance: str) -> ShardingContext:
    return ShardingContext(
        job_name=job,
        item=0,
        item_parameter="",
        sharding_total_count=1,
        job_parameter="",
        fire_time=datetime.fromtimestamp(fire_time, UTC),
        instance_id=instance,
        execution_id=f"{job}@{round(fire_time * 1000)}#0",
        fencing_token=token,
    )


def _mark(store: CoordinationStore, instance: str, fire_time: float) -> tuple[int, str]:
    """``instance``'s persistent running mark of item 0 for ``fire_time``: (token, fence)."""
    fence_id = new_fence()
    mark = RunningMark(instance, fire_time, f"export@{round(fire_time * 1000)}#0")
    done = store.commit(
        [Create(P.running(0), mark.to_bytes()), Create(f"{P.running(0)}/{fence_id}")]
    )
    assert done
    return done.revision, fence_id


@pytest.mark.parametrize("backend", ["memory"], ids=["memory"])
def test_the_coordination_layers_stale_failover_run_is_refused(
    store: CoordinationStore, db: sa.Engine
) -> None:
    """The review's inversion: fire F0's run on A is cut off and queued; no survivor
    claims it while B runs fire F1 of the item; then C claims F0, with a token larger
    than B's. B's and C's fenced writes, in that order: C's is refused."""
    token_a, fence_a = _mark(store, "A", F0)
    entry = FailoverEntry(F0, f"export@{round(F0 * 1000)}#0", "A")
    assert FailoverService(store, P, "A").hand_off({0: (token_a, entry, fence_a)}, keep=True) == [0]
    f1 = F0 + 60
    token_b, fence_b = _mark(store, "B", f1)
    assert ExecutionService(store, P, "B").finish([0], token_b, {0: fence_b}) == []
    claim = FailoverService(store, P, "C").claim()
    assert claim is not None and claim.entry.fire_time == F0
    assert claim.token > token_b  # the inversion: the older fire's run has the larger token

    with db.begin() as conn:
        fence(conn, _sc("export", f1, token_b, "B"))
        conn.execute(sa.insert(DATA).values(id=1, value="fire 1"))
    with pytest.raises(FencedWriteError, match="a later fire"), db.begin() as conn:
        fence(conn, _sc("export", F0, claim.token, "C"))
        conn.execute(sa.update(DATA).values(value="fire 0"))
    assert value(db) == "fire 1"
