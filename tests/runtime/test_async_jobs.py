"""Async jobs run on one long-lived event loop, so loop-bound clients survive calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from shardkeeper.asyncloop import EventLoopThread
from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)


class LoopBound(ShardedJob):
    """Keeps an asyncio.Queue (bound to the loop of its first blocking use) across
    calls, as a job keeps an HTTP session or a connection pool."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int] | None = None
        self.loops: set[int] = set()
        self.calls = 0
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    async def execute(self, ctx: ShardingContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            if self.queue is None:
                self.queue = asyncio.Queue()
            loop.call_later(0.005, self.queue.put_nowait, ctx.item)
            await self.queue.get()  # blocks: binds the queue to this loop
        except BaseException as exc:
            with self.lock:
                self.errors.append(exc)
            raise
        with self.lock:
            self.loops.add(id(loop))
            self.calls += 1


@pytest.fixture
def server() -> Iterator[MemoryServer]:
    srv = MemoryServer()
    try:
        yield srv
    finally:
        srv.shutdown()


def test_async_items_share_one_loop_across_calls(server: MemoryServer) -> None:
    job = LoopBound()
    rt = Runtime(server.store(), shutdown_grace=2)
    rt.add_job(job, JobConfig(name="async", interval=0.2, sharding_total_count=1))
    rt.start()
    try:
        wait_until(lambda: job.calls >= 4 or bool(job.errors), 15, message="too few calls")
    finally:
        rt.stop()
    assert not job.errors, job.errors
    assert len(job.loops) == 1


def test_the_loop_thread_returns_results_and_raises_errors() -> None:
    loop = EventLoopThread(name="sk-async-test")
    try:

        async def double(x: int) -> int:
            await asyncio.sleep(0)
            return 2 * x

        async def boom() -> None:
            raise KeyError("k")

        assert loop.run(double(21)) == 42
        with pytest.raises(KeyError):
            loop.run(boom())
        assert loop.run(double(1)) == 2  # an error does not break the loop
    finally:
        loop.close()
