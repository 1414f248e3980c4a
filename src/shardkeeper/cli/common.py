"""What every command module shares: the Typer apps, common options, exit codes.

The root callback (``--log-level``, ``--version``) lives here too, so that the
command modules only add commands.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from shardkeeper._version import __version__
from shardkeeper.cli.render import out
from shardkeeper.errors import ConfigError, JobConflictError, ShardkeeperError

if TYPE_CHECKING:
    from shardkeeper.ops import Operations

#: the registry URL's environment variable: shardkeeper.registry.url.ENV_VAR, written
#: out so that ``--help`` does not import the registry package (and pydantic);
#: tests/test_packaging.py checks that the two agree
ENV_VAR = "SHARDKEEPER_REGISTRY"

__all__ = [
    "ENV_VAR",
    "Backend",
    "Failed",
    "HistoryUrlOpt",
    "JobArg",
    "JsonOpt",
    "LogLevel",
    "RegistryOpt",
    "app",
    "config_app",
    "connect",
    "exit_code",
    "registry_app",
]


def _tidy_params(command: TyperCommand | TyperGroup, ctx: Any) -> None:
    """Give every flag of ``command`` (``--help`` included) an empty metavar.

    Typer shows the type of a flag (``<bool>``) in the type column as if the flag
    took a value; an option's metavar replaces that column, and an empty one leaves
    it blank. Set on the parameter objects, so the rich and the plain help agree.
    """
    for param in command.get_params(ctx):
        # duck-typed: the parameter classes are click's before Typer 0.2x, then
        # Typer's own copy of click
        flag = param.param_type_name == "option" and getattr(param, "is_flag", False)
        if flag and param.metavar is None:
            param.metavar = ""


def _usage_pieces(command: TyperCommand, ctx: Any) -> list[str]:
    """The usage line in click's (and every Unix man page's) notation.

    A required argument is ``NAME``, an optional one ``[NAME]`` and a repeatable one
    ``NAME...``; Typer writes a required one as ``{NAME}``, which reads like a
    placeholder to fill in braces and all.
    """
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name != "argument":
            pieces.extend(param.get_usage_pieces(ctx))
            continue
        name = param.metavar or (param.name or "").upper()
        if param.nargs != 1 and not name.endswith("..."):
            name += "..."
        pieces.append(name if param.required else f"[{name}]")
    return pieces


class HelpCommand(TyperCommand):
    """A Typer command whose help shows no ``<bool>`` on flags and a plain usage line."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage line's parts: see :func:`_usage_pieces`."""
        return _usage_pieces(self, ctx)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The help, flags without a type (see :func:`_tidy_params`)."""
        _tidy_params(self, ctx)
        super().format_help(ctx, formatter)


class HelpGroup(TyperGroup):
    """A Typer group whose help shows no ``<bool>`` on flags (see :class:`HelpCommand`)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The help, flags without a type (see :func:`_tidy_params`)."""
        _tidy_params(self, ctx)
        super().format_help(ctx, formatter)


class _Typer(typer.Typer):
    """A Typer app whose commands are :class:`HelpCommand` unless they say otherwise."""

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Any:
        """``typer.Typer.command`` with :class:`HelpCommand` as the default class."""
        return super().command(*args, cls=cls or HelpCommand, **kwargs)


def _make_app(**kwargs: Any) -> typer.Typer:
    # "rich" explicitly: Typer's default depends on its version (None before 0.13),
    # and the help texts escape Rich markup (``\\[default: 8]``) only in this mode
    return _Typer(cls=HelpGroup, rich_markup_mode="rich", **kwargs)


app = _make_app(
    name="shardkeeper",
    help="Elastic sharded jobs on ZooKeeper or etcd: run them, inspect and steer them.\n\n"
    f"Commands that read or change a registry take --registry URL, or the URL in "
    f"${ENV_VAR} (e.g. zk://host:2181/my-app or etcd://host:2379/my-app).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = _make_app(help="Read or change a job's stored configuration.", no_args_is_help=True)
registry_app = _make_app(
    help="A local ZooKeeper or etcd for development (detached servers); fix-acl.",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")
app.add_typer(registry_app, name="registry")

RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry",
        "-r",
        envvar=ENV_VAR,
        show_envvar=True,
        metavar="URL",
        help="Registry URL, e.g. zk://host:2181/my-app or etcd://host:2379/my-app.",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON (stable schema, see docs/cli.md).")
]
JobArg = Annotated[str, typer.Argument(metavar="NAME", help="Job name.")]
HistoryUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--history-url",
        envvar="SHARDKEEPER_HISTORY_URL",
        show_envvar=True,
        metavar="URL",
        help="Execution history: sqlite:///PATH, postgresql://USER:PW@HOST/DB or off "
        "(default: $XDG_DATA_HOME/shardkeeper/history.db).",
    ),
]


class Backend(StrEnum):
    """Backends of ``shardkeeper registry up``."""

    zookeeper = "zookeeper"
    etcd = "etcd"


class LogLevel(StrEnum):
    """Log levels of ``--log-level``."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def exit_code(exc: ShardkeeperError) -> int:
    """The exit code for an error: 2 for bad input, 1 for everything else."""
    if isinstance(exc, JobConflictError):
        return 1  # the input is fine; the registry refuses it
    return 2 if isinstance(exc, ConfigError) else 1


class Failed(Exception):
    """A command that ran but did not achieve what was asked (exit 1)."""


@contextmanager
def connect(registry: str | None) -> Iterator[Operations]:
    """Operations on the registry (URL or ``$SHARDKEEPER_REGISTRY``), closed on exit."""
    from shardkeeper.ops import Operations  # here: --help needs none of it

    ops = Operations.connect(registry)
    try:
        yield ops
    finally:
        ops.close()


def _show_version(value: bool) -> None:
    if value:
        out.print(f"shardkeeper {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            "--log-level", help="Show library logs at this level (default: none; run: info)."
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            help="Print the version and exit.",
            callback=_show_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Elastic sharded jobs on ZooKeeper or etcd: run them, inspect and steer them."""
    root = logging.getLogger()
    if log_level is not None:
        logging.basicConfig(
            level=log_level.value.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    elif not root.handlers:
        # Client libraries log connection retries as warnings; an operator command
        # reports one clear error line instead.
        root.addHandler(logging.NullHandler())
