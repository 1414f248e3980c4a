"""OpenTelemetry spans (shardkeeper.tracing), on the MemoryStore runtime with the SDK's
in-memory exporter: a fire decision's span and each item execution's span under it
with their attributes and outcome, log records carrying the item span's ids, the
running mark carrying its trace context, a misfire re-run linking to the fire it
stands for, HttpJob's ``traceparent`` header, and everything a no-op without
OpenTelemetry. The link of a failover re-run across two processes on ZooKeeper is in
test_tracing_failover.py."""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shardkeeper import tracing
from shardkeeper.config import JobConfig
from shardkeeper.coordination.model import FailoverEntry, RunningMark
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.httpjob import HttpJob
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.logcontext import TRACE_FIELDS, ItemContextFilter
from shardkeeper.ops import Operations
from shardkeeper.registry.memory import MemoryServer
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)

user_log = logging.getLogger("user.traced")


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The SDK, exporting to memory, for this test only: shardkeeper's tracer comes
    from a provider of the test's own, not the process's global one (which can be set
    once, and would leave tracing on, marks carrying trace context, for every later
    test of the process)."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    api = tracing._api()
    assert api is not None
    own = SimpleNamespace(**{**vars(api), "tracer": provider.get_tracer(tracing.TRACER)})
    monkeypatch.setattr(tracing, "_api", lambda: own)
    try:
        yield exporter
    finally:
        provider.shutdown()


