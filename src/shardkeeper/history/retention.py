"""Retention: history older than N days, and rows beyond a maximum, are deleted."""

from __future__ import annotations

import time

from sqlalchemy import delete, select
from sqlalchemy.engine import Engine

from shardkeeper.errors import ConfigError
from shardkeeper.history.schema import executions

__all__ = ["Retention", "apply_retention"]


class Retention:
    """How much history to keep. ``days``/``max_rows`` None: no limit of that kind."""

    def __init__(self, days: float | None = 30.0, max_rows: int | None = 1_000_000) -> None:
        if days is not None and days <= 0:
            raise ConfigError(f"retention_days={days!r} must be > 0 (or None: keep all)")
        if max_rows is not None and max_rows < 1:
            raise ConfigError(f"max_rows={max_rows!r} must be >= 1 (or None: no limit)")
        self.days = days
        self.max_rows = max_rows

    def __repr__(self) -> str:
        return f"Retention(days={self.days!r}, max_rows={self.max_rows!r})"


def apply_retention(engine: Engine, retention: Retention, *, now: float | None = None) -> int:
    """Delete what ``retention`` does not keep; returns the number of rows deleted."""
    deleted = 0
    t = executions.c
    with engine.begin() as conn:
        if retention.days is not None:
            cutoff = (time.time() if now is None else now) - retention.days * 86_400
            deleted += conn.execute(delete(executions).where(t.started < cutoff)).rowcount
        if retention.max_rows is not None:
            # ids grow with insertion: keep the newest max_rows rows
            boundary = conn.execute(
                select(t.id).order_by(t.id.desc()).offset(retention.max_rows).limit(1)
            ).scalar()
            if boundary is not None:
                deleted += conn.execute(delete(executions).where(t.id <= boundary)).rowcount
    return deleted
