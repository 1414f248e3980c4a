"""Coordination cost per trigger: registry round trips per instance per trigger.

One runtime runs a no-op job whose N items are all local (one instance), with a
schedule that never fires on its own; the harness drives triggers itself through
``JobRunner.on_trigger`` (the very method the scheduler's fire ends in) and waits
until the batch is complete and the store is quiet. The figure is the growth of
the runtime store's ``round_trips`` counter per trigger.

A counting wrapper around the runtime's store also records what the runtime
asked for (store calls; a commit counts one): on etcd every call is one request;
on ZooKeeper a commit also sends one pre-read per node whose condition the multi
cannot check natively (see the ZooKeeper backend's docstring).

The store also re-reads what its namespace watch reports (ZooKeeper's tree watch
re-reads every node that changed; etcd streams the changes and sends nothing). To
tell that part from the trigger flow, a passive observer store holds the same watch
on ``/`` and does nothing else: its own ``round_trips`` growth is the watch part.

The servers count too (bench/server_counters.py: ZooKeeper's ``mntr`` packets, etcd's
unary gRPC calls): their growth per trigger covers both clients (the runtime and the
observer), so it is compared with the sum of the two client-side counters.

ElasticJob's reference (from its source: per item it writes/deletes running,
misfire and failover nodes and re-reads sharding state) is about 7 calls per item
plus a constant; it is shown as that model, not measured.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bench.common import BENCH_ETCD_TXN_OPS, BenchContext, summary, wait_until
from bench.counting import CountingStore
from bench.server_counters import server_requests
from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import is_high_churn
from shardkeeper.coordination.snapshot import read_snapshot
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry import open_store
from shardkeeper.registry.counting import request_count
from shardkeeper.runtime import Runtime

#: a schedule that does not fire during a run (the harness fires by hand)
NEVER = "0 0 1 1 *"
SIZES = (1, 10, 100, 1000)


class NoOpJob(ShardedJob):
    """Does nothing; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        """Count the call."""
        with self._lock:
            self.calls += 1


def _quiet(counters: Sequence[Any], quiet_for: float = 0.2, timeout: float = 15.0) -> None:
    """Wait until none of the ``round_trips`` counters moved for ``quiet_for`` s."""
    deadline = time.monotonic() + timeout
    last = [request_count(c) for c in counters]
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.03)
        now = [request_count(c) for c in counters]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_for:
            return
    # a store that never goes quiet is reported by the numbers it produces


