"""Execution history in SQL: every item execution and skipped trigger, kept for a while.

:class:`HistoryRecorder` is an execution observer (:mod:`shardkeeper.observe`) that
writes records off the trigger path to SQLite (the default: a local file) or
PostgreSQL; :class:`HistoryReader` queries them (``shardkeeper history``). See
docs/monitoring.md.

Modules: ``url`` (the ``history_url`` setting), ``engine`` (SQLAlchemy engines),
``schema`` (the ``executions`` table), ``rows`` (records to rows), ``recorder`` (the
queue and writer thread), ``retention`` (age and row limits), ``query`` (reading), ``render`` (the
command's output), ``errors``; ``audit`` (the ``audit_log`` table of operator actions,
imported on its own).
"""

from shardkeeper.history.errors import HistoryUnavailableError
from shardkeeper.history.query import (
    ALL_SCOPES,
    LEGACY_SCOPE,
    HistoryEntry,
    HistoryQuery,
    HistoryReader,
    parse_since,
)
from shardkeeper.history.recorder import HistoryRecorder, RecorderStats
from shardkeeper.history.retention import Retention, apply_retention
from shardkeeper.history.url import ENV_VAR, default_path, display_url, resolve_url

__all__ = [
    "ALL_SCOPES",
    "ENV_VAR",
    "LEGACY_SCOPE",
    "HistoryEntry",
    "HistoryQuery",
    "HistoryReader",
    "HistoryRecorder",
    "HistoryUnavailableError",
    "RecorderStats",
    "Retention",
    "apply_retention",
    "default_path",
    "display_url",
    "parse_since",
    "resolve_url",
]