def parts(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a W3C traceparent (its flags aside: the SDK sets the
    random-trace-id flag, 03)."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id


def named(exporter: InMemorySpanExporter, name: str, job: str) -> list[ReadableSpan]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("shardkeeper.job") == job
    ]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def ids(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._mutex = threading.Lock()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        with self._mutex:
            self.records.append(record)

    def of(self, logger: str) -> list[logging.LogRecord]:
        with self._mutex:
            return [r for r in self.records if r.name == logger]


@pytest.fixture
def collected() -> Iterator[Collect]:
    handler = Collect()
    handler.addFilter(ItemContextFilter())
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


class Traced(ShardedJob):
    """Logs one line per item; item 1 raises; records the mark of each item seen."""

    def __init__(self) -> None:
        self.marks: dict[int, RunningMark] = {}
        self.store: Any = None

    def execute(self, ctx: ShardingContext) -> None:
        user_log.info("item %d runs", ctx.item)
        node = self.store.get(JobPaths(ctx.job_name).running(ctx.item))
        if node is not None:
            self.marks.setdefault(ctx.item, RunningMark.from_bytes(node.value))
        if ctx.item == 1:
            raise KeyError("item one fails")


def _runtime(server: MemoryServer, job: ShardedJob, **cfg: Any) -> Runtime:
    rt = Runtime(server.store(), shutdown_grace=1)
    rt.add_job(job, JobConfig(**{"interval": 1, "sharding_total_count": 2, **cfg}))
    rt.start()
    return rt


@pytest.mark.parametrize("timeout", [None, 30], ids=["worker-thread", "timeout-thread"])
def test_fire_and_item_spans(
    memory_server: MemoryServer,
    spans: InMemorySpanExporter,
    collected: Collect,
    timeout: int | None,
) -> None:
    """One fire span per decision, an item span per execution under it, with the job,
    item, instance, fire time, execution id, fencing token, attempt and outcome; the
    item's log records carry the item span's ids, its running mark its traceparent."""
    job = Traced()
    rt = _runtime(memory_server, job, name="traced", failover=True, execution_timeout=timeout)
    job.store = rt.store
    try:

        def both() -> dict[int, ReadableSpan] | None:
            items = {
                attrs(s)["shardkeeper.item"]: s for s in named(spans, "shardkeeper.item", "traced")
            }
            return items if {0, 1} <= set(items) else None

        items = wait_until(both, 20, message=lambda: f"spans: {spans.get_finished_spans()}")
    finally:
        rt.stop_now()
    ok, failed = items[0], items[1]
    fires = {ids(s)[1]: s for s in named(spans, "shardkeeper.fire", "traced")}
    for item, span in items.items():
        a = attrs(span)
        assert a["shardkeeper.instance"] == rt.instance_id
        assert a["shardkeeper.run"] == "fire"
        assert a["shardkeeper.execution_id"].startswith("traced@")
        assert a["shardkeeper.execution_id"].endswith(f"#{item}")
        assert a["shardkeeper.fire_time"].endswith("+00:00")
        assert a["shardkeeper.attempt"] == 1
        assert a["shardkeeper.fencing_token"] > 0
        # its parent is the span of the fire that launched it
        assert span.parent is not None
        fire = fires[format(span.parent.span_id, "016x")]
        assert attrs(fire)["shardkeeper.outcome"] == "launched"
        assert attrs(fire)["shardkeeper.fire_time"] == a["shardkeeper.fire_time"]
        assert attrs(fire)["shardkeeper.instance"] == rt.instance_id
        assert item in attrs(fire)["shardkeeper.items"]
        assert fire.parent is None  # a fire starts a trace
    assert attrs(ok)["shardkeeper.outcome"] == "ok"
    assert ok.status.status_code is trace.StatusCode.UNSET
    assert attrs(failed)["shardkeeper.outcome"] == "failed"
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert (failed.events[0].attributes or {})["exception.type"] == "KeyError"
    # the records of an item carry its span's ids (user code's, through logging)
    every = named(spans, "shardkeeper.item", "traced")
    span_ids = {ids(s): attrs(s)["shardkeeper.item"] for s in every}
    records = [r for r in collected.of("user.traced") if r.getMessage().endswith(" runs")]
    for r in records:
        logged = (r.__dict__["sk_trace_id"], r.__dict__["sk_span_id"])
        assert span_ids.get(logged) == r.__dict__["sk_item"], r.__dict__
    assert {r.__dict__["sk_item"] for r in records} >= {0, 1}
    # ... and its running mark the span's W3C trace context
    assert set(job.marks) == {0, 1}
    assert all(parts(mark.traceparent) in span_ids for mark in job.marks.values()), job.marks


def test_records_outside_an_item_carry_no_trace_ids(collected: Collect) -> None:
    user_log.info("outside")
    (record,) = collected.of("user.traced")
    assert all(getattr(record, f) is None for f in TRACE_FIELDS)


class AsyncTraced(ShardedJob):
    """An async job: its task sees the item span as current (asyncio copies the
    context into tasks, as it does for the item's log fields)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str | None]] = []

    async def execute(self, ctx: ShardingContext) -> None:  # type: ignore[override]
        async def inner() -> None:
            self.seen.append(dict(tracing.current_ids()))

        await asyncio.create_task(inner())


def test_an_async_jobs_tasks_run_under_the_item_span(
    memory_server: MemoryServer, spans: InMemorySpanExporter
) -> None:
    job = AsyncTraced()
    rt = _runtime(memory_server, job, name="async", sharding_total_count=1)
    try:
        span = wait_until(lambda: named(spans, "shardkeeper.item", "async"), 20)[0]
    finally:
        rt.stop_now()
    trace_id, span_id = ids(span)
    assert {"sk_trace_id": trace_id, "sk_span_id": span_id} in job.seen


class Stoppable(ShardedJob):
    """Runs until told to stop (a first run), or returns at once (a failover re-run);
    records which instance ran what."""

    def __init__(self) -> None:
        self.started: list[tuple[str, bool]] = []

    def execute(self, ctx: ShardingContext) -> None:
        self.started.append((ctx.instance_id, ctx.is_failover))
        if ctx.is_failover:
            return
        pause = threading.Event()
        while not ctx.should_stop():
            pause.wait(0.02)  # the item's own work loop, not a test's synchronisation


def test_a_handed_off_runs_rerun_links_to_it(
    memory_server: MemoryServer, spans: InMemorySpanExporter
) -> None:
    """A graceful stop interrupts a run: handed off (its entry carrying its span's
    context), the other instance's failover re-run links to it."""
    job = Stoppable()
    cfg: dict[str, Any] = {"name": "handoff", "sharding_total_count": 1, "failover": True}
    runtimes = [_runtime(memory_server, job, interval=3600, **cfg)]
    runtimes.append(_runtime(memory_server, job, interval=3600, **cfg))
    try:
        wait_until(lambda: all(rt.runners["handoff"].state.registered for rt in runtimes), 20)
        admin = memory_server.store()
        admin.start()
        try:
            Operations(admin).trigger("handoff")  # to both: one owns the item
        finally:
            admin.close()
        owner_id = wait_until(lambda: job.started and job.started[0][0], 20)
        owner = next(rt for rt in runtimes if rt.instance_id == owner_id)
        other = next(rt for rt in runtimes if rt is not owner)
        owner.stop(grace=5)

        def rerun() -> ReadableSpan | None:
            return next(
                (
                    s
                    for s in named(spans, "shardkeeper.item", "handoff")
                    if attrs(s)["shardkeeper.run"] == "failover"
                ),
                None,
            )

        span = wait_until(rerun, 20, message=lambda: f"{job.started} {spans.get_finished_spans()}")
    finally:
        for rt in runtimes:
            rt.stop_now()
    (interrupted,) = [
        s
        for s in named(spans, "shardkeeper.item", "handoff")
        if attrs(s)["shardkeeper.outcome"] == "interrupted"
    ]
    assert attrs(interrupted)["shardkeeper.instance"] == owner_id
    assert attrs(span)["shardkeeper.instance"] == other.instance_id
    assert attrs(span)["shardkeeper.outcome"] == "ok"
    assert span.parent is None
    assert [ids(interrupted)] == [
        (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
        for link in span.links
    ]


class Slow(ShardedJob):
    """The first run of the item outlasts the next fire (a misfire); then quick."""

    def __init__(self) -> None:
        self.runs = 0

    def execute(self, ctx: ShardingContext) -> None:
        self.runs += 1
        if self.runs == 1:
            deadline = threading.Event()
            deadline.wait(2.5)


def test_a_misfire_rerun_links_to_the_fire_it_stands_for(
    memory_server: MemoryServer, spans: InMemorySpanExporter
) -> None:
    rt = _runtime(memory_server, Slow(), name="slow", sharding_total_count=1, misfire=True)
    try:

        def rerun() -> ReadableSpan | None:
            for s in named(spans, "shardkeeper.item", "slow"):
                if attrs(s)["shardkeeper.run"] == "misfire":
                    return s
            return None

        span = wait_until(rerun, 20, message=lambda: f"spans: {spans.get_finished_spans()}")
    finally:
        rt.stop_now()
    deferred = {
        ids(s)[1]: s
        for s in named(spans, "shardkeeper.fire", "slow")
        if attrs(s)["shardkeeper.outcome"] == "deferred"
    }
    assert deferred, "no fire was deferred"
    linked = [format(link.context.span_id, "016x") for link in span.links]
    assert linked and set(linked) <= set(deferred)
    assert all((link.attributes or {})["shardkeeper.link"] == "misfire" for link in span.links)
    assert attrs(span)["shardkeeper.outcome"] == "ok"


class Recorder(http.server.BaseHTTPRequestHandler):
    headers_seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Recorder.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Hook(HttpJob):
    """POSTs to the test's server (its URL set by the test)."""


def test_httpjob_sends_the_item_spans_traceparent(
    memory_server: MemoryServer, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Recorder.headers_seen = []
    monkeypatch.setattr(Hook, "url", f"http://127.0.0.1:{server.server_address[1]}/run/{{item}}")

    rt = _runtime(memory_server, Hook(), name="hook", sharding_total_count=1)
    try:
        wait_until(lambda: named(spans, "shardkeeper.item", "hook"), 20)
    finally:
        rt.stop_now()
        server.shutdown()
        server.server_close()
    span = named(spans, "shardkeeper.item", "hook")[0]
    trace_id, span_id = ids(span)
    sent = [parts(h["traceparent"]) for h in Recorder.headers_seen]
    assert (trace_id, span_id) in sent
    assert attrs(span)["shardkeeper.outcome"] == "ok"


def test_without_opentelemetry_everything_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """As with the API not installed (the core's case, run for real in
    tests/test_packaging.py): no span, no trace context, headers untouched."""
    monkeypatch.setattr(tracing, "_api", lambda: None)
    assert not tracing.enabled()
    fire = tracing.start_fire("j", "i", 0.0)
    span = tracing.start_item("j", 0, "i", 0.0, "j@0#0", parent=fire, replaces=("x",))
    assert fire is None and span is None
    assert tracing.traceparent(span) == ""
    tracing.end_item(span, "ok", attempt=1, fencing_token=1)
    tracing.end_fire(fire, "launched")
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}
    with tracing.using(span):
        assert tracing.current_ids() == {"sk_trace_id": None, "sk_span_id": None}


def test_the_trace_context_in_the_registry_is_optional() -> None:
    """A mark or queue entry without one is written as before, and old documents (no
    field) still read; a fold keeps the replaced run's context."""
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    plain = RunningMark("i-1", 1.0, "j@1000#0", started_at=2.0)
    assert b"traceparent" not in plain.to_bytes()
    assert RunningMark.from_bytes(plain.to_bytes()) == plain
    marked = RunningMark("i-1", 1.0, "j@1000#0", started_at=2.0, traceparent=tp)
    assert RunningMark.from_bytes(marked.to_bytes()).traceparent == tp
    entry = FailoverEntry(1.0, "j@1000#0", "i-1", queued_at=3.0)
    assert b"traceparent" not in entry.to_bytes()
    later = FailoverEntry(2.0, "j@2000#0", "i-1", queued_at=4.0)
    assert later.fold(FailoverEntry(1.0, "j@1000#0", "i-1", traceparent=tp)).traceparent == tp
    queued = FailoverEntry(1.0, "x", "i", queued_at=5.0, traceparent=tp)
    assert FailoverEntry.from_bytes(queued.to_bytes()) == queued
