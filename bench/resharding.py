"""Resharding: latency after a join/leave, and the leader's compute + commit cost.

Latency: three bench workers run a no-op job of 6 items on a 1 s interval. A fourth
joins (its runtime has registered when it prints READY) and later leaves gracefully
(SIGTERM: it unregisters and sets the reshard flag). Resharding is lazy: the leader
recomputes at the next trigger, so the figure splits into

* ``trigger_wait``: from the join/leave to the fire time of the first trigger that
  runs the new assignment (up to one interval: waiting for the schedule), and
* ``overhead``: from that fire time to the first start under the new assignment
  (the reshard itself plus the followers' wait for it),

next to ``steady``: fire time to first start for triggers without a change.

Leader cost: 10,000 items over 100 instances, called directly on a store: the
strategy alone, ``ShardingService.reshard`` (membership reads + strategy + commit)
on its two paths (see :func:`leader_cost`), its reads one by one, and the commit
alone, with the requests each sends and the store calls ``reshard()`` makes.
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
from bench.counting import CountingStore
from shardkeeper.coordination.election import LeaderElection
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.sharding import ShardingService
from shardkeeper.coordination.strategies import BUILTIN_STRATEGIES, average
from shardkeeper.registry.base import Delete, Op, Put
from shardkeeper.registry.counting import request_count

ITEMS = 6
INTERVAL = 1.0
BIG_ITEMS = 10_000
BIG_INSTANCES = 100


def leader_cost(ctx: BenchContext, backend: str, repeats: int) -> dict[str, Any]:
    """Compute + commit of 10,000 items over 100 instances, ``repeats`` times.

    Every instance has a fired mark (of an earlier fire), as in a running cluster.
    Two paths of ``reshard()``: nobody started the fire yet (the flag was set before
    it: the leader needs every member's join time and every fired mark), and the
    fire already started somewhere (the flag came after it: neither is read). The
    parts are timed alone too: the two listings, the membership nodes, the fired
    marks, and the commit with the three operations ``reshard()`` sends.
    """
    url = ctx.url(backend, "reshard-big")
    paths = JobPaths("big")
    instances = [f"host-{i:03d}@{1000 + i}@bench" for i in range(BIG_INSTANCES)]
    with ctx.store(url) as raw:
        store = CountingStore(raw)
        raw.commit([Put(paths.instance(i), b"{}") for i in instances])
        earlier = repr(time.time() - 60.0).encode()
        for chunk in range(0, BIG_INSTANCES, 50):
            raw.commit([Put(paths.fired(i), earlier) for i in instances[chunk : chunk + 50]])
        election = LeaderElection(raw, paths, instances[0])
        election.try_acquire()
        sharding = ShardingService(store, paths, instances[0])
        strategy_s: dict[str, list[float]] = {name: [] for name in BUILTIN_STRATEGIES}
        paths_s: dict[str, list[float]] = {"not_started": [], "started": []}
        paths_rt: dict[str, list[int]] = {"not_started": [], "started": []}
        paths_calls: dict[str, dict[str, int]] = {}
        parts_rt: dict[str, list[int]] = {"listings": [], "members": [], "fired": []}
        commit_s: list[float] = []
        commit_rt: list[int] = []
        # the assignment of a stable period before: every measured reshard replaces
        # it (the document keeps it for fires still in flight: two levels of owners)
        sharding.set_necessary("bench")
        base = sharding.reshard(
            average, BIG_ITEMS, election.leader_check(), 1, fire=time.time() - 300.0
        )
        if base is None:
            raise RuntimeError("the bench leader's first reshard was not committed")
        doc = base.to_bytes()
        gen = 1
        for _ in range(repeats):
            for name, fn in BUILTIN_STRATEGIES.items():
                t0 = time.perf_counter()
                fn(instances, "big", BIG_ITEMS)
                strategy_s[name].append(time.perf_counter() - t0)
            for path in ("not_started", "started"):
                gen += 1
                sharding.set_necessary("bench")
                calls0 = dict(store.calls)
                rt0 = request_count(raw)
                t0 = time.perf_counter()
                done = sharding.reshard(
                    average,
                    BIG_ITEMS,
                    election.leader_check(),
                    gen,
                    fire=time.time(),
                    previous=base,
                    from_next_fire=path == "started",
                )
                paths_s[path].append(time.perf_counter() - t0)
                paths_rt[path].append(request_count(raw) - rt0)
                paths_calls[path] = {
                    k: v - calls0.get(k, 0) for k, v in store.calls.items() if v != calls0.get(k)
                }
                if done is None:
                    raise RuntimeError("the bench leader's reshard was not committed")
                doc = done.to_bytes()
            for part, read in (
                ("listings", sharding.enabled_instances),
                ("members", lambda: sharding.enabled_members(set())),
                ("fired", lambda: sharding.last_started_fire(instances)),
            ):
                rt0 = request_count(raw)
                read()
                parts_rt[part].append(request_count(raw) - rt0)
            # the commit alone, with the same three operations (and document) the
            # last reshard() sent
            sharding.set_necessary("bench")
            ops: list[Op] = [
                election.leader_check(),
                Put(paths.sharding, doc),
                Delete(paths.necessary),
            ]
            rt0 = request_count(raw)
            t0 = time.perf_counter()
            if not raw.commit(ops):
                raise RuntimeError("the bench commit failed")
            commit_s.append(time.perf_counter() - t0)
            commit_rt.append(request_count(raw) - rt0)
    return {
        "items": BIG_ITEMS,
        "instances": BIG_INSTANCES,
        "assignment_bytes": len(doc),
        "strategy_seconds": {k: summary(v) for k, v in strategy_s.items()},
        "reshard_seconds": summary(paths_s["not_started"]),
        "reshard_round_trips": summary([float(x) for x in paths_rt["not_started"]]),
        "reshard_calls": paths_calls.get("not_started", {}),
        "reshard_started_seconds": summary(paths_s["started"]),
        "reshard_started_round_trips": summary([float(x) for x in paths_rt["started"]]),
        "reshard_started_calls": paths_calls.get("started", {}),
        "parts_round_trips": {k: summary([float(x) for x in v]) for k, v in parts_rt.items()},
        "commit_seconds": summary(commit_s),
        "commit_round_trips": summary([float(x) for x in commit_rt]),
    }


def _start(rec: dict[str, Any]) -> float:
    return float(rec["start"])


def _first_start_per_fire(recs: list[dict[str, Any]]) -> dict[float, float]:
    out: dict[float, float] = {}
    for r in recs:
        key = round(r["fire"], 3)
        out[key] = min(out.get(key, r["start"]), r["start"])
    return out


def latency(ctx: BenchContext, backend: str, cycles: int) -> dict[str, Any]:
    """``cycles`` joins and leaves of a fourth instance next to three steady ones."""
    # quiet time between changes: it yields the steady-state samples (shorter in quick)
    settle = 2.0 if ctx.quick else 3.5
    url = ctx.url(backend, "reshard")
    scratch = ctx.scratch(f"reshard-{backend}")
    options: dict[str, Any] = {"count": ITEMS, "interval": INTERVAL, "grace": 2.0}
    workers: list[Worker] = []
    join: list[dict[str, float]] = []
    leave: list[dict[str, float]] = []
    changes: list[float] = []  # wall times of every join and leave
    with workers_cleanup(workers):
        for n in range(3):
            workers.append(Worker.start(url, scratch / f"base-{n}.jsonl", **options))
            changes.append(workers[-1].ready_at)
        base_files = [w.records for w in workers]
        for c in range(cycles):
            # let the cluster settle on three instances (and give steady-state fires)
            time.sleep(settle * INTERVAL)
            newcomer = Worker.start(url, scratch / f"new-{c}.jsonl", **options)
            workers.append(newcomer)
            joined = newcomer.ready_at
            changes.append(joined)

            def first_new(nc: Worker = newcomer) -> dict[str, Any] | None:
                recs = read_records([nc.records])
                return min(recs, key=_start) if recs else None

            rec = wait_until(f"cycle {c}: the newcomer's first run", first_new, 20.0)
            join.append(
                {
                    "total": rec["start"] - joined,
                    "trigger_wait": rec["fire"] - joined,
                    "overhead": rec["start"] - rec["fire"],
                }
            )
            time.sleep(2 * INTERVAL)
            mine = read_records([newcomer.records])
            last_fire = max(r["fire"] for r in mine)
            owned = {r["item"] for r in mine if r["fire"] == last_fire}
            left_at = time.time()
            changes.append(left_at)
            newcomer.term(timeout=15.0)

            def taken(
                owned: set[int] = owned, last_fire: float = last_fire, left_at: float = left_at
            ) -> Any:
                recs = [
                    r
                    for r in read_records(base_files)
                    if r["fire"] > last_fire and r["item"] in owned and r["start"] > left_at
                ]
                return min(recs, key=_start) if recs else None

            rec = wait_until(f"cycle {c}: the leaver's items to run elsewhere", taken, 20.0)
            leave.append(
                {
                    "total": rec["start"] - left_at,
                    "trigger_wait": rec["fire"] - left_at,
                    "overhead": rec["start"] - rec["fire"],
                }
            )
            ctx.log(
                f"  reshard {backend} cycle {c + 1}/{cycles}: join overhead "
                f"{join[-1]['overhead'] * 1000:.0f} ms, leave overhead "
                f"{leave[-1]['overhead'] * 1000:.0f} ms"
            )
        # steady state: fires of the base instances away from any join or leave
        time.sleep((settle + 0.5) * INTERVAL)
        steady = [
            start - fire
            for fire, start in _first_start_per_fire(read_records(base_files)).items()
            if fire > changes[0] - 30 and all(abs(fire - t) > 1.5 * INTERVAL for t in changes)
        ]
    return {
        "items": ITEMS,
        "interval": INTERVAL,
        "join": {k: summary([j[k] for j in join]) for k in ("total", "trigger_wait", "overhead")},
        "leave": {k: summary([x[k] for x in leave]) for k in ("total", "trigger_wait", "overhead")},
        "steady_overhead": summary(steady),
        "raw_join": join,
        "raw_leave": leave,
    }


def run(ctx: BenchContext, backend: str) -> dict[str, Any]:
    """Both parts of the resharding benchmark."""
    big = leader_cost(ctx, backend, repeats=5 if ctx.quick else 20)
    ctx.log(
        f"  reshard {backend} 10k/100: reshard() "
        f"{big['reshard_seconds']['median'] * 1000:.1f} ms, "
        f"{big['reshard_round_trips']['median']:.0f} requests (fire started elsewhere: "
        f"{big['reshard_started_seconds']['median'] * 1000:.1f} ms, "
        f"{big['reshard_started_round_trips']['median']:.0f}); commit alone "
        f"{big['commit_seconds']['median'] * 1000:.1f} ms, "
        f"{big['commit_round_trips']['median']:.0f} requests"
    )
    lat = latency(ctx, backend, cycles=2 if ctx.quick else 5)
    return {"leader": big, "latency": lat}
