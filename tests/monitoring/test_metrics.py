"""Prometheus metrics and the probes, scraped over HTTP from a real runtime on the
real stores."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardkeeper.config import JobConfig
from shardkeeper.errors import ConfigError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.metrics_http import MetricsServer, readiness
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import ServerCluster

pytestmark = pytest.mark.timeout(120)

JOB = "metered"


class HalfFailing(ShardedJob):
    """Item 1 raises on every trigger; item 0 succeeds."""

    def execute(self, ctx: ShardingContext) -> None:
        if ctx.item == 1:
            raise ValueError("item 1 is broken")


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base: str) -> Samples:
    """Every sample of /metrics by (name, sorted labels)."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def runtime(registry_url: str) -> Iterator[Runtime]:
    rt = Runtime(registry_url, metrics_port=0, shutdown_grace=2)
    rt.add_job(HalfFailing(), JobConfig(name=JOB, interval=0.3, sharding_total_count=2))
    rt.start()
    try:
        yield rt
    finally:
        rt.stop()


def base_url(rt: Runtime) -> str:
    assert rt.metrics_server is not None
    return rt.metrics_server.url


def test_executions_durations_and_leadership_are_scraped(runtime: Runtime) -> None:
    base = base_url(runtime)

    def counted() -> Samples | None:
        s = scrape(base)
        ok = value(s, "shardkeeper_executions_total", job=JOB, outcome="ok")
        failed = value(s, "shardkeeper_executions_total", job=JOB, outcome="failed")
        return s if ok >= 2 and failed >= 2 else None

    s = wait_until(counted, 20, 0.2, "executions not counted")
    ok = value(s, "shardkeeper_executions_total", job=JOB, outcome="ok")
    failed = value(s, "shardkeeper_executions_total", job=JOB, outcome="failed")
    # every ok or failed execution was timed; one scrape is one consistent moment
    # only per metric, so compare with what the histogram itself says
    count = value(s, "shardkeeper_item_duration_seconds_count", job=JOB)
    assert count >= ok + failed - 2 and count >= 4
    inf = value(s, "shardkeeper_item_duration_seconds_bucket", job=JOB, le="+Inf")
    assert inf == count
    assert value(s, "shardkeeper_trigger_lateness_seconds_count", job=JOB) >= 2
    assert value(s, "shardkeeper_leader", job=JOB) == 1.0
    assert value(s, "shardkeeper_job_registered", job=JOB) == 1.0
    assert value(s, "shardkeeper_items_owned", job=JOB) == 2.0
    assert value(s, "shardkeeper_last_success_timestamp_seconds", job=JOB) > 0
    assert value(s, "shardkeeper_last_failure_timestamp_seconds", job=JOB) > 0
    assert value(s, "shardkeeper_job_failed_total", job=JOB) >= 2
    assert value(s, "shardkeeper_job_triggers_total", job=JOB) >= 2
    assert value(s, "shardkeeper_session_fresh") == 1.0
    # no label carries an execution id or an item
    assert all(
        dict(labels).keys() <= {"job", "outcome", "reason", "state", "le"} for _, labels in s
    )


def test_skipped_triggers_are_counted_by_reason(registry_url: str) -> None:
    rt = Runtime(registry_url, metrics_port=0, shutdown_grace=2)
    rt.add_job(
        HalfFailing(), JobConfig(name=JOB, interval=0.2, sharding_total_count=2, disabled=True)
    )
    with rt:
        base = base_url(rt)
        s = wait_until(
            lambda: (
                s
                if value(
                    s := scrape(base),
                    "shardkeeper_skipped_triggers_total",
                    job=JOB,
                    reason="disabled",
                )
                >= 2
                else None
            ),
            20,
            0.2,
            "skips not counted",
        )
        assert value(s, "shardkeeper_executions_total", job=JOB, outcome="ok") == 0


def test_readyz_follows_the_session(runtime: Runtime, server: ServerCluster) -> None:
    base = base_url(runtime)
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    wait_until(lambda: httpx.get(f"{base}/readyz", timeout=5).status_code == 200, 10)
    server.pause(0)
    try:
        reply = wait_until(
            lambda: r if (r := httpx.get(f"{base}/readyz", timeout=5)).status_code == 503 else None,
            15,
            0.1,
            "readyz stayed 200 with the store stopped",
        )
        assert "session" in reply.text or "connection" in reply.text
        # liveness is the process, not the store
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    finally:
        server.resume(0)
    wait_until(lambda: httpx.get(f"{base}/readyz", timeout=5).status_code == 200, 30, 0.2)
    assert httpx.get(f"{base}/nope", timeout=5).status_code == 404
    runtime.stop()
    assert readiness(runtime) == ["runtime not running"]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/healthz", timeout=2)


def test_two_runtimes_in_one_process_have_their_own_metrics(registry_url: str) -> None:
    a = Runtime(registry_url, metrics_port=0)
    b = Runtime(registry_url, metrics_port=0)
    assert a.metrics is not None and b.metrics is not None
    assert a.metrics.registry is not b.metrics.registry


def test_a_bad_port_is_named() -> None:
    from prometheus_client import CollectorRegistry

    with pytest.raises(ConfigError, match="70000"):
        MetricsServer(CollectorRegistry(), list, port=70000)
    first = MetricsServer(CollectorRegistry(), list, port=0)
    first.start()
    try:
        second = MetricsServer(CollectorRegistry(), list, port=first.port)
        with pytest.raises(ConfigError, match=str(first.port)):
            second.start()
    finally:
        first.stop()
