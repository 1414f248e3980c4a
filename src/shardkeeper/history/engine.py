"""SQLAlchemy engines for history URLs (see :mod:`shardkeeper.history.url`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine

from shardkeeper.errors import ConfigError

__all__ = ["CONNECT_TIMEOUT", "open_engine", "sqlite_path"]

#: seconds a connection attempt may take (a down database must not stall the writer long)
CONNECT_TIMEOUT = 5


def sqlite_path(url: URL) -> Path | None:
    """The file of a SQLite URL, None for any other database."""
    if url.get_backend_name() != "sqlite" or not url.database:
        return None
    return Path(url.database)


def open_engine(url: URL, *, create_dir: bool = True) -> Engine:
    """An engine for ``url``. ``create_dir``: create a SQLite file's directory."""
    path = sqlite_path(url)
    if path is not None:
        if create_dir:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"history file {str(path)!r}: cannot create its directory ({exc.strerror}); "
                    "give another history_url (sqlite:///PATH or postgresql://...) or 'off'"
                ) from None
        engine = create_engine(url, connect_args={"timeout": 10.0})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    try:
        import psycopg  # noqa: F401  (the driver SQLAlchemy loads for this URL)
    except ImportError:
        raise ConfigError(
            f"history URL {url.render_as_string(hide_password=True)!r} needs the psycopg "
            "driver, which is not installed: pip install 'shardkeeper[postgres]' (or use "
            "sqlite:///PATH, or 'off')"
        ) from None
    return create_engine(
        url,
        pool_size=2,
        max_overflow=2,
        pool_pre_ping=True,  # a restarted server leaves dead pooled connections
        connect_args={"connect_timeout": CONNECT_TIMEOUT},
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL: readers (the CLI) do not block the writer thread, nor it them
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()
