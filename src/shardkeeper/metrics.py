"""Prometheus metrics of one runtime (``docs/monitoring.md`` lists every metric).

:class:`RuntimeMetrics` is an execution observer (:mod:`shardkeeper.observe`): it
counts executions, their durations and lateness, and skipped triggers as they happen
(a counter increment: it never blocks the worker). The counters the runtime keeps
anyway (``JobRunner.stats``: failovers, misfires, reshards, fencings, ...) and the
gauges (leadership, items owned, session freshness) are read from the runners when
Prometheus scrapes, by a custom collector, so the trigger path pays nothing for them.

Each runtime has its own :class:`~prometheus_client.CollectorRegistry` (not the
process-wide default), so two runtimes in one process never clash. Labels are the
job, the outcome and the skip reason only: nothing per execution or per item.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shardkeeper.counters import STAT_KEYS, SkipReason
from shardkeeper.errors import StoreError
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.registry.base import ConnectionState

if TYPE_CHECKING:
    from shardkeeper.runtime.runner.runner import JobRunner
    from shardkeeper.runtime.runtime import Runtime

__all__ = ["DURATION_BUCKETS", "LATENESS_BUCKETS", "RuntimeMetrics", "skip_reason_label"]

log = logging.getLogger(__name__)

#: item durations: from a few milliseconds to an hour
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
#: start of an item after its scheduled fire: milliseconds normally, seconds when late
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_REASONS = {r.value: r.name.lower() for r in SkipReason}


def skip_reason_label(reason: str) -> str:
    """The short label of a skip reason (``disabled``, ``store``, ...; ``other``)."""
    return _REASONS.get(reason, "other")


class RuntimeMetrics:
    """The metrics of one runtime: an execution observer plus a scrape-time collector.

    Register it with the runtime (``Runtime(metrics_port=...)`` does) and serve
    :attr:`registry` (:mod:`shardkeeper.metrics_http`).
    """

    def __init__(self, runtime: Runtime) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.executions = Counter(
            "shardkeeper_executions",
            "Item executions that ended, by outcome (ok, failed, fenced, timed_out, interrupted, "
            "crashed).",
            ["job", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "shardkeeper_item_duration_seconds",
            "How long item executions took (ok and failed ones).",
            ["job"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.lateness = Histogram(
            "shardkeeper_trigger_lateness_seconds",
            "Start of an item after its scheduled fire time (regular fires only: "
            "failover and misfire re-runs are late by design).",
            ["job"],
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.skipped = Counter(
            "shardkeeper_skipped_triggers",
            "Triggers that started no item here, by reason.",
            ["job", "reason"],
            registry=r,
        )
        self.covered = Counter(
            "shardkeeper_covered_fires",
            "Fires of an item that no run started, folded into a run of it that says so "
            "(ctx.covers): their owner was gone before starting them, or they came while "
            "the item ran (a misfire re-run's fold).",
            ["job"],
            registry=r,
        )
        self.last_success = Gauge(
            "shardkeeper_last_success_timestamp_seconds",
            "End of the last item execution of the job that succeeded here (epoch).",
            ["job"],
            registry=r,
        )
        self.last_failure = Gauge(
            "shardkeeper_last_failure_timestamp_seconds",
            "End of the last item execution of the job that failed here (epoch).",
            ["job"],
            registry=r,
        )
        self.store_events = Counter(
            "shardkeeper_store_connection_events",
            "Connection state changes of the store session (suspended, lost, "
            "reconnected, connected).",
            ["state"],
            registry=r,
        )
        self.registry.register(_RuntimeCollector(runtime))
        runtime.store.add_state_listener(self._on_state)

    # -- ExecutionObserver ------------------------------------------------------------

    def on_execution(self, record: ExecutionRecord) -> None:
        """Count one execution (called on the worker thread: increments only)."""
        self.executions.labels(record.job, record.outcome.value).inc()
        if record.covers or record.covered_before:
            self.covered.labels(record.job).inc(len(record.covers) + record.covered_before)
        if record.outcome is Outcome.FENCED or record.reported_by:
            # a run recorded by another instance (a dead one's, found by the leader)
            # is counted, but its time and end are not this instance's
            return
        self.duration.labels(record.job).observe(record.duration)
        if not (record.failover or record.misfire):
            self.lateness.labels(record.job).observe(max(0.0, record.started - record.fire_time))
        if record.outcome is Outcome.OK:
            self.last_success.labels(record.job).set(record.ended)
        elif record.outcome in (Outcome.FAILED, Outcome.CRASHED):
            self.last_failure.labels(record.job).set(record.ended)

    def on_skip(self, record: SkipRecord) -> None:
        """Count one skipped trigger."""
        self.skipped.labels(record.job, skip_reason_label(record.reason)).inc()

    def _on_state(self, state: ConnectionState) -> None:
        self.store_events.labels(state.value).inc()


_STAT_HELP = {
    "triggers": "Fires of the job's trigger seen here.",
    "executed": "Item executions that ran here (ok or failed).",
    "failed": "Item executions that raised here.",
    "skipped": "Fires that started nothing here (see shardkeeper_skipped_triggers_total).",
    "misfires": "Fires missed while items still ran here (re-run after, misfire on).",
    "failovers": "Items taken over here from an instance that died.",
    "fenced": "Executions fenced off here (session lost, or the mark was taken over).",
    "reshards": "Reshards this instance performed as the job's leader.",
    "repairs": "Repairs of the registry state made by the self-repair pass.",
    "retries": "Failed item executions run again here (the job's retries setting).",
    "timed_out": "Item executions here that ran past the job's execution_timeout.",
    "interrupted": "Item executions here that returned after should_stop() said true "
    "(not done: run again).",
    "store_errors": "Registry operations of the job that failed here (retried or repaired).",
    "checkpoints": "Checkpoint writes of the job's items accepted by the store here.",
    "checkpoints_refused": "Checkpoint calls refused here: the execution was no longer the "
    "item's (a zombie's late write; the successor's state is kept).",
    "checkpoint_errors": "Checkpoint writes that met a store error here (kept, written later).",
}


def _progress_families(runners: dict[str, JobRunner]) -> Iterator[Metric]:
    """The progress of the items running here (their last ``ctx.progress``), per job:
    no label per item."""
    ratio = GaugeMetricFamily(
        "shardkeeper_items_progress_ratio",
        "Done over total of the job's running items here that report a total.",
        labels=["job"],
    )
    rate = GaugeMetricFamily(
        "shardkeeper_items_progress_rate",
        "Units per second done by the job's running items here (sum of their rates).",
        labels=["job"],
    )
    eta = GaugeMetricFamily(
        "shardkeeper_items_progress_eta_seconds",
        "Seconds until the last of the job's running items here is done at its rate.",
        labels=["job"],
    )
    for name, runner in sorted(runners.items()):
        reports = runner.item_states.running_progress()
        totals = [r for r in reports if r.total]
        if totals:
            done = sum(r.done for r in totals)
            ratio.add_metric([name], done / sum(r.total or 0.0 for r in totals))
        rates = [r.rate for r in reports if r.rate is not None]
        if rates:
            rate.add_metric([name], sum(rates))
        etas = [e for r in reports if (e := r.eta()) is not None]
        if etas:
            eta.add_metric([name], max(etas))
    yield ratio
    yield rate
    yield eta


class _RuntimeCollector(Collector):
    """Reads the runners at scrape time: their counters and gauges."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._lock = threading.Lock()
        self._owned: dict[str, int] = {}

    def describe(self) -> list[Metric]:
        # nothing to describe up front: the job labels are known only at scrape time
        return []

    def collect(self) -> Iterator[Metric]:
        runners = self._rt.runners
        for key in STAT_KEYS:
            help_text = _STAT_HELP.get(key, f"The runner's {key!r} counter.")
            fam = CounterMetricFamily(f"shardkeeper_job_{key}", help_text, labels=["job"])
            for name, runner in sorted(runners.items()):
                fam.add_metric([name], float(runner.stats.get(key, 0)))
            yield fam
        leader = GaugeMetricFamily(
            "shardkeeper_leader", "1 while this instance leads the job, else 0.", labels=["job"]
        )
        registered = GaugeMetricFamily(
            "shardkeeper_job_registered",
            "1 while this instance is a registered member of the job, else 0.",
            labels=["job"],
        )
        running = GaugeMetricFamily(
            "shardkeeper_items_running", "Items of the job executing here now.", labels=["job"]
        )
        owned = GaugeMetricFamily(
            "shardkeeper_items_owned",
            "Items the current assignment gives this instance.",
            labels=["job"],
        )
        fresh = self._rt.liveness.fresh()
        for name, runner in sorted(runners.items()):
            leader.add_metric([name], 1.0 if runner.leader.is_leader else 0.0)
            registered.add_metric([name], 1.0 if runner.state.registered else 0.0)
            running.add_metric([name], float(runner.running_count()))
            count = self._owned_count(name, runner, fresh)
            if count is not None:
                owned.add_metric([name], float(count))
        yield leader
        yield registered
        yield running
        yield owned
        yield from _progress_families(runners)
        session = GaugeMetricFamily(
            "shardkeeper_session_fresh",
            "1 while the store session is known to be alive (executions are valid).",
        )
        session.add_metric([], 1.0 if fresh else 0.0)
        yield session
        age = GaugeMetricFamily(
            "shardkeeper_store_contact_age_seconds",
            "Seconds since the store last answered this instance.",
        )
        age.add_metric([], self._rt.liveness.age())
        yield age
        clock = self._rt.clock
        sample = clock.sample if clock is not None else None
        if sample is not None:
            offset = GaugeMetricFamily(
                "shardkeeper_clock_offset_seconds",
                "The store's time minus this instance's clock at the latest clock sample "
                "(taken while some job has max_time_diff_seconds on).",
            )
            offset.add_metric([], sample.offset)
            yield offset
            bound = GaugeMetricFamily(
                "shardkeeper_clock_offset_error_seconds",
                "The bound of that sample: the true offset is within offset ± this.",
            )
            bound.add_metric([], sample.error)
            yield bound
        if clock is not None:
            skewed = GaugeMetricFamily(
                "shardkeeper_clock_skewed",
                "1 while this instance's clock is past the job's max_time_diff_seconds "
                "(it runs none of the job's items), else 0.",
                labels=["job"],
            )
            limits = clock.limits()
            for name in sorted(limits):
                skewed.add_metric([name], 1.0 if name in clock.skewed else 0.0)
            yield skewed
        late = self._rt.heartbeat_lateness()
        if late is not None:
            last = GaugeMetricFamily(
                "shardkeeper_heartbeat_lateness_seconds",
                "How late the housekeeping thread woke at its last tick (it runs every "
                "T/3): a process starved of CPU delays the store client's heartbeats "
                "the same way.",
            )
            last.add_metric([], late[0])
            yield last
            most = GaugeMetricFamily(
                "shardkeeper_heartbeat_lateness_max_seconds",
                "The largest lateness of a housekeeping tick since the runtime started.",
            )
            most.add_metric([], late[1])
            yield most

    def _owned_count(self, name: str, runner: JobRunner, fresh: bool) -> int | None:
        # one read of the assignment per job per scrape (Prometheus scrapes every
        # 15-60 s); while the store does not answer, the last count read is shown
        with self._lock:
            last = self._owned.get(name)
        if not fresh:
            return last  # a read would hold the scrape for a whole timeout
        try:
            assignment = runner.assignment()
        except StoreError:
            return last
        count = len(assignment.items_of(self._rt.instance_id)) if assignment else 0
        with self._lock:
            self._owned[name] = count
        return count
