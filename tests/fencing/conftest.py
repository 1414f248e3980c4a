"""Fencing fixtures: the databases a fenced write is tested on.

* ``postgres_server``: a PostgreSQL server for the whole session (started on first use,
  removed at the end; see :mod:`shardkeeper.testing.postgres`).
* ``db_kind``: parametrized over ``"sqlite"`` and ``"postgresql"`` (tests/conftest.py
  marks the PostgreSQL ones as needing an external service).
* ``db_url``: a database of this test only: a SQLite file in the test's temporary
  directory, or a fresh database on ``postgres_server``.
* ``engine``: an Engine on ``db_url``, disposed of at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from shardkeeper.testing.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture(params=["sqlite", "postgresql"], ids=["sqlite", "pg"])
def db_kind(request: pytest.FixtureRequest) -> str:
    """The database under test."""
    return str(request.param)


@pytest.fixture
def db_url(db_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database of this test only (see module docstring)."""
    if db_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'fencing.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    url = server.create_database(f"f_{uuid.uuid4().hex[:12]}")
    # psycopg (3) by name: the plain postgresql:// scheme means psycopg2 on SQLAlchemy 2.0
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    """An Engine on ``db_url``."""
    # SQLite: a writer waits at most 10 s for another's lock, then fails (not forever)
    connect_args = {"timeout": 10.0} if db_url.startswith("sqlite") else {"connect_timeout": 10}
    eng = sa.create_engine(db_url, connect_args=connect_args)
    try:
        yield eng
    finally:
        eng.dispose()
