"""OpenTelemetry spans of fires and item executions, the way a library makes them.

shardkeeper depends on OpenTelemetry's API only (the ``otel`` extra); the application
installs and configures the SDK and its exporters. Without the API installed every
function here is a no-op that costs one cached look-up, and nothing imports it up
front: the import is tried the first time it is needed (a fire, an item, a record
through ``ItemContextFilter``), and the answer kept. With the API but no SDK
configured, the API's own no-op tracer answers (spans that record nothing and whose
context is invalid, so nothing is written to the registry either).

Two spans (tracer ``shardkeeper``):

* ``shardkeeper.fire``: one decision of one fire on this instance, from its first
  look to its outcome (``launched``, ``skipped`` with its reason, or ``deferred``: the
  items still run here and a misfire re-run stands for it). A root span: a fire is
  started by the schedule, not by a request.
* ``shardkeeper.item``: one execution of one item, from the commit that marks it
  running to its outcome (``ok``, ``failed``, ``timed_out``, ``fenced``,
  ``interrupted``: the outcomes of the execution history). The span is current while
  ``execute`` runs (log records, ``HttpJob``'s ``traceparent`` header and the job's own
  spans are under it). A regular run's parent is its fire span.

A run that replaces another links to it (a span ``Link``): a failover re-run to the
item span of the run that died or was handed off, a misfire re-run to the fire spans
it stands for. The replaced run may have been on another instance, now dead, so its
span context travels through the registry: the item span exists before the start
commit, and its W3C ``traceparent`` is written in the running mark, carried into the
failover entry, and read back by the instance that claims it (docs/registry-layout.md).
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "FIRE_SPAN",
    "ITEM_SPAN",
    "TRACER",
    "attached",
    "current_ids",
    "enabled",
    "end_fire",
    "end_item",
    "inject",
    "record_attempt_error",
    "start_fire",
    "start_item",
    "traceparent",
    "using",
]

#: the tracer's instrumentation scope name
TRACER = "shardkeeper"
#: the name of a fire decision's span
FIRE_SPAN = "shardkeeper.fire"
#: the name of an item execution's span
ITEM_SPAN = "shardkeeper.item"
#: most links one span carries (a misfire re-run folding many fires links the latest)
MAX_LINKS = 8


@functools.cache
def _api() -> SimpleNamespace | None:
    """OpenTelemetry's API modules, imported on first use; None when not installed.
    Cached: the answer does not change in a process (a provider set later is still
    used, since the API's tracer delegates to whatever provider is set)."""
    try:
        trace = importlib.import_module("opentelemetry.trace")
        context = importlib.import_module("opentelemetry.context")
        propagate = importlib.import_module("opentelemetry.propagate")
        tracecontext = importlib.import_module("opentelemetry.trace.propagation.tracecontext")
    except ImportError:
        return None
    from shardkeeper._version import __version__

    return SimpleNamespace(
        trace=trace,
        context=context,
        propagate=propagate,
        # the registry carries W3C trace context, whatever propagator the application
        # configured for its own requests
        w3c=tracecontext.TraceContextTextMapPropagator(),
        tracer=trace.get_tracer(TRACER, __version__),
    )


def enabled() -> bool:
    """True when OpenTelemetry's API is installed (spans are made; whether they record
    depends on the SDK the application configured)."""
    return _api() is not None


def _iso(fire_time: float) -> str:
    return datetime.fromtimestamp(fire_time, UTC).isoformat(timespec="milliseconds")


def _links(api: SimpleNamespace, parents: Sequence[str], why: str) -> list[Any]:
    """Links to the spans named by W3C ``traceparent`` values (invalid ones dropped)."""
    links: list[Any] = []
    for value in dict.fromkeys(p for p in parents if p):
        span_context = api.trace.get_current_span(
            api.w3c.extract({"traceparent": value})
        ).get_span_context()
        if span_context.is_valid:
            links.append(api.trace.Link(span_context, {"shardkeeper.link": why}))
    return links[-MAX_LINKS:]


def start_fire(
    job: str,
    instance: str,
    fire_time: float,
    *,
    misfire: bool = False,
    manual: bool = False,
    replaces: Sequence[str] = (),
) -> Span | None:
    """Open the span of a fire's decision (a new trace); end it with :func:`end_fire`.
    ``replaces``: the ``traceparent`` values of the fire spans a misfire re-run stands
    for (linked). None without OpenTelemetry."""
    api = _api()
    if api is None:
        return None
    span: Span = api.tracer.start_span(
        FIRE_SPAN,
        context=api.context.Context(),  # a root: never under whatever is current here
        attributes={
            "shardkeeper.job": job,
            "shardkeeper.instance": instance,
            "shardkeeper.fire_time": _iso(fire_time),
            "shardkeeper.misfire": misfire,
            "shardkeeper.manual": manual,
        },
        links=_links(api, replaces, "misfire"),
    )
    return span


def end_fire(
    span: Span | None, outcome: str, *, reason: str = "", items: Sequence[int] = ()
) -> None:
    """End a fire span with its outcome (``launched``, ``skipped``, ``deferred``), the
    skip's reason and the items it concerned."""
    if span is None:
        return
    span.set_attribute("shardkeeper.outcome", outcome)
    if reason:
        span.set_attribute("shardkeeper.skip_reason", reason)
    if items:
        span.set_attribute("shardkeeper.items", list(items))
    span.end()


def start_item(
    job: str,
    item: int,
    instance: str,
    fire_time: float,
    execution_id: str,
    *,
    parent: Span | None = None,
    run: str = "fire",
    replaces: Sequence[str] = (),
) -> Span | None:
    """Open the span of one execution of ``item`` (before its start commit, so that
    its ``traceparent`` goes into the running mark); end it with :func:`end_item`.
    ``parent``: the fire span (none for a failover claim: a trace of its own);
    ``run``: ``fire``, ``misfire`` or ``failover``; ``replaces``: the ``traceparent``
    values of the runs it replaces (linked). None without OpenTelemetry."""
    api = _api()
    if api is None:
        return None
    context = api.trace.set_span_in_context(parent) if parent is not None else api.context.Context()
    span: Span = api.tracer.start_span(
        ITEM_SPAN,
        context=context,
        attributes={
            "shardkeeper.job": job,
            "shardkeeper.item": item,
            "shardkeeper.instance": instance,
            "shardkeeper.fire_time": _iso(fire_time),
            "shardkeeper.execution_id": execution_id,
            "shardkeeper.run": run,
        },
        links=_links(api, replaces, run),
    )
    return span


def end_item(span: Span | None, outcome: str, *, attempt: int, fencing_token: int) -> None:
    """End an item span with the execution's outcome (the history's words), the
    attempts it took (0: it never started) and its fencing token."""
    if span is None:
        return
    api = _api()
    span.set_attribute("shardkeeper.outcome", outcome)
    span.set_attribute("shardkeeper.attempt", attempt)
    span.set_attribute("shardkeeper.fencing_token", fencing_token)
    if api is not None and outcome in ("failed", "timed_out", "crashed"):
        span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, outcome))
    span.end()


