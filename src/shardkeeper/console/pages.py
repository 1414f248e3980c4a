"""The pages: overview, job, instances, and logging in and out."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shardkeeper.console.auth import Principal
from shardkeeper.console.context import context_of
from shardkeeper.console.deps import page_principal, session_of
from shardkeeper.console.forms import WHOLE, config_fields, history_query
from shardkeeper.console.render import page, set_session
from shardkeeper.console.session import SESSION_COOKIE
from shardkeeper.console.throttle import TooManyLogins
from shardkeeper.errors import ConfigError
from shardkeeper.history import HistoryEntry, HistoryUnavailableError

__all__ = ["job_page", "router"]

router = APIRouter(include_in_schema=False)
Viewer = Annotated[Principal, Depends(page_principal)]


@router.get("/", response_class=HTMLResponse)
def overview(request: Request, principal: Viewer) -> Response:
    """Live instances and every job with its health and leader."""
    overview = context_of(request).ops.status()
    return page(request, "overview.html", principal, overview=overview)


@router.get("/instances", response_class=HTMLResponse)
def instances(request: Request, principal: Viewer) -> Response:
    """Every live instance with its items per job."""
    views = context_of(request).ops.instances()
    return page(request, "instances.html", principal, instances=views)


def job_page(
    request: Request,
    principal: Principal,
    name: str,
    *,
    submitted: dict[str, str] | None = None,
    errors: dict[str, str] | None = None,
    status_code: int = 200,
) -> Response:
    """The job page (also re-rendered by a config edit with its field errors)."""
    ctx = context_of(request)
    detail = ctx.ops.job(name)
    filters = {k: v for k, v in request.query_params.items() if isinstance(v, str)}
    history: list[HistoryEntry] = []
    history_error: str | None = None
    if ctx.history is None:
        history_error = "history is off (serve --history-url)"
    else:
        try:
            history = ctx.history.query(history_query(name, filters))
        except (ConfigError, HistoryUnavailableError) as exc:
            history_error = ctx.scrub(str(exc))
    stored = ctx.ops.stored_config(name)
    values: dict[str, Any] = {
        "job": detail,
        "written": {"by": stored.by or "?", "writer": stored.writer, "at": stored.at or None},
        "fields": config_fields(detail.config, submitted=submitted, errors=errors),
        "config_error": (errors or {}).get(WHOLE),
        "filters": filters,
        "history": history,
        "history_error": history_error,
        "history_where": (
            f"{ctx.history.describe()}, runs in {ctx.history.scope}"
            if ctx.history and ctx.history.scope
            else (ctx.history.describe() if ctx.history else "off")
        ),
    }
    return page(request, "job.html", principal, status_code=status_code, **values)


@router.get("/jobs/{name}", response_class=HTMLResponse)
def job(request: Request, name: str, principal: Viewer) -> Response:
    """One job: config, items, history."""
    return job_page(request, principal, name)


def _safe_next(target: str) -> str:
    # only a path of this site: never send the browser elsewhere after a login
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> Response:
    """The login form."""
    return page(request, "login.html", None, next=_safe_next(next), error=None)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the user name and password (and the form's CSRF token); a new session."""
    ctx = context_of(request)
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    target = _safe_next(fields.get("next", "/"))
    if not ctx.signer.check_csrf(session_of(request), fields.get("csrf")):
        error = "the login form expired: try again"
        return page(request, "login.html", None, next=target, error=error, status_code=403)
    try:
        principal = ctx.check_password(
            fields.get("username", ""), fields.get("password", ""), "session"
        )
    except TooManyLogins as exc:
        return page(request, "login.html", None, next=target, error=str(exc), status_code=429)
    if principal is None:
        error = "wrong user name or password"
        return page(request, "login.html", None, next=target, error=error, status_code=401)
    response = RedirectResponse(target, status_code=303)
    set_session(request, response, ctx.signer.new_session(principal.name))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session (CSRF-checked, so no other site can log anyone out)."""
    ctx = context_of(request)
    form = await request.form()
    token = form.get("csrf")
    response = RedirectResponse("/login", status_code=303)
    if ctx.signer.check_csrf(session_of(request), token if isinstance(token, str) else None):
        response.delete_cookie(SESSION_COOKIE, path="/")
    return response
