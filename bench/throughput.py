"""Throughput: shard executions per second of a no-op job across 3 instances.

Three bench workers (separate processes) run a no-op job of 12 items (4 per
instance) fired every ``INTERVAL`` (5 ms: below the shortest interval a
configuration accepts, so the workers fire the job themselves: ``--drive``). A fire
that finds the previous batch still running is a misfire: the items are marked
and re-run once right after the batch, so the instances run back to back and the
rate is what they sustain (misfire=False would skip instead). The workers write
their counters every 0.2 s; the rate is the growth of ``executed`` over a
measuring window after a warm-up. Measured with monitor_execution on (two commits
per trigger per instance: marks and clears) and off (one check-only commit).

Baseline, measured by the same harness against the same server: the raw rate of
the store's own write commits (one ``Put`` per commit), from one client and from
three clients (threads, one store each) at once.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Worker, wait_until, workers_cleanup
from shardkeeper.registry import CoordinationStore, open_store
from shardkeeper.registry.base import Put

ITEMS = 12
INTERVAL = 0.005


def _stats(path: Path) -> dict[str, float] | None:
    try:
        loaded: dict[str, float] = json.loads(path.read_text())
        return loaded
    except (OSError, ValueError):
        return None


def executions(ctx: BenchContext, backend: str, *, monitor: bool, window: float) -> dict[str, Any]:
    """Executions/s of 3 instances over ``window`` seconds."""
    url = ctx.url(backend, "tput")
    scratch = ctx.scratch(f"tput-{backend}")
    workers: list[Worker] = []
    files = [scratch / f"stats-{n}.json" for n in range(3)]
    with workers_cleanup(workers):
        for n in range(3):
            workers.append(
                Worker.start(
                    url,
                    scratch / f"rec-{n}.jsonl",
                    count=ITEMS,
                    drive=INTERVAL,
                    no_monitor=not monitor,
                    stats=files[n],
                    record=False,
                )
            )
        # warm-up: every instance has run items (the three-way reshard is done)
        wait_until(
            "every instance to run items",
            lambda: all((s := _stats(f)) and s.get("executed", 0) > 20 for f in files),
            30.0,
        )
        time.sleep(1.0)
        before = [_stats(f) or {} for f in files]
        time.sleep(window)
        after = [_stats(f) or {} for f in files]

    def delta(key: str) -> float:
        return sum(a.get(key, 0) - b.get(key, 0) for a, b in zip(after, before, strict=True))

    span = sum(a["time"] - b["time"] for a, b in zip(after, before, strict=True)) / 3
    return {
        "monitor": monitor,
        "window": span,
        "executions_per_s": delta("executed") / span,
        "triggers_per_s": delta("triggers") / span,
        "skipped_per_s": delta("skipped") / span,
        "misfires_per_s": delta("misfires") / span,
        "round_trips_per_s": delta("round_trips") / span,
        "executions_per_trigger": delta("executed") / max(1.0, delta("triggers")),
    }


def commit_rate(url: str, clients: int, window: float) -> float:
    """Commits per second of ``clients`` stores each committing one Put in a loop."""
    stores: list[CoordinationStore] = [open_store(url) for _ in range(clients)]
    counts = [0] * clients
    stop = threading.Event()

    def loop(k: int) -> None:
        store = stores[k]
        while not stop.is_set():
            store.commit([Put(f"/raw/c{k}", str(counts[k]).encode())])
            counts[k] += 1

    try:
        for s in stores:
            s.start()
        for s in stores:  # the first commit creates the parent node: not measured
            s.commit([Put("/raw/warm", b"")])
        threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(clients)]
        began = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(window)
        stop.set()
        for t in threads:
            t.join(10.0)
        return sum(counts) / (time.monotonic() - began)
    finally:
        for s in stores:
            s.close()


def run(ctx: BenchContext, backend: str) -> dict[str, Any]:
    """Executions/s with monitor on and off, next to the raw commit rate."""
    window = 3.0 if ctx.quick else 10.0
    url = ctx.url(backend, "raw")
    raw1 = commit_rate(url, 1, window / 2)
    raw3 = commit_rate(url, 3, window / 2)
    cases = [executions(ctx, backend, monitor=m, window=window) for m in (True, False)]
    for c in cases:
        c["ratio_to_raw_commits"] = c["executions_per_s"] / raw1
        ctx.log(
            f"  throughput {backend} monitor={c['monitor']}: "
            f"{c['executions_per_s']:.0f} executions/s ({c['triggers_per_s']:.1f} triggers/s) "
            f"vs {raw1:.0f} raw commits/s"
        )
    return {
        "items": ITEMS,
        "instances": 3,
        "interval": INTERVAL,
        "raw_commits_per_s_1_client": raw1,
        "raw_commits_per_s_3_clients": raw3,
        "cases": cases,
    }
