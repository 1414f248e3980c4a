"""Log records written during an item carry its job, item, fire time, execution id
and fencing token (shardkeeper.logcontext), from user code and from shardkeeper, in
the worker thread, in the execution timeout's thread and in an async job's tasks;
records outside an item carry None. On the MemoryStore (the fields come from the
runtime, not from the store)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.logcontext import FIELDS, ItemContextFilter, current_item
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

user_log = logging.getLogger("user.code")


class Collect(logging.Handler):
    """Keeps every record it is given (after its filters ran)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        # not ``self.lock``: that is the Handler's own, held around emit()
        self._mutex = threading.Lock()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        with self._mutex:
            self.records.append(record)

    def fields(self, logger: str) -> list[dict[str, Any]]:
        with self._mutex:
            return [
                {f: getattr(r, f) for f in FIELDS} | {"msg": r.getMessage()}
                for r in self.records
                if r.name == logger
            ]


@pytest.fixture
def collected() -> Any:
    handler = Collect()
    handler.addFilter(ItemContextFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


class Logs(ShardedJob):
    """Logs one line per item, and one from a thread it starts without the context."""

    def execute(self, ctx: ShardingContext) -> None:
        user_log.info("item %d says hello", ctx.item)
        seen: list[object] = []
        t = threading.Thread(target=lambda: seen.append(current_item()))
        t.start()
        t.join(5)
        user_log.info("a plain thread of item %d saw %r", ctx.item, seen)


class AsyncLogs(ShardedJob):
    """An async job (on the process's event loop thread) logging from a task."""

    async def execute(self, ctx: ShardingContext) -> None:  # type: ignore[override]
        async def inner() -> None:
            user_log.info("task of item %d", ctx.item)

        await asyncio.create_task(inner())


def _run(server: MemoryServer, job: ShardedJob, **cfg: Any) -> Runtime:
    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(name="logs", interval=1, sharding_total_count=2, **cfg))
    rt.start()
    return rt


@pytest.mark.parametrize("timeout", [None, 30], ids=["worker-thread", "timeout-thread"])
def test_user_records_during_an_item_name_it(
    memory_server: MemoryServer, collected: Collect, timeout: int | None
) -> None:
    rt = _run(memory_server, Logs(), execution_timeout=timeout)
    try:
        wait_until(
            lambda: {r["sk_item"] for r in collected.fields("user.code")} >= {0, 1},
            20,
            message=lambda: f"no record of both items: {collected.fields('user.code')[:4]}",
        )
    finally:
        rt.stop_now()
    hello = [r for r in collected.fields("user.code") if "says hello" in r["msg"]]
    for r in hello:
        assert r["sk_job"] == "logs" and r["msg"] == f"item {r['sk_item']} says hello"
        assert r["sk_execution_id"] and r["sk_execution_id"].startswith("logs@")
        assert isinstance(r["sk_fencing_token"], int) and r["sk_fencing_token"] > 0
        assert r["sk_fire_time"].endswith("+00:00") and "T" in r["sk_fire_time"]
    # a thread the item starts does not inherit the context (documented)
    plain = [r for r in collected.fields("user.code") if "plain thread" in r["msg"]]
    assert plain and all(r["msg"].endswith("saw [None]") for r in plain)


def test_async_tasks_of_an_item_name_it(memory_server: MemoryServer, collected: Collect) -> None:
    rt = _run(memory_server, AsyncLogs())
    try:
        wait_until(
            lambda: {r["sk_item"] for r in collected.fields("user.code")} >= {0, 1},
            20,
            message=lambda: f"no record of both items: {collected.fields('user.code')[:4]}",
        )
    finally:
        rt.stop_now()
    for r in collected.fields("user.code"):
        assert r["sk_job"] == "logs" and r["msg"] == f"task of item {r['sk_item']}"


def test_records_outside_items_carry_none_and_extra_wins(collected: Collect) -> None:
    user_log.info("outside")
    user_log.info("given", extra={"sk_job": "mine"})
    outside, given = collected.fields("user.code")
    assert all(outside[f] is None for f in FIELDS)
    assert given["sk_job"] == "mine" and given["sk_item"] is None
