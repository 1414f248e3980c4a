"""How ``shardkeeper history`` shows rows: a table, JSON lines, tracebacks."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rich.table import Table
from rich.text import Text

from shardkeeper.history.query import HistoryEntry
from shardkeeper.history.rows import WHOLE_FIRE
from shardkeeper.ops.views import iso

__all__ = ["COLUMNS", "flags", "history_table", "json_lines", "scope_label", "tracebacks"]

#: the table's columns
COLUMNS = ("FIRE", "ITEM", "INSTANCE", "STARTED", "DURATION", "OUTCOME", "FLAGS", "ERROR")
#: longest error text in a table cell (the whole of it is in --json and --execution)
ERROR_WIDTH = 100


def _when(value: float) -> str:
    text = iso(value)
    return text.replace("+00:00", "Z") if text else "-"


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s" if seconds < 10 else f"{seconds:.1f}s"


def _error(e: HistoryEntry) -> str:
    text = f"{e.error_type}: {e.error_message}" if e.error_type else e.error_message
    text = " ".join(text.split())
    return (text[: ERROR_WIDTH - 3] + "...") if len(text) > ERROR_WIDTH else (text or "-")


def flags(e: HistoryEntry) -> str:
    """The FLAGS cell: ``failover`` (``taken over from X`` when known), ``resumed from
    checkpoint ...``, ``misfire``, and ``reported by Y`` for a run another instance
    recorded (a dead instance's cut-off run); ``-`` for none."""
    parts: list[str] = []
    if e.failover:
        parts.append(
            f"failover, taken over from {e.taken_over_from}" if e.taken_over_from else "failover"
        )
    if e.resumed_from:
        parts.append(f"resumed from {e.resumed_from}")
    if e.misfire:
        parts.append("misfire")
    if e.reported_by:
        parts.append(f"reported by {e.reported_by}")
    return "; ".join(parts) or "-"


def scope_label(scope: str) -> str:
    """A row's scope as shown: the registry identity, or ``(before scoping)`` for a
    legacy row."""
    return scope or "(before scoping)"


def history_table(entries: Iterable[HistoryEntry], *, show_scope: bool = False) -> Table:
    """The rows as a table (newest first, as given); ``show_scope`` adds a SCOPE
    column (rows of several deployments: ``history --all-scopes``)."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in (*COLUMNS, "SCOPE") if show_scope else COLUMNS:
        table.add_column(column, overflow="fold")
    for e in entries:
        cells = (
            _when(e.fire_time),
            "all" if e.item == WHOLE_FIRE else str(e.item),
            e.instance,
            _when(e.started),
            _duration(e.duration),
            e.outcome,
            flags(e),
            _error(e),
            *((scope_label(e.scope),) if show_scope else ()),
        )
        # Text, not str: an error message such as "missing key [id]" is not markup
        table.add_row(*(Text(c) for c in cells))
    return table


def json_lines(entries: Iterable[HistoryEntry]) -> str:
    """One JSON object per row (``HistoryEntry.to_dict``), newline-terminated."""
    return "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in entries)


def tracebacks(entries: Iterable[HistoryEntry]) -> str:
    """The traceback of every row that has one, each under a header line."""
    parts = [
        f"--- {e.execution_id} on {e.instance} at {_when(e.started)} ({e.outcome})\n"
        f"{e.traceback.rstrip()}\n"
        for e in entries
        if e.traceback
    ]
    return "\n".join(parts)
