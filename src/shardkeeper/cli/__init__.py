"""The ``shardkeeper`` command line: run jobs, inspect and steer them, a local registry.

The package only parses arguments and renders results; the work is done by
:mod:`shardkeeper.ops` (and :mod:`shardkeeper.runtime` for ``run``). Every command is
described in ``docs/cli.md``, with the JSON schema of each ``--json`` output.

Modules: :mod:`~shardkeeper.cli.common` (the apps, shared options, exit codes),
:mod:`~shardkeeper.cli.render` (console, tables, JSON), and one per group of commands:
:mod:`~shardkeeper.cli.run`, :mod:`~shardkeeper.cli.inspect` (reads),
:mod:`~shardkeeper.cli.steer` (writes and ``config``), :mod:`~shardkeeper.cli.serve` (the
web console), :mod:`~shardkeeper.cli.registry`.

Exit codes: 0 ok; 1 the operation was refused or failed (unknown job or instance,
unreachable store, wrong credentials, a request the state forbids); 2 usage error
(bad arguments, bad registry URL, invalid config values). Errors are ONE line on
stderr, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from shardkeeper.cli.common import Failed, app, exit_code
from shardkeeper.errors import ShardkeeperError

__all__ = ["app", "exit_code", "main"]

# Each command module registers its commands on ``app`` when imported; the order
# here is the order of ``shardkeeper --help``.
for _module in ("run", "inspect", "steer", "serve", "registry"):
    importlib.import_module(f"shardkeeper.cli.{_module}")


def _error(message: str) -> None:
    line = " ".join(message.split())  # one line, whatever the library put in it
    sys.stderr.write(f"error: {line}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see module docstring)."""
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
