"""Turning ``key=value`` text (``shardkeeper config set``) into config changes.

A shell gives every value as text, while JobConfig fields are numbers, booleans,
mappings and lists. Text fields keep the text exactly as typed (so
``job_parameter=007`` stays ``"007"``); ``null`` clears an optional field (to
switch ``cron`` to ``interval`` in one edit); other fields take a JSON value when the
text is one (``props={"a": "b"}``, ``listeners=["m:L"]``) and otherwise the text, which
JobConfig's own validation then converts or rejects with a message that names the
field (``failover=yes``, ``sharding_item_parameters=0=a,1=b``).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable
from typing import Any

from shardkeeper.config import JobConfig
from shardkeeper.errors import ConfigError

__all__ = ["parse_assignments", "parse_value"]


def _is_text(annotation: Any) -> tuple[bool, bool]:
    """(is a text field, is optional) for a field annotation."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return str in args and all(a in (str, type(None)) for a in args), type(None) in args
    return annotation is str, False


def parse_value(key: str, text: str) -> Any:
    """The value for field ``key`` given as ``text`` on a command line."""
    info = JobConfig.model_fields.get(key)
    if info is None:
        # Unknown field: JobConfig reports it, with a "did you mean".
        return text
    is_text, optional = _is_text(info.annotation)
    if optional and text.strip().lower() in ("null", "none"):
        return None
    if is_text:
        return text
    if key == "listeners" and not text.lstrip().startswith("["):
        return tuple(p.strip() for p in text.split(",") if p.strip())
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_assignments(pairs: Iterable[str]) -> dict[str, Any]:
    """``["key=value", ...]`` -> ``{key: value}``; ConfigError for an entry without ``=``
    or a key given twice."""
    changes: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{pair!r} is not key=value (e.g. sharding_total_count=4)")
        if key in changes:
            raise ConfigError(f"{key!r} is given twice")
        changes[key] = parse_value(key, text)
    if not changes:
        raise ConfigError("nothing to change: give at least one key=value")
    return changes
