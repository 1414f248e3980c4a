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
  time it takes grows with the machine's load, as real CPU-bound items do).

Each execution appends a ``start`` and an ``end`` JSON line (job, instance, item,
fire time, token, execution id, failover/misfire flags, ``params`` of a run-now,
``covers`` when the context names the fire times it covers) to ``--log`` with one
``write`` each on an ``O_APPEND`` descriptor: a kill -9 cannot lose a line the
kernel already has, so no fsync (which would cost thousands of disk flushes a fire
for the bulk job). ``state`` lines record every connection-state change of the
store, an ``exit`` line the end of the runtime. The record format is the one
tests/jobs/worker.py writes, plus ``job``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry import ConnectionState
from shardkeeper.runtime import Runtime

KINDS = ("sleep", "bulk", "long", "cpu")


@dataclass(frozen=True)
class JobSpec:
    """One job of the chaos workload (also read by the driver and the checker)."""

    name: str
    kind: str
    interval: float
    count: int
    #: seconds (sleep, long) or million iterations (cpu); unused for bulk
    work: float = 0.0
    sharding_wait: float = 5.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"job {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
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
        }


class Recorder:
    """Appends JSON lines to one file, one ``write`` each (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record."""
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:  # one line, one write: lines of two threads never interleave
            os.write(self._fd, line)


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
        outcome = getattr(self, f"_{self.spec.kind}")(ctx)
        self.rec.write({**base, "phase": "end", "end": time.time(), **outcome})

    # -- the workload kinds: each returns the end record's verdict fields --------------

    def _sleep(self, ctx: ShardingContext) -> dict[str, Any]:
        return _poll(ctx, time.time() + self.spec.work, 0.05, stop=False)

    def _long(self, ctx: ShardingContext) -> dict[str, Any]:
        return _poll(ctx, time.time() + self.spec.work, 0.1, stop=True)

    def _bulk(self, ctx: ShardingContext) -> dict[str, Any]:
        before = time.time()
        valid = ctx.is_valid()
        return {
            "valid": valid,
            "valid_through": before if valid else None,
            "invalid_at": None if valid else before,
        }

    def _cpu(self, ctx: ShardingContext) -> dict[str, Any]:
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


def _timestamp(value: Any) -> float:
    """A fire time (datetime or number) as epoch seconds."""
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


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
        )
        rt.add_job(ChaosJob(spec, rec), cfg)

    def on_state(state: ConnectionState) -> None:
        rec.write(
            {"phase": "state", "instance": rt.instance_id, "state": state.value, "t": time.time()}
        )

    rt.store.add_state_listener(on_state)
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
    sys.exit(main())
