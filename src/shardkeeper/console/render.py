"""Rendering pages: the Jinja2 environment, time formats, the flash message.

Every page gets ``principal``, ``csrf`` (its session's token: a browser without a
valid session gets a new anonymous one here), ``flash`` (the message of the last
action, read once), ``refresh`` (seconds between live refreshes) and ``title``.
Jinja2 autoescaping is on: every value is HTML-escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from shardkeeper.console.auth import Principal
from shardkeeper.console.context import context_of
from shardkeeper.console.deps import session_of
from shardkeeper.console.session import FLASH_COOKIE, SESSION_COOKIE, Session
from shardkeeper.ops.views import item_ranges

__all__ = ["TEMPLATES", "page", "redirect", "set_session"]

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))


def _time(value: float | datetime | None) -> str:
    """Epoch seconds or a datetime as ``2024-05-01 12:00:00 UTC`` ("-" for none):
    every time the console shows names its zone (a naive datetime is taken as UTC,
    as the stores and the history write them)."""
    if value is None or (isinstance(value, int | float) and value <= 0):
        return "-"
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
    else:
        dt = datetime.fromtimestamp(value, UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _count(value: Any) -> str:
    """A count without a needless ``.0`` (``500``, ``2.5``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _eta(value: float | None) -> str:
    """Seconds left as ``45s``, ``1m05s`` or ``2h03m`` ("-" when unknown)."""
    if value is None:
        return "-"
    minutes, seconds = divmod(round(value), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def _progress(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A running item's last progress report (``ItemView.progress``) as the item
    table shows it: ``percent`` (a number or None, for the bar), ``amount``
    (``50.0% (500/1000)``, or ``500`` without a total), ``note``, ``rate``
    (``12.5/s``) and ``eta`` (``1m05s``), "-" for what is unknown; None without a
    report (the same cells as ``shardkeeper shards``' PROGRESS, RATE and ETA)."""
    if not report:
        return None
    done, total, percent = report.get("done"), report.get("total"), report.get("percent")
    amount = f"{_count(done)}/{_count(total)}" if total is not None else _count(done)
    rate = report.get("rate")
    return {
        "percent": percent,
        "amount": f"{percent:.1f}% ({amount})" if percent is not None else amount,
        "note": str(report.get("note") or ""),
        "rate": f"{rate:.3g}/s" if rate is not None else "-",
        "eta": _eta(report.get("eta")),
    }


TEMPLATES.env.filters["time"] = _time
TEMPLATES.env.filters["seconds"] = _seconds
TEMPLATES.env.filters["progress"] = _progress
# item lists as ranges ("0-999,1500"): a big job's share stays one short line
TEMPLATES.env.filters["ranges"] = item_ranges


def set_session(request: Request, response: Response, session: Session) -> None:
    """Store ``session`` in the browser (HttpOnly, SameSite=Strict)."""
    ctx = context_of(request)
    response.set_cookie(
        SESSION_COOKIE,
        ctx.signer.dump(session),
        max_age=int(ctx.signer.max_age),
        httponly=True,
        samesite="strict",
        secure=ctx.cookie_secure,
        path="/",
    )


def page(
    request: Request,
    template: str,
    principal: Principal | None,
    *,
    status_code: int = 200,
    **values: Any,
) -> HTMLResponse:
    """Render ``template`` with the common values (see module docstring)."""
    ctx = context_of(request)
    session = session_of(request)
    fresh = session is None
    if session is None:
        session = ctx.signer.new_session(None)
    data = ctx.signer.unsign("flash", request.cookies.get(FLASH_COOKIE))
    flash = data if data and isinstance(data.get("text"), str) else None
    response = TEMPLATES.TemplateResponse(
        request,
        template,
        {
            "principal": principal,
            "csrf": ctx.signer.csrf_token(session),
            "flash": flash,
            "refresh": ctx.refresh_seconds,
            "title": ctx.title,
            "namespace": ctx.ops.store.namespace,
            **values,
        },
        status_code=status_code,
    )
    if fresh:
        set_session(request, response, session)
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path="/")
    return response


def redirect(request: Request, url: str, message: str, *, error: bool = False) -> Response:
    """A 303 to ``url`` that shows ``message`` there once."""
    ctx = context_of(request)
    response = RedirectResponse(url, status_code=303)
    value = ctx.signer.sign("flash", {"text": ctx.scrub(message), "error": error})
    response.set_cookie(
        FLASH_COOKIE, value, httponly=True, samesite="strict", secure=ctx.cookie_secure, path="/"
    )
    return response
