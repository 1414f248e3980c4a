"""``shardkeeper audit``: the operators' audit trail; and :func:`audited`, through
which every write command acts (so each is recorded).

The CLI's actor is the OS user and the host (``alice@laptop``). Entries go to the
registry's trail, and also to the history database when ``SHARDKEEPER_HISTORY_URL``
is set (and not ``off``): a URL set on purpose is the deployment's database, where
the default file would only be this machine's. An entry that cannot be written is a
``warning:`` line on stderr; the command's action and exit code stand.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from shardkeeper._imports import needs_extra
from shardkeeper.cli.common import JsonOpt, RegistryOpt, app, connect
from shardkeeper.cli.render import emit_json, fmt_time, new_table, out

if TYPE_CHECKING:
    from shardkeeper.ops.audit import AuditEntry, AuditSink
    from shardkeeper.ops.audited import AuditedOperations
    from shardkeeper.registry.base import CoordinationStore

__all__ = ["audit", "audited", "history_sinks", "record_done"]

#: the history URL's environment variable (shardkeeper.history.url.ENV_VAR, written out
#: so that a write command does not import SQLAlchemy when it is unset)
HISTORY_ENV = "SHARDKEEPER_HISTORY_URL"


def history_sinks() -> list[AuditSink]:
    """The history database's audit table when ``SHARDKEEPER_HISTORY_URL`` is set (and
    not ``off``), else nothing. A bad URL or a missing extra is an error before any
    action: the operator asked for a database trail and must not act without it."""
    value = os.environ.get(HISTORY_ENV, "").strip()
    if not value or value.lower() == "off":
        return []
    with needs_extra("history", f"{HISTORY_ENV} (the audit trail in the history database)"):
        from shardkeeper.history.audit import AuditTable

    return [AuditTable(value)]


@contextmanager
def _recording(store: CoordinationStore, extra: list[AuditSink]) -> Iterator[AuditedOperations]:
    from shardkeeper.ops import Operations
    from shardkeeper.ops.audit import cli_actor
    from shardkeeper.ops.auditlog import RegistryAuditLog

    writer = Operations(store).audited(cli_actor(), [RegistryAuditLog(store), *extra])
    try:
        yield writer
    finally:
        for warning in writer.warnings:
            sys.stderr.write(f"warning: {warning}\n")
        for sink in extra:
            close = getattr(sink, "close", None)
            if close is not None:
                close()


@contextmanager
def audited(registry: str | None) -> Iterator[AuditedOperations]:
    """The writes of the registry's operations made by this process's user, each
    recorded; warnings about entries not written are printed on stderr at the end."""
    extra = history_sinks()
    with connect(registry) as ops, _recording(ops.store, extra) as writer:
        yield writer


def record_done(store: CoordinationStore, action: str, details: dict[str, object]) -> None:
    """Record ``action``, done by this process's user on ``store``'s namespace with a
    store of its own (``registry fix-acl``); a warning on stderr if it cannot be."""
    from shardkeeper.errors import ConfigError

    try:
        extra = history_sinks()
    except ConfigError as exc:  # the action is done: say so, do not fail it
        sys.stderr.write(f"warning: the audit entry is not written to the database: {exc}\n")
        extra = []
    with _recording(store, extra) as writer:
        writer.record(action, details=details)


def _details(entry: AuditEntry) -> str:
    details = dict(entry.details)
    changes = details.pop("changes", None)
    parts = []
    if isinstance(changes, dict):
        for key, pair in changes.items():
            before = json.dumps(pair.get("before"), ensure_ascii=False)
            after = json.dumps(pair.get("after"), ensure_ascii=False)
            parts.append(f"{key}: {before} -> {after}")
    parts.extend(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in details.items())
    if entry.error:
        parts.append(entry.error)
    return "; ".join(parts) or "-"


@app.command()
def audit(
    name: Annotated[
        str | None, typer.Argument(metavar="JOB", help="Only this job (also a removed one).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="DURATION_OR_TIME",
            help="Only entries since: 30s, 15m, 1h, 2d, 1w, or a time (2026-01-05T12:00Z).",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many entries.")] = 100,
    history_url: Annotated[
        str | None,
        typer.Option(
            "--history-url",
            metavar="URL",
            help="Read the history database's full trail instead of the registry's newest "
            "200 per job (this namespace's entries).",
        ),
    ] = None,
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Operator actions (who did what to which job, item or instance, and how it
    ended), newest first. Read-only: no tool edits or deletes entries."""
    from shardkeeper.ops.audit import parse_since

    start = parse_since(since) if since is not None else None
    if history_url is not None:
        # a missing extra is said before the store is asked (exit 2 whatever its state)
        with needs_extra("history", "shardkeeper audit --history-url"):
            from shardkeeper.history.audit import AuditTable
    with connect(registry) as ops:
        if history_url is None:
            entries, source = ops.audit(name, since=start, limit=limit), "registry"
        else:
            table = AuditTable(history_url)
            try:
                entries = table.read(ops.store.namespace, name, since=start, limit=limit)
                source = table.describe()
            finally:
                table.close()
    if as_json:
        emit_json(
            {
                "job": name,
                "since": start,
                "source": source,
                "entries": [e.to_dict() for e in entries],
            }
        )
        return
    if not entries:
        what = f"job {name!r}" if name else "this namespace"
        out.print(f"no audit entries for {what} in {source}", markup=False)
        return
    table_out = new_table("AT", "WHO", "VIA", "ACTION", "TARGET", "OUTCOME", "DETAILS")
    for e in entries:
        who = e.who if not e.host or e.via == "cli" else f"{e.who} ({e.host})"
        cells = (fmt_time(e.at), who, e.via, e.action, e.target, e.outcome, _details(e))
        # Text: a value such as ["a"] is data, never Rich markup
        table_out.add_row(*(Text(c) for c in cells))
    out.print(table_out)
