"""Durable run-now requests over the MemoryStore (coordination/runnow.py): the claim
is exactly once per item per request whoever owns the item, the leader records what
nobody can run and retires finished requests, and a request's ``at`` is validated
(review finding 15: NaN, infinity or a time far ahead dropped the request with a
traceback, or put its fire in the future)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.model import RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.runnow import (
    MAX_AHEAD,
    RunNowRequest,
    RunNowService,
    check_request_at,
    request_value,
)
from shardkeeper.errors import ConfigError
from shardkeeper.observe import ExecutionRecord, SkipRecord
from shardkeeper.ops import Operations
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob

pytestmark = pytest.mark.timeout(60)

JOB = "rn"
P = JobPaths(JOB)
PARAMS = {"batch": "7"}
NEVER = "0 0 1 1 *"


@pytest.fixture
def store(memory_server: MemoryServer) -> Iterator[CoordinationStore]:
    s = memory_server.store()
    s.start()
    try:
        yield s
    finally:
        s.close()


# -- the request's time ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "shown"),
    [
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (1e13, "10000000000000.0"),
        (-1.0, "-1.0"),
        ("soon", "'soon'"),
        (True, "True"),
        (None, "None"),
    ],
)
def test_a_bad_time_is_refused_naming_it_and_what_is_valid(at: object, shown: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_request_at(at, now=1_800_000_000.0)
    assert f"at={shown}" in str(err.value)
    assert "seconds since the epoch" in str(err.value)


def test_a_time_a_little_ahead_or_long_ago_is_valid() -> None:
    now = 1_800_000_000.0
    assert check_request_at(now + MAX_AHEAD, now) == now + MAX_AHEAD
    assert check_request_at(now - 86_400, now) == now - 86_400
    assert check_request_at(int(now), now) == now


def test_a_request_that_cannot_be_read_is_invalid_not_an_exception() -> None:
    bad = RunNowRequest.parse("r", b'{"at": NaN, "total": 2}', (), now=1_800_000_000.0)
    assert "at=nan" in bad.invalid and bad.pending() == [0, 1]
    assert "not a JSON object" in RunNowRequest.parse("r", b"[1]", ()).invalid
    assert RunNowRequest.parse("r", b"{not json", ()).invalid
    assert RunNowRequest.parse("r", b'{"at": 1, "total": 2, "params": {"a": 1}}', ()).invalid
    good = RunNowRequest.parse(
        "r", request_value(by="me", at=10.0, params=PARAMS, total=4), [1], now=20.0
    )
    assert (good.invalid, good.params, good.pending()) == ("", PARAMS, [0, 2, 3])
    some = RunNowRequest.parse(
        "r", request_value(by="me", at=10.0, params={}, total=4, items=[3, 1]), [], now=20.0
    )
    assert some.asked() == [1, 3]


# -- the claim: exactly once per item per request ----------------------------------------


def _start(store: CoordinationStore, me: str, items: list[int], request: str) -> tuple[int, ...]:
    """``me`` marks ``items`` running for ``request`` (its parts' records with the
    marks), as a start of a fire; returns the items marked, and clears them."""
    execution = ExecutionService(store, P, me)
    runnow = RunNowService(store, P, me)
    version = store.get(P.sharding)
    assert version is not None
    ids = {i: f"{JOB}@{me}#{i}" for i in items}
    result = execution.start(
        items,
        fire_time=time.time(),
        execution_ids=ids,
        assignment_version=version.version,
        persistent=True,
        monitor=True,
        claims={i: runnow.claim_ops(request, i, ids[i]) for i in items},
    )
    if result.marked:
        assert not execution.finish(result.marked, 0, result.fences)
    else:
        assert result.reason == "claimed", result
    return result.marked


def test_an_item_is_claimed_once_per_request_whoever_owns_it(store: CoordinationStore) -> None:
    """The owner ran items 0 and 1 for the request; after a reshard (or its death) a
    new owner that finds the request pending with the same items starts none of them
    again, and still starts the item nobody ran."""
    store.put(P.sharding, b"{}")
    store.put(P.runnow("r1"), request_value(by="op", at=time.time(), params=PARAMS, total=3))
    assert _start(store, "a", [0, 1], "r1") == (0, 1)
    assert _start(store, "b", [0, 1], "r1") == ()
    assert _start(store, "b", [2], "r1") == (2,)
    records = RunNowService(store, P, "x").pending()
    assert [r.recorded for r in records] == [frozenset({0, 1, 2})]
    # another request is a request of its own: its items run again
    store.put(P.runnow("r2"), request_value(by="op", at=time.time(), params=PARAMS, total=3))
    assert _start(store, "b", [0, 1], "r2") == (0, 1)


def test_two_owners_claiming_at_once_start_each_item_once(store: CoordinationStore) -> None:
    """Two instances that both believe they own every item (an old and a new
    assignment) claim concurrently: each item starts once."""
    store.put(P.sharding, b"{}")
    store.put(P.runnow("r1"), request_value(by="op", at=time.time(), params=PARAMS, total=8))
    got: dict[str, tuple[int, ...]] = {}
    barrier = threading.Barrier(2)

    def claim(me: str, order: list[int]) -> None:
        barrier.wait()
        marked: list[int] = []
        for i in order:
            marked += _start(store, me, [i], "r1")
        got[me] = tuple(marked)

    threads = [
        threading.Thread(target=claim, args=("a", list(range(8)))),
        threading.Thread(target=claim, args=("b", list(reversed(range(8))))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(got["a"] + got["b"]) == list(range(8))


def test_a_skipped_part_is_never_claimed_and_a_claimed_one_never_skipped(
    store: CoordinationStore,
) -> None:
    store.put(P.sharding, b"{}")
    store.put(P.runnow("r1"), request_value(by="op", at=time.time(), params={}, total=3))
    leader = RunNowService(store, P, "lead")
    assert leader.skip("r1", [2], "item disabled") == [2]
    assert _start(store, "a", [2], "r1") == ()
    assert _start(store, "a", [0], "r1") == (0,)
    assert leader.skip("r1", [0, 1], "removed") == [1]
    leader.delete("r1")
    assert _start(store, "a", [1], "r1") == ()  # a request that is gone runs nothing


# -- the runtime: the leader's part, and the catch-up path's time --------------------------


class Skips:
    """Records the skip records of a runtime."""

    def __init__(self) -> None:
        self.skips: list[SkipRecord] = []

    def on_execution(self, record: ExecutionRecord) -> None:
        """Executions are not looked at here."""

    def on_skip(self, record: SkipRecord) -> None:
        self.skips.append(record)


def _runtime(
    memory_server: MemoryServer, runtimes: list[Runtime], job: RecordingJob, count: int = 4
) -> tuple[Runtime, Skips]:
    skips = Skips()
    rt = Runtime(memory_server.store(), shutdown_grace=1, observers=[skips])
    rt.add_job(job, JobConfig(name=JOB, cron=NEVER, sharding_total_count=count))
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    return rt, skips


def test_the_leader_records_disabled_and_removed_items_skipped_and_retires_the_request(
    memory_server: MemoryServer, store: CoordinationStore, runtimes: list[Runtime]
) -> None:
    """A request of 6 items for a job of 4 (a count cut after it), item 1 disabled:
    items 0, 2, 3 run with the params, 1 and 4, 5 are recorded skipped with their
    reasons (skip records too), and the request is deleted."""
    job = RecordingJob()
    _rt, skips = _runtime(memory_server, runtimes, job)
    store.put(P.disabled_item(1), b"")
    wait_until(lambda: 1 in runtimes[0].runners[JOB].state.disabled_items, 10)
    store.put(P.runnow("r1"), request_value(by="op", at=time.time(), params=PARAMS, total=6))
    wait_until(
        lambda: not store.children(P.runnow_root),
        15,
        message=lambda: f"the request is still there: {store.get_tree(P.runnow_root)}",
    )
    assert sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 2, 3]
    by_reason = {s.reason: s.items for s in skips.skips}
    assert by_reason == {
        "job disabled": (1,),
        "items an operator's cut of sharding_total_count removed before they started": (4, 5),
    }


def test_a_request_with_a_bad_time_is_recorded_skipped_with_the_reason_not_a_traceback(
    memory_server: MemoryServer,
    store: CoordinationStore,
    runtimes: list[Runtime],
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = RecordingJob()
    _rt, skips = _runtime(memory_server, runtimes, job, count=2)
    caplog.set_level(logging.INFO)
    store.put(P.runnow("r1"), b'{"at": NaN, "total": 2, "params": {"batch": "7"}}')
    wait_until(lambda: not store.children(P.runnow_root), 15, message="the request stayed")
    assert job.runs == []
    assert [s.items for s in skips.skips] == [(0, 1)]
    assert "at=nan" in skips.skips[0].reason or any(
        "at=nan" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
    )
    assert not [r for r in caplog.records if "coordination task failed" in r.getMessage()]


@pytest.mark.parametrize("value", [b'{"at": NaN}', b'{"at": Infinity}', b'{"at": 1e13}'])
def test_a_catch_up_node_with_a_bad_time_is_refused_with_an_error_naming_it(
    memory_server: MemoryServer,
    store: CoordinationStore,
    runtimes: list[Runtime],
    caplog: pytest.LogCaptureFixture,
    value: bytes,
) -> None:
    """The per-instance node (a one-off job's catch-up): before, the fire crashed its
    lane task with a traceback ("coordination task failed") and was dropped."""
    job = RecordingJob()
    rt, _skips = _runtime(memory_server, runtimes, job, count=2)
    caplog.set_level(logging.INFO)
    store.put(P.trigger(rt.instance_id), value)
    wait_until(
        lambda: any("is not valid" in r.getMessage() for r in caplog.records),
        10,
        message=lambda: "no error: " + "; ".join(r.getMessage() for r in caplog.records),
    )
    assert not store.exists(P.trigger(rt.instance_id))
    assert not [r for r in caplog.records if "coordination task failed" in r.getMessage()]
    assert job.runs == []


def test_a_request_whose_fire_gave_up_on_a_busy_item_runs_it_once_it_is_free(
    memory_server: MemoryServer, store: CoordinationStore, runtimes: list[Runtime]
) -> None:
    """No fault of the owner: the item is marked running by another live member (a
    failover taker, say) for longer than the fire may wait, so the request's fire
    gives up on it ("items still run elsewhere"). Before, the request was gone with
    that fire; now its part stays pending and runs, with the params, once the item
    is free."""
    job = RecordingJob()
    skips = Skips()
    rt = Runtime(memory_server.store(), shutdown_grace=1, observers=[skips])
    cfg = JobConfig(name=JOB, cron=NEVER, sharding_total_count=2, sharding_wait_timeout=1.0)
    rt.add_job(job, cfg)
    runtimes.append(rt)
    rt.start()
    runner = rt.runners[JOB]
    wait_until(lambda: runner.state.registered and runner.leader.is_leader, 10)
    ops = Operations(store)
    ops.trigger(JOB)  # the assignment: both items are this instance's
    wait_until(lambda: len(job.runs) == 2 and runner.idle, 10)
    store.put(P.instance("other"), b"{}", ephemeral=True)
    store.put(P.running(1), RunningMark("other", time.time() - 1, f"{JOB}@1#1").to_bytes())
    ops.trigger(JOB, params=PARAMS)
    wait_until(
        lambda: [r.item for r in job.runs if r.params == PARAMS] == [0],
        10,
        message=lambda: f"item 0 did not run with the params: {job.runs}",
    )
    # the fire gave up on item 1 (it waited sharding_wait_timeout), then it is free
    wait_until(lambda: runner.pending_fires() == 0, 10, message="the fire did not end")
    store.delete(P.running(1))
    wait_until(
        lambda: sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1],
        20,
        message=lambda: f"item 1 never ran with the params: {job.runs}",
    )
    wait_until(lambda: not store.children(P.runnow_root), 10, message="the request stayed")
    assert sorted(r.item for r in job.runs if r.params == PARAMS) == [0, 1]
    assert not [s for s in skips.skips if s.reason == "items still run elsewhere"]
