"""Optional dependencies: a URL that needs an extra that is not installed names it."""

from __future__ import annotations

import sys

import pytest

from shardkeeper.errors import ConfigError
from shardkeeper.registry import open_store


def test_an_etcd_url_without_the_etcd_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "etcd3" or m.startswith("etcd3.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "shardkeeper.registry.etcd", raising=False)
    monkeypatch.setitem(sys.modules, "etcd3", None)  # "not installed"
    with pytest.raises(ConfigError, match=r"shardkeeper\[etcd\]") as err:
        open_store("etcd://127.0.0.1:2379/ns")
    assert "etcd3" in str(err.value)


def test_a_postgresql_history_url_without_the_driver_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardkeeper.history.engine import open_engine
    from shardkeeper.history.url import resolve_url

    monkeypatch.setitem(sys.modules, "psycopg", None)
    url = resolve_url("postgresql://user:secret@127.0.0.1:5432/db")
    assert url is not None
    with pytest.raises(ConfigError, match=r"shardkeeper\[postgres\]") as err:
        open_engine(url)
    assert "secret" not in str(err.value)
