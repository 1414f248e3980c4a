"""A chaos instance: one OS process, one Runtime, several recording jobs at once.

The jobs come from ``--jobs`` (a JSON list of :class:`JobSpec` fields), each of one
of the workload kinds of :data:`KINDS`:

* ``sleep``: waits ``work`` seconds, checking ``ctx.is_valid()`` every 50 ms (the
  original chaos job);
* ``bulk``: a no-op item (thousands of them a fire: the start spans several commits);
* ``long``: ``work`` seconds, longer than the interval, polling ``ctx.should_stop()``
  and ``ctx.is_valid()`` every 0.1 s; it returns early when asked to stop and records
  that it did (``stopped`` and the reason if the context gives one): the checker
  counts such an execution as not done;
* ``cpu``: ``work`` million iterations of pure-Python arithmetic (holds the GIL; the
  time it takes grows with the machine's load, as real CPU-bound items do);
* ``stateful``: ``work`` seconds in steps of :data:`STEP` seconds, each followed by
  ``ctx.checkpoint({"step": n})``; a resumed run starts after ``ctx.resume_state``'s
  step. Like the example of docs/concepts.md it stops when a checkpoint is refused
  (taken over) and not on a mere ``ctx.is_valid()`` false, so a zombie that wakes up
  writes, and the store must refuse it; it returns early on a graceful stop
  as its grace runs out (``StopReason.SHUTDOWN``: its successor resumes). With ``crash`` (the
  process executor only) a run that is not a failover run may end its worker
  process with ``os._exit`` after an accepted checkpoint: the item is handed to
  failover, the instance must go on.

Each execution appends a ``start`` and an ``end`` JSON line (job, instance, item,
fire time, token, execution id, failover/misfire flags, ``params`` of a run-now,
``covers`` when the context names the fire times it covers) to ``--log`` with one
``write`` each on an ``O_APPEND`` descriptor: a kill -9 cannot lose a line the
kernel already has, so no fsync (which would cost thousands of disk flushes a fire
for the bulk job). ``state`` lines record every connection-state change of the
store, an ``exit`` line the end of the runtime. The record format is the one
tests/jobs/worker.py writes, plus ``job``.

A ``stateful`` execution also appends, keyed like its ``end`` record (instance,
execution id, start): a ``resume`` line (``resume_step``: the step of
``ctx.resume_state``, None for none; ``resumed``; ``t``), then one ``ckpt`` line per
call (``step``, ``accepted``: what ``ctx.checkpoint`` returned, ``t`` when the call
began and ``t_end`` when it returned); its ``end`` line adds ``steps`` (the last
accepted step), ``refused`` (it stopped on a refused checkpoint) and ``crashed`` (it
ended its worker process itself; ``valid`` false: not done). A checkpoint call whose
commit met a store error still returns True (the state is held and sent again): the
instance appends a ``ckpt_error`` line (instance, job, item, ``t``) from the
runtime's log record of it, made inside that call, so that the checker does not
count such a call as a write the store accepted. A call whose commit met a store
error and that then returns False (the execution was fenced before the store
answered) may have been written all the same (ZooKeeper applies a request held in the
session's pipeline before the session's close): a ``ckpt_unknown`` line (same fields)
marks each such store error inside a call, and the checker counts the call's step as
a state a successor may resume from (not as accepted).

``skip`` lines: the product's skip records (``JobListener.on_skipped``), one line per
(fire, item): job, instance, item, fire, ``reason`` (the :class:`SkipReason` name in
lower case: ``disabled``, ``removed``, ``suspended``, ...) and ``t`` (when it was
recorded). A skip that names no items stands, for a whole job disabled, for every
item of the job's count at that time (every instance skips them all); for any other
reason (suspended, not registered, ...) it is one line with item -1 (the trigger as
a whole: which items this instance owned it cannot tell). The checker accepts an
operator's pair only with such a line (``disabled`` or ``removed``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.counters import SkipReason
from shardkeeper.job import JobListener, ShardedJob, ShardingContext, StopReason
from shardkeeper.observe import SkipRecord
from shardkeeper.registry import ConnectionState
from shardkeeper.runtime import Runtime

KINDS = ("sleep", "bulk", "long", "cpu", "stateful")
EXECUTORS = ("thread", "process")
#: seconds of work between two checkpoints of a ``stateful`` item
STEP = 0.25
#: the exit status of a worker process that a ``stateful`` item ends itself
CRASH_STATUS = 3
#: the runtime's log message (runtime/fire/checkpoints.py) for a checkpoint whose commit met
#: a store error; its arguments are (job, item, error)
NOT_WRITTEN = "checkpoint of item %d not written"
#: its message for a commit of a ``ctx.checkpoint`` call that met a store error and is
#: sent again (the outcome of that commit is unknown); arguments (job, item, error)
SENT_AGAIN = "checkpoint commit of item %d met a store error"


@dataclass(frozen=True)
class JobSpec:
    """One job of the chaos workload (also read by the driver and the checker)."""

    name: str
    kind: str
    interval: float
    count: int
    #: seconds (sleep, long, stateful) or million iterations (cpu); unused for bulk
    work: float = 0.0
    sharding_wait: float = 5.0
    #: where the items run (the job's ``executor``)
    executor: str = "thread"
    #: stateful: the chance that a first run ends its worker process (process only)
    crash: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"job {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"job {self.name!r}: executor {self.executor!r} not in {EXECUTORS}")
        if not 0.0 <= self.crash <= 1.0 or (self.crash and self.executor != "process"):
            # os._exit in a thread would end the instance itself, not a worker process
            raise ValueError(
                f"job {self.name!r}: crash {self.crash} must be in [0, 1], and only with "
                "executor='process'"
            )
        if self.count < 1 or self.interval <= 0 or self.work < 0:
            raise ValueError(
                f"job {self.name!r}: count {self.count}, interval {self.interval} and work "
                f"{self.work} must be positive (work may be 0)"
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form given to ``--jobs``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "interval": self.interval,
            "count": self.count,
            "work": self.work,
            "sharding_wait": self.sharding_wait,
            "executor": self.executor,
            "crash": self.crash,
        }


class Recorder:
    """Appends JSON lines to one file, one ``write`` each (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self._open(path)

    def _open(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # the process executor pickles the job: a worker process opens the file anew
        # (O_APPEND: its lines and the instance's never overwrite each other)
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open(str(state["path"]))

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        self.write_many([record])

    def write_many(self, records: list[dict[str, Any]]) -> None:
        """Append records in one ``write`` (a skip of thousands of items: one call)."""
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
        with self._lock:  # one write: lines of two threads never interleave
            os.write(self._fd, data)


class ChaosJob(ShardedJob):
    """Executes one :class:`JobSpec`'s items and records each execution."""

    def __init__(self, spec: JobSpec, recorder: Recorder) -> None:
        self.spec = spec
        self.rec = recorder

    def execute(self, ctx: ShardingContext) -> None:
        start = time.time()
        base: dict[str, Any] = {
            "job": ctx.job_name,
            "instance": ctx.instance_id,
            "item": ctx.item,
            "fire": ctx.fire_time.timestamp(),
            "token": ctx.fencing_token,
            "execution_id": ctx.execution_id,
            "failover": ctx.is_failover,
            "misfire": ctx.is_misfire,
            "start": start,
        }
        if ctx.params:
            base["params"] = dict(ctx.params)
        covers = getattr(ctx, "covers", None)  # issue 25 section 4, where it exists
        if covers:
            base["covers"] = [_timestamp(x) for x in covers]
        self.rec.write({**base, "phase": "start"})
        try:
            outcome = getattr(self, f"_{self.spec.kind}")(ctx, base)
        except Exception as exc:
            # The run ends here too (the runtime records it failed): without an end
            # line the checker saw it run until its process died, overlapping every
            # later run of the item (a resume_state read that met store timeouts and
            # raised CheckpointUnavailableError, etcd stateful seed 20261222). It
            # never acted: valid through nothing, and as valid as it is told now.
            before = time.time()
            valid = ctx.is_valid()
            self.rec.write(
                {
                    **base,
                    "phase": "end",
                    "end": time.time(),
                    "valid": valid,
                    "valid_through": before if valid else None,
                    "invalid_at": None if valid else before,
                    "error": repr(exc)[:200],
                }
            )
            raise
        self.rec.write({**base, "phase": "end", "end": time.time(), **outcome})

    # -- the workload kinds: each returns the end record's verdict fields --------------

    def _sleep(self, ctx: ShardingContext, base: dict[str, Any]) -> dict[str, Any]:
        return _poll(ctx, time.time() + self.spec.work, 0.05, stop=False)

    def _long(self, ctx: ShardingContext, base: dict[str, Any]) -> dict[str, Any]:
        return _poll(ctx, time.time() + self.spec.work, 0.1, stop=True)

    def _bulk(self, ctx: ShardingContext, base: dict[str, Any]) -> dict[str, Any]:
        before = time.time()
        valid = ctx.is_valid()
        return {
            "valid": valid,
            "valid_through": before if valid else None,
            "invalid_at": None if valid else before,
        }

    def _cpu(self, ctx: ShardingContext, base: dict[str, Any]) -> dict[str, Any]:
        valid_through: float | None = None
        invalid_at: float | None = None
        acc = 0
        for _chunk in range(max(1, round(self.spec.work * 10))):
            before = time.time()
            if ctx.is_valid():
                valid_through = before
            elif invalid_at is None:
                invalid_at = before
            for n in range(100_000):  # pure Python: holds the GIL throughout
                acc = (acc * 31 + n) % 1_000_003
        before = time.time()
        if ctx.is_valid():
            valid_through = before
        elif invalid_at is None:
            invalid_at = before
        return {
            "valid": invalid_at is None,
            "valid_through": valid_through,
            "invalid_at": invalid_at,
            "acc": acc,
        }

    def _stateful(self, ctx: ShardingContext, base: dict[str, Any]) -> dict[str, Any]:
        steps = max(1, round(self.spec.work / STEP))
        resume = ctx.resume_state  # the store read comes first, as a real job's would
        first = int(resume["step"]) if isinstance(resume, dict) and "step" in resume else 0
        self.rec.write(
            {
                **base,
                "phase": "resume",
                "resume_step": None if resume is None else first,
                "resumed": ctx.resumed,
                "t": time.time(),
            }
        )
        crash_at = self._crash_step(ctx, first, steps)
        valid_through: float | None = None
        invalid_at: float | None = None
        done, refused, stopped = first, False, False
        acc = 0
        for n in range(first + 1, steps + 1):
            before = time.time()
            if ctx.is_valid():
                valid_through = before
            elif invalid_at is None:
                invalid_at = before
            if ctx.stop_reason() is StopReason.SHUTDOWN:
                stopped = True  # a graceful stop: hand the item over, the successor resumes
                break
            # the step's work: a little arithmetic, then the rest of the step waiting
            # (as on I/O); a fenced run goes on until its checkpoint is refused
            for k in range(10_000):
                acc = (acc * 31 + k) % 1_000_003
            time.sleep(max(0.0, STEP - (time.time() - before)))
            t = time.time()
            accepted = ctx.checkpoint({"step": n})
            self.rec.write(
                {
                    **base,
                    "phase": "ckpt",
                    "step": n,
                    "accepted": accepted,
                    "t": t,
                    "t_end": time.time(),
                }
            )
            if not accepted:
                refused = True  # taken over: the successor's state is kept, stop writing
                break
            done = n
            if n == crash_at:
                self.rec.write(
                    {
                        **base,
                        "phase": "end",
                        "end": time.time(),
                        "valid": False,
                        "valid_through": valid_through,
                        "invalid_at": invalid_at,
                        "steps": done,
                        "crashed": True,
                    }
                )
                os._exit(CRASH_STATUS)  # the worker process dies under the item
        before = time.time()
        if ctx.is_valid():
            valid_through = before
        elif invalid_at is None:
            invalid_at = before
        out: dict[str, Any] = {
            "valid": invalid_at is None,
            "valid_through": valid_through,
            "invalid_at": invalid_at,
            "steps": done,
            "refused": refused,
            "acc": acc,
        }
        if stopped:
            out.update(stopped=True, stop_reason=StopReason.SHUTDOWN.value)
        return out

    def _crash_step(self, ctx: ShardingContext, first: int, steps: int) -> int | None:
        """The step after whose checkpoint this run ends its worker process, or None.
        A failover run never crashes (one that crashed too would be done for that
        fire: docs/failover.md); the others with the spec's chance (misfire re-runs
        included: with items longer than the interval most runs are), chosen from the
        execution's ids and token."""
        if not self.spec.crash or ctx.is_failover or first + 1 >= steps:
            return None
        rng = random.Random(f"{ctx.execution_id}:{ctx.fencing_token}")
        if rng.random() >= self.spec.crash:
            return None
        return rng.randint(first + 1, steps - 1)


def _poll(ctx: ShardingContext, deadline: float, step: float, *, stop: bool) -> dict[str, Any]:
    """Work until ``deadline``, checking validity (and, with ``stop``, should_stop)
    every ``step`` seconds; the end record's verdict fields."""
    valid_through: float | None = None
    invalid_at: float | None = None
    stopped = False
    while True:
        before = time.time()
        if ctx.is_valid():
            valid_through = before
        elif invalid_at is None:
            invalid_at = before
        if before >= deadline:
            break
        if stop and ctx.should_stop():
            stopped = True
            break
        time.sleep(min(step, max(0.0, deadline - time.time())))
    out: dict[str, Any] = {
        "valid": invalid_at is None,
        "valid_through": valid_through,
        "invalid_at": invalid_at,
    }
    if stopped:
        out["stopped"] = True
        reason = getattr(ctx, "stop_reason", None)  # where the runtime says why
        if callable(reason):
            value = reason()
            out["stop_reason"] = None if value is None else str(getattr(value, "value", value))
    return out


class CheckpointErrors(logging.Handler):
    """Appends a ``ckpt_error`` line for each checkpoint held after a store error, and
    a ``ckpt_unknown`` line for each commit of a call that met one (the runtime logs
    them in the thread that makes the call, or, for the process executor, in the
    instance's thread that answers the worker process's call: inside the call either
    way)."""

    def __init__(self, recorder: Recorder, instance: str) -> None:
        super().__init__(logging.INFO)  # "sent again" is logged at INFO
        self.rec = recorder
        self.instance = instance

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        msg = str(record.msg)
        if len(args) < 2:
            return
        if NOT_WRITTEN in msg:
            phase = "ckpt_error"
        elif SENT_AGAIN in msg:
            phase = "ckpt_unknown"
        else:
            return
        self.rec.write(
            {
                "phase": phase,
                "instance": self.instance,
                "job": str(args[0]),
                "item": int(str(args[1])),
                "t": record.created,
            }
        )


class SkipLines(JobListener):
    """Appends a ``skip`` line per (fire, item) of each skip record of one job (see the
    module docstring)."""

    def __init__(self, recorder: Recorder, count: Callable[[], int]) -> None:
        self.rec = recorder
        #: the job's sharding_total_count now (for a skip that names no items)
        self.count = count

    def on_skipped(self, event: SkipRecord) -> None:
        """Write the lines at once (the job's coordination lane: one write each)."""
        t = time.time()
        reason = skip_reason_name(event.reason)
        items: tuple[int, ...] = event.items
        if not items:
            # a whole job disabled: every instance skips every item of the job; any
            # other skip of the whole trigger here (suspended, not registered, ...)
            # names no item this instance could tell: one line, item -1
            items = tuple(range(self.count())) if reason == "disabled" else (-1,)
        fire = _timestamp(event.fire_time)
        base = {"phase": "skip", "job": event.job, "instance": event.instance}
        self.rec.write_many(
            [{**base, "item": i, "fire": fire, "reason": reason, "t": t} for i in items]
        )


def skip_reason_name(value: str) -> str:
    """A skip record's reason (the :class:`SkipReason` value) as its lower-case name
    (``disabled``, ``removed``, ...); an unknown text as it is, lower case."""
    for reason in SkipReason:
        if reason.value == value:
            return reason.name.lower()
    return value.lower()


def _timestamp(value: Any) -> float:
    """A fire time (datetime or number) as epoch seconds."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


def _counter(rt: Runtime, spec: JobSpec) -> Callable[[], int]:
    """The job's current sharding_total_count (an operator may change it), read from
    its runner's config; the spec's count before the runner exists."""

    def count() -> int:
        runner = rt.runners.get(spec.name)
        return spec.count if runner is None else int(runner.state.config.sharding_total_count)

    return count


def main(argv: list[str] | None = None) -> int:
    """Run the jobs of ``--jobs`` until SIGTERM or a remote shutdown."""
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--jobs", required=True, help="JSON list of JobSpec fields")
    p.add_argument("--grace", type=float, default=10.0)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    specs = [JobSpec(**raw) for raw in json.loads(args.jobs)]
    rec = Recorder(args.log)
    rt = Runtime(args.url, shutdown_grace=args.grace)
    for spec in specs:
        cfg = JobConfig.parse(
            name=spec.name,
            interval=spec.interval,
            sharding_wait_timeout=spec.sharding_wait,
            sharding_total_count=spec.count,
            failover=True,
            misfire=True,
            executor=spec.executor,
            # every call written at once: a True answer is a write the store accepted
            # (or one whose commit met a store error: the ckpt_error line says so)
            checkpoint_interval=0.0,
        )
        rt.add_job(ChaosJob(spec, rec), cfg, listeners=[SkipLines(rec, _counter(rt, spec))])
    logging.getLogger("shardkeeper.runtime.fire.checkpoints").addHandler(
        CheckpointErrors(rec, rt.instance_id)
    )

    def on_state(state: ConnectionState) -> None:
        rec.write(
            {"phase": "state", "instance": rt.instance_id, "state": state.value, "t": time.time()}
        )

    rt.store.add_state_listener(on_state)
    hold = getattr(rt.store, "hold_requests", None)
    if hold is not None:  # etcd's gray link (tests/chaos/test_chaos.py SIGNAL_GRAY)
        signal.signal(signal.SIGUSR1, lambda *_: hold(True))
        signal.signal(signal.SIGUSR2, lambda *_: hold(False))
    try:
        rt.start()
    except Exception as exc:  # report the refusal on one line for the driver to read
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 3
    print(f"READY {rt.instance_id}", flush=True)
    rt.run_forever(install_signal_handlers=True)
    rec.write({"phase": "exit", "instance": rt.instance_id, "t": time.time()})
    print("STOPPED", flush=True)
    return 0


if __name__ == "__main__":
    # run as a script: run the module's own main, so that the job class is
    # tests.chaos.worker.ChaosJob, which the process executor's workers import by name
    # (the launcher puts the repository root on PYTHONPATH)
    from tests.chaos.worker import main as _main

    sys.exit(_main())
