"""Failover latency: kill -9 the instance running an item; time until it starts elsewhere.

Three bench workers run a job of ONE item with failover on; the item works longer
than a trigger interval, so at any moment one instance runs it and two are idle
(idle instances are the ones that claim orphaned items). Each round waits until a
live instance starts the item normally, kills that process with SIGKILL (its whole
process group) and waits for the first start of the item by another instance. The
dead instance's session must expire first (its ephemeral nodes, the leader node
among them, are deleted then), so the configured session timeout is the floor.
A replacement worker is started after each round so there are always three.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import (
    BenchContext,
    Worker,
    read_records,
    summary,
    wait_until,
    workers_cleanup,
)

SESSION_TIMEOUT = 2.0
WORK = 2.5
INTERVAL = 1.0


def run(ctx: BenchContext, backend: str) -> dict[str, Any]:
    """Measure ``rounds`` kills (10, quick: 3) on ``backend``."""
    rounds = 3 if ctx.quick else 10
    url = ctx.url(backend, "failover", session_timeout=SESSION_TIMEOUT)
    scratch = ctx.scratch(f"failover-{backend}")
    options: dict[str, Any] = {
        "count": 1,
        "interval": INTERVAL,
        "work": WORK,
        "failover": True,
        "grace": 0.5,
    }
    samples: list[float] = []
    via_failover: list[bool] = []
    workers: list[Worker] = []
    seq = 0

    def spawn() -> Worker:
        nonlocal seq
        seq += 1
        w = Worker.start(url, scratch / f"rec-{seq}.jsonl", **options)
        workers.append(w)
        return w

    with workers_cleanup(workers):
        for _ in range(3):
            spawn()
        after = time.time()
        for n in range(rounds):
            live = {w.instance_id: w for w in workers if w.alive}

            def running_normally(since: float = after, live: dict[str, Worker] = live) -> Any:
                recs = read_records([w.records for w in workers])
                fresh = [
                    r
                    for r in recs
                    if r["start"] > since and not r["failover"] and r["instance"] in live
                ]
                return fresh[-1] if fresh else None

            # the reshard after the previous round's kill and replacement comes first
            rec = wait_until(f"round {n}: a normal run of the item", running_normally, 30.0)
            victim = live[rec["instance"]]
            time.sleep(0.2)  # kill in the middle of the execution, not at its first line
            killed_at = victim.kill()

            def started_elsewhere(killed_at: float = killed_at, gone: str = rec["instance"]) -> Any:
                recs = read_records([w.records for w in workers])
                later = [r for r in recs if r["start"] > killed_at and r["instance"] != gone]
                return min(later, key=lambda r: r["start"]) if later else None

            took = wait_until(
                f"round {n}: the item to start elsewhere", started_elsewhere, SESSION_TIMEOUT + 20
            )
            samples.append(took["start"] - killed_at)
            via_failover.append(bool(took["failover"]))
            ctx.log(f"  failover {backend} round {n + 1}/{rounds}: {samples[-1]:.3f}s")
            spawn()
            after = took["start"] + WORK
    for w in workers:
        w.kill()
    return {
        "session_timeout": SESSION_TIMEOUT,
        "target": SESSION_TIMEOUT + 0.5,
        "samples": samples,
        "via_failover": via_failover,
        "latency": summary(samples),
        "over_floor": summary([s - SESSION_TIMEOUT for s in samples]),
    }
