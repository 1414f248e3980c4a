"""Reading history: filter by job, item, instance, failures and age; newest first.

Rows are scoped by registry and namespace (``scope``, history/schema.py). A reader
built with a ``scope`` reads only that deployment's rows unless a query asks for
:data:`ALL_SCOPES`; the tools (``shardkeeper history``, the console and its REST API)
always build their reader with the scope of the registry they were pointed at. A
reader built without one (Python code reading a database it knows to hold one
deployment) reads every row.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import SQLAlchemyError

from shardkeeper.errors import ConfigError
from shardkeeper.history.engine import open_engine, sqlite_path
from shardkeeper.history.errors import HistoryUnavailableError
from shardkeeper.history.schema import COLUMNS, LEGACY_SCOPE, executions
from shardkeeper.history.url import display_url, resolve_url
from shardkeeper.observe import Outcome

__all__ = [
    "ALL_SCOPES",
    "FAILED_OUTCOMES",
    "LEGACY_SCOPE",
    "HistoryEntry",
    "HistoryQuery",
    "HistoryReader",
    "parse_since",
]

#: a query's ``scope`` that reads every deployment's rows (legacy ones included)
ALL_SCOPES = "*"

#: outcomes ``failed_only`` selects: the job's own code did not succeed
FAILED_OUTCOMES = (str(Outcome.FAILED), str(Outcome.TIMED_OUT), str(Outcome.CRASHED))

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_since(text: str) -> float:
    """Seconds in a duration such as ``30s``, ``15m``, ``1h``, ``2d`` or ``1w``."""
    match = _SINCE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(
            f"duration {text!r} is not valid: expected a positive number and a unit "
            "s, m, h, d or w (e.g. 30s, 15m, 1h, 2d)"
        )
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


@dataclass(frozen=True)
class HistoryEntry:
    """One row of history (times are epoch seconds, UTC). For a skipped trigger,
    ``error_message`` holds the reason and ``item`` is -1 when it concerned the whole
    fire."""

    id: int
    job: str
    item: int
    fire_time: float
    execution_id: str
    instance: str
    started: float
    ended: float
    duration: float
    outcome: str
    failover: bool
    misfire: bool
    fencing_token: int
    error_type: str
    error_message: str
    traceback: str
    #: earlier fire times this run stood for (``ctx.covers``), comma-separated
    covers: str = ""
    #: the registry and namespace it ran in ("" for a row recorded before scoping)
    scope: str = LEGACY_SCOPE
    #: the run's last progress report (JSON: done, total, note, at) when it did not
    #: end ok ("" otherwise)
    progress: str = ""
    #: how many fires, older than those in :attr:`covers`, this run stood for
    #: without listing them (``ctx.covered_before``)
    covered_before: int = 0
    #: a failover run: the instance whose cut-off run it took over ("" otherwise)
    taken_over_from: str = ""
    #: the checkpoint a re-run resumed from ("" when it read none)
    resumed_from: str = ""
    #: the instance that recorded a run it did not run ("" when :attr:`instance` did)
    reported_by: str = ""

    @property
    def covered(self) -> tuple[float, ...]:
        """The fire times of :attr:`covers`, oldest first."""
        return tuple(float(t) for t in self.covers.split(",") if t)

    @property
    def progress_report(self) -> dict[str, Any] | None:
        """:attr:`progress` decoded (done, total, note, at), None when there is none
        (or it is not readable JSON)."""
        if not self.progress:
            return None
        try:
            report = json.loads(self.progress)
        except ValueError:
            return None
        return report if isinstance(report, dict) else None

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready data (the ``--json`` schema of ``history``):
        ``covers`` a list of fire times, ``progress`` an object or null, and the
        optional texts (``taken_over_from``, ``resumed_from``, ``reported_by``) null
        when empty: never a string standing for "nothing"."""
        data = asdict(self)
        data["covers"] = list(self.covered)
        data["progress"] = self.progress_report
        for name in ("taken_over_from", "resumed_from", "reported_by"):
            data[name] = data[name] or None
        return data


@dataclass(frozen=True)
class HistoryQuery:
    """What to read. ``since``: seconds back from now; ``failed_only``: outcomes
    failed, timed_out and crashed; ``execution_id``: every row of one execution. ``scope``:
    one deployment's rows (a registry identity, ``""`` for legacy rows),
    :data:`ALL_SCOPES` for all, None for the reader's own scope."""

    job: str | None = None
    item: int | None = None
    instance: str | None = None
    failed_only: bool = False
    since: float | None = None
    execution_id: str | None = None
    limit: int = 50
    scope: str | None = None

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ConfigError(f"limit={self.limit!r} must be >= 1")
        if self.since is not None and self.since <= 0:
            raise ConfigError(f"since={self.since!r} must be > 0 seconds")


