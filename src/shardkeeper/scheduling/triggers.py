"""Cron parsing and trigger building: when a job fires, with no scheduler attached.

Pure functions over APScheduler 3's trigger classes: the configuration validates cron
expressions and time zones with them, the operators' view computes next fire times,
and :mod:`shardkeeper.scheduling.scheduler` arms them. Nothing here starts a thread or
touches the registry.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from shardkeeper.errors import JobConfigError

if TYPE_CHECKING:
    from shardkeeper.config import JobConfig

__all__ = ["OnceTrigger", "build_trigger", "parse_cron", "resolve_time_zone"]

_DOW_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_DOW_TOKEN = re.compile(r"^(?:[0-7]|sun|mon|tue|wed|thu|fri|sat)$", re.IGNORECASE)
_CRON_FIELDS_5 = "minute hour day-of-month month day-of-week"
_CRON_FIELDS_6 = "second minute hour day-of-month month day-of-week"


def resolve_time_zone(name: str | tzinfo) -> tzinfo:
    """The time zone named ``name`` (an IANA name such as ``Europe/Paris``, or ``UTC``).

    Raises :class:`~shardkeeper.errors.JobConfigError` naming the value when unknown.
    """
    if isinstance(name, tzinfo):
        return name
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise JobConfigError(
            f"unknown time zone {name!r}; give an IANA name such as 'UTC' or 'Europe/Paris'"
        ) from None


def _dow_value(token: str, expr: str) -> int:
    if not _DOW_TOKEN.match(token):
        raise JobConfigError(
            f"invalid cron expression {expr!r}: day-of-week value {token!r} is not valid; "
            "use 0-7 (0 and 7 are Sunday) or sun, mon, tue, wed, thu, fri, sat"
        )
    if token.isdigit():
        return int(token)
    return _DOW_NAMES[token.lower()]


def _translate_day_of_week(field: str, expr: str) -> str:
    """Standard cron day-of-week (0/7 = Sunday) to APScheduler 3's (0 = Monday)."""
    if field == "*":
        return "*"
    days: set[int] = set()
    for part in field.split(","):
        base, slash, step_s = part.partition("/")
        step = 1
        if slash:
            if not step_s.isdigit() or int(step_s) == 0:
                raise JobConfigError(
                    f"invalid cron expression {expr!r}: step {step_s!r} in day-of-week "
                    f"{part!r} must be a whole number > 0"
                )
            step = int(step_s)
        if base == "*":
            first, last = 0, 6
        elif "-" in base:
            lo, _, hi = base.partition("-")
            first, last = _dow_value(lo, expr), _dow_value(hi, expr)
            if first > last:
                raise JobConfigError(
                    f"invalid cron expression {expr!r}: day-of-week range {base!r} runs "
                    "backwards; ranges go from Sunday (0) to Saturday (6) or Sunday (7)"
                )
        else:
            first = _dow_value(base, expr)
            # "a/n" means "from a to the end of the week, every n days", as in cronie.
            last = 6 if slash else first
        days.update(d % 7 for d in range(first, last + 1, step))
    # APScheduler 3 numbers Monday 0 .. Sunday 6 (its documented historical mistake).
    return ",".join(str((d - 1) % 7) for d in sorted(days, key=lambda d: (d - 1) % 7))


def parse_cron(expr: str, tz: str | tzinfo = "UTC") -> Any:
    """An APScheduler ``CronTrigger`` for a 5- or 6-field cron expression in ``tz``.

    Five fields are ``minute hour day-of-month month day-of-week`` (the trigger fires at
    second 0); six fields put ``second`` first, as Quartz/ElasticJob expressions do.
    Day of week follows standard cron: 0 and 7 are Sunday, or the names sun..sat.
    ``?`` (Quartz's "no specific value") is accepted in the day fields as ``*``.
    Restricting both day-of-month and day-of-week is refused, because cron ORs them
    and APScheduler would AND them: give ``*`` (or ``?``) in one of the two.

    Raises :class:`~shardkeeper.errors.JobConfigError` naming the expression and the
    problem.

    The trigger is shared: equal arguments give the same object, which APScheduler
    only reads (a ``CronTrigger`` is not changed by computing fire times). Jobs of one
    process tend to share a few expressions, and building one costs about 0.1 ms,
    which was a tenth of a 5,000-job start-up (each expression is parsed when the
    config is checked and again when the job is scheduled).
    """
    if not isinstance(expr, str):
        raise JobConfigError(f"cron expression must be a string, got {expr!r}")
    return _parse_cron(expr, tz)


