"""Overload: a job triggered several times faster than the cluster can coordinate.

Two phases per backend, each on its own namespace of the same server:

1. **Calibration**: three bench workers run a no-op job of 12 items (4 per
   instance) with monitor_execution and misfire on, fired every 2 ms (far more
   than they can serve; the workers fire the job themselves, ``--drive``, as the
   configuration accepts no interval under 0.1 s). The fires an instance
   completes per second there (its executions per second over its 4 items) is
   the *sustainable trigger rate*.
2. **Overload**: three fresh workers run the same job on the interval that fires
   ``FACTOR`` (3) times that rate, for ``duration`` seconds (60, quick: 15). Every
   0.2 s each worker logs the fires queued on its coordinator
   (``JobRunner.pending_fires()``), the largest age of a fire when one of its
   items started (start minus fire time), and its counters (``reshards`` among
   them).

Bounded means: the queue stays at a few fires, the age does not grow from the
first third of the run to the last, and no reshard happens after the initial ones
(every reshard here would be a storm: membership and config do not change).
Baseline: the raw commit rate (one ``Put`` per commit, one client) of the same
server, measured in the same run just before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Worker, summary, wait_until, workers_cleanup
from bench.throughput import commit_rate

ITEMS = 12
INSTANCES = 3
CALIBRATION_INTERVAL = 0.002
FACTOR = 3.0


def _last(path: Path) -> dict[str, float] | None:
    try:
        loaded: dict[str, float] = json.loads(path.read_text())
        return loaded
    except (OSError, ValueError):
        return None


def _samples(path: Path) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line
    return out


def _start(ctx: BenchContext, url: str, scratch: Path, interval: float, n: int) -> Worker:
    return Worker.start(
        url,
        scratch / f"rec-{n}.jsonl",
        count=ITEMS,
        drive=interval,
        stats=scratch / f"stats-{n}.json",
        stats_log=scratch / f"stats-{n}.jsonl",
        record=False,
    )


def _warm(files: list[Path]) -> None:
    # every instance has run items: the initial reshards are done
    wait_until(
        "every instance to run items",
        lambda: all((s := _last(f)) and s.get("executed", 0) > 2 * ITEMS for f in files),
        60.0,
    )


def calibrate(ctx: BenchContext, backend: str, window: float) -> float:
    """Fires per second one instance completes under saturation (see module doc)."""
    url = ctx.url(backend, "calib")
    scratch = ctx.scratch(f"calib-{backend}")
    workers: list[Worker] = []
    files = [scratch / f"stats-{n}.json" for n in range(INSTANCES)]
    with workers_cleanup(workers):
        for n in range(INSTANCES):
            workers.append(_start(ctx, url, scratch, CALIBRATION_INTERVAL, n))
        _warm(files)
        time.sleep(1.0)
        before = [_last(f) or {} for f in files]
        time.sleep(window)
        after = [_last(f) or {} for f in files]
    executed = sum(
        a.get("executed", 0) - b.get("executed", 0) for a, b in zip(after, before, strict=True)
    )
    span = sum(a["time"] - b["time"] for a, b in zip(after, before, strict=True)) / INSTANCES
    # 4 items per instance: one completed fire is 4 executions
    return executed / span / INSTANCES / (ITEMS / INSTANCES)


def overload(ctx: BenchContext, backend: str, interval: float, duration: float) -> dict[str, Any]:
    """Run at ``interval`` for ``duration`` s; the figures of the module doc."""
    url = ctx.url(backend, "overload")
    scratch = ctx.scratch(f"overload-{backend}")
    workers: list[Worker] = []
    files = [scratch / f"stats-{n}.json" for n in range(INSTANCES)]
    logs = [scratch / f"stats-{n}.jsonl" for n in range(INSTANCES)]
    with workers_cleanup(workers):
        for n in range(INSTANCES):
            workers.append(_start(ctx, url, scratch, interval, n))
        _warm(files)
        time.sleep(1.0)  # the initial reshards settle; every later one is counted
        began = time.time()
        before = [_last(f) or {} for f in files]
        time.sleep(duration)
        after = [_last(f) or {} for f in files]
        ended = time.time()
    series = [[s for s in _samples(p) if began <= s["time"] <= ended] for p in logs]
    flat = [s for ser in series for s in ser]
    third = duration / 3

    def window(lo: float, hi: float, key: str) -> list[float]:
        return [s[key] for s in flat if began + lo <= s["time"] < began + hi]

    def delta(key: str) -> float:
        return sum(a.get(key, 0) - b.get(key, 0) for a, b in zip(after, before, strict=True))

    span = sum(a["time"] - b["time"] for a, b in zip(after, before, strict=True)) / INSTANCES
    ages = [s["age_max"] for s in flat if s["age_max"] > 0]
    return {
        "interval": interval,
        "duration": span,
        "samples": len(flat),
        "pending_fires": summary([s["pending_fires"] for s in flat]),
        "fire_age": summary(ages),
        "fire_age_normal": summary([s["age_max_normal"] for s in flat if s["age_max_normal"] > 0]),
        "fire_age_first_third": summary([a for a in window(0, third, "age_max") if a > 0]),
        "fire_age_last_third": summary(
            [a for a in window(2 * third, duration + 1, "age_max") if a > 0]
        ),
        "pending_first_third": summary(window(0, third, "pending_fires")),
        "pending_last_third": summary(window(2 * third, duration + 1, "pending_fires")),
        "reshards_initial": sum(b.get("reshards", 0) for b in before),
        "reshards_during": delta("reshards"),
        "executions_per_s": delta("executed") / span,
        "triggers_per_s": delta("triggers") / span,
        "misfires_per_s": delta("misfires") / span,
        "skipped_per_s": delta("skipped") / span,
        "round_trips_per_s": delta("round_trips") / span,
        "executed_per_instance": [
            a.get("executed", 0) - b.get("executed", 0) for a, b in zip(after, before, strict=True)
        ],
    }


def run(
    ctx: BenchContext,
    backend: str,
    *,
    duration: float | None = None,
    calibration: float | None = None,
) -> dict[str, Any]:
    """Calibrate (``calibration`` s: 8, quick: 4), then overload at FACTOR times the
    sustainable trigger rate for ``duration`` s (60, quick: 15)."""
    duration = duration if duration is not None else (15.0 if ctx.quick else 60.0)
    calib_window = calibration if calibration is not None else (4.0 if ctx.quick else 8.0)
    raw = commit_rate(ctx.url(backend, "raw"), 1, min(calib_window, 5.0))
    sustainable = calibrate(ctx, backend, calib_window)
    # a bound that keeps a pathological calibration from a sub-millisecond interval
    interval = max(0.001, 1.0 / (FACTOR * max(sustainable, 1e-3)))
    case = overload(ctx, backend, interval, duration)
    case["raw_commits_per_s"] = raw
    case["sustainable_fires_per_s"] = sustainable
    case["factor"] = FACTOR
    case["offered_fires_per_s"] = 1.0 / interval
    case["ratio_to_raw_commits"] = case["executions_per_s"] / raw if raw else float("nan")
    ctx.log(
        f"  overload {backend}: {1 / interval:.0f} fires/s per instance offered "
        f"({FACTOR:g}x the sustainable {sustainable:.0f}); queue max "
        f"{case['pending_fires'].get('max', float('nan')):.0f}, fire age p95 "
        f"{case['fire_age'].get('p95', float('nan')) * 1000:.0f} ms, reshards during "
        f"{case['reshards_during']:.0f}; {case['executions_per_s']:.0f} executions/s vs "
        f"{raw:.0f} raw commits/s"
    )
    return case