class HistoryReader:
    """Reads history from a ``history_url`` (None: the default SQLite file). Never
    creates anything: a database with no history yet reads as empty. ``scope``: the
    registry and namespace whose rows queries read by default (None: every row; see
    the module docstring)."""

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        engine: Engine | None = None,
        scope: str | None = None,
    ) -> None:
        resolved = url if isinstance(url, URL) else resolve_url(url)
        if resolved is None:
            raise ConfigError("history_url is 'off': there is no history to read")
        if scope == ALL_SCOPES:
            scope = None
        self.url = resolved
        self.scope = scope
        self._own = engine is None
        self._engine = engine or open_engine(resolved, create_dir=False)

    def describe(self) -> str:
        """Where the history is read from (no password)."""
        return display_url(self.url)

    def query(self, q: HistoryQuery, *, now: float | None = None) -> list[HistoryEntry]:
        """The rows matching ``q``, newest first (by start time), at most ``q.limit``.
        Raises HistoryUnavailableError when the database cannot be read."""
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            return []  # nothing recorded there yet; do not create the file
        try:
            return self._query(q, now)
        except SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    def elsewhere(self, job: str) -> int:
        """How many rows of ``job`` lie outside this reader's scope (other
        deployments' and legacy rows): what a scoped query that found nothing may be
        missing. 0 for a reader without a scope."""
        path = sqlite_path(self.url)
        if self.scope is None or (path is not None and not path.exists()):
            return 0
        try:
            if not inspect(self._engine).has_table(executions.name):
                return 0
            have = {c["name"] for c in inspect(self._engine).get_columns(executions.name)}
            t = executions.c
            stmt = select(func.count()).select_from(executions).where(t.job == job)
            if "scope" in have:
                stmt = stmt.where(t.scope != self.scope)
            with self._engine.connect() as conn:
                return int(conn.execute(stmt).scalar() or 0)
        except SQLAlchemyError as exc:
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: SQLAlchemyError) -> HistoryUnavailableError:
        cause = getattr(exc, "orig", None) or exc
        reason = " ".join(str(cause).split())[:300]
        return HistoryUnavailableError(
            f"cannot read history from {self.describe()}: {type(cause).__name__}: {reason}"
        )

    def _query(self, q: HistoryQuery, now: float | None) -> list[HistoryEntry]:
        if not inspect(self._engine).has_table(executions.name):
            return []
        t = executions.c
        # a table written by a release before a column was added reads without it
        have = {c["name"] for c in inspect(self._engine).get_columns(executions.name)}
        stmt = select(t.id, *(t[c] for c in COLUMNS if c in have))
        scope = self.scope if q.scope is None else q.scope
        if scope is not None and scope != ALL_SCOPES:
            if "scope" in have:
                stmt = stmt.where(t.scope == scope)
            elif scope != LEGACY_SCOPE:
                return []  # a table from before scoping holds legacy rows only
        if q.job is not None:
            stmt = stmt.where(t.job == q.job)
        if q.item is not None:
            stmt = stmt.where(t.item == q.item)
        if q.instance is not None:
            stmt = stmt.where(t.instance == q.instance)
        if q.failed_only:
            stmt = stmt.where(t.outcome.in_(FAILED_OUTCOMES))
        if q.since is not None:
            stmt = stmt.where(t.started >= (time.time() if now is None else now) - q.since)
        if q.execution_id is not None:
            stmt = stmt.where(t.execution_id == q.execution_id)
        stmt = stmt.order_by(t.started.desc(), t.id.desc()).limit(q.limit)
        with self._engine.connect() as conn:
            return [HistoryEntry(**row._asdict()) for row in conn.execute(stmt)]

    def executions(self, job: str, **filters: Any) -> list[HistoryEntry]:
        """Shorthand: ``query(HistoryQuery(job=job, **filters))``."""
        return self.query(HistoryQuery(job=job, **filters))

    def close(self) -> None:
        """Release the connections (of an engine this reader opened)."""
        if self._own:
            self._engine.dispose()

    def __enter__(self) -> HistoryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
