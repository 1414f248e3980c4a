"""A request on an etcd channel this client closed is a store that no longer
answers (StoreUnavailableError), not grpc's bare ValueError: a thread still at
work while the runtime stops handles store errors, not arbitrary exceptions."""

from __future__ import annotations

import pytest

from shardkeeper.errors import StoreUnavailableError
from shardkeeper.registry.etcd.errors import translated
from shardkeeper.registry.url import parse_registry_url

SETTINGS = parse_registry_url("etcd://127.0.0.1:2379/closed")


def test_a_closed_channel_is_an_unavailable_store() -> None:
    with (
        pytest.raises(StoreUnavailableError, match="exists /x: the etcd client is closed"),
        translated("exists /x", SETTINGS, lambda: 0),
    ):
        raise ValueError("Cannot invoke RPC on closed channel!")


def test_any_other_value_error_is_left_alone() -> None:
    with (
        pytest.raises(ValueError, match="bad bytes") as err,
        translated("get /x", SETTINGS, lambda: 0),
    ):
        raise ValueError("bad bytes")
    assert not isinstance(err.value, StoreUnavailableError)
