"""Who may use the console: accounts, bearer tokens and their roles.

Two roles: ``viewer`` reads every page and every ``GET /api/...``; ``operator`` also
steers (trigger, switches, config edits, shutdown, removal). Accounts log in to the
pages with a user name and password (or use HTTP Basic on the REST API); tokens are
for scripts (``Authorization: Bearer TOKEN``). Where they come from (all add up):

* ``SHARDKEEPER_CONSOLE_USERS``: ``name:role:password`` entries separated by commas
  (the password is everything after the second ``:``; it may not contain a comma);
* ``SHARDKEEPER_CONSOLE_TOKENS``: ``name:role:token`` entries, likewise;
* a users file (``--users-file``, ``SHARDKEEPER_CONSOLE_USERS_FILE``), YAML or TOML::

      users:
        - {name: alice, role: operator, password_hash: "pbkdf2_sha256$600000$..."}
        - {name: bob, role: viewer, password: "a plain password"}
      tokens:
        - {name: deploy-bot, role: operator, token_sha256: "<hex sha256 of the token>"}

``password_hash`` is what :func:`hash_password` (``shardkeeper serve --hash-password``)
prints. Passwords have at least 8 characters and tokens at least 16. Anything else
is a :class:`~shardkeeper.errors.ConfigError` naming the entry (never its secret).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shardkeeper.errors import ConfigError

__all__ = [
    "OPERATOR",
    "ROLES",
    "TOKENS_ENV",
    "USERS_ENV",
    "USERS_FILE_ENV",
    "AuthConfig",
    "Principal",
    "hash_password",
    "load_auth",
]

VIEWER = "viewer"
OPERATOR = "operator"
#: the roles, weakest first
ROLES = (VIEWER, OPERATOR)
USERS_ENV = "SHARDKEEPER_CONSOLE_USERS"
TOKENS_ENV = "SHARDKEEPER_CONSOLE_TOKENS"
USERS_FILE_ENV = "SHARDKEEPER_CONSOLE_USERS_FILE"
MIN_PASSWORD = 8
MIN_TOKEN = 16
_PBKDF2 = "pbkdf2_sha256"
_ITERATIONS = 600_000


@dataclass(frozen=True)
class Principal:
    """Someone the console knows: a name, a role and how they proved it (``session``,
    ``basic``, ``bearer`` or ``anonymous``)."""

    name: str
    role: str
    via: str

    @property
    def can_write(self) -> bool:
        """Whether this principal may steer (the operator role)."""
        return self.role == OPERATOR


def hash_password(password: str, *, iterations: int = _ITERATIONS) -> str:
    """A salted PBKDF2-SHA256 hash of ``password`` for a users file."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    b64 = base64.b64encode
    return f"{_PBKDF2}${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def _verify_hash(password: str, stored: str) -> bool:
    scheme, iterations, salt, digest = stored.split("$")
    del scheme  # checked when the file was read
    got = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(salt), int(iterations))
    return hmac.compare_digest(got, base64.b64decode(digest))


def _check_hash(stored: str, where: str) -> str:
    parts = stored.split("$")
    try:
        ok = len(parts) == 4 and parts[0] == _PBKDF2 and int(parts[1]) > 0
        ok = ok and bool(base64.b64decode(parts[2], validate=True))
        ok = ok and bool(base64.b64decode(parts[3], validate=True))
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(
            f"{where}: password_hash is not valid; expected {_PBKDF2}$ITERATIONS$SALT$HASH "
            "as printed by shardkeeper serve --hash-password"
        )
    return stored


