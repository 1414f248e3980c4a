"""A traced test instance: one job in its own OS process, with OpenTelemetry's SDK
exporting every span to a JSON-lines file (test_tracing_failover.py).

Spans go through a SimpleSpanProcessor, so each is in the file (written and fsynced)
when it ends, not at a flush a kill -9 would never reach. An item span ends only
when its execution does: the execution itself writes a ``start`` line with its
span's ids to ``--runs`` as it begins, so that the test knows the span of a run that
the kill cut off.

Items run for ``--work`` seconds (stopping early when told to), failover re-runs
return at once (their span ends and is exported).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from shardkeeper.config import JobConfig
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime


def _append(path: Path, lines: list[str]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, "".join(lines).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class JsonLinesExporter(SpanExporter):
    """Each span as one JSON line: name, ids, parent, attributes, links, status."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            assert ctx is not None
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent": format(span.parent.span_id, "016x") if span.parent else None,
                        "attributes": dict(span.attributes or {}),
                        "links": [
                            {
                                "trace_id": format(link.context.trace_id, "032x"),
                                "span_id": format(link.context.span_id, "016x"),
                                "attributes": dict(link.attributes or {}),
                            }
                            for link in span.links
                        ],
                        "status": span.status.status_code.name,
                    }
                )
                + "\n"
            )
        _append(self.path, lines)
        return SpanExportResult.SUCCESS


class Traced(ShardedJob):
    """Writes its span's ids as it starts; works ``work`` seconds unless a failover."""

    def __init__(self, runs: Path, work: float) -> None:
        self.runs = runs
        self.work = work

    def execute(self, ctx: ShardingContext) -> None:
        span = trace.get_current_span().get_span_context()
        _append(
            self.runs,
            [
                json.dumps(
                    {
                        "instance": ctx.instance_id,
                        "item": ctx.item,
                        "execution_id": ctx.execution_id,
                        "failover": ctx.is_failover,
                        "trace_id": format(span.trace_id, "032x"),
                        "span_id": format(span.span_id, "016x"),
                    }
                )
                + "\n"
            ],
        )
        if ctx.is_failover:
            return
        stop = threading.Event()
        waited = 0.0
        while waited < self.work and not ctx.should_stop():
            stop.wait(0.05)  # a bounded wait in the item, not a test's synchronisation
            waited += 0.05


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--job", default="traced")
    p.add_argument("--count", type=int, default=2)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--work", type=float, default=60.0)
    p.add_argument("--spans", required=True)
    p.add_argument("--runs", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(args.spans))))
    trace.set_tracer_provider(provider)
    cfg = JobConfig.parse(
        name=args.job,
        interval=args.interval,
        sharding_total_count=args.count,
        failover=True,
    )
    rt = Runtime(args.url, shutdown_grace=5)
    rt.add_job(Traced(Path(args.runs), args.work), cfg)
    rt.start()
    print(f"READY {rt.instance_id}", flush=True)
    rt.run_forever(install_signal_handlers=True)
    provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
