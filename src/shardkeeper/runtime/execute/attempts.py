"""Running one item once: the execution timeout.

A Python thread cannot be killed. With ``execution_timeout`` set, the item runs in a
thread of its own while the worker waits for it at most that long. When the time is
up the item is reported timed out, ``ctx.should_stop()`` turns true and
``ctx.is_valid()`` false for it (so code that checks them stops and commits nothing
more), and the worker slot is freed for the next item; the abandoned thread runs on
until ``execute`` returns. At most :data:`MAX_ABANDONED` such threads may exist in a
process: past that, items run in the worker thread without a timeout (logged), so a
job whose items never return cannot grow the thread count without bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardkeeper import tracing
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.logcontext import item_context

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["MAX_ABANDONED", "Attempt", "run_once"]

log = logging.getLogger(__name__)

#: timed-out item threads still running, at most (per process)
MAX_ABANDONED = 32

_abandoned = 0
_abandoned_lock = threading.Lock()
_warned_full = False


@dataclass(frozen=True)
class Attempt:
    """How one run of an item ended: ``ok``, ``failed`` or ``timed_out``."""

    outcome: str
    started: float
    ended: float
    error: BaseException | None = None


def abandoned_threads() -> int:
    """Timed-out item threads still running in this process."""
    with _abandoned_lock:
        return _abandoned


def run_once(
    job: ShardedJob,
    ctx: ShardingContext,
    timeout: float | None,
    on_timeout: Callable[[], None],
    span: Span | None = None,
) -> Attempt:
    """Run ``ctx``'s item once, within ``timeout`` seconds when given, with ``span``
    (its execution's, shardkeeper/tracing.py) current while it runs."""
    global _abandoned, _warned_full
    started = time.time()
    if timeout is None:
        return _direct(job, ctx, started, span)
    with _abandoned_lock:
        full = _abandoned >= MAX_ABANDONED
        if full and not _warned_full:
            _warned_full = True
            log.warning(
                "%d timed-out items still run in this process: new items run without "
                "a timeout until some of them end",
                _abandoned,
            )
    if full:
        return _direct(job, ctx, started, span)
    done = threading.Event()
    box: list[BaseException | None] = [None]

    def target() -> None:
        global _abandoned
        try:
            # the span too: this thread starts with an empty context
            with item_context(ctx), tracing.using(span):
                job.run_item(ctx)
        except BaseException as exc:  # user code: reported by the waiting worker
            box[0] = exc
        finally:
            with _abandoned_lock:
                if done.is_set():  # the worker gave up on it: it was counted
                    _abandoned -= 1
                done.set()

    thread = threading.Thread(target=target, name=f"sk-item-{ctx.job_name}-{ctx.item}", daemon=True)
    thread.start()
    finished = done.wait(timeout)
    with _abandoned_lock:
        if not finished and not done.is_set():
            done.set()  # from now on the thread's end uncounts itself
            _abandoned += 1
            finished = False
        else:
            finished = True
    if not finished:
        on_timeout()
        log.warning(
            "%s: item %d timed out after %.1fs (its thread runs on; told to stop)",
            ctx.job_name,
            ctx.item,
            timeout,
        )
        return Attempt("timed_out", started, time.time())
    error = box[0]
    return Attempt("failed" if error is not None else "ok", started, time.time(), error)


def _direct(job: ShardedJob, ctx: ShardingContext, started: float, span: Span | None) -> Attempt:
    try:
        with item_context(ctx), tracing.using(span):
            job.run_item(ctx)
    except BaseException as exc:  # user code: never let it kill the instance
        return Attempt("failed", started, time.time(), exc)
    return Attempt("ok", started, time.time())
