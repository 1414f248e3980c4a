"""One long-lived event loop for the async jobs of a process.

``execute`` may be ``async def``. Running each call in a fresh ``asyncio.run`` loop
(as shardkeeper did first) breaks every loop-bound client a job keeps between calls
(an aiohttp session, an asyncpg pool, an ``asyncio.Lock``): they belong to the loop
that created them, which is closed after the call. Instead, every coroutine of every
async job in the process runs on ONE event loop, in one daemon thread started on the
first async call. The worker thread that runs the item waits for the coroutine, so an
async item still holds one worker slot (the worker budget bounds it like any other).

A coroutine that blocks the loop (a synchronous sleep, CPU work) delays every other
async item of the process: keep ``execute`` properly asynchronous, or make it a plain
function. A coroutine that never ends holds its worker slot, as a hung plain item
does; the loop keeps serving the others.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["EventLoopThread", "run_awaitable", "shared_loop"]

T = TypeVar("T")


class EventLoopThread:
    """An asyncio event loop running forever in one daemon thread."""

    def __init__(self, name: str = "sk-async") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop (started on first use)."""
        with self._lock:
            if self._loop is None or self._loop.is_closed():
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
                self._thread.start()
                ready.wait(10)
                self._loop = loop
            return self._loop

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the loop and wait for its result (or exception) in the
        calling thread. Must not be called from the loop's own thread."""
        loop = self.loop
        if threading.current_thread() is self._thread:
            raise RuntimeError("EventLoopThread.run() called from its own loop thread")

        async def _await() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(_await(), loop).result()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop and its thread (tests; a process normally keeps it)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)
        if not loop.is_running():
            loop.close()


_shared = EventLoopThread()


def shared_loop() -> EventLoopThread:
    """The process-wide loop the async jobs run on."""
    return _shared


def run_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Run ``awaitable`` on the shared loop and return its result (worker threads)."""
    return _shared.run(awaitable)
