"""Busy-survivor failover: kill -9 one of three busy instances; time until each of its
items starts elsewhere.

Unlike ``failover.py`` (one item, two idle survivors), every instance here is busy
all the time: 6 items (2 per instance) on a 1 s interval work 2 s each (twice the
interval) and never look at ``ctx.should_stop()``, so each instance runs its items
back to back (every fire finds them running: a misfire re-run follows each batch).
Two cases: 8 worker threads per instance (free slots next to its 2 items) and 2
(no free slot: the instance is fully busy). Each round kills (SIGKILL, whole
process group) the instance that started an item last, and for every item that
instance was running at the kill (its latest start anywhere was that instance's,
less than ``WORK`` before), times from the kill to the first start of that item by
another instance (a failover claim into a free worker slot, or a normal fire after
the reshard). A replacement is started after each round, and the next round waits
until every live instance runs items again.

Next to the latency, the run counts *stale* failover runs: a failover run of fire F
of an item that starts after a run of a newer fire of that item started (the killed
fire re-running late; ``ctx.is_failover`` and the fire time tell it apart).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from bench.common import (
    BenchContext,
    BenchTimeoutError,
    Worker,
    read_records,
    summary,
    wait_until,
    workers_cleanup,
)

SESSION_TIMEOUT = 2.0
INTERVAL = 1.0
WORK = 2.0
ITEMS = 6
#: worker threads per instance, one case each: free slots next to the 2 items an
#: instance runs, and none (the instance is fully busy until one of its items ends;
#: after a kill the survivors own 3 items each, more than they have threads for)
SLOTS = (8, 2)
#: how long a round waits for one item of the killed instance to start elsewhere
CLAIM_DEADLINE = SESSION_TIMEOUT + 20.0


def stale_failover_runs(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failover runs that started after a run of a newer fire of the same item had
    started (the killed fire re-running after the item moved on)."""
    newest_start: dict[int, list[tuple[float, float]]] = {}
    for r in recs:
        newest_start.setdefault(r["item"], []).append((r["start"], r["fire"]))
    stale = []
    for r in recs:
        if not r["failover"]:
            continue
        if any(
            fire > r["fire"] + 1e-6 and start < r["start"]
            for start, fire in newest_start[r["item"]]
        ):
            stale.append(r)
    return stale


def run(
    ctx: BenchContext,
    backend: str,
    *,
    rounds: int | None = None,
    slots: tuple[int, ...] = SLOTS,
) -> dict[str, Any]:
    """``rounds`` kills (6, quick: 3) on ``backend`` for each worker pool size in
    ``slots``."""
    rounds = rounds if rounds is not None else (3 if ctx.quick else 6)
    return {"cases": [case(ctx, backend, rounds, n) for n in slots]}


def case(ctx: BenchContext, backend: str, rounds: int, threads: int) -> dict[str, Any]:
    """``rounds`` kills with ``threads`` worker threads per instance."""
    url = ctx.url(backend, "busyfo", session_timeout=SESSION_TIMEOUT)
    scratch = ctx.scratch(f"busyfo-{backend}")
    options: dict[str, Any] = {
        "count": ITEMS,
        "interval": INTERVAL,
        "work": WORK,
        "failover": True,
        "no_poll": True,
        "grace": 0.5,
        "worker_threads": threads,
    }
    workers: list[Worker] = []
    latencies: list[float] = []
    via_failover: list[bool] = []
    unclaimed = 0
    settle_timeouts = 0
    seq = 0

    def spawn() -> Worker:
        nonlocal seq
        seq += 1
        w = Worker.start(url, scratch / f"rec-{seq}.jsonl", **options)
        workers.append(w)
        return w

    def all_records() -> list[dict[str, Any]]:
        return read_records([w.records for w in workers])

    def settled(since: float) -> bool:
        live = {w.instance_id for w in workers if w.alive}
        ran = {r["instance"] for r in all_records() if r["start"] > since}
        return live <= ran

    with workers_cleanup(workers):
        for _ in range(3):
            spawn()
        since = max(w.ready_at for w in workers)
        for n in range(rounds):
            try:
                wait_until(
                    f"round {n}: every instance to run items",
                    functools.partial(settled, since),
                    30.0,
                )
            except BenchTimeoutError:
                settle_timeouts += 1
            time.sleep(0.5)
            live = {w.instance_id: w for w in workers if w.alive}
            recs = [r for r in all_records() if r["instance"] in live]
            last = max(recs, key=lambda r: r["start"])
            victim = live[last["instance"]]
            killed_at = victim.kill()
            gone = victim.instance_id
            # the items it was running: the latest start of the item anywhere is its
            # own, less than WORK before the kill (an item never ends early here)
            latest: dict[int, dict[str, Any]] = {}
            for r in recs:
                if r["start"] <= killed_at and (
                    r["item"] not in latest or r["start"] > latest[r["item"]]["start"]
                ):
                    latest[r["item"]] = r
            owned = {
                item
                for item, r in latest.items()
                if r["instance"] == gone and r["start"] > killed_at - WORK
            }
            taken: dict[int, dict[str, Any]] = {}

            def all_taken(
                killed_at: float = killed_at,
                gone: str = gone,
                owned: set[int] = owned,
                taken: dict[int, dict[str, Any]] = taken,
            ) -> bool:
                for r in all_records():
                    if r["item"] in owned and r["instance"] != gone and r["start"] > killed_at:
                        first = taken.get(r["item"])
                        if first is None or r["start"] < first["start"]:
                            taken[r["item"]] = r
                return set(taken) >= owned

            try:
                wait_until(f"round {n}: the items of {gone} elsewhere", all_taken, CLAIM_DEADLINE)
            except BenchTimeoutError:
                unclaimed += len(owned - set(taken))
            for rec in taken.values():
                latencies.append(rec["start"] - killed_at)
                via_failover.append(bool(rec["failover"]))
            worst = max((r["start"] - killed_at for r in taken.values()), default=float("nan"))
            ctx.log(
                f"  busy failover {backend} ({threads} worker threads) round "
                f"{n + 1}/{rounds}: {len(taken)}/{len(owned)} "
                f"items elsewhere, last after {worst:.2f}s"
            )
            since = spawn().ready_at
        recs = all_records()
    stale = stale_failover_runs(recs)
    return {
        "worker_threads": threads,
        "session_timeout": SESSION_TIMEOUT,
        "interval": INTERVAL,
        "work": WORK,
        "items": ITEMS,
        "kills": rounds,
        "samples": latencies,
        "via_failover": via_failover,
        "latency": summary(latencies),
        "unclaimed": unclaimed,
        "settle_timeouts": settle_timeouts,
        "failover_runs": sum(1 for r in recs if r["failover"]),
        "stale_failover_runs": len(stale),
        "executions": len(recs),
    }
