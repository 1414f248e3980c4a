"""History fixtures: a throwaway PostgreSQL server and one database per test.

* ``postgres_server``: a PostgreSQL server for the whole session (started on first use,
  removed at the end; see :mod:`shardkeeper.testing.postgres`).
* ``db_kind``: parametrized over ``"sqlite"`` and ``"postgresql"``.
* ``history_url``: a ``history_url`` of this test only: a SQLite file in the test's
  temporary directory, or a fresh database on ``postgres_server``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
    """The history database under test."""
    return str(request.param)


@pytest.fixture
def history_url(db_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A history database of this test only (see module docstring)."""
    if db_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"t_{uuid.uuid4().hex[:12]}")
