"""The :class:`JobConfig` model: every field, its checks, and the JSON form stored
in the registry (the package docstring, :mod:`shardkeeper.config`, says how to
build one)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shardkeeper._imports import is_import_path
from shardkeeper.errors import JobConfigError
from shardkeeper.limits import ASSIGNMENT_MAX_BYTES, CHECKPOINT_DEFAULT_BYTES, CHECKPOINT_MAX_BYTES
from shardkeeper.scheduling.triggers import resolve_time_zone
from shardkeeper.secretref import check_reference, is_reference, mask_webhook_url

from .fields import (
    BUILTIN_ERROR_HANDLER_NAMES,
    BUILTIN_STRATEGY_NAMES,
    MAX_SHARDING_TOTAL_COUNT,
    MIN_INTERVAL_SECONDS,
    check_at,
    check_cron,
    check_interval,
    check_one_trigger,
    check_plugin,
    parse_item_parameters,
    scalar_to_str,
)
from .secrets import mask_value

__all__ = ["JobConfig", "build_config", "config_label", "describe_invalid", "make_job_config"]

#: where a job's items may run (runtime/execute/procpool.py runs the process executor)
EXECUTORS = ("thread", "process")

# \Z, not $: "$" also matches before a trailing newline, which is no node name.
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}\Z")
#: what an alert recipient must look like (the SMTP server has the final word)
_EMAIL = re.compile(r"^[^@\s<>,;]+@[^@\s<>,;]+\.[^@\s<>,;]+\Z")


class JobConfig(BaseModel):
    """The complete, validated configuration of one sharded job (immutable).

    Exactly one of ``cron``, ``interval`` and ``at`` is set. Defaults follow ElasticJob
    where it has the same setting; ``docs/configuration.md`` describes every field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    if not TYPE_CHECKING:
        # Hidden from type checkers, which keep the keyword signature pydantic derives
        # from the fields (dataclass_transform) and so still flag a misspelt field.

        def __init__(self, /, **data: Any) -> None:
            """Build and validate; JobConfigError (a ValueError) names every bad field.

            ``JobConfig(...)`` is what the README shows, so it is the first error most
            users meet: it reads like :meth:`parse`'s (``invalid job 'x':
            sharding_total_count=-3: Input should be greater than 0``), not like
            pydantic's raw text with its links.
            """
            try:
                super().__init__(**data)
            except ValidationError as exc:
                raise JobConfigError(describe_invalid(exc, config_label(data))) from None

        # pydantic calls a model's own __init__ from model_validate and from the
        # validation of a model holding a JobConfig too, and turns what it raises into
        # one opaque value_error; marked as the base initializer, validation keeps
        # pydantic's per-field errors (build_config and the console form read them)
        # and only a direct call comes here.
        __init__.__pydantic_base_init__ = True

    name: str = Field(description="Unique job name: 1-100 of [A-Za-z0-9._-].")
    cron: str | None = Field(
        default=None, description="5-field cron, or 6 fields with seconds first."
    )
    interval: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description=f"Seconds between fires, >= {MIN_INTERVAL_SECONDS:g}.",
    )
    at: datetime | None = Field(
        default=None,
        description="One-off job: the single fire time (ISO 8601 with a zone; kept as UTC).",
    )
    time_zone: str = Field(default="UTC", description="IANA time zone of the cron expression.")
    sharding_total_count: int = Field(gt=0, description="Number of items, 0..count-1.")
    sharding_item_parameters: dict[int, str] = Field(
        default_factory=dict, description="Parameter per item; also '0=a,1=b'."
    )
    job_parameter: str = Field(default="", description="Parameter shared by all items.")
    monitor_execution: bool = Field(default=True, description="Track running items.")
    failover: bool = Field(default=False, description="Take over a dead instance's items.")
    misfire: bool = Field(default=True, description="Re-run items whose fire was missed.")
    max_time_diff_seconds: int = Field(
        default=-1, description="Max clock skew against the store; -1 = no check."
    )
    reconcile_interval: float = Field(
        default=600.0, ge=0, allow_inf_nan=False, description="Seconds; 0 = off."
    )
    sharding_strategy: str = Field(
        default="average", description="average, odevity, round_robin or an import path."
    )
    error_handler: str = Field(
        default="log", description="log, ignore, raise, webhook, email or an import path."
    )
    alert_webhook_url: str | None = Field(
        default=None,
        description="http(s) URL the webhook error handler POSTs alerts to (a secret: "
        "or env:NAME / file:PATH).",
    )
    alert_email_to: tuple[str, ...] = Field(
        default=(), description="Recipients of the email error handler's alerts."
    )
    listeners: tuple[str, ...] = Field(default=(), description="Import paths of listeners.")
    max_threads: int = Field(
        default=0, ge=0, description="Items of this job at once per instance; 0 = no limit."
    )
    executor: str | None = Field(
        default=None,
        description="Where items run: thread (in the instance) or process (in worker "
        "processes); None = the runtime's default (thread unless set there).",
    )
    retries: int = Field(
        default=0, ge=0, le=100, description="Times a failed item is run again (same instance)."
    )
    retry_backoff: float = Field(
        default=1.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds before the first retry; doubles each time (at most 5 min).",
    )
    execution_timeout: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds an item may run before it is reported timed out; None = no limit.",
    )
    checkpoint_interval: float = Field(
        default=1.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds between two checkpoint/progress writes of an item; faster "
        "calls are coalesced (the latest is written). 0 = write every call.",
    )
    checkpoint_max_bytes: int = Field(
        default=CHECKPOINT_DEFAULT_BYTES,
        ge=1,
        le=CHECKPOINT_MAX_BYTES,
        description="Largest JSON of one ctx.checkpoint state, bytes.",
    )
    checkpoint_strict: bool = Field(
        default=False,
        description="A refused checkpoint raises CheckpointFencedError instead of returning False.",
    )
    checkpoint_carry: bool = Field(
        default=False,
        description="Hand each run the last checkpoint of the item's previous ended run "
        "(ctx.last_state: cursors across fires).",
    )
    description: str = Field(default="", description="Free text for operators.")
    props: dict[str, str] = Field(default_factory=dict, description="Free key/value settings.")
    disabled: bool = Field(default=False, description="Registered but not run.")
    overwrite: bool = Field(default=False, description="Replace the stored config at start.")
    job_class: str | None = Field(
        default=None, description="Import path of the job class (set by the runtime)."
    )
    sharding_wait_timeout: float = Field(
        default=5.0, gt=0, allow_inf_nan=False, description="Max wait for a reshard, seconds."
    )
    execution_wait_timeout: float = Field(
        default=5.0,
        gt=0,
        allow_inf_nan=False,
        description="Max wait for running items before a reshard, seconds (at most half "
        "of sharding_wait_timeout: the rest is the other instances' to start the fire).",
    )

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        # a config's repr reaches log lines and tracebacks: never a secret in it
        for name, value in super().__repr_args__():
            yield name, (mask_value(name, value) if name is not None else value)

    # -- field validators -------------------------------------------------------------

    @field_validator(
        "sharding_total_count",
        "max_time_diff_seconds",
        "max_threads",
        "retries",
        "checkpoint_max_bytes",
        mode="before",
    )
    @classmethod
    def _no_bool_for_int(cls, value: Any) -> Any:
        # pydantic would read True as 1: almost certainly a mistake in a file.
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is a boolean; expected a whole number")
        return value

    @field_validator(
        "interval",
        "reconcile_interval",
        "sharding_wait_timeout",
        "execution_wait_timeout",
        "retry_backoff",
        "execution_timeout",
        "checkpoint_interval",
        mode="before",
    )
    @classmethod
    def _no_bool_for_float(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is a boolean; expected a number of seconds")
        return value

    @field_validator("sharding_total_count")
    @classmethod
    def _check_total_count(cls, value: int) -> int:
        if value > MAX_SHARDING_TOTAL_COUNT:
            raise ValueError(
                f"sharding_total_count={value} is over the limit of "
                f"{MAX_SHARDING_TOTAL_COUNT} items: the store holds a node per running "
                f"item and the whole assignment in one value of at most "
                f"{ASSIGNMENT_MAX_BYTES} bytes"
            )
        return value

    @field_validator("interval")
    @classmethod
    def _check_interval(cls, value: float | None) -> float | None:
        return check_interval(value)

    @field_validator("at", mode="before")
    @classmethod
    def _check_at(cls, value: Any) -> Any:
        return check_at(value)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value) or value in (".", ".."):
            raise ValueError(
                f"job name {value!r} is invalid; use 1-100 characters of letters, digits, "
                "'.', '_' and '-' (not '.' or '..' alone)"
            )
        return value

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, value: str | None) -> str | None:
        return check_cron(value)

    @field_validator("time_zone")
    @classmethod
    def _check_time_zone(cls, value: str) -> str:
        resolve_time_zone(value)
        return value

    @field_validator("sharding_item_parameters", mode="before")
    @classmethod
    def _parse_item_parameters(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_item_parameters(value)
        if isinstance(value, Mapping):
            return {k: scalar_to_str(v) for k, v in value.items()}
        return value

    @field_validator("sharding_item_parameters")
    @classmethod
    def _check_item_keys(cls, value: dict[int, str]) -> dict[int, str]:
        negative = sorted(k for k in value if k < 0)
        if negative:
            raise ValueError(f"item {negative[0]} is negative; items are 0..count-1")
        return dict(sorted(value.items()))

    @field_validator("props", mode="before")
    @classmethod
    def _props_scalars(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: scalar_to_str(v) for k, v in value.items()}
        return value

    @field_validator("executor")
    @classmethod
    def _check_executor(cls, value: str | None) -> str | None:
        if value is not None and value not in EXECUTORS:
            raise ValueError(f"executor={value!r} is not one of: {', '.join(EXECUTORS)}")
        return value

    @field_validator("max_time_diff_seconds")
    @classmethod
    def _check_time_diff(cls, value: int) -> int:
        if value != -1 and value <= 0:
            raise ValueError(
                f"max_time_diff_seconds {value} is invalid; give -1 to turn the check off "
                "or a number of seconds >= 1"
            )
        return value

    @field_validator("sharding_strategy")
    @classmethod
    def _check_strategy(cls, value: str) -> str:
        return check_plugin(value, "sharding strategy", BUILTIN_STRATEGY_NAMES)

    @field_validator("error_handler")
    @classmethod
    def _check_error_handler(cls, value: str) -> str:
        return check_plugin(value, "error handler", BUILTIN_ERROR_HANDLER_NAMES)

    @field_validator("alert_webhook_url")
    @classmethod
    def _check_webhook_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        text = value.strip()
        if is_reference(text):
            # kept as written: the instance that sends an alert reads it then
            return check_reference("alert_webhook_url", text)
        parsed = urlsplit(text)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            # the value may be a secret: the message quotes its mask only
            raise ValueError(
                f"alert_webhook_url {mask_webhook_url(text)!r} is not an http(s) URL; "
                "expected e.g. 'https://hooks.example.com/services/T000/B000/XXXX', or a "
                "reference to it: 'env:NAME' or 'file:/PATH'"
            )
        return text

    @field_validator(
        "job_parameter",
        "description",
        "props",
        "sharding_item_parameters",
        "alert_webhook_url",
        "alert_email_to",
    )
    @classmethod
    def _storable_text(cls, value: Any, info: ValidationInfo) -> Any:
        # The store holds UTF-8: text with a lone surrogate (from Python code, or a
        # "\ud800" escape) was accepted here and then failed every write with a
        # UnicodeEncodeError; every reader must be able to accept what is written.
        texts = (
            [*value.keys(), *value.values()]
            if isinstance(value, Mapping)
            else list(value)
            if isinstance(value, tuple)
            else [value]
        )
        for text in texts:
            if isinstance(text, str):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    # (the value is not quoted: alert_webhook_url may be a secret)
                    raise ValueError(
                        f"{info.field_name} holds {text[exc.start : exc.end]!r} at "
                        f"character {exc.start} of a value, which is not Unicode text "
                        "(a lone surrogate): the store holds UTF-8; remove it"
                    ) from None
        return value

    @field_validator("alert_email_to", mode="before")
    @classmethod
    def _split_recipients(cls, value: Any) -> Any:
        # "a@x, b@y" in a file or on the command line means two recipients
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("alert_email_to")
    @classmethod
    def _check_recipients(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            if not _EMAIL.match(address):
                raise ValueError(
                    f"alert_email_to: {address!r} is not an email address; expected "
                    "name@domain (several: a list, or 'a@x.org, b@y.org')"
                )
        return value

    @field_validator("listeners")
    @classmethod
    def _check_listeners(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for path in value:
            if not is_import_path(path):
                raise ValueError(
                    f"listener {path!r} is not an import path; expected "
                    "'package.module:attr' or 'package.module.attr'"
                )
        return value

    @field_validator("job_class")
    @classmethod
    def _check_job_class(cls, value: str | None) -> str | None:
        if value is not None and not is_import_path(value):
            raise ValueError(
                f"job_class {value!r} is not an import path; expected "
                "'package.module:Class' or 'package.module.Class'"
            )
        return value

    # -- rules across fields ----------------------------------------------------------

    @model_validator(mode="after")
    def _check_whole(self) -> JobConfig:
        check_one_trigger(self.cron, self.interval, self.at)
        too_big = sorted(k for k in self.sharding_item_parameters if k >= self.sharding_total_count)
        if too_big:
            raise ValueError(
                f"sharding_item_parameters names item {too_big[0]}, but items are "
                f"0..{self.sharding_total_count - 1} (sharding_total_count="
                f"{self.sharding_total_count})"
            )
        if self.error_handler == "webhook" and not self.alert_webhook_url:
            raise ValueError(
                "error_handler 'webhook' needs alert_webhook_url (the URL alerts are POSTed to)"
            )
        if self.error_handler == "email" and not self.alert_email_to:
            raise ValueError(
                "error_handler 'email' needs alert_email_to (who receives the alerts); the "
                "SMTP server comes from SHARDKEEPER_SMTP_HOST/PORT/FROM"
            )
        if self.at is not None and not self.monitor_execution:
            raise ValueError(
                "at (a one-off job) needs monitor_execution=True: the job is done once "
                "every item's completion is recorded, which only monitored items are"
            )
        if self.failover and not self.monitor_execution:
            raise ValueError(
                "failover=True needs monitor_execution=True: failover finds a dead "
                "instance's items through their running marks"
            )
        return self

    # -- construction that reports JobConfigError ---------------------------------------

    @classmethod
    def parse(cls, **kwargs: Any) -> JobConfig:
        """Build and validate a config; raises JobConfigError naming every bad field."""
        return build_config(kwargs, config_label(kwargs))

    @classmethod
    def from_json(cls, data: bytes | str) -> JobConfig:
        """The config that :meth:`to_json` wrote (a ``_meta`` key, the registry
        document's writer metadata, is ignored); raises JobConfigError when invalid."""
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise JobConfigError(f"stored job config is not valid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise JobConfigError(
                f"stored job config is a JSON {type(obj).__name__}; expected an object"
            )
        # The registry document also says who wrote it (see coordination.config_service).
        obj.pop("_meta", None)
        return build_config(obj, "stored " + config_label(obj))

    def to_json(self) -> bytes:
        """Canonical UTF-8 JSON: the same config always gives the same bytes."""
        return json.dumps(
            self.model_dump(mode="json"),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        ).encode("utf-8")

    # -- reading ----------------------------------------------------------------------

    @property
    def one_off(self) -> bool:
        """Whether this is a one-off job (``at`` is set): it fires once, then is done."""
        return self.at is not None

    def item_parameter(self, item: int) -> str:
        """The parameter of ``item`` ("" when it has none); ValueError when out of range."""
        if not 0 <= item < self.sharding_total_count:
            raise ValueError(
                f"item {item} is out of range for job {self.name!r}: items are "
                f"0..{self.sharding_total_count - 1}"
            )
        return self.sharding_item_parameters.get(item, "")

    def items_without_parameters(self) -> list[int]:
        """Items that ``sharding_item_parameters`` leaves without a parameter, when it
        gives some (a job with none uses no parameters: []). After a raise of
        ``sharding_total_count`` these are usually the new items, whose
        ``ctx.item_parameter`` is then ""."""
        params = self.sharding_item_parameters
        if not params:
            return []
        return [i for i in range(self.sharding_total_count) if i not in params]

    def parameters_gap(self) -> str:
        """A warning naming the items :meth:`items_without_parameters` finds ("" when
        none): said when a count raise leaves new items without a parameter."""
        missing = self.items_without_parameters()
        if not missing:
            return ""
        given = _ranges(sorted(self.sharding_item_parameters))
        return (
            f"job {self.name!r}: item(s) {_ranges(missing)} of {self.sharding_total_count} "
            f"have no parameter (sharding_item_parameters gives items {given} only): their "
            "ctx.item_parameter is ''; set sharding_item_parameters for them too"
        )

    def describe_trigger(self) -> str:
        """A short human description such as ``cron '0 */5 * * * *' (UTC)``, ``every 30s``
        or ``once at 2026-12-01T12:00:00Z``."""
        if self.cron is not None:
            return f"cron {self.cron!r} ({self.time_zone})"
        if self.at is not None:
            return f"once at {self.at.isoformat().replace('+00:00', 'Z')}"
        assert self.interval is not None  # guaranteed by validation
        return f"every {self.interval:g}s"


def make_job_config(**kwargs: Any) -> JobConfig:
    """Same as :meth:`JobConfig.parse`: validate, raising JobConfigError when invalid."""
    return JobConfig.parse(**kwargs)


def config_label(data: Mapping[str, Any]) -> str:
    """How error messages name the job of ``data`` (``job 'name'``, or ``job``)."""
    name = data.get("name")
    return f"job {name!r}" if isinstance(name, str) and name else "job"


_FIELDS = tuple(JobConfig.model_fields)


def _describe_error(err: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    kind = err["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(loc, _FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown field {loc!r}{hint}; valid fields are {', '.join(_FIELDS)}"
    if kind == "missing":
        return f"{loc} is required"
    if not loc:
        return msg
    if kind == "value_error":
        # Our own validators' messages already quote the value (and may name the field).
        return msg if msg.startswith(loc) else f"{loc}: {msg}"
    return f"{loc}={err.get('input')!r}: {msg}"


def build_config(data: Mapping[str, Any], label: str, prefix: str = "") -> JobConfig:
    """A JobConfig of ``data``, or JobConfigError ``{prefix}invalid {label}: ...``
    listing every bad field."""
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise JobConfigError(
            f"{prefix}invalid {label}: field names must be text, got {bad_keys[0]!r}"
        )
    try:
        return JobConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise JobConfigError(prefix + describe_invalid(exc, label)) from None


def describe_invalid(exc: ValidationError, label: str) -> str:
    """``invalid {label}: ...``: every error of ``exc`` in one line, each naming its field
    and value (an unknown field with the closest valid name)."""
    details = "; ".join(_describe_error(e) for e in exc.errors())
    return f"invalid {label}: {details}"


def _ranges(items: list[int]) -> str:
    """Sorted item numbers as ranges (``0-3,7``): a count of thousands stays short."""
    parts: list[str] = []
    start = prev = items[0]
    for i in [*items[1:], -2]:
        if i != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = i
        prev = i
    return ",".join(parts)
