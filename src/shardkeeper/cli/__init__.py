"""The ``shardkeeper`` command line: run jobs, inspect and steer them, a local registry.

The package only parses arguments and renders results; the work is done by
:mod:`shardkeeper.ops` (and :mod:`shardkeeper.runtime` for ``run``). Every command is
described in ``docs/cli.md``, with the JSON schema of each ``--json`` output.

Modules: :mod:`~shardkeeper.cli.common` (the apps, shared options, exit codes),
:mod:`~shardkeeper.cli.render` (console, tables, JSON), and one per group of commands:
:mod:`~shardkeeper.cli.run`, :mod:`~shardkeeper.cli.inspect` (reads),
:mod:`~shardkeeper.cli.steer` (writes and ``config``), :mod:`~shardkeeper.cli.audit`
(the audit trail, and the recording of every write), :mod:`~shardkeeper.cli.serve` (the
web console), :mod:`~shardkeeper.cli.registry`.

Imports are lazy: this package imports nothing until :func:`main` runs, and the
command modules import the library parts a command uses inside its body, so
``shardkeeper --help`` loads Typer and Rich only, and ``status`` adds the store client
and the views it prints (``bench/startup_imports.py`` measures it). The command line
is the ``cli`` extra: without Typer or Rich, :func:`main` prints one line naming it.

Exit codes: 0 ok; 1 the operation was refused or failed (unknown job or instance,
unreachable store, wrong credentials, a request the state forbids); 2 usage error
(bad arguments, bad registry URL, invalid config values, a job class that cannot be
loaded, a missing extra: the same code for every extra and command). Errors are ONE
line on stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shardkeeper._imports import needs_extra
from shardkeeper.errors import ConfigError, ShardkeeperError

if TYPE_CHECKING:
    import typer

__all__ = ["app", "exit_code", "main"]

# Each command module registers its commands on ``app`` when imported; the order
# here is the order of ``shardkeeper --help``.
_COMMAND_MODULES = ("run", "inspect", "steer", "audit", "serve", "registry")


def _load_app() -> typer.Typer:
    """The Typer app with every command registered (imports Typer and Rich)."""
    with needs_extra("cli", "the shardkeeper command"):
        import rich  # noqa: F401  (checked here so that a missing Rich is named too)
        import typer  # noqa: F401
    from shardkeeper.cli.common import app

    for module in _COMMAND_MODULES:
        importlib.import_module(f"shardkeeper.cli.{module}")
    return app


def __getattr__(name: str) -> object:
    """``app`` (every command registered) and ``exit_code``, imported on first use."""
    if name == "app":
        return _load_app()
    if name == "exit_code":
        from shardkeeper.cli.common import exit_code

        return exit_code
    raise AttributeError(f"module 'shardkeeper.cli' has no attribute {name!r}")


def _error(message: str) -> None:
    line = " ".join(message.split())  # one line, whatever the library put in it
    sys.stderr.write(f"error: {line}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see module docstring)."""
    try:
        app = _load_app()
    except ConfigError as exc:  # the cli extra is not installed
        _error(str(exc))
        return 2
    from shardkeeper.cli.common import Failed, exit_code

    try:
        app(args=list(argv) if argv is not None else None, prog_name="shardkeeper")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except ShardkeeperError as exc:
        _error(str(exc))
        return exit_code(exc)
    except Failed as exc:
        _error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
