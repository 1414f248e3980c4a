"""Fixtures shared by the runtime tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shardkeeper.runtime import Runtime


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    """Runtimes a test appends here are stopped at once at teardown."""
    started: list[Runtime] = []
    try:
        yield started
    finally:
        for rt in started:
            rt.stop_now()
