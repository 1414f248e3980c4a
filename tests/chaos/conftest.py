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
    """Deselect ``chaos``-marked tests unless selected; give them a duration-based
    timeout when they are. (Deselected, not skipped: a plain run reports them as not
    collected for this run, the way ``-m`` would.)"""
    duration = int(config.getoption("--chaos-duration"))
    if not _chaos_selected(config):
        long_runs = [item for item in items if item.get_closest_marker("chaos") is not None]
        if long_runs:
            config.hook.pytest_deselected(items=long_runs)
            items[:] = [item for item in items if item.get_closest_marker("chaos") is None]
        return
    for item in items:
        if item.get_closest_marker("chaos") is not None:
            item.add_marker(pytest.mark.timeout(duration + 600))
