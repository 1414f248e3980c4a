"""The audit trail in the history database: the ``audit_log`` table, written by the
tools (an :class:`~shardkeeper.ops.audit.AuditSink`) and read like the registry's.

The registry keeps the newest entries per job; the database keeps them all (no
retention applies to this table: an audit record is not pruned by the execution
history's limits). Each row carries the registry namespace it happened in, and
:meth:`AuditTable.read` filters on it, since one database may serve several
deployments. Writes are synchronous (an operator's action is rare, and its entry
must be written or reported as not written before the command ends).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    inspect,
    select,
)
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import SQLAlchemyError

from shardkeeper.errors import ConfigError
from shardkeeper.history.engine import open_engine, sqlite_path
from shardkeeper.history.errors import HistoryUnavailableError
from shardkeeper.history.url import display_url, resolve_url
from shardkeeper.ops.audit import AuditEntry

__all__ = ["AuditTable", "audit_log"]

metadata = MetaData()
_ID = BigInteger().with_variant(Integer(), "sqlite")

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", _ID, primary_key=True, autoincrement=True),
    Column("entry_id", String(64), nullable=False, unique=True),
    Column("namespace", String(255), nullable=False, default=""),
    Column("at", Float, nullable=False),
    Column("who", String(255), nullable=False),
    Column("via", String(32), nullable=False),
    Column("host", String(255), nullable=False, default=""),
    Column("action", String(64), nullable=False),
    Column("outcome", String(16), nullable=False),
    Column("job", String(255), nullable=True),
    Column("item", Integer, nullable=True),
    Column("instance", String(255), nullable=True),
    Column("error", Text, nullable=False, default=""),
    # the entry's details (params, config changes...) as JSON text
    Column("details", Text, nullable=False, default="{}"),
    Index("ix_audit_log_namespace_job_at", "namespace", "job", "at"),
    Index("ix_audit_log_at", "at"),
)


class AuditTable:
    """The ``audit_log`` table of a ``history_url`` (None: the default SQLite file).
    ``write`` creates the table on first use; ``read`` never creates anything."""

    def __init__(self, url: str | URL | None = None) -> None:
        resolved = url if isinstance(url, URL) else resolve_url(url)
        if resolved is None:
            raise ConfigError("history_url is 'off': there is no database for the audit trail")
        self.url = resolved
        self._engine: Engine | None = None
        self._ready = False

    def describe(self) -> str:
        """Where the table is (no password)."""
        return display_url(self.url)

    def _open(self, *, create: bool) -> Engine:
        if self._engine is None:
            self._engine = open_engine(self.url, create_dir=create)
        return self._engine

    def write(self, entry: AuditEntry) -> None:
        """Insert ``entry`` (creating the table when missing). Raises
        HistoryUnavailableError when the database cannot be written."""
        try:
            engine = self._open(create=True)
            if not self._ready:
                self._create(engine)
                self._ready = True
            row: dict[str, Any] = entry.to_dict()
            row["entry_id"] = row.pop("id")
            row["details"] = json.dumps(row["details"], sort_keys=True)
            with engine.begin() as conn:
                conn.execute(insert(audit_log), [row])
        except SQLAlchemyError as exc:
            raise self._unavailable("write", exc) from None

    @staticmethod
    def _create(engine: Engine) -> None:
        try:
            metadata.create_all(engine, checkfirst=True)
        except SQLAlchemyError:
            # another tool created it at the same moment
            if not inspect(engine).has_table(audit_log.name):
                raise

    def read(
        self,
        namespace: str,
        job: str | None = None,
        *,
        since: float | None = None,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """The entries of ``namespace`` (of ``job`` only, when given) at or after
        ``since``, newest first, at most ``limit``. Raises HistoryUnavailableError
        when the database cannot be read."""
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            return []  # nothing recorded there yet; do not create the file
        try:
            engine = self._open(create=False)
            if not inspect(engine).has_table(audit_log.name):
                return []
            t = audit_log.c
            stmt = select(audit_log).where(t.namespace == namespace)
            if job is not None:
                stmt = stmt.where(t.job == job)
            if since is not None:
                stmt = stmt.where(t.at >= since)
            stmt = stmt.order_by(t.at.desc(), t.id.desc()).limit(limit)
            with engine.connect() as conn:
                rows = [row._asdict() for row in conn.execute(stmt)]
        except SQLAlchemyError as exc:
            raise self._unavailable("read", exc) from None
        entries = []
        for row in rows:
            row.pop("id")
            row["id"] = row.pop("entry_id")
            row["details"] = json.loads(row["details"] or "{}")
            entries.append(AuditEntry.from_dict(row))
        return entries

    def _unavailable(self, verb: str, exc: SQLAlchemyError) -> HistoryUnavailableError:
        cause = getattr(exc, "orig", None) or exc
        reason = " ".join(str(cause).split())[:300]
        return HistoryUnavailableError(
            f"cannot {verb} the audit trail in {self.describe()}: {type(cause).__name__}: {reason}"
        )

    def close(self) -> None:
        """Release the connections."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
