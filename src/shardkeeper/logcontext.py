"""Log records with the item they were written for: job, item, fire time, execution id
and fencing token on every record logged while an item runs.

While ``execute`` runs (in the worker thread, in the timeout's own thread, and in the
asyncio tasks an async job starts from there), a context variable holds the item's
:class:`ItemLogContext`. :class:`ItemContextFilter`, added to a handler, copies it onto
each record as attributes (``sk_job``, ``sk_item``, ``sk_fire_time``,
``sk_execution_id``, ``sk_fencing_token``; ``None`` outside an item; and with
OpenTelemetry the current span's ``sk_trace_id`` and ``sk_span_id``), so a format
string or a JSON formatter can show them, whether the record came from shardkeeper or
from user code through the standard ``logging`` module::

    import logging
    from shardkeeper.logcontext import ItemContextFilter

    handler = logging.StreamHandler()
    handler.addFilter(ItemContextFilter())
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s [%(sk_job)s/%(sk_item)s %(sk_execution_id)s] %(message)s"
    ))
    logging.basicConfig(level=logging.INFO, handlers=[handler])

:func:`current_item` gives the same values to anything else (structlog's processor,
docs/monitoring.md). A context variable, not a thread-local: an item's asyncio tasks
see their own item, and a thread the user starts sees none unless it copies the
context (``contextvars.copy_context().run``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from shardkeeper import tracing
from shardkeeper.job import ShardingContext

__all__ = [
    "FIELDS",
    "TRACE_FIELDS",
    "ItemContextFilter",
    "ItemLogContext",
    "current_item",
    "item_context",
]

#: the record attributes :class:`ItemContextFilter` sets
FIELDS = ("sk_job", "sk_item", "sk_fire_time", "sk_execution_id", "sk_fencing_token")
#: the trace attributes it sets too: the current span's (the item's, or a span the
#: job opened under it), None without one (shardkeeper/tracing.py)
TRACE_FIELDS = ("sk_trace_id", "sk_span_id")


@dataclass(frozen=True)
class ItemLogContext:
    """What a log record written during an item says of it."""

    job: str
    item: int
    #: ISO 8601, UTC, milliseconds (as the history and the CLI show fire times)
    fire_time: str
    execution_id: str
    fencing_token: int

    def as_dict(self) -> dict[str, Any]:
        """The record attributes, by their :data:`FIELDS` names."""
        return {
            "sk_job": self.job,
            "sk_item": self.item,
            "sk_fire_time": self.fire_time,
            "sk_execution_id": self.execution_id,
            "sk_fencing_token": self.fencing_token,
        }


_current: ContextVar[ItemLogContext | None] = ContextVar("shardkeeper_item", default=None)


def current_item() -> ItemLogContext | None:
    """The item running in this context (thread or task), or None outside one."""
    return _current.get()


@contextlib.contextmanager
def item_context(ctx: ShardingContext) -> Iterator[ItemLogContext]:
    """Mark everything logged in this context, until the block ends, as written for
    ``ctx``'s item (the runtime wraps each ``execute`` in it)."""
    value = ItemLogContext(
        job=ctx.job_name,
        item=ctx.item,
        fire_time=ctx.fire_time.isoformat(timespec="milliseconds"),
        execution_id=ctx.execution_id,
        fencing_token=ctx.fencing_token,
    )
    token = _current.set(value)
    try:
        yield value
    finally:
        _current.reset(token)


class ItemContextFilter(logging.Filter):
    """A handler filter that adds the running item's :data:`FIELDS` to each record
    (``None`` outside an item), and the current span's :data:`TRACE_FIELDS` (with
    OpenTelemetry: an item runs under its span), and never drops a record. Attributes
    a record already has (set through ``extra=``) are kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the fields; always True."""
        current = _current.get()
        values = current.as_dict() if current is not None else dict.fromkeys(FIELDS)
        values.update(tracing.current_ids())
        for name, value in values.items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True
