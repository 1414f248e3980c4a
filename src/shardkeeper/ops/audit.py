"""The audit trail's vocabulary: who did what to which target, when, and how it ended.

An :class:`AuditEntry` is one operator action made through the CLI, the console or the
REST API (see :class:`~shardkeeper.ops.audited.AuditedOperations`). Its JSON form
(:meth:`AuditEntry.to_dict`) is what the registry keeps, what the history database
stores in columns, and what ``shardkeeper audit --json`` and ``GET /api/audit`` print
(docs/cli.md). An :class:`AuditSink` is where entries go: the registry's bounded list
(:mod:`shardkeeper.ops.auditlog`) always, the history database when one is configured
(:mod:`shardkeeper.history.audit`).

Also here: :func:`parse_since` (``--since`` as a duration or a time) and
:func:`config_changes` (the before and after of a config edit, secrets masked).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from shardkeeper.config.secrets import mask_value
from shardkeeper.errors import ConfigError

__all__ = [
    "ACTIONS",
    "OUTCOMES",
    "Actor",
    "AuditEntry",
    "AuditSink",
    "cli_actor",
    "config_changes",
    "new_entry_id",
    "parse_since",
    "shown",
]

#: every action the tools record (the ``action`` of an entry)
ACTIONS = (
    "trigger",
    "disable-job",
    "enable-job",
    "disable-item",
    "enable-item",
    "disable-instance",
    "enable-instance",
    "shutdown",
    "remove-job",
    "config-set",
    "config-replace",
    "fix-acl",
)
#: ``ok``: done; ``refused``: the state forbade it (nothing changed); ``failed``: an
#: error after the request was sent (e.g. a timeout: the change may or may not be made)
OUTCOMES = ("ok", "refused", "failed")

#: the longest text kept of one value of an entry (a config's props or parameters may
#: be large; an entry must stay far below the stores' node size limits)
MAX_VALUE_CHARS = 1000


@dataclass(frozen=True)
class Actor:
    """Who acts: ``name`` (a console user, an API token's name, or ``user@host`` for
    the CLI), ``via`` (``cli``, ``console``, ``api`` or ``library``) and ``host`` (the
    CLI's host, or the address a console request came from)."""

    name: str
    via: str
    host: str = ""


def cli_actor() -> Actor:
    """The actor of a command run by this process: the OS user and the host."""
    host = socket.gethostname().split(".")[0] or "host"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        user = f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return Actor(f"{user}@{host}", "cli", host)


def new_entry_id(at: float) -> str:
    """A node name for an entry made at ``at``: microseconds since the epoch, zero
    padded so that names sort by time, and a random suffix so that two entries of one
    microsecond never collide."""
    return f"{int(at * 1_000_000):017d}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class AuditEntry:
    """One recorded operator action (see the module docstring).

    ``job``, ``item`` and ``instance`` name the target (None when not concerned);
    ``error`` says why an action was refused or failed; ``details`` holds what else
    the action was given or did: trigger ``params``, config ``changes`` (field ->
    ``{"before": ..., "after": ...}``), ``force``, the ``jobs`` an instance switch
    concerned, the instances a removal left running (``members``)."""

    id: str
    at: float
    who: str
    via: str
    host: str
    action: str
    outcome: str
    job: str | None = None
    item: int | None = None
    instance: str | None = None
    error: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    namespace: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the schema of ``shardkeeper audit --json``)."""
        return asdict(self)

    def encode(self) -> bytes:
        """The value of the entry's registry node."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditEntry:
        """An entry from :meth:`to_dict` data; ConfigError when it is not one."""
        try:
            item = data.get("item")
            return cls(
                id=str(data["id"]),
                at=float(data["at"]),
                who=str(data["who"]),
                via=str(data["via"]),
                host=str(data.get("host") or ""),
                action=str(data["action"]),
                outcome=str(data["outcome"]),
                job=None if data.get("job") is None else str(data["job"]),
                item=None if item is None else int(item),
                instance=None if data.get("instance") is None else str(data["instance"]),
                error=str(data.get("error") or ""),
                details=dict(data.get("details") or {}),
                namespace=str(data.get("namespace") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not an audit entry: {exc}") from None

    @classmethod
    def decode(cls, raw: bytes) -> AuditEntry:
        """An entry from a registry node's value; ConfigError when it is not one."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"not an audit entry: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError("not an audit entry: not a JSON object")
        return cls.from_dict(data)

    @property
    def target(self) -> str:
        """The target in words: ``job x``, ``item 3 of x``, ``instance i`` (of a job)."""
        if self.item is not None:
            return f"item {self.item} of {self.job}"
        if self.instance is not None:
            return f"instance {self.instance}" + (f" in {self.job}" if self.job else "")
        if self.job is not None:
            return f"job {self.job}"
        return f"namespace {self.namespace}" if self.namespace else "namespace"


class AuditSink(Protocol):
    """Where entries are written. ``write`` raises on failure; the caller decides
    what a failure means (the operator's action is already done: a warning)."""

    def write(self, entry: AuditEntry) -> None:
        """Store ``entry``."""


# ---- values of an entry ------------------------------------------------------------


def shown(name: str, value: Any) -> Any:
    """``value`` of field ``name`` as an entry keeps it: a secret field masked as every
    view masks it (a literal webhook URL as ``https://host/***``; an ``env:``/``file:``
    reference as it is), long text cut to :data:`MAX_VALUE_CHARS` (marked with an
    ellipsis and the full length). Viewers read the trail: it never holds a secret."""
    if value is None:
        return None
    value = mask_value(name, value)
    text = json.dumps(value, default=str, sort_keys=True)
    if len(text) <= MAX_VALUE_CHARS:
        # round-tripped so that tuples, datetimes and int keys read back as they are stored
        return json.loads(text)
    return f"{text[:MAX_VALUE_CHARS]}... ({len(text)} characters)"


def config_changes(
    before: dict[str, Any] | None, after: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The fields that differ, each as ``{"before": ..., "after": ...}`` (values as
    :func:`shown` keeps them). ``before`` None (an unreadable stored config): every
    field, each with before null."""
    old = before or {}
    return {
        key: {"before": shown(key, old.get(key)), "after": shown(key, after.get(key))}
        for key in sorted(set(old) | set(after))
        if before is None or old.get(key) != after.get(key)
    }


# ---- --since ---------------------------------------------------------------------------

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)


def parse_since(text: str, *, now: float | None = None) -> float:
    """The epoch time ``text`` stands for: a duration back from ``now`` (``30s``,
    ``15m``, ``1h``, ``2d``, ``1w``) or an ISO 8601 date or time (``2026-01-05``,
    ``2026-01-05T12:00``, ``2026-01-05T12:00:00+01:00``; without a zone it is UTC).
    ConfigError naming the value and what is valid otherwise."""
    match = _DURATION.match(text)
    if match and float(match.group(1)) > 0:
        seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
        return (time.time() if now is None else now) - seconds
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        pass
    else:
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    raise ConfigError(
        f"--since {text!r} is not valid: give a positive duration (a number and a unit "
        "s, m, h, d or w: 30s, 15m, 1h, 2d, 1w) or an ISO 8601 date or time "
        "(2026-01-05, 2026-01-05T12:00:00Z; UTC when no zone is given)"
    )
