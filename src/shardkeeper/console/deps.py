"""Who is asking: request authentication for pages, forms and the REST API.

* Pages (GET) need a logged-in session (or ``anonymous_read``); otherwise the
  browser is sent to the login page.
* Forms (POST from a page) need a session whose account has the operator role and
  the session's CSRF token in the form's ``csrf`` field.
* REST reads take a bearer token, HTTP Basic or the browser's session; REST writes
  take only a bearer token or HTTP Basic of an operator (a cookie alone never
  writes, so another site cannot make a logged-in browser write). 401 answers say
  ``WWW-Authenticate: Bearer``, never Basic, so that browsers do not cache Basic
  credentials that they would then send on their own.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from fastapi import HTTPException, Request
from starlette.datastructures import FormData

from shardkeeper.console.auth import Principal
from shardkeeper.console.context import context_of
from shardkeeper.console.session import SESSION_COOKIE, Session
from shardkeeper.console.throttle import TooManyLogins

__all__ = [
    "Forbidden",
    "LoginRequired",
    "OperatorForm",
    "api_reader",
    "api_writer",
    "operator_form",
    "page_principal",
    "session_of",
]

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="shardkeeper"'}
ANONYMOUS = Principal("anonymous", "viewer", "anonymous")


class LoginRequired(Exception):
    """The page needs a login; ``next`` is where to go back to."""

    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url


class Forbidden(Exception):
    """The request is not allowed (the message says why)."""


def session_of(request: Request) -> Session | None:
    """The valid session of the request's cookie, or None."""
    return context_of(request).signer.load(request.cookies.get(SESSION_COOKIE))


def _session_principal(request: Request) -> Principal | None:
    session = session_of(request)
    if session is None or session.user is None:
        return None
    # the account may have been removed or changed role since the login
    role = context_of(request).auth.role_of(session.user)
    return Principal(session.user, role, "session") if role else None


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(status_code=401, detail=message, headers=_CHALLENGE)


def _header_principal(request: Request) -> Principal | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    ctx = context_of(request)
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        principal = ctx.auth.check_token(value.strip())
        if principal is None:
            raise _unauthorized("the bearer token is not valid")
        return principal
    if scheme.lower() == "basic":
        try:
            user, sep, password = base64.b64decode(value.strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, sep, password = "", "", ""
        try:
            principal = ctx.check_password(user, password, "basic") if sep else None
        except TooManyLogins as exc:
            headers = {"Retry-After": str(exc.retry_after)}
            raise HTTPException(status_code=429, detail=str(exc), headers=headers) from None
        if principal is None:
            raise _unauthorized("wrong user name or password")
        return principal
    raise _unauthorized(f"authorization scheme {scheme!r} is not supported; use Bearer or Basic")


def page_principal(request: Request) -> Principal:
    """Dependency of the pages: the logged-in principal (or anonymous viewer)."""
    principal = _session_principal(request)
    if principal is not None:
        return principal
    if context_of(request).auth.anonymous_read:
        return ANONYMOUS
    query = f"?{request.url.query}" if request.url.query else ""
    raise LoginRequired(request.url.path + query)


@dataclass(frozen=True)
class OperatorForm:
    """A checked form POST: who sent it and its fields."""

    principal: Principal
    form: FormData

    def text(self, name: str) -> str:
        """Field ``name`` as text ("" when absent or a file)."""
        value = self.form.get(name)
        return value if isinstance(value, str) else ""


async def operator_form(request: Request) -> OperatorForm:
    """Dependency of the form actions: an operator's session and a valid CSRF token."""
    principal = _session_principal(request)
    if principal is None:
        raise LoginRequired(request.headers.get("referer") or "/")
    form = await request.form()
    token = form.get("csrf")
    if not context_of(request).signer.check_csrf(
        session_of(request), token if isinstance(token, str) else None
    ):
        raise Forbidden(
            "the form's CSRF token is missing or does not match your session: "
            "reload the page and try again"
        )
    if not principal.can_write:
        raise Forbidden(f"{principal.name} has the {principal.role} role; steering needs operator")
    return OperatorForm(principal, form)


def api_reader(request: Request) -> Principal:
    """Dependency of REST reads: any role, by header or the browser's session."""
    principal = _header_principal(request) or _session_principal(request)
    if principal is not None:
        return principal
    if context_of(request).auth.anonymous_read:
        return ANONYMOUS
    raise _unauthorized("credentials needed: a bearer token or HTTP Basic")


def api_writer(request: Request) -> Principal:
    """Dependency of REST writes: an operator's bearer token or HTTP Basic."""
    principal = _header_principal(request)
    if principal is None:
        raise _unauthorized(
            "writes need a bearer token or HTTP Basic of an operator "
            "(a browser session writes through the pages' forms)"
        )
    if not principal.can_write:
        raise HTTPException(
            status_code=403,
            detail=f"{principal.name} has the {principal.role} role; writes need operator",
        )
    return principal
