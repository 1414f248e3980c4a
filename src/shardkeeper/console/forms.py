"""Form values to operations: the config editor, trigger parameters, history filters.

The config editor shows every editable field as the text ``shardkeeper config set``
takes (:func:`shardkeeper.ops.parse_value` reads it back), and submits only the
fields whose text changed. The result is validated as a whole before it is
written, so each error is shown next to its field (errors about several fields,
such as "give exactly one of cron and interval", go above the form).
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shardkeeper.config import JobConfig
from shardkeeper.errors import ConfigError
from shardkeeper.history import HistoryQuery, parse_since
from shardkeeper.ops import parse_value

__all__ = [
    "EDITABLE",
    "WHOLE",
    "ConfigField",
    "config_fields",
    "form_changes",
    "history_query",
    "item_page",
    "parse_params",
    "validate_changes",
]

#: fields the editor leaves alone: the name cannot change, the runtime sets job_class
_FIXED = {"name", "job_class"}
EDITABLE = tuple(f for f in JobConfig.model_fields if f not in _FIXED)
#: the key of errors that concern the config as a whole
WHOLE = "_config"
MAX_HISTORY_ROWS = 500


def _optional(key: str) -> bool:
    annotation = JobConfig.model_fields[key].annotation
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


@dataclass(frozen=True)
class ConfigField:
    """One row of the editor: the field, its text, its help and its error."""

    name: str
    text: str
    help: str
    kind: str  # "bool" (a select) or "text"
    error: str | None = None


def field_text(key: str, value: Any) -> str:
    """A stored value as the editor shows it."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    plain = isinstance(value, Mapping) and not any("," in str(v) for v in value.values())
    if key == "sharding_item_parameters" and isinstance(value, Mapping) and plain:
        return ",".join(f"{k}={v}" for k, v in value.items())
    return json.dumps(value, ensure_ascii=False)


def config_fields(
    data: Mapping[str, Any],
    *,
    submitted: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
) -> list[ConfigField]:
    """The editor's rows for stored ``data`` (with what was submitted, on an error)."""
    rows = []
    for key in EDITABLE:
        info = JobConfig.model_fields[key]
        text = field_text(key, data.get(key, info.default if not info.is_required() else None))
        if submitted is not None and key in submitted:
            text = submitted[key]
        kind = "bool" if info.annotation is bool else "text"
        rows.append(ConfigField(key, text, info.description or "", kind, (errors or {}).get(key)))
    return rows


def form_changes(data: Mapping[str, Any], submitted: Mapping[str, str]) -> dict[str, Any]:
    """The fields whose submitted text differs from the stored value's text, parsed."""
    changes: dict[str, Any] = {}
    for key in EDITABLE:
        if key not in submitted:
            continue
        info = JobConfig.model_fields[key]
        stored = field_text(key, data.get(key, None if info.is_required() else info.default))
        text = submitted[key].strip() if key != "job_parameter" else submitted[key]
        if text == stored:
            continue
        changes[key] = None if text == "" and _optional(key) else parse_value(key, text)
    return changes


def validate_changes(data: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, str]:
    """Errors (field -> message, :data:`WHOLE` for the config as a whole) of applying
    ``changes`` to the stored ``data``; empty when the result is valid."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        return {
            WHOLE: f"field(s) {', '.join(unknown)} cannot be edited; editable: "
            f"{', '.join(EDITABLE)}"
        }
    merged = {k: v for k, v in data.items() if k in JobConfig.model_fields}
    merged.update(changes)
    try:
        # model_validate, not JobConfig(...): the per-field errors, not one line
        JobConfig.model_validate(merged)
    except ValidationError as exc:
        errors: dict[str, str] = {}
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else WHOLE
            if key not in JobConfig.model_fields:
                key = WHOLE
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] != "value_error":  # pydantic's own messages do not quote the value
                msg = f"{err.get('input')!r}: {msg}"
            errors[key] = f"{errors[key]}; {msg}" if key in errors else msg
        return errors
    except ConfigError as exc:  # a validator that raises our own error type
        return {WHOLE: str(exc)}
    return {}


def parse_params(text: str) -> dict[str, str]:
    """Trigger parameters from the form: one ``name=value`` per line (blank lines
    ignored); ConfigError naming the bad line."""
    params: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, eq, value = line.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"parameter line {n} {line.strip()!r} is not name=value")
        if name.strip() in params:
            raise ConfigError(f"parameter {name.strip()!r} is given twice")
        params[name.strip()] = value.strip()
    return params


#: items per page of a job page's item table (and the REST API's default page)
ITEM_PAGE = 100
#: the largest page of items a request may ask for
MAX_ITEM_PAGE = 1000


def item_page(filters: Mapping[str, str], *, default: int = ITEM_PAGE) -> tuple[int, int]:
    """``(offset, limit)`` of the item table from ``items_offset`` and
    ``items_limit``; ConfigError naming a bad one and what is valid."""
    offset_text = filters.get("items_offset", "").strip() or "0"
    limit_text = filters.get("items_limit", "").strip() or str(default)
    if not offset_text.isdigit():
        raise ConfigError(f"items_offset {offset_text!r} is not a whole number >= 0")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_ITEM_PAGE:
        raise ConfigError(
            f"items_limit {limit_text!r} is not a number of items from 1 to {MAX_ITEM_PAGE}"
        )
    return int(offset_text), int(limit_text)


def history_query(job: str, filters: Mapping[str, str]) -> HistoryQuery:
    """The history query of the job page's filters (``item``, ``instance``,
    ``failed``, ``since``, ``limit``, ``execution``); ConfigError naming a bad one."""
    item_text = filters.get("item", "").strip()
    if item_text and not item_text.isdigit():
        raise ConfigError(f"item filter {item_text!r} is not a whole number >= 0")
    limit_text = filters.get("limit", "").strip() or "50"
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_HISTORY_ROWS:
        raise ConfigError(
            f"limit {limit_text!r} is not a number of rows from 1 to {MAX_HISTORY_ROWS}"
        )
    since = filters.get("since", "").strip()
    return HistoryQuery(
        job=job,
        item=int(item_text) if item_text else None,
        instance=filters.get("instance", "").strip() or None,
        failed_only=filters.get("failed", "") in ("1", "on", "true"),
        since=parse_since(since) if since else None,
        execution_id=filters.get("execution", "").strip() or None,
        limit=int(limit_text),
    )
