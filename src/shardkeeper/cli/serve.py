"""``shardkeeper serve``: the web console and REST API (the ``console`` extra)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from shardkeeper.cli.common import RegistryOpt, app
from shardkeeper.cli.render import out
from shardkeeper.errors import ConfigError

__all__ = ["SECRET_ENV", "serve"]

#: the environment variable holding the key that signs session cookies
SECRET_ENV = "SHARDKEEPER_CONSOLE_SECRET"
_NEEDS = ("fastapi", "uvicorn", "jinja2", "multipart")


def _check_extra() -> None:
    missing = []
    for module in _NEEDS:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append("python-multipart" if module == "multipart" else module)
    if missing:
        # a ConfigError, as every missing extra (needs_extra): exit code 2 everywhere
        raise ConfigError(
            f"shardkeeper serve needs the 'console' extra (missing: {', '.join(missing)}): "
            "pip install 'shardkeeper[console]'"
        )


def _hash_password() -> None:
    from shardkeeper.console.auth import MIN_PASSWORD, hash_password

    password = sys.stdin.readline().rstrip("\n")
    if len(password) < MIN_PASSWORD:
        raise ConfigError(f"the password needs at least {MIN_PASSWORD} characters")
    # one line whatever the terminal's width: the value is pasted into a users file
    out.print(hash_password(password), markup=False, highlight=False, soft_wrap=True)


@app.command()
def serve(
    registry: RegistryOpt = None,
    host: Annotated[
        str,
        typer.Option("--host", envvar="SHARDKEEPER_CONSOLE_HOST", help="Address to bind."),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            "--port", min=0, max=65535, envvar="SHARDKEEPER_CONSOLE_PORT", help="Port to bind."
        ),
    ] = 8780,
    history_url: Annotated[
        str | None,
        typer.Option(
            "--history-url",
            "--history",
            envvar="SHARDKEEPER_HISTORY_URL",
            show_envvar=True,
            metavar="URL",
            help="Execution history shown on the job pages: sqlite:///PATH, "
            "postgresql://USER:PW@HOST/DB or off (default: the default history file).",
        ),
    ] = None,
    users_file: Annotated[
        Path | None,
        typer.Option(
            "--users-file",
            envvar="SHARDKEEPER_CONSOLE_USERS_FILE",
            help="YAML/TOML file of accounts and tokens (see docs/console.md).",
        ),
    ] = None,
    anonymous_read: Annotated[
        bool,
        typer.Option(
            "--anonymous-read",
            envvar="SHARDKEEPER_CONSOLE_ANONYMOUS_READ",
            help="Let anyone read without logging in (writing always needs an operator).",
        ),
    ] = False,
    refresh: Annotated[
        float,
        typer.Option(
            "--refresh",
            min=0,
            envvar="SHARDKEEPER_CONSOLE_REFRESH",
            help="Seconds between live refreshes of the pages (0 = off).",
        ),
    ] = 5.0,
    cookie_secure: Annotated[
        bool,
        typer.Option(
            "--cookie-secure",
            envvar="SHARDKEEPER_CONSOLE_COOKIE_SECURE",
            help="Send the session cookie over HTTPS only (behind a TLS proxy).",
        ),
    ] = False,
    hash_password: Annotated[
        bool,
        typer.Option(
            "--hash-password",
            help="Read a password on stdin, print its password_hash for a users file, exit.",
        ),
    ] = False,
) -> None:
    """Serve the web console and its REST API until SIGTERM/SIGINT.

    Accounts and tokens come from SHARDKEEPER_CONSOLE_USERS (name:role:password,...),
    SHARDKEEPER_CONSOLE_TOKENS (name:role:token,...) and --users-file; roles are
    viewer and operator. See docs/console.md."""
    if hash_password:
        _hash_password()
        return
    _check_extra()
    import uvicorn

    from shardkeeper.console import load_auth, open_console

    auth = load_auth(users_file, anonymous_read=anonymous_read)
    if auth.empty and not auth.anonymous_read:
        raise ConfigError(
            "no console account: set SHARDKEEPER_CONSOLE_USERS (name:role:password,...), "
            "SHARDKEEPER_CONSOLE_TOKENS or --users-file, or give --anonymous-read for a "
            "read-only console"
        )
    secret_text = os.environ.get(SECRET_ENV, "")
    if secret_text and len(secret_text) < 16:
        raise ConfigError(f"{SECRET_ENV} needs at least 16 characters")
    console = open_console(
        registry,
        auth,
        history_url=history_url,
        secret=secret_text.encode() or None,
        refresh_seconds=refresh,
        cookie_secure=cookie_secure,
    )
    config = uvicorn.Config(console, host=host, port=port, log_level="info", access_log=False)
    uvicorn.Server(config).run()
