"""The app factory: pages, forms and REST API over one :class:`Operations`.

:func:`create_app` wires an already connected :class:`Operations` (tests, or an
application embedding the console); :func:`open_console` connects to a registry URL
and a history URL itself (``shardkeeper serve``) and closes both at shutdown.
"""

from __future__ import annotations

import secrets as random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from shardkeeper._version import __version__
from shardkeeper.console import actions, api, audit, pages
from shardkeeper.console.auth import AuthConfig
from shardkeeper.console.context import ConsoleContext, context_of
from shardkeeper.console.deps import Forbidden, LoginRequired, page_principal
from shardkeeper.console.render import page
from shardkeeper.console.session import Signer
from shardkeeper.errors import (
    ConfigError,
    InstanceLookupError,
    JobLookupError,
    OperationRefusedError,
    ShardkeeperError,
    StoreError,
)
from shardkeeper.history import HistoryReader, HistoryUnavailableError, resolve_url
from shardkeeper.history.audit import AuditTable
from shardkeeper.ops import Operations
from shardkeeper.registry.url import RegistrySettings

__all__ = ["create_app", "open_console", "secrets_of"]

_STATIC = Path(__file__).parent / "static"
_HEADERS = {
    # no inline script or style anywhere: the pages load /static only
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def status_of(exc: ShardkeeperError) -> int:
    """The HTTP status of an error of the operations API."""
    if isinstance(exc, JobLookupError | InstanceLookupError):
        return 404
    if isinstance(exc, ConfigError):
        return 422
    if isinstance(exc, OperationRefusedError):
        return 409
    if isinstance(exc, StoreError | HistoryUnavailableError):
        return 503
    return 500


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ShardkeeperError)
    async def _error(request: Request, exc: ShardkeeperError) -> Response:
        ctx = context_of(request)
        message = ctx.scrub(str(exc))
        code = status_of(exc)
        if request.url.path.startswith("/api"):
            return JSONResponse({"detail": message, "error": type(exc).__name__}, code)
        try:
            principal = page_principal(request)
        except LoginRequired:
            principal = None
        return page(request, "error.html", principal, status_code=code, message=message)

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired) -> Response:
        return RedirectResponse(f"/login?next={quote(exc.next_url, safe='/')}", status_code=303)

    @app.exception_handler(Forbidden)
    async def _forbidden(request: Request, exc: Forbidden) -> Response:
        principal = None
        with suppress(LoginRequired):
            principal = page_principal(request)
        return page(request, "error.html", principal, status_code=403, message=str(exc))

    @app.middleware("http")
    async def _security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        for name, value in _HEADERS.items():
            response.headers.setdefault(name, value)
        warnings = audit.audit_warnings(request)
        if warnings and request.url.path.startswith("/api"):
            # the action is done and answered as such; the header says what was not
            response.headers[audit.WARNING_HEADER] = "; ".join(warnings)
        return response


def create_app(
    ops: Operations,
    auth: AuthConfig,
    *,
    history: HistoryReader | None = None,
    secret: bytes | None = None,
    secrets: Iterable[str] = (),
    refresh_seconds: float = 5.0,
    cookie_secure: bool = False,
    close: Callable[[], None] | None = None,
) -> FastAPI:
    """The console app over ``ops``. ``secret`` signs the session cookies (random
    when None: sessions then end with the process); ``secrets`` are strings never to
    show (registry and history passwords); ``close`` runs at shutdown. With a
    ``history``, the console's writes are also recorded in its database's audit
    table. The history shown is the registry's and namespace's of ``ops`` only: a
    reader built without a scope is given that one (one database may hold several
    deployments' runs)."""
    if history is not None and history.scope is None:
        history.scope = ops.store.identity()
    audit_db = AuditTable(history.url) if history is not None else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if audit_db is not None:
                audit_db.close()
            if close is not None:
                close()

    app = FastAPI(
        title="shardkeeper console",
        version=__version__,
        description="Inspect and steer shardkeeper jobs (see docs/console.md).",
        openapi_url="/openapi.json",
        docs_url=None,  # the interactive docs load scripts from elsewhere: not served
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.console = ConsoleContext(
        ops=ops,
        auth=auth,
        signer=Signer(secret or random.token_bytes(32)),
        history=history,
        secrets=[s for s in secrets if s],
        refresh_seconds=refresh_seconds,
        cookie_secure=cookie_secure,
        audit_db=audit_db,
    )
    _install_handlers(app)
    app.mount("/static", StaticFiles(directory=_STATIC), name="static")
    app.include_router(api.router)
    app.include_router(pages.router)
    app.include_router(audit.router)
    app.include_router(actions.router)
    return app


def secrets_of(registry: RegistrySettings, history_url: str | None) -> list[str]:
    """The strings of the two URLs that must never be shown."""
    found: list[str] = []
    if registry.password:
        found.append(registry.password)
        if registry.username:
            found.append(f"{registry.username}:{registry.password}")
    history = resolve_url(history_url)
    if history is not None and history.password:
        found.append(str(history.password))
    return found


def open_console(
    registry: str | None,
    auth: AuthConfig,
    *,
    history_url: str | None = None,
    secret: bytes | None = None,
    refresh_seconds: float = 5.0,
    cookie_secure: bool = False,
) -> FastAPI:
    """Connect to ``registry`` (None: ``SHARDKEEPER_REGISTRY``) and the history
    (``history_url`` as ``shardkeeper history`` reads it; ``off``: none) and build
    the app; both are closed when the app shuts down."""
    ops = Operations.connect(registry)
    try:
        url = resolve_url(history_url)
        reader = HistoryReader(url, scope=ops.store.identity()) if url is not None else None
        settings = getattr(ops.store, "settings", None) or getattr(ops.store, "_settings", None)
        found = secrets_of(settings, history_url) if isinstance(settings, RegistrySettings) else []
    except BaseException:
        ops.close()
        raise

    def close() -> None:
        if reader is not None:
            reader.close()
        ops.close()

    return create_app(
        ops,
        auth,
        history=reader,
        secret=secret,
        secrets=found,
        refresh_seconds=refresh_seconds,
        cookie_secure=cookie_secure,
        close=close,
    )