def record_attempt_error(span: Span | None, error: BaseException, attempt: int) -> None:
    """An attempt raised: an exception event on the item span (the span ends once, with
    the last attempt's outcome; retries are events, not spans)."""
    if span is not None:
        span.record_exception(error, {"shardkeeper.attempt": attempt}, timestamp=time.time_ns())


@contextmanager
def using(span: Span | None) -> Iterator[None]:
    """Make ``span`` the current span in this context for the block (not ended)."""
    api = _api()
    if span is None or api is None:
        yield
        return
    # exceptions are the runtime's to report (record_attempt_error, end_item)
    with api.trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    ):
        yield


@contextmanager
def attached(traceparent: str) -> Iterator[None]:
    """Make the span named by a W3C ``traceparent`` current in this context for the
    block: a worker process of the process executor (runtime/execute/child.py) runs its item
    under the parent's item span this way. The span object stays in the parent (it
    is recorded and ended there); here it is a non-recording stand-in with its
    context, so log records, ``inject`` and the job's own spans are under it. A
    no-op without OpenTelemetry or without a valid ``traceparent``."""
    api = _api()
    if not traceparent or api is None:
        yield
        return
    token = api.context.attach(api.w3c.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        api.context.detach(token)


def traceparent(span: Span | None) -> str:
    """The W3C ``traceparent`` of ``span``; "" when there is no span or it is invalid
    (the API without an SDK): nothing is then written to the registry."""
    api = _api()
    if span is None or api is None or not span.get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    api.w3c.inject(carrier, context=api.trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current trace context to outgoing request ``headers`` with the
    application's propagators (W3C ``traceparent`` by default)."""
    api = _api()
    if api is not None:
        api.propagate.inject(headers)


def current_ids() -> Mapping[str, str | None]:
    """``sk_trace_id`` and ``sk_span_id`` of the current span (32 and 16 hex digits, as
    exporters and log backends show them), both None without a valid one."""
    api = _api()
    if api is not None:
        span_context = api.trace.get_current_span().get_span_context()
        if span_context.is_valid:
            return {
                "sk_trace_id": format(span_context.trace_id, "032x"),
                "sk_span_id": format(span_context.span_id, "016x"),
            }
    return {"sk_trace_id": None, "sk_span_id": None}
