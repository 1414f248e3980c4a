"""Field checks of a job configuration that need no model: limits, names, item
parameters, plug-in names and the trigger fields (``cron``, ``interval``, ``at``).

Each check returns the normalised value or raises ``ValueError`` (pydantic turns it
into a field error) or :class:`~shardkeeper.errors.JobConfigError` naming the bad
value and what would be valid.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from shardkeeper._imports import is_import_path
from shardkeeper.errors import JobConfigError
from shardkeeper.scheduling.triggers import parse_cron

__all__ = [
    "BUILTIN_ERROR_HANDLER_NAMES",
    "BUILTIN_STRATEGY_NAMES",
    "MAX_SHARDING_TOTAL_COUNT",
    "MIN_INTERVAL_SECONDS",
    "check_at",
    "check_cron",
    "check_interval",
    "check_one_trigger",
    "check_plugin",
    "parse_item_parameters",
    "scalar_to_str",
]

MAX_SHARDING_TOTAL_COUNT = 100_000
"""The largest sharding_total_count: each item is a node in the registry, and the
assignment of every item must fit one store value (see
:func:`~shardkeeper.coordination.assignment_codec.worst_case_bytes`: at this count,
over 1,000 instances, it is about 670 kB for every strategy, under the 900 kB limit)."""

MIN_INTERVAL_SECONDS = 0.1
"""The shortest interval: every fire costs a few store round trips (milliseconds) per
instance, and the scheduler cannot represent intervals below a microsecond at all."""

BUILTIN_STRATEGY_NAMES = ("average", "odevity", "round_robin")
"""Sharding strategies selectable by name (see shardkeeper.coordination.strategies)."""

BUILTIN_ERROR_HANDLER_NAMES = ("log", "ignore", "raise", "webhook", "email")
"""Error handlers selectable by name (see shardkeeper.errorhandlers)."""

_ITEM_KEY = re.compile(r"^[0-9]+$")
_PARAMS_EXAMPLE = "'0=Beijing,1=Shanghai'"
_AT_EXAMPLE = "'2026-12-01T12:00:00Z' or '2026-12-01T13:00:00+01:00'"


def parse_item_parameters(text: str) -> dict[int, str]:
    """Parse ElasticJob's ``"0=a,1=b"`` item parameter string into ``{0: "a", 1: "b"}``.

    Whitespace around entries, items and values is ignored, a value may contain ``=``
    but not ``,`` (use the mapping form for that), and the empty string means no
    parameters. Raises :class:`~shardkeeper.errors.JobConfigError` naming the bad
    entry for an entry without ``=``, an item that is not a whole number >= 0, or an
    item given twice.
    """
    result: dict[int, str] = {}
    if not text.strip():
        return result
    for entry in text.split(","):
        key, eq, value = entry.partition("=")
        key = key.strip()
        if not eq:
            raise JobConfigError(
                f"sharding_item_parameters {text!r}: entry {entry.strip()!r} is not "
                f"'item=value'; expected e.g. {_PARAMS_EXAMPLE}"
            )
        if not _ITEM_KEY.match(key):
            raise JobConfigError(
                f"sharding_item_parameters {text!r}: item {key!r} in entry "
                f"{entry.strip()!r} is not a whole number >= 0; expected e.g. {_PARAMS_EXAMPLE}"
            )
        item = int(key)
        if item in result:
            raise JobConfigError(f"sharding_item_parameters {text!r}: item {item} is given twice")
        result[item] = value.strip()
    return result


def scalar_to_str(value: Any) -> Any:
    """A number or boolean from a file as the text the user wrote (other values as
    they are): YAML and TOML turn ``retries: 3`` into an int, but a parameter is text
    to the job."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def check_plugin(value: str, what: str, builtin: tuple[str, ...]) -> str:
    """``value`` when it is a built-in name or an import path; ValueError otherwise."""
    if value in builtin or is_import_path(value):
        return value
    raise ValueError(
        f"unknown {what} {value!r}; valid choices are {', '.join(builtin)}, "
        "or an import path 'package.module:attr'"
    )


# -- trigger fields -------------------------------------------------------------------


def check_cron(value: str | None) -> str | None:
    """The cron expression with its whitespace normalised (None stays None)."""
    if value is None:
        return None
    normalised = " ".join(value.split())
    # Syntax does not depend on the zone; the zone is checked on its own field.
    parse_cron(normalised, "UTC")
    return normalised


def check_interval(value: float | None) -> float | None:
    """The interval when it is at least :data:`MIN_INTERVAL_SECONDS`."""
    if value is not None and value < MIN_INTERVAL_SECONDS:
        raise ValueError(
            f"interval {value!r} is too short; give at least {MIN_INTERVAL_SECONDS:g} "
            "seconds (each fire costs store round trips), or a cron expression"
        )
    return value


def check_at(value: Any) -> Any:
    """The one-off fire time as an aware UTC datetime (before pydantic's own parsing).

    Accepts an aware ``datetime`` or ISO 8601 text with a zone (``Z`` or an offset).
    A time without a zone is refused rather than guessed: a one-off job fires exactly
    once, so an hour's ambiguity (which zone? which side of a DST change?) is not
    worth the convenience.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | datetime):
        raise ValueError(
            f"at={value!r} is not a date and time; expected ISO 8601 text with a zone, "
            f"e.g. {_AT_EXAMPLE}"
        )
    if isinstance(value, str):
        text = value.strip()
        try:
            # fromisoformat takes "Z" from Python 3.11 on
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"at={value!r} is not an ISO 8601 date and time; expected e.g. {_AT_EXAMPLE}"
            ) from None
    else:
        parsed = value
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError(
            f"at={value!r} has no time zone; give one explicitly (times without a zone "
            f"are not guessed), e.g. {_AT_EXAMPLE}"
        )
    return parsed.astimezone(UTC)


def check_one_trigger(cron: str | None, interval: float | None, at: datetime | None) -> None:
    """ValueError unless exactly one of ``cron``, ``interval`` and ``at`` is given."""
    given = [n for n, v in (("cron", cron), ("interval", interval), ("at", at)) if v is not None]
    if len(given) != 1:
        got = {0: "neither", 2: "both " + " and ".join(given), 3: "all three"}[len(given)]
        raise ValueError(
            f"give exactly one of cron, interval and at (got {got}): cron for a calendar "
            "schedule, interval for a fixed number of seconds, at for a one-off job that "
            "runs once at that time"
        )
