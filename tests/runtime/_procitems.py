"""Jobs run in worker processes by the process executor's signal and isolation tests
(tests/runtime/test_process_executor_signals.py, test_process_executor_isolation.py).

Importable by a worker process (a module of their own). They report what they saw in
the child through JSON files in the directory named by ``job_parameter``, and wait for
the test's files with bounded polls (the test's signals; never a sleep as a guess).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from shardkeeper.job import ShardedJob, ShardingContext

#: the longest anything here waits for a file of the test
WAIT = 60.0


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has: a test's own
    spawned child stays one until the pool reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def write(ctx: ShardingContext, name: str, data: dict[str, Any]) -> None:
    """``data`` as the file ``name`` of the job's directory, whole or not at all."""
    path = Path(ctx.job_parameter) / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def await_file(ctx: ShardingContext, name: str, timeout: float = WAIT) -> bool:
    """Whether the file ``name`` of the job's directory appeared within ``timeout``."""
    path = Path(ctx.job_parameter) / name
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not path.exists():
        if time.monotonic() >= deadline:
            return False
        pause.wait(0.01)
    return True


class Sleeps(ShardedJob):
    """Writes ``started-<item>`` (its pid, and the pid of a ``sleep`` it starts when the
    item parameter says ``helper``), then waits for the file ``release`` (at most
    :data:`WAIT` s) without ever asking its context anything, and writes
    ``finished-<item>``."""

    def execute(self, ctx: ShardingContext) -> None:
        helper = None
        if ctx.item_parameter == "helper":
            helper = subprocess.Popen(["sleep", "120"])
        write(
            ctx,
            f"started-{ctx.item}",
            {"pid": os.getpid(), "helper": helper.pid if helper is not None else None},
        )
        await_file(ctx, "release")
        write(ctx, f"finished-{ctx.item}", {"pid": os.getpid()})


class TerminatesItsHelper(ShardedJob):
    """Starts ``sleep 120``, records which signals it ignores (``SigIgn`` of
    /proc/PID/status), ``terminate()``s it and raises unless it ended by SIGTERM
    within 10 s."""

    def execute(self, ctx: ShardingContext) -> None:
        helper = subprocess.Popen(["sleep", "120"])
        try:
            ignored = "?"
            for line in Path(f"/proc/{helper.pid}/status").read_text().splitlines():
                if line.startswith("SigIgn:"):
                    ignored = line.split()[1]
            write(ctx, "helper", {"pid": helper.pid, "sigign": ignored})
            helper.terminate()
            code = helper.wait(timeout=10)
        finally:
            if helper.poll() is None:
                helper.kill()
                helper.wait()
        if code != -15:
            raise RuntimeError(f"the helper ended with {code}, not by SIGTERM")


class HangsWithAHelper(ShardedJob):
    """Starts ``sleep 120``, writes ``hanging`` (its pid and the helper's) and waits
    for a file that never comes: ended by the execution timeout."""

    def execute(self, ctx: ShardingContext) -> None:
        helper = subprocess.Popen(["sleep", "120"])
        write(ctx, "hanging", {"pid": os.getpid(), "helper": helper.pid})
        await_file(ctx, "never", 120)


class LeavesAThread(ShardedJob):
    """Returns at once, leaving a thread behind that waits for the file ``go``, then
    calls ``ctx.checkpoint``, ``ctx.is_valid()`` and ``ctx.progress`` on this item's
    context and writes what they answered (``leftover``)."""

    def execute(self, ctx: ShardingContext) -> None:
        def late() -> None:
            if not await_file(ctx, "go"):
                return
            answers: dict[str, Any] = {}
            try:
                answers["checkpoint"] = ctx.checkpoint({"written_by": "the leftover thread"})
            except Exception as exc:
                answers["checkpoint"] = f"{type(exc).__name__}: {exc}"
            answers["valid"] = ctx.is_valid()
            answers["stop_reason"] = str(ctx.stop_reason())
            ctx.progress(99, 100, "late")
            write(ctx, "leftover", answers)

        threading.Thread(target=late, name="leftover", daemon=True).start()


class WaitsForTheLeftover(ShardedJob):
    """Writes ``running`` and waits for the file ``leftover`` (another item's late
    thread's answers), then checkpoints once itself and returns."""

    def execute(self, ctx: ShardingContext) -> None:
        write(ctx, "running", {"pid": os.getpid()})
        if not await_file(ctx, "leftover"):
            raise RuntimeError("the leftover thread never answered")
        ctx.checkpoint({"written_by": "the item itself"})


def _rebuild(pid: int) -> ProcessLocal:
    if pid != os.getpid():
        raise ValueError("this handle belongs to another process")
    return ProcessLocal(pid)


class ProcessLocal(Exception):
    """An exception that round-trips in its own process only (a handle, a cursor id)."""

    def __init__(self, pid: int) -> None:
        super().__init__(f"a handle of process {pid}")
        self.pid = pid

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.pid,))


class RaisesProcessLocal(ShardedJob):
    """Raises :class:`ProcessLocal` for item 0; item 1 ends ok."""

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 0:
            raise ProcessLocal(os.getpid())


class ReadsItsState(ShardedJob):
    """Reads ``ctx.resume_state`` and writes what happened (``state``)."""

    def execute(self, ctx: ShardingContext) -> None:
        try:
            seen: object = repr(ctx.resume_state)
        except Exception as exc:
            write(ctx, "state", {"error": f"{type(exc).__name__}: {exc}"})
            raise
        write(ctx, "state", {"seen": seen})


class Pid(ShardedJob):
    """Writes ``pid-<item>-<pid>``."""

    def execute(self, ctx: ShardingContext) -> None:
        write(ctx, f"pid-{ctx.item}-{os.getpid()}", {"pid": os.getpid()})
