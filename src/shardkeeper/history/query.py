"""Reading history: filter by job, item, instance, failures and age; newest first."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import inspect, select
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import SQLAlchemyError

from shardkeeper.errors import ConfigError
from shardkeeper.history.engine import open_engine, sqlite_path
from shardkeeper.history.errors import HistoryUnavailableError
from shardkeeper.history.schema import COLUMNS, executions
from shardkeeper.history.url import display_url, resolve_url
from shardkeeper.observe import Outcome

__all__ = ["FAILED_OUTCOMES", "HistoryEntry", "HistoryQuery", "HistoryReader", "parse_since"]

#: outcomes ``failed_only`` selects: the job's own code did not succeed
FAILED_OUTCOMES = (str(Outcome.FAILED), str(Outcome.TIMED_OUT))

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

    @property
    def covered(self) -> tuple[float, ...]:
        """The fire times of :attr:`covers`, oldest first."""
        return tuple(float(t) for t in self.covers.split(",") if t)

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready data (the ``--json`` schema of ``history``)."""
        return asdict(self)


@dataclass(frozen=True)
class HistoryQuery:
    """What to read. ``since``: seconds back from now; ``failed_only``: outcomes
    failed and timed_out; ``execution_id``: every row of one execution."""

    job: str | None = None
    item: int | None = None
    instance: str | None = None
    failed_only: bool = False
    since: float | None = None
    execution_id: str | None = None
    limit: int = 50

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ConfigError(f"limit={self.limit!r} must be >= 1")
        if self.since is not None and self.since <= 0:
            raise ConfigError(f"since={self.since!r} must be > 0 seconds")


class HistoryReader:
    """Reads history from a ``history_url`` (None: the default SQLite file). Never
    creates anything: a database with no history yet reads as empty."""

    def __init__(self, url: str | URL | None = None, *, engine: Engine | None = None) -> None:
        resolved = url if isinstance(url, URL) else resolve_url(url)
        if resolved is None:
            raise ConfigError("history_url is 'off': there is no history to read")
        self.url = resolved
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
            cause = getattr(exc, "orig", None) or exc
            reason = " ".join(str(cause).split())[:300]
            raise HistoryUnavailableError(
                f"cannot read history from {self.describe()}: {type(cause).__name__}: {reason}"
            ) from None

    def _query(self, q: HistoryQuery, now: float | None) -> list[HistoryEntry]:
        if not inspect(self._engine).has_table(executions.name):
            return []
        t = executions.c
        # a table written by a release before a column was added reads without it
        have = {c["name"] for c in inspect(self._engine).get_columns(executions.name)}
        stmt = select(t.id, *(t[c] for c in COLUMNS if c in have))
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
