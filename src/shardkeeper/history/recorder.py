"""HistoryRecorder: the observer that writes every execution and skip to SQL.

Off the trigger path: :meth:`on_execution` and :meth:`on_skip` only put the record on a
bounded queue (never blocking; when it is full the record is dropped, counted, and a
warning logged at most once per ``warn_interval``). One daemon writer thread takes
records in batches and inserts each batch with one ``executemany``. A database error
never reaches the instance: the writer logs it (rate-limited), counts it, keeps the
batch and retries every ``retry_interval`` seconds; meanwhile the queue fills and new
records are dropped, so memory stays bounded. The writer also creates the schema on
first use and applies retention every ``retention_interval`` seconds.
:meth:`close` flushes what is queued (bounded by its timeout).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import URL, Engine

from shardkeeper.errors import ConfigError
from shardkeeper.history.engine import open_engine
from shardkeeper.history.retention import Retention, apply_retention
from shardkeeper.history.rows import execution_row, skip_rows
from shardkeeper.history.schema import ensure_schema, executions
from shardkeeper.history.url import display_url, resolve_url
from shardkeeper.observe import ExecutionRecord, SkipRecord

__all__ = ["HistoryRecorder", "RecorderStats"]

log = logging.getLogger(__name__)

Row = dict[str, Any]
_Item = ExecutionRecord | SkipRecord | None  # None only wakes the writer


@dataclass(frozen=True)
class RecorderStats:
    """Counters of a recorder since it was built."""

    written: int
    """Rows inserted."""
    dropped: int
    """Records dropped because the queue was full (or the recorder closed)."""
    errors: int
    """Failed database operations (writes, schema creation, retention)."""
    queued: int
    """Records waiting in the queue now."""
    deleted: int
    """Rows deleted by retention."""


class HistoryRecorder:
    """An :class:`~shardkeeper.observe.ExecutionObserver` writing history to SQL (see
    the module docstring). ``url``: a ``history_url`` value (None: the default SQLite
    file) or a SQLAlchemy URL; ``off`` is refused here (use :meth:`from_url`)."""

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        queue_size: int = 10_000,
        batch_size: int = 500,
        retention: Retention | None = None,
        retention_interval: float = 600.0,
        retry_interval: float = 5.0,
        warn_interval: float = 60.0,
    ) -> None:
        resolved = url if isinstance(url, URL) else resolve_url(url)
        if resolved is None:
            raise ConfigError("history_url is 'off': there is no history to record")
        if queue_size < 1 or batch_size < 1:
            raise ConfigError(
                f"queue_size={queue_size!r} and batch_size={batch_size!r} must be >= 1"
            )
        for name, value in (
            ("retention_interval", retention_interval),
            ("retry_interval", retry_interval),
            ("warn_interval", warn_interval),
        ):
            if value <= 0:
                raise ConfigError(f"{name}={value!r} must be > 0 seconds")
        self.url = resolved
        self.retention = retention or Retention()
        self._batch_size = batch_size
        self._retention_interval = retention_interval
        self._retry_interval = retry_interval
        self._warn_interval = warn_interval
        self._engine: Engine = open_engine(resolved)
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._written = 0
        self._dropped = 0
        self._errors = 0
        self._deleted = 0
        self._drop_warned = -float("inf")
        self._error_warned = -float("inf")
        self._closing = threading.Event()
        self._abandoned = threading.Event()
        self._interrupt = threading.Event()
        self._deadline = float("inf")
        self._lost = 0
        self._writer = threading.Thread(target=self._run, name="sk-history", daemon=True)
        self._writer.start()
        log.info("execution history: %s (%r)", display_url(resolved), self.retention)

    @classmethod
    def from_url(cls, url: str | None, **options: Any) -> HistoryRecorder | None:
        """A recorder for a ``history_url`` value, or None when it is ``off``."""
        resolved = resolve_url(url)
        return None if resolved is None else cls(resolved, **options)

    # -- the observer (called on worker threads and coordination lanes) ---------------

    def on_execution(self, record: ExecutionRecord) -> None:
        """Queue ``record`` (never blocks; dropped and counted when the queue is full)."""
        self._offer(record)

    def on_skip(self, record: SkipRecord) -> None:
        """Queue ``record`` (never blocks; dropped and counted when the queue is full)."""
        self._offer(record)

    def _offer(self, record: ExecutionRecord | SkipRecord) -> None:
        if not self._closing.is_set():
            try:
                self._queue.put_nowait(record)
                return
            except queue.Full:
                pass
        now = time.monotonic()
        with self._lock:
            self._dropped += 1
            dropped = self._dropped
            warn = now - self._drop_warned >= self._warn_interval
            if warn:
                self._drop_warned = now
        if warn:
            log.warning(
                "execution history: queue full or closed, record of %s dropped "
                "(%d dropped so far; the database is slow or unreachable)",
                record.job,
                dropped,
            )

    # -- state ------------------------------------------------------------------------

    def stats(self) -> RecorderStats:
        """The counters now."""
        with self._lock:
            return RecorderStats(
                written=self._written,
                dropped=self._dropped,
                errors=self._errors,
                queued=self._queue.qsize(),
                deleted=self._deleted,
            )

    @property
    def engine(self) -> Engine:
        """The recorder's engine (readers may share it)."""
        return self._engine

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is queued (waiting up to ``timeout`` seconds), then stop the
        writer. Returns whether everything queued was written. Idempotent."""
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        self._interrupt.set()
        # wake the writer if it waits for records (a full queue keeps it busy anyway)
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._writer.join(timeout)
        if self._writer.is_alive():
            self._abandoned.set()
            log.warning(
                "execution history: %d record(s) not written at close (timeout %.1fs)",
                self._queue.qsize(),
                timeout,
            )
            return False
        self._engine.dispose()
        return self._lost == 0 and self._queue.empty()

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HistoryRecorder({display_url(self.url)!r})"

    # -- the writer thread -----------------------------------------------------------

    def write_batch(self, rows: list[Row]) -> None:
        """Insert ``rows`` in one transaction (one ``executemany``). The writer
        thread's unit of work; raises on a database error."""
        with self._engine.begin() as conn:
            conn.execute(insert(executions), rows)

    def _run(self) -> None:
        pending: list[Row] = []
        schema_ready = False
        next_retention = time.monotonic()
        while True:
            if not pending:
                wait = max(0.0, next_retention - time.monotonic())
                pending = self._take(None if self._closing.is_set() else wait)
            if pending:
                try:
                    if not schema_ready:
                        ensure_schema(self._engine)
                        schema_ready = True
                    self.write_batch(pending)
                except Exception as exc:
                    self._failed("write", exc)
                    if not self._pause():
                        self._lost = len(pending) + self._queue.qsize()
                        log.warning(
                            "execution history: %d record(s) not written at close "
                            "(the database is unreachable)",
                            self._lost,
                        )
                        return
                    continue
                with self._lock:
                    self._written += len(pending)
                pending = []
            if time.monotonic() >= next_retention and schema_ready:
                next_retention = time.monotonic() + self._retention_interval
                self._retain()
            elif not schema_ready:
                next_retention = time.monotonic() + self._retention_interval
            if self._closing.is_set() and self._queue.empty():
                return

    def _take(self, timeout: float | None) -> list[Row]:
        """Up to ``batch_size`` records' rows: waits ``timeout`` for the first (None:
        no wait), then takes what is there without waiting."""
        rows: list[Row] = []
        try:
            first = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue.Empty:
            return rows
        taken = [first]
        while len(taken) < self._batch_size:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for record in taken:
            try:
                if isinstance(record, ExecutionRecord):
                    rows.append(execution_row(record))
                elif isinstance(record, SkipRecord):
                    rows.extend(skip_rows(record))
            except Exception as exc:  # a malformed record must not end the writer
                self._failed("record conversion", exc)
        return rows

    def _retain(self) -> None:
        try:
            deleted = apply_retention(self._engine, self.retention)
        except Exception as exc:
            self._failed("retention", exc)
            return
        if deleted:
            with self._lock:
                self._deleted += deleted
            log.info("execution history: retention deleted %d row(s)", deleted)

    def _pause(self) -> bool:
        """Wait before a retry; False when the writer should give up (closing and out
        of time: what is left is lost, and the close says so)."""
        if not self._closing.is_set():
            self._interrupt.wait(self._retry_interval)  # close() cuts the wait short
            return True
        left = self._deadline - time.monotonic()
        if left <= 0:
            return False
        return not self._abandoned.wait(min(self._retry_interval, 0.2, left))

    def _failed(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            self._errors += 1
            errors = self._errors
            warn = now - self._error_warned >= self._warn_interval
            if warn:
                self._error_warned = now
        if warn:
            # the driver's own error, not SQLAlchemy's text (which lists every
            # parameter of the batch); it names the server, never the password
            cause = getattr(exc, "orig", None) or exc
            text = " ".join(str(cause).split())[:300]
            log.warning(
                "execution history: %s failed on %s (%d error(s) so far; retrying every "
                "%.0fs): %s: %s",
                what,
                display_url(self.url),
                errors,
                self._retry_interval,
                type(cause).__name__,
                text,
            )
