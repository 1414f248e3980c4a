"""``--help`` of every command as a user reads it: ``shardkeeper.cli.main`` (what the
``shardkeeper`` script runs) in a process of its own, for every command and
subcommand (the list is taken from the app, so a new command is covered without
editing this file).

What it guards against (newcomer review 2026-12, step 4.5 and D14): Rich took the
``[default: 8]`` written into help texts for markup and dropped it ("Items run at
once ."); flags showed ``<bool>`` as if they took a value; usage lines read
``{NAME}``; ``--param`` showed ``<list[str]>``; the top level did not name
``SHARDKEEPER_REGISTRY``; ``-V`` was refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import typer

import shardkeeper.cli
from shardkeeper import __version__

pytestmark = pytest.mark.timeout(120)


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, group
    for name, sub in getattr(group, "commands", {}).items():
        yield from _commands(sub, (*path, name))


# the app with every command registered (shardkeeper.cli loads it on first use)
COMMANDS = dict(_commands(typer.main.get_command(cast(typer.Typer, shardkeeper.cli.app))))


_HELP_ALL = """
import json, sys
from contextlib import redirect_stdout
from io import StringIO
from shardkeeper.cli import main
outs = {}
for path in json.loads(sys.argv[1]):
    buf = StringIO()
    with redirect_stdout(buf):
        rc = main([*path, "--help"])
    outs[" ".join(path)] = [rc, buf.getvalue()]
print(json.dumps(outs))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str]]:
    """``--help`` of every command, through ``shardkeeper.cli.main`` (what the
    ``shardkeeper`` script runs) in one process of its own (one per command cost 30
    interpreter starts), wide enough not to wrap."""
    env = {**os.environ, "COLUMNS": "250", "TERM": "dumb"}
    env.pop("SHARDKEEPER_REGISTRY", None)
    result = subprocess.run(
        [sys.executable, "-c", _HELP_ALL, json.dumps(list(COMMANDS))],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return {k: (v[0], v[1]) for k, v in json.loads(result.stdout).items()}


@pytest.fixture
def help_of(helps: dict[str, tuple[int, str]]) -> Callable[..., str]:
    """The help of the command ``ARGS`` (asserting it exited 0)."""

    def get(*args: str) -> str:
        rc, out = helps[" ".join(args)]
        assert rc == 0, f"{args}: rc={rc}\n{out}"
        return out

    return get


def _markup_default(text: str) -> str | None:
    """The ``X`` of an escaped ``\\[default: X]`` in a help text written for Rich."""
    found = re.search(r"\\\[default: ([^\]]+)\]", text)
    return found.group(1) if found else None


def test_every_command_is_listed() -> None:
    """The walk below sees the commands a user has (a sanity check of the list)."""
    names = {" ".join(path) for path in COMMANDS}
    assert {"", "run", "status", "trigger", "config set", "registry up", "audit"} <= names
    assert len(COMMANDS) >= 23


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "top")
def test_help_shows_defaults_and_no_type_on_flags(
    path: tuple[str, ...], help_of: Callable[..., str]
) -> None:
    out = help_of(*path)
    command = COMMANDS[path]
    usage = next(line for line in out.splitlines() if "Usage:" in line)
    assert "{" not in usage and "[[" not in usage, usage
    assert "<bool>" not in out
    # "Items run at once ." was a help text whose bracketed default Rich ate
    assert not re.search(r"\w \.(\s|$)", out, re.MULTILINE), out
    for param in command.params:
        text = param.help or ""
        # a bracket Rich would read as markup and drop, unless escaped
        assert not re.search(r"(?<!\\)\[[a-z/]", text), f"{path} {param.name}: {text!r}"
        default = _markup_default(text)
        if default is not None:
            assert f"[default: {default}]" in out, f"{path} {param.name}"
        if param.param_type_name == "option" and not getattr(param, "is_flag", False):
            assert not (param.metavar or "").startswith("<list"), param.name
    for name in getattr(command, "commands", {}):
        assert name in out


def test_run_help_shows_every_default_of_docs_cli(help_of: Callable[..., str]) -> None:
    """The defaults docs/cli.md's table gives for ``run`` (D14), as --help shows them."""
    out = help_of("run")
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│ --")}
    assert "[default: 8]" in rows["--worker-threads"]
    assert "[default: 30]" in rows["--grace"]
    assert "[default: info]" in rows["--log-level"]
    assert "[default: 127.0.0.1]" in rows["--metrics-host"]
    assert "Usage: shardkeeper run [OPTIONS] [MODULE:CLASS...]" in out


def test_flags_and_repeatable_options_read_as_what_they_take(
    help_of: Callable[..., str],
) -> None:
    trigger = help_of("trigger")
    assert "Usage: shardkeeper trigger [OPTIONS] NAME" in trigger
    param = next(line for line in trigger.splitlines() if "--param" in line)
    assert "KEY=VALUE" in param and "<list" not in param
    job = help_of("job")
    json_row = next(line for line in job.splitlines() if "--json" in line)
    assert "<" not in json_row.split("Print JSON")[0], json_row
    assert "Usage: shardkeeper audit [OPTIONS] [JOB]" in help_of("audit")
    assert "Usage: shardkeeper config set [OPTIONS] NAME KEY=VALUE..." in help_of("config", "set")


def test_top_level_help_names_the_registry_variable_and_v(help_of: Callable[..., str]) -> None:
    out = help_of()
    assert "$SHARDKEEPER_REGISTRY" in out
    version_row = next(line for line in out.splitlines() if "--version" in line)
    assert "-V" in version_row


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_short_and_long_version(flag: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"shardkeeper {__version__}"
