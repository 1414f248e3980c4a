"""shardkeeper_covered_fires_total counts the fires later runs stood for."""

from __future__ import annotations

from shardkeeper.metrics import RuntimeMetrics
from shardkeeper.observe import ExecutionRecord, Outcome
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime


def _run(covers: tuple[float, ...]) -> ExecutionRecord:
    return ExecutionRecord(
        job="j",
        item=0,
        fire_time=24.0,
        execution_id="j@24000#0",
        instance="i",
        started=24.0,
        ended=24.5,
        outcome=Outcome.OK,
        covers=covers,
    )


def test_fires_folded_into_later_runs_are_counted() -> None:
    server = MemoryServer()
    try:
        metrics = RuntimeMetrics(Runtime(server.store()))
        metrics.on_execution(_run((8.0, 16.0)))
        metrics.on_execution(_run(()))
        value = metrics.registry.get_sample_value("shardkeeper_covered_fires_total", {"job": "j"})
        assert value == 2.0
    finally:
        server.shutdown()