@dataclass(frozen=True)
class _Account:
    name: str
    role: str
    #: a pbkdf2 hash, or the sha256 of a plain password (hex) when given in plain
    secret: str


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class AuthConfig:
    """Accounts and tokens (see module docstring); ``anonymous_read`` lets anyone
    without credentials read (never write)."""

    users: dict[str, _Account] = field(default_factory=dict)
    #: sha256 hex of the token -> account
    tokens: dict[str, _Account] = field(default_factory=dict)
    anonymous_read: bool = False

    @property
    def empty(self) -> bool:
        """True when no account or token is configured."""
        return not self.users and not self.tokens

    def add_user(
        self,
        name: str,
        role: str,
        *,
        password: str | None = None,
        password_hash: str | None = None,
        where: str = "console users",
    ) -> None:
        """Add an account (exactly one of ``password`` and ``password_hash``)."""
        where = f"{where}: user {name!r}"
        _check_name_role(name, role, where)
        if name in self.users:
            raise ConfigError(f"{where} is given twice")
        if (password is None) == (password_hash is None):
            raise ConfigError(f"{where}: give exactly one of password and password_hash")
        if password is not None:
            if len(password) < MIN_PASSWORD:
                raise ConfigError(f"{where}: the password needs at least {MIN_PASSWORD} characters")
            secret = "sha256$" + _sha256(password)
        else:
            secret = _check_hash(str(password_hash), where)
        self.users[name] = _Account(name, role, secret)

    def add_token(
        self,
        name: str,
        role: str,
        *,
        token: str | None = None,
        token_sha256: str | None = None,
        where: str = "console tokens",
    ) -> None:
        """Add a bearer token (exactly one of ``token`` and ``token_sha256``)."""
        where = f"{where}: token {name!r}"
        _check_name_role(name, role, where)
        if (token is None) == (token_sha256 is None):
            raise ConfigError(f"{where}: give exactly one of token and token_sha256")
        if token is not None:
            if len(token) < MIN_TOKEN:
                raise ConfigError(f"{where}: the token needs at least {MIN_TOKEN} characters")
            digest = _sha256(token)
        else:
            digest = str(token_sha256).lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ConfigError(f"{where}: token_sha256 is not 64 hex digits")
        if digest in self.tokens:
            raise ConfigError(f"{where}: the same token is given twice")
        self.tokens[digest] = _Account(name, role, digest)

    def check_password(self, name: str, password: str, via: str) -> Principal | None:
        """The principal for a correct user name and password, else None."""
        account = self.users.get(name)
        if account is None:
            _verify_hash(password, _DUMMY_HASH)  # same time for unknown names
            return None
        if account.secret.startswith("sha256$"):
            ok = hmac.compare_digest(account.secret[7:], _sha256(password))
        else:
            ok = _verify_hash(password, account.secret)
        return Principal(account.name, account.role, via) if ok else None

    def check_token(self, token: str) -> Principal | None:
        """The principal of a bearer token, else None."""
        account = self.tokens.get(_sha256(token))
        return Principal(account.name, account.role, "bearer") if account else None

    def role_of(self, name: str) -> str | None:
        """The current role of account ``name`` (None: no such account any more)."""
        account = self.users.get(name)
        return account.role if account else None


_DUMMY_HASH = hash_password("not a password", iterations=1000)


def _check_name_role(name: str, role: str, where: str) -> None:
    if not name or ":" in name or "," in name or name != name.strip():
        raise ConfigError(f"{where}: the name must be non-empty, without ':' ',' or spaces")
    if role not in ROLES:
        raise ConfigError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")


def _entries(text: str, env: str) -> list[tuple[str, str, str]]:
    out = []
    for n, entry in enumerate(p for p in text.split(",") if p.strip()):
        name, sep1, rest = entry.strip().partition(":")
        role, sep2, secret = rest.partition(":")
        if not (sep1 and sep2):
            raise ConfigError(f"{env}: entry {n + 1} is not name:role:secret")
        out.append((name, role, secret))
    return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"users file {str(path)!r}: cannot read it ({exc.strerror})") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            data: Any = yaml.safe_load(text) or {}
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(f"users file {str(path)!r}: use a .yaml, .yml or .toml file")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"users file {str(path)!r} is not valid: {exc}") from None
    unknown = set(data) - {"users", "tokens"} if isinstance(data, dict) else {"(not a mapping)"}
    if unknown:
        raise ConfigError(
            f"users file {str(path)!r}: unknown key(s) {', '.join(sorted(unknown))}; "
            "expected users and tokens"
        )
    checked: dict[str, Any] = data
    return checked


_USER_KEYS = {"name", "role", "password", "password_hash"}
_TOKEN_KEYS = {"name", "role", "token", "token_sha256"}


def _file_entries(data: dict[str, Any], key: str, allowed: set[str], where: str) -> list[Any]:
    entries = data.get(key) or []
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: {key} must be a list")
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or not set(entry) <= allowed:
            raise ConfigError(
                f"{where}: {key} entry {n + 1} must be a mapping of {', '.join(sorted(allowed))}"
            )
        if not all(isinstance(v, str) for v in entry.values()):
            raise ConfigError(f"{where}: {key} entry {n + 1}: every value must be a string")
    return entries


def load_auth(
    users_file: str | Path | None = None,
    *,
    anonymous_read: bool = False,
    environ: dict[str, str] | None = None,
) -> AuthConfig:
    """The accounts and tokens of the environment and ``users_file`` (see module
    docstring); ConfigError naming a bad entry."""
    env = dict(os.environ if environ is None else environ)
    auth = AuthConfig(anonymous_read=anonymous_read)
    for name, role, secret in _entries(env.get(USERS_ENV, ""), USERS_ENV):
        auth.add_user(name, role, password=secret, where=USERS_ENV)
    for name, role, secret in _entries(env.get(TOKENS_ENV, ""), TOKENS_ENV):
        auth.add_token(name, role, token=secret, where=TOKENS_ENV)
    path = users_file if users_file is not None else env.get(USERS_FILE_ENV) or None
    if path is not None:
        where = f"users file {str(path)!r}"
        data = _read_file(Path(path))
        for e in _file_entries(data, "users", _USER_KEYS, where):
            auth.add_user(
                e.get("name", ""),
                e.get("role", ""),
                password=e.get("password"),
                password_hash=e.get("password_hash"),
                where=where,
            )
        for e in _file_entries(data, "tokens", _TOKEN_KEYS, where):
            auth.add_token(
                e.get("name", ""),
                e.get("role", ""),
                token=e.get("token"),
                token_sha256=e.get("token_sha256"),
                where=where,
            )
    return auth