def measure(
    ctx: BenchContext,
    backend: str,
    items: int,
    *,
    monitor: bool,
    triggers: int,
    options: dict[str, int] | None = None,
    idle: float = 4.0,
) -> dict[str, Any]:
    """Round trips per trigger for one job of ``items`` local items; ``options`` go
    in the registry URL (etcd's ``max_txn_ops``); ``idle`` seconds measure the
    background."""
    url = ctx.url(backend, "cost", **(options or {}))
    job = NoOpJob()
    cfg = JobConfig.parse(
        name="cost", cron=NEVER, sharding_total_count=items, monitor_execution=monitor
    )
    observer = open_store(url)
    observer.start()
    counting = CountingStore(open_store(url))
    rt = Runtime(counting, worker_threads=8)
    limit = counting.max_ops_per_commit
    try:
        observer.watch("/", lambda _event: None, exclude=is_high_churn)
        rt.add_job(job, cfg)
        rt.start()
        runner = rt.runners["cost"]

        executed: list[int] = []
        left_marked: list[int] = []

        def fire(n: int) -> float:
            began = time.monotonic()
            before = job.calls
            runner.on_trigger(datetime.now(UTC))
            # on_trigger queues the fire on the job's lane; the trigger is over when
            # no fire is queued or in progress and no batch runs
            wait_until(
                f"trigger {n} of {items} items to complete",
                lambda: runner.pending_fires() == 0 and runner.idle,
                60.0,
                0.002,
            )
            elapsed = time.monotonic() - began
            # Not "calls == items": a trigger that runs fewer items than it owns is
            # a finding to report, not a reason for the harness to stop.
            executed.append(job.calls - before)
            return elapsed

        # the first trigger computes the assignment and creates parent nodes: warm-up
        fire(0)
        _quiet([rt.store, observer])
        # Background work, not caused by triggers: the liveness probe (every T/3) and
        # the job's repair pass (each job at least once per sweep; with one job, every
        # tick). Measured here, idle, as requests per second ...
        bg0 = request_count(rt.store)
        time.sleep(idle)  # a measuring window, not a synchronisation
        background = (request_count(rt.store) - bg0) / idle
        # ... and kept out of the triggers' windows: no repair pass meanwhile, and the
        # probes that fall inside a window are counted and taken off
        request_repair, reconcile_due = runner.request_repair, runner.leader.reconcile_due
        runner.request_repair = lambda: None  # type: ignore[method-assign]
        runner.leader.reconcile_due = lambda: False  # type: ignore[method-assign]
        executed.clear()
        left_marked.clear()
        calls: list[int] = []
        commits: list[int] = []
        totals: list[int] = []
        watch: list[int] = []
        served: list[int] = []
        seconds: list[float] = []
        cluster = ctx.servers.get(backend)
        own: list[int] = []
        for n in range(1, triggers + 1):
            rt0, ob0 = request_count(rt.store), request_count(observer)
            server0 = server_requests(cluster)
            calls0, commits0 = counting.total_calls, counting.calls.get("commit", 0)
            probes0 = counting.probes
            seconds.append(fire(n))
            _quiet([rt.store, observer])
            totals.append(request_count(rt.store) - rt0)
            own.append(totals[-1] - (counting.probes - probes0))
            calls.append(counting.total_calls - calls0)
            commits.append(counting.calls.get("commit", 0) - commits0)
            watch.append(request_count(observer) - ob0)
            served.append(server_requests(cluster) - server0)
            # read after the counters: this read is the harness's, not the runtime's
            snap = read_snapshot(observer, "cost")
            left_marked.append(len(snap.running) if snap is not None else -1)
        runner.request_repair = request_repair  # type: ignore[method-assign]
        runner.leader.reconcile_due = reconcile_due  # type: ignore[method-assign]
        flow = [t - w for t, w in zip(totals, watch, strict=True)]
        return {
            # the trigger's own requests: sent in its window, less the liveness probes
            # that fell into it (repair passes were held off meanwhile)
            "own_per_trigger": summary([float(x) for x in own]),
            "raw_own": own,
            # the idle instance's background (probes and repair passes), per second
            "background_per_s": background,
            "items": items,
            "monitor": monitor,
            "triggers": triggers,
            # what the runtime asked the store for (a commit counts one) ...
            "calls_per_trigger": summary([float(x) for x in calls]),
            "commits_per_trigger": summary([float(x) for x in commits]),
            # ... and what the store sent for it (round_trips)
            "total_per_trigger": summary([float(x) for x in totals]),
            "watch_per_trigger": summary([float(x) for x in watch]),
            "flow_per_trigger": summary([float(x) for x in flow]),
            "trigger_seconds": summary(seconds),
            "raw_total": totals,
            # items run per trigger (should be ``items``) and running marks left in
            # the registry once the batch was over (should be 0)
            "executed_per_trigger": executed,
            "marks_left_after_trigger": left_marked,
            "raw_watch": watch,
            # the servers' own count for both clients (runtime + observer), and the
            # clients' count of the same (pings on ZooKeeper make up a difference)
            "server_per_trigger": summary([float(x) for x in served]),
            "clients_per_trigger": summary(
                [float(t + w) for t, w in zip(totals, watch, strict=True)]
            ),
            # what the chunking rules predict: marks in chunks of the store's limit
            # less the 2 checks, clears in chunks of half of it (check + delete)
            "start_commits": math.ceil(items / (limit - 2)) if monitor else 1,
            "finish_commits": math.ceil(items / (limit // 2)) if monitor else 0,
            "elasticjob_model": 7 * items + 10,
            "commit_limit": limit,
            "url_options": dict(options or {}),
        }
    finally:
        rt.stop(grace=1.0)
        observer.close()


def run(
    ctx: BenchContext,
    backend: str,
    sizes: Sequence[int] | None = None,
    triggers: int | None = None,
    idle: float | None = None,
) -> dict[str, Any]:
    """Round trips per trigger for each size, monitor_execution on and off (on etcd
    also with ``max_txn_ops`` raised); ``idle``: seconds of each background window."""
    sizes = tuple(sizes or SIZES)
    triggers = triggers or (3 if ctx.quick else 8)
    cases: list[dict[str, Any]] = []
    variants: list[tuple[bool, dict[str, int]]] = [(True, {}), (False, {})]
    if backend == "etcd":
        # the bench's etcd server allows it (bench/common.py); the client's default
        # stays etcd's own 128, measured above
        variants.append((True, {"max_txn_ops": BENCH_ETCD_TXN_OPS}))
    for monitor, options in variants:
        for items in sizes:
            case = measure(ctx, backend, items, monitor=monitor, triggers=triggers, options=options)
            shown = "".join(f" {k}={v}" for k, v in options.items())
            ctx.log(
                f"  cost {backend}{shown} items={items} monitor={monitor}: "
                f"{case['calls_per_trigger']['median']:.0f} calls "
                f"({case['commits_per_trigger']['median']:.0f} commits), "
                f"{case['total_per_trigger']['median']:.0f} round trips/trigger, "
                f"{case['own_per_trigger']['median']:.0f} its own "
                f"(background {case['background_per_s']:.1f}/s idle) "
                f"(watch {case['watch_per_trigger']['median']:.0f}); "
                f"server counted {case['server_per_trigger']['median']:.0f} for "
                f"{case['clients_per_trigger']['median']:.0f} sent by both clients; "
                f"ran {case['executed_per_trigger']} of {items}, "
                f"marks left {case['marks_left_after_trigger']}"
            )
            cases.append(case)
    return {"cases": cases, "commit_limit": cases[0]["commit_limit"] if cases else None}
