"""Where execution history goes: the ``history_url`` setting and its default.

* unset (None or empty) or ``default``: a SQLite file in the user's data directory,
  ``$XDG_DATA_HOME/shardkeeper/history.db`` (``~/.local/share/shardkeeper/history.db``
  when ``XDG_DATA_HOME`` is unset). The readers (``shardkeeper history``, the
  console) read it when no URL is given; ``shardkeeper run`` records only when given
  a value (``default`` names this file), as a ``Runtime`` records only when given a
  :class:`~shardkeeper.history.HistoryRecorder`;
* ``off``: no history;
* ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``: a SQLite file;
* ``postgresql://user:password@host:port/database`` (also ``postgres://`` and
  ``postgresql+psycopg://``): PostgreSQL through the psycopg 3 driver.

Anything else is a :class:`~shardkeeper.errors.ConfigError` naming the value (its
password hidden) and what is valid. Passwords never reach a log line: use
:func:`display_url` to show a URL.

A URL with a password is a secret: the whole value may be a reference,
``env:NAME`` or ``file:PATH`` (see :mod:`shardkeeper.secretref`), and so may the
password alone (``postgresql://jobs:env:PGPASSWORD@db/jobs``, or the ``password``
query option: ``postgresql://jobs@db/jobs?password=file:/run/secrets/pg``). Either
is read by :func:`resolve_url`, on the instance that opens the database; one that
cannot be read is a :class:`~shardkeeper.errors.SecretReferenceError` naming
``history_url``, the reference and what is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from shardkeeper.errors import ConfigError
from shardkeeper.registry.url import redact
from shardkeeper.secretref import is_reference, resolve_secret

__all__ = ["DEFAULT", "ENV_VAR", "OFF", "default_path", "display_url", "resolve_url"]

#: environment variable read by ``shardkeeper run`` and ``shardkeeper history``
ENV_VAR = "SHARDKEEPER_HISTORY_URL"
#: the value that turns history off
OFF = "off"
#: the value that names the default SQLite file (for ``run``, where unset means none)
DEFAULT = "default"
#: the setting's name in messages
SETTING = "history_url"

_VALID = (
    f"expected {OFF!r}, {DEFAULT!r} (the default file), sqlite:///PATH (a file) or "
    "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
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
    text = resolve_secret(SETTING, value.strip()).strip()
    if text.lower() == OFF:
        return None
    if text.lower() == DEFAULT:
        return URL.create("sqlite", database=str(default_path()))
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
        return _resolve_password(url).set(drivername="postgresql+psycopg")
    raise ConfigError(
        f"history_url {display_url(url)!r} has an unsupported scheme {url.drivername!r}: {_VALID}"
    )


def _resolve_password(url: URL) -> URL:
    """``url`` with a password reference (user-info, or the ``password`` option, which
    moves to the user-info) replaced by what it refers to."""
    option = url.query.get("password")
    if isinstance(option, str) and is_reference(option):
        url = url.difference_update_query(["password"]).set(password=option)
    if url.password is not None and is_reference(str(url.password)):
        url = url.set(password=resolve_secret(f"{SETTING} password", str(url.password)))
    return url


def display_url(url: URL | None) -> str:
    """``url`` fit for a log line or a message: the password is hidden."""
    if url is None:
        return OFF
    return url.render_as_string(hide_password=True)
