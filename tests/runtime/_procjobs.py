"""Jobs run by the process executor's tests (tests/runtime/test_process_executor.py).

They live in a module of their own, importable by a worker process, and report what
happened in the child through files in the directory named by ``job_parameter`` (a
child shares no memory with the test). Each item's ``item_parameter`` says what it
does: ``ok``, ``segv`` (a NULL read), ``exit3`` (``os._exit(3)``), ``sigkill``,
``crash_once`` (``os._exit(3)`` on the first run of a fire, then ok), ``sleep``
(until killed), ``wait_fenced`` (until ``ctx.is_valid()`` is false), ``pid``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time
from pathlib import Path

from shardkeeper.job import ShardedJob, ShardingContext


def _write(ctx: ShardingContext, name: str, data: dict[str, object]) -> None:
    path = Path(ctx.job_parameter) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # the test reads whole files only


def _fire(ctx: ShardingContext) -> int:
    return round(ctx.fire_time.timestamp() * 1000)


class Behaves(ShardedJob):
    """Does what its item parameter says (module docstring)."""

    def execute(self, ctx: ShardingContext) -> None:
        what = ctx.item_parameter
        seen = {**ctx.to_dict(), "pid": os.getpid(), "valid": ctx.is_valid()}
        if what == "segv":
            ctypes.string_at(0)
        elif what == "exit3":
            os._exit(3)
        elif what == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif what == "crash_once":
            marker = Path(ctx.job_parameter) / f"crashed-{_fire(ctx)}-{ctx.item}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os._exit(3)
        elif what == "sleep":
            _write(ctx, f"sleeping-{ctx.item}", seen)
            time.sleep(60)  # killed by the execution timeout long before
        elif what == "wait_fenced":
            _write(ctx, f"running-{ctx.item}", seen)
            deadline = time.monotonic() + 30
            while ctx.is_valid() and time.monotonic() < deadline:
                time.sleep(0.01)
            seen["valid_after"] = ctx.is_valid()
            seen["stop_reason"] = str(ctx.stop_reason())
            seen["should_stop"] = ctx.should_stop()
            _write(ctx, f"fenced-{ctx.item}", seen)
            return
        _write(ctx, f"ok-{_fire(ctx)}-{ctx.item}-{os.getpid()}", seen)


class Failing(ShardedJob):
    """Raises an exception that does not pickle (a lock in it), and a plain one."""

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 0:
            raise KeyError(f"missing {ctx.item_parameter}")
        import threading

        exc = RuntimeError("with a lock")
        exc.lock = threading.Lock()  # type: ignore[attr-defined]
        raise exc