@functools.lru_cache(maxsize=1024)
def _parse_cron(expr: str, tz: str | tzinfo) -> Any:
    fields = expr.split()
    if len(fields) == 5:
        second, (minute, hour, day, month, dow) = "0", fields
    elif len(fields) == 6:
        second, minute, hour, day, month, dow = fields
    else:
        raise JobConfigError(
            f"invalid cron expression {expr!r}: it has {len(fields)} fields; expected 5 "
            f"({_CRON_FIELDS_5}) or 6 ({_CRON_FIELDS_6})"
        )
    day = "*" if day == "?" else day
    dow = "*" if dow == "?" else dow
    if day != "*" and dow != "*":
        raise JobConfigError(
            f"invalid cron expression {expr!r}: it restricts both day-of-month ({day!r}) "
            f"and day-of-week ({dow!r}); give '*' or '?' in one of them"
        )
    zone = resolve_time_zone(tz)
    day_of_week = _translate_day_of_week(dow, expr)
    try:
        trigger = CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=day_of_week,
            timezone=zone,
        )
    except ValueError as exc:
        raise JobConfigError(f"invalid cron expression {expr!r}: {exc}") from None
    # A date that does not exist (30 February, 31 April) is valid syntax but would
    # leave the job registered and never run: refuse it now, with the reason.
    if trigger.get_next_fire_time(None, datetime.now(zone)) is None:
        raise JobConfigError(
            f"invalid cron expression {expr!r}: it can never fire (no calendar date "
            f"matches day-of-month {day!r} in month {month!r})"
        )
    return trigger


class OnceTrigger(BaseTrigger):  # type: ignore[misc]
    """Fires once at ``run_date``, and only while that time is still ahead.

    Unlike APScheduler's ``DateTrigger`` it never reports a time that has passed: a
    one-off job whose time went by while no instance was up is run by the leader's
    catch-up (runtime/runner/oneoff.py), with a fire time every instance agrees on, instead
    of each instance firing it late on its own. So "when does it fire next" is None
    once the time has passed, which is also what status pages and health show.
    """

    __slots__ = ("run_date", "timezone")

    def __init__(self, run_date: datetime) -> None:
        self.run_date = run_date
        self.timezone = run_date.tzinfo or UTC

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        """``run_date`` before it has fired and while ``now`` is not past it."""
        if previous_fire_time is None and now <= self.run_date:
            return self.run_date
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {"version": 1, "run_date": self.run_date}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.run_date = state["run_date"]
        self.timezone = self.run_date.tzinfo or UTC

    def __str__(self) -> str:
        return f"once[{self.run_date.isoformat()}]"


def build_trigger(config: JobConfig) -> Any:
    """The APScheduler trigger for ``config``: its cron expression, its interval, or
    its one-off time (:class:`OnceTrigger`)."""
    if config.cron is not None:
        return parse_cron(config.cron, config.time_zone)
    if config.at is not None:
        return OnceTrigger(config.at)
    if config.interval is None:  # JobConfig guarantees one of the three
        raise JobConfigError(f"job {config.name!r} has none of cron, interval and at")
    # Anchor interval triggers at the Unix epoch so that every instance of the job
    # fires at the same scheduled times (k * interval): the instances then agree on
    # what "the next trigger" is, as they do for a cron expression.
    tz = resolve_time_zone(config.time_zone)
    return IntervalTrigger(
        seconds=config.interval, start_date=datetime.fromtimestamp(0, tz), timezone=tz
    )
