"""Chaos-test selection: long runs only under ``-m chaos``, with a timeout that fits.

The long runs last ``--chaos-duration`` seconds each, so a plain ``pytest`` (or
``make test``) must not pick them up; ``make chaos`` selects them with ``-m chaos``.
Their timeout follows the duration: the run, the quiet period, start and stop.
"""

from __future__ import annotations

import pytest


def _chaos_selected(config: pytest.Config) -> bool:
    expr = str(config.getoption("markexpr") or "")
    return "chaos" in expr and "not chaos" not in expr


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``chaos``-marked tests unless selected; give them a duration-based timeout."""
    duration = int(config.getoption("--chaos-duration"))
    skip = pytest.mark.skip(reason="long chaos run: select it with -m chaos (make chaos)")
    for item in items:
        if item.get_closest_marker("chaos") is None:
            continue
        if not _chaos_selected(config):
            item.add_marker(skip)
        else:
            item.add_marker(pytest.mark.timeout(duration + 600))
