"""When to fire: the adapter around APScheduler (the only module that imports it)."""

from shardkeeper.scheduling.scheduler import (
    MISFIRE_GRACE_SECONDS,
    FireCallback,
    TriggerScheduler,
    build_trigger,
    parse_cron,
    resolve_time_zone,
)

__all__ = [
    "MISFIRE_GRACE_SECONDS",
    "FireCallback",
    "TriggerScheduler",
    "build_trigger",
    "parse_cron",
    "resolve_time_zone",
]
