"""When to fire: the pure trigger functions and the adapter around APScheduler.

* :mod:`~shardkeeper.scheduling.triggers`: cron parsing, time zones and trigger
  building over APScheduler's trigger classes; no thread, no scheduler. The
  configuration and the operators' views use only this module.
* :mod:`~shardkeeper.scheduling.scheduler`: :class:`TriggerScheduler`, the one
  module that imports APScheduler's ``BackgroundScheduler``; only the runtime runs it.

The names below are re-exported lazily: importing ``shardkeeper.scheduling.triggers``
runs this file first, and an eager import of the scheduler here would load
APScheduler's scheduler into every process that only validates a configuration.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardkeeper.scheduling.scheduler import (
        MISFIRE_GRACE_SECONDS,
        FireCallback,
        TriggerScheduler,
    )
    from shardkeeper.scheduling.triggers import build_trigger, parse_cron, resolve_time_zone

__all__ = [
    "MISFIRE_GRACE_SECONDS",
    "FireCallback",
    "TriggerScheduler",
    "build_trigger",
    "parse_cron",
    "resolve_time_zone",
]

#: where each re-exported name is defined (imported on first use)
_HOMES = {
    "MISFIRE_GRACE_SECONDS": "shardkeeper.scheduling.scheduler",
    "FireCallback": "shardkeeper.scheduling.scheduler",
    "TriggerScheduler": "shardkeeper.scheduling.scheduler",
    "build_trigger": "shardkeeper.scheduling.triggers",
    "parse_cron": "shardkeeper.scheduling.triggers",
    "resolve_time_zone": "shardkeeper.scheduling.triggers",
}


def __getattr__(name: str) -> Any:
    """Import a re-exported name from its module on first use (see the docstring)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'shardkeeper.scheduling' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
