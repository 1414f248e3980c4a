"""The pages: overview, job, instances, and logging in and out."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from shardkeeper.console.auth import Principal
from shardkeeper.console.context import context_of
from shardkeeper.console.deps import page_principal, session_of
from shardkeeper.console.forms import WHOLE, config_fields, history_query, item_page
from shardkeeper.console.render import page, set_session
from shardkeeper.console.session import SESSION_COOKIE
from shardkeeper.console.throttle import TooManyLogins
from shardkeeper.errors import ConfigError
from shardkeeper.history import HistoryEntry, HistoryUnavailableError
from shardkeeper.ops.views import ItemView

__all__ = ["config_notice", "item_table", "job_page", "router"]

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
        **item_table(detail.items, filters, f"/jobs/{quote(name, safe='')}"),
        "job": detail,
        "written": {"by": stored.by or "?", "writer": stored.writer, "at": stored.at or None},
        "fields": config_fields(detail.config, submitted=submitted, errors=errors),
        "config_error": (errors or {}).get(WHOLE),
        "config_notice": config_notice(errors or {}, submitted or {}),
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


def config_notice(errors: dict[str, str], submitted: dict[str, str]) -> list[dict[str, str]]:
    """The notice at the top of a job page whose config save was refused: one line
    per error, each field's with the text that was typed (the error about the config
    as a whole, or the store's refusal, without one); empty when nothing was refused."""
    lines = [{"field": "", "typed": "", "message": errors[WHOLE]}] if WHOLE in errors else []
    for key, message in errors.items():
        if key != WHOLE:
            lines.append({"field": key, "typed": submitted.get(key, ""), "message": message})
    return lines


def _notable(item: ItemView) -> bool:
    """Whether an item is worth a look: not healthy, switched off, running, waiting
    for failover or misfired (the "problems" view of a big job's item table)."""
    return (
        item.health != "ok" or item.disabled or item.running or item.failover_queued or item.misfire
    )


def item_table(items: list[ItemView], filters: dict[str, str], base: str) -> dict[str, Any]:
    """The job page's item table: a summary of every item (by health, disabled,
    running), and one page of them (``items_offset``/``items_limit``; ``items=notable``
    keeps only the items worth a look) with links to the other pages. A job of 2,000
    items is a summary line and 100 rows, not a page 64,000 pixels tall."""
    offset, limit = item_page(filters)
    notable_only = filters.get("items", "") == "notable"
    shown = [i for i in items if _notable(i)] if notable_only else items
    health: dict[str, int] = {}
    for i in items:
        health[i.health] = health.get(i.health, 0) + 1
    summary = [f"{count:,} {name}" for name, count in sorted(health.items())]
    for label, count in (
        ("disabled", sum(i.disabled for i in items)),
        # an item that ended while its batch's slower items run is not running
        # (newcomer review N15: "2,000 ok, 2,000 running" while two had failed)
        ("running", sum(i.running for i in items)),
        ("ended in a fire still running", sum(i.finished for i in items)),
        ("queued for failover", sum(i.failover_queued for i in items)),
    ):
        if count:
            summary.append(f"{count:,} {label}")

    def link(**changes: str | int) -> str:
        query = {**filters, **{k: str(v) for k, v in changes.items()}}
        return base + "?" + urlencode({k: v for k, v in query.items() if v != ""})

    pages = [
        {"start": start, "end": min(start + limit, len(shown)) - 1, "url": link(items_offset=start)}
        for start in range(0, len(shown), limit)
    ]
    return {
        "items_page": shown[offset : offset + limit],
        "items_total": len(shown),
        "items_offset": offset,
        "items_limit": limit,
        "items_summary": f"{len(items):,} items: " + ", ".join(summary) if items else "no items",
        "items_pages": pages if len(pages) > 1 else [],
        "items_notable": notable_only,
        "items_toggle": link(items="" if notable_only else "notable", items_offset=0),
    }


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
