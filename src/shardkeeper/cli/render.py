"""Rendering for the command line: the console, tables, JSON and value formats.

Tables go through one :data:`out` console. On a terminal it wraps to the terminal's
width; piped (stdout not a terminal and no ``COLUMNS`` set) it never wraps, so an
instance id or an error stays on one line for ``grep`` and ``awk``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = [
    "emit_json",
    "fmt_ids",
    "fmt_next",
    "fmt_progress",
    "fmt_seconds",
    "fmt_short",
    "fmt_time",
    "fmt_yes",
    "make_console",
    "new_table",
    "out",
]

#: the width of a piped console: wide enough that no row of ours is ever wrapped
PIPE_WIDTH = 100_000


def make_console() -> Console:
    """The console tables print on: unbounded width when piped, see the module doc."""
    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    # rich would assume 80 columns for a pipe and fold long ids onto two lines
    return Console(highlight=False, soft_wrap=False, width=PIPE_WIDTH if piped else None)


out = make_console()


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on plain stdout."""
    # plain stdout, not rich: the JSON must not be wrapped or coloured
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def new_table(*columns: str) -> Table:
    """A borderless table with these column headers."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def fmt_time(value: datetime | float | None) -> str:
    """A time as ISO 8601 UTC with ``Z``, or ``-``."""
    from shardkeeper.ops.views import iso  # here: importing ops loads config

    text = iso(value)
    return text.replace("+00:00", "Z") if text else "-"


def fmt_next(when: datetime | None, reason: str | None) -> str:
    """The next fire time, or why there is none (``- (no instance)``)."""
    if when is None and reason:
        return f"- ({reason})"
    return fmt_time(when)


def fmt_seconds(value: float | None) -> str:
    """A duration: milliseconds below a second, else seconds."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def fmt_short(text: str | None, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters (with ``...``), or ``-``."""
    if not text:
        return "-"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fmt_progress(progress: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """A running item's last progress report as (PROGRESS, RATE, ETA) cells:
    ``42.0% (420/1000) note`` (``420`` without a total), ``12.5/s``, ``1m05s``; ``-``
    for what is unknown."""
    if not progress:
        return "-", "-", "-"
    done, total, percent = progress.get("done"), progress.get("total"), progress.get("percent")
    amount = f"{_num(done)}/{_num(total)}" if total is not None else _num(done)
    cell = f"{percent:.1f}% ({amount})" if percent is not None else amount
    if progress.get("note"):
        cell += " " + fmt_short(str(progress["note"]), 30)
    rate = progress.get("rate")
    eta = progress.get("eta")
    rate_cell = f"{rate:.3g}/s" if rate is not None else "-"
    if eta is None:
        eta_cell = "-"
    else:
        minutes, seconds = divmod(round(eta), 60)
        hours, minutes = divmod(minutes, 60)
        eta_cell = (
            f"{hours}h{minutes:02d}m"
            if hours
            else f"{minutes}m{seconds:02d}s"
            if minutes
            else f"{seconds}s"
        )
    return cell, rate_cell, eta_cell


def _num(value: Any) -> str:
    """A count without a needless ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def fmt_ids(values: Sequence[str]) -> str:
    """A comma-separated list, or ``-``."""
    return ", ".join(values) if values else "-"


def fmt_yes(flag: bool) -> str:
    """``yes`` or ``no``."""
    return "yes" if flag else "no"
