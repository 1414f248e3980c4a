"""Where execution history goes: the ``history_url`` setting and its default.

* unset (None or empty): a SQLite file in the user's data directory,
  ``$XDG_DATA_HOME/shardkeeper/history.db`` (``~/.local/share/shardkeeper/history.db``
  when ``XDG_DATA_HOME`` is unset);
* ``off``: no history;
* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``: a SQLite file;
* ``postgresql://user:password@host:port/database`` (also ``postgres://`` and
  ``postgresql+psycopg://``): PostgreSQL through the psycopg 3 driver.

Anything else is a :class:`~shardkeeper.errors.ConfigError` naming the value (its
password hidden) and what is valid. Passwords never reach a log line: use
:func:`display_url` to show a URL.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from shardkeeper.errors import ConfigError
from shardkeeper.registry.url import redact

__all__ = ["ENV_VAR", "OFF", "default_path", "display_url", "resolve_url"]

#: environment variable read by ``shardkeeper run`` and ``shardkeeper history``
ENV_VAR = "SHARDKEEPER_HISTORY_URL"
#: the value that turns history off
OFF = "off"

_VALID = (
    f"expected {OFF!r}, sqlite:///PATH (a file) or "
    "postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or leave it unset for the default file"
)
_POSTGRES = {"postgresql", "postgres", "postgresql+psycopg"}


def default_path() -> Path:
    """The default SQLite file: ``$XDG_DATA_HOME/shardkeeper/history.db``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "shardkeeper" / "history.db"


def resolve_url(value: str | None) -> URL | None:
    """The SQLAlchemy URL for a ``history_url`` value, or None when history is off."""
    if value is None or not value.strip():
        return URL.create("sqlite", database=str(default_path()))
    text = value.strip()
    if text.lower() == OFF:
        return None
    try:
        url = make_url(text)
    except ArgumentError:
        raise ConfigError(f"history_url {redact(text)!r} is not a URL: {_VALID}") from None
    if url.drivername == "sqlite":
        if not url.database or url.database == ":memory:":
            raise ConfigError(
                f"history_url {redact(text)!r} names no file (an in-memory database "
                f"would lose the history): {_VALID}"
            )
        return url
    if url.drivername in _POSTGRES:
        if not url.host and not url.query.get("host"):
            raise ConfigError(f"history_url {display_url(url)!r} names no host: {_VALID}")
        return url.set(drivername="postgresql+psycopg")
    raise ConfigError(
        f"history_url {display_url(url)!r} has an unsupported scheme {url.drivername!r}: {_VALID}"
    )


def display_url(url: URL | None) -> str:
    """``url`` fit for a log line or a message: the password is hidden."""
    if url is None:
        return OFF
    return url.render_as_string(hide_password=True)
