"""The audit trail in the console: who did what, and how the console's writes are
recorded.

* :func:`audited`: the writes of the console's operations made by a principal (a
  logged-in user, or the name of an API token or a Basic account). Every form action
  and REST write acts through it; an entry that could not be written leaves the
  action done and its warning in :func:`audit_warnings` (the forms add it to their
  message, the REST API answers it in the ``X-Shardkeeper-Audit-Warning`` header).
* ``GET /audit`` (the page) and ``GET /api/audit`` (JSON): the registry's trail, of
  one job or all, since a duration or a time. Any role reads them; nothing in the
  console edits or deletes an entry.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from shardkeeper.console.auth import Principal
from shardkeeper.console.context import context_of
from shardkeeper.console.deps import api_reader, page_principal
from shardkeeper.console.render import page
from shardkeeper.errors import ConfigError
from shardkeeper.ops.audit import Actor, AuditEntry, AuditSink, parse_since
from shardkeeper.ops.audited import AuditedOperations
from shardkeeper.ops.auditlog import RegistryAuditLog

__all__ = ["WARNING_HEADER", "audit_warnings", "audited", "router", "warning_suffix"]

router = APIRouter()
Viewer = Annotated[Principal, Depends(page_principal)]
Reader = Annotated[Principal, Depends(api_reader)]

#: the REST API's header naming an audit entry that could not be written
WARNING_HEADER = "X-Shardkeeper-Audit-Warning"
#: the most entries one page or answer shows
MAX_ROWS = 500


def audited(request: Request, principal: Principal) -> AuditedOperations:
    """The console's writes made by ``principal`` for ``request`` (kept on the
    request, so that :func:`audit_warnings` finds its warnings)."""
    ctx = context_of(request)
    via = "console" if principal.via == "session" else "api"
    host = request.client.host if request.client else ""
    sinks: list[AuditSink] = [RegistryAuditLog(ctx.ops.store)]
    if ctx.audit_db is not None:
        sinks.append(ctx.audit_db)
    writer = ctx.ops.audited(Actor(principal.name, via, host), sinks)
    request.state.audit_writer = writer
    return writer


def audit_warnings(request: Request) -> list[str]:
    """The warnings of the entries this request's writes could not record."""
    writer = getattr(request.state, "audit_writer", None)
    return list(writer.warnings) if isinstance(writer, AuditedOperations) else []


def _read(request: Request, job: str, since: str, limit: str) -> tuple[list[AuditEntry], float]:
    limit_text = limit.strip() or "100"
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_ROWS:
        raise ConfigError(f"limit {limit_text!r} is not a number of entries from 1 to {MAX_ROWS}")
    start = parse_since(since) if since.strip() else 0.0
    entries = context_of(request).ops.audit(
        job.strip() or None, since=start or None, limit=int(limit_text)
    )
    return entries, start


@router.get("/audit", response_class=HTMLResponse, include_in_schema=False)
def audit_page(
    request: Request, principal: Viewer, job: str = "", since: str = "", limit: str = ""
) -> Response:
    """Operator actions, newest first (filters: job, since, rows)."""
    ctx = context_of(request)
    filters = {"job": job, "since": since, "limit": limit}
    entries: list[AuditEntry] = []
    error: str | None = None
    try:
        entries, _ = _read(request, job, since, limit)
    except ConfigError as exc:
        error = ctx.scrub(str(exc))
    status = 422 if error else 200
    return page(
        request,
        "audit.html",
        principal,
        status_code=status,
        entries=entries,
        filters=filters,
        audit_error=error,
    )


@router.get("/api/audit", tags=["api"], summary="Operator actions, newest first")
def audit_api(
    request: Request,
    _: Reader,
    job: Annotated[str, Query(description="Only this job (also a removed one).")] = "",
    since: Annotated[str, Query(description="Since a duration (1h, 2d) or a time.")] = "",
    limit: Annotated[str, Query(description=f"At most this many (1-{MAX_ROWS}).")] = "100",
) -> dict[str, Any]:
    """``{"job", "since", "source", "entries": [...]}``: the ``audit --json`` document."""
    entries, start = _read(request, job, since, limit)
    return {
        "job": job or None,
        "since": start or None,
        "source": "registry",
        "entries": [e.to_dict() for e in entries],
    }


def warning_suffix(request: Request) -> str:
    """`` (warning: ...)`` for a form's message when an entry was not written."""
    warnings = audit_warnings(request)
    return f" (warning: {'; '.join(warnings)})" if warnings else ""
