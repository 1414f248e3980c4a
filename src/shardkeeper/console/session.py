"""Signed session cookies and the CSRF tokens derived from them.

Every browser gets a session cookie on its first page (anonymous until it logs in):
``base64(json) "." base64(HMAC-SHA256)``, signed with the console's secret, holding
the user name (or none), a random nonce and the time it was issued. The CSRF token
of a session is an HMAC of its nonce: every form carries it, every POST from a page
is checked against the session cookie of the same request, so a page of another
site (which can make the browser send the cookie but cannot read the token) cannot
submit a form. Logging in issues a new nonce (no session fixation).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

__all__ = ["SESSION_COOKIE", "Session", "Signer"]

SESSION_COOKIE = "shardkeeper_session"
FLASH_COOKIE = "shardkeeper_flash"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Session:
    """A decoded session: ``user`` is None before login."""

    user: str | None
    nonce: str
    issued: float


class Signer:
    """Signs and checks cookie values with ``secret``; sessions older than
    ``max_age`` seconds are refused."""

    def __init__(self, secret: bytes, *, max_age: float = 12 * 3600) -> None:
        if len(secret) < 16:
            raise ValueError("the console secret needs at least 16 bytes")
        self._secret = secret
        self.max_age = max_age

    def _mac(self, purpose: str, payload: bytes) -> bytes:
        return hmac.new(self._secret, purpose.encode() + b"|" + payload, hashlib.sha256).digest()

    def sign(self, purpose: str, data: dict[str, object]) -> str:
        """``data`` as a signed cookie value for ``purpose``."""
        payload = json.dumps(data, separators=(",", ":")).encode()
        return f"{_b64(payload)}.{_b64(self._mac(purpose, payload))}"

    def unsign(self, purpose: str, value: str | None) -> dict[str, object] | None:
        """The data of a value :meth:`sign` made for ``purpose``, else None."""
        if not value or value.count(".") != 1:
            return None
        body, mac = value.split(".")
        try:
            payload = _unb64(body)
            good = hmac.compare_digest(_unb64(mac), self._mac(purpose, payload))
            data = json.loads(payload) if good else None
        except (ValueError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def new_session(self, user: str | None) -> Session:
        """A fresh session (new nonce) for ``user``."""
        return Session(user=user, nonce=secrets.token_urlsafe(16), issued=time.time())

    def dump(self, session: Session) -> str:
        """The cookie value of ``session``."""
        return self.sign("session", {"u": session.user, "n": session.nonce, "t": session.issued})

    def load(self, value: str | None) -> Session | None:
        """The session of a cookie value; None when forged, malformed or expired."""
        data = self.unsign("session", value)
        if data is None:
            return None
        user, nonce, issued = data.get("u"), data.get("n"), data.get("t")
        if not isinstance(nonce, str) or not isinstance(issued, int | float):
            return None
        if user is not None and not isinstance(user, str):
            return None
        if not 0 <= time.time() - issued <= self.max_age:
            return None
        return Session(user=user, nonce=nonce, issued=float(issued))

    def csrf_token(self, session: Session) -> str:
        """The CSRF token of ``session`` (what its forms carry)."""
        return _b64(self._mac("csrf", session.nonce.encode()))

    def check_csrf(self, session: Session | None, token: str | None) -> bool:
        """Whether ``token`` is the CSRF token of ``session``."""
        if session is None or not token:
            return False
        return hmac.compare_digest(token, self.csrf_token(session))
