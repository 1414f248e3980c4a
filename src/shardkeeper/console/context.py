"""What every request of the console needs: the operations API, the history reader,
the accounts, the cookie signer, and the secrets that must never be shown."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from shardkeeper.console.auth import AuthConfig, Principal
from shardkeeper.console.session import Signer
from shardkeeper.console.throttle import LoginThrottle, TooManyLogins
from shardkeeper.history import HistoryReader
from shardkeeper.ops import Operations
from shardkeeper.ops.audit import AuditSink

__all__ = ["ConsoleContext", "context_of"]


@dataclass
class ConsoleContext:
    """The console's shared state (one per app).

    ``history`` is None when history is off. ``secrets`` are strings (registry and
    history passwords, user-info) scrubbed from every message the console shows.
    ``refresh_seconds`` is how often pages refresh their live parts (0: never).
    ``audit_db`` is the history database's audit table (None when history is off):
    the console's writes are recorded there too, besides the registry's trail.
    """

    ops: Operations
    auth: AuthConfig
    signer: Signer
    history: HistoryReader | None = None
    secrets: list[str] = field(default_factory=list)
    refresh_seconds: float = 5.0
    cookie_secure: bool = False
    title: str = "shardkeeper"
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    audit_db: AuditSink | None = None

    def check_password(self, user: str, password: str, via: str) -> Principal | None:
        """The principal for a correct password, None for a wrong one; TooManyLogins
        while the user name has too many recent failures (even for the right one)."""
        wait = self.throttle.wait_for(user)
        if wait > 0:
            raise TooManyLogins(user, wait)
        principal = self.auth.check_password(user, password, via)
        if principal is None:
            self.throttle.failed(user)
        else:
            self.throttle.succeeded(user)
        return principal

    def scrub(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***``."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, "***")
        return text


def context_of(request: Request) -> ConsoleContext:
    """The console context of the app serving ``request``."""
    ctx: ConsoleContext = request.app.state.console
    return ctx
