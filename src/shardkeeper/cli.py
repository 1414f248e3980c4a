"""The ``shardkeeper`` command line: run jobs, inspect and steer them, a local registry.

This module only parses arguments and renders results; the work is done by
:mod:`shardkeeper.ops` (and :mod:`shardkeeper.runtime` for ``run``). Every command is
described in ``docs/cli.md``, with the JSON schema of each ``--json`` output.

Exit codes: 0 ok; 1 the operation was refused or failed (unknown job or instance,
unreachable store, wrong credentials, a request the state forbids); 2 usage error
(bad arguments, bad registry URL, invalid config values). Errors are ONE line on
stderr, never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from shardkeeper._version import __version__
from shardkeeper.config import load_job_configs
from shardkeeper.errors import ConfigError, JobConflictError, ShardkeeperError
from shardkeeper.ops import (
    DumpEntry,
    InstanceView,
    ItemView,
    JobSummary,
    Operations,
    config_to_dict,
    parse_assignments,
)
from shardkeeper.ops.launch import resolve_jobs
from shardkeeper.ops.views import iso
from shardkeeper.registry.url import ENV_VAR, redact

__all__ = ["app", "exit_code", "main"]

T = TypeVar("T")

app = typer.Typer(
    name="shardkeeper",
    help="Elastic sharded jobs on ZooKeeper or etcd: run them, inspect and steer them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Read or change a job's stored configuration.", no_args_is_help=True)
registry_app = typer.Typer(
    help="A local ZooKeeper or etcd for development (detached servers); fix-acl.",
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")
app.add_typer(registry_app, name="registry")

_out = Console(highlight=False, soft_wrap=False)

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


# -- plumbing ------------------------------------------------------------------------


def exit_code(exc: ShardkeeperError) -> int:
    """The exit code for an error: 2 for bad input, 1 for everything else."""
    if isinstance(exc, JobConflictError):
        return 1  # the input is fine; the registry refuses it
    return 2 if isinstance(exc, ConfigError) else 1


class _Failed(Exception):
    """A command that ran but did not achieve what was asked (exit 1)."""


@contextmanager
def _ops(registry: str | None) -> Iterator[Operations]:
    ops = Operations.connect(registry)
    try:
        yield ops
    finally:
        ops.close()


def _emit_json(data: Any) -> None:
    # plain stdout, not rich: the JSON must not be wrapped or coloured
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _table(*columns: str) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _when(value: datetime | float | None) -> str:
    text = iso(value)
    return text.replace("+00:00", "Z") if text else "-"


def _next(when: datetime | None, reason: str | None) -> str:
    """The next fire time, or why there is none (``- (no instance)``)."""
    if when is None and reason:
        return f"- ({reason})"
    return _when(when)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.1f}s"


def _short(text: str | None, limit: int = 60) -> str:
    if not text:
        return "-"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ids(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _show_version(value: bool) -> None:
    if value:
        _out.print(f"shardkeeper {__version__}")
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


# -- run -------------------------------------------------------------------------------


@app.command()
def run(
    jobs: Annotated[
        list[str],
        typer.Argument(metavar="MODULE:CLASS...", help="Job classes, e.g. myapp.jobs:OrderSync."),
    ],
    registry: RegistryOpt = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML/TOML job file; jobs matched by name."),
    ] = None,
    worker_threads: Annotated[
        int, typer.Option("--worker-threads", min=1, help="Items run at once.")
    ] = 8,
    grace: Annotated[
        float, typer.Option("--grace", min=0, help="Seconds running items get at shutdown.")
    ] = 30.0,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", metavar="KEY=VALUE", help="Instance label (repeatable)."),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option("--log-level", help="Log level.")] = (
        LogLevel.info
    ),
    history_url: HistoryUrlOpt = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve /metrics, /healthz and /readyz on this port (0 = any free port).",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address the metrics port binds to.")
    ] = "127.0.0.1",
) -> None:
    """Run job classes as one instance until SIGTERM/SIGINT or a remote shutdown."""
    from shardkeeper.history import HistoryRecorder, resolve_url
    from shardkeeper.runtime import Runtime

    logging.basicConfig(
        level=log_level.value.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    labels: dict[str, str] = {}
    for pair in label or []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"--label {pair!r} is not KEY=VALUE")
        labels[key] = value
    specs, unclaimed = resolve_jobs(jobs, config)
    if unclaimed:
        logging.getLogger("shardkeeper.cli").warning(
            "jobs in %s not run by this instance (no matching class): %s",
            config,
            ", ".join(unclaimed),
        )
    history = resolve_url(history_url)  # a bad URL fails before anything starts
    runtime = Runtime(
        registry,
        worker_threads=worker_threads,
        shutdown_grace=grace,
        labels=labels,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )
    for cls, job_config in specs:
        runtime.add_job(cls, job_config)
    recorder = HistoryRecorder(history) if history is not None else None
    if recorder is not None:
        runtime.observers.add(recorder)
    try:
        runtime.run_forever()
    finally:
        if recorder is not None:
            recorder.close(timeout=10.0)  # flush what the last executions queued


# -- reads -----------------------------------------------------------------------------


@app.command()
def status(registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """Overview: live instances and every job with its health."""
    with _ops(registry) as ops:
        overview = ops.status()
    if as_json:
        _emit_json(overview.to_dict())
        return
    _out.print(
        f"{overview.backend} namespace {overview.namespace!r}: "
        f"{len(overview.instances)} live instance(s), {len(overview.jobs)} job(s)"
    )
    if not overview.jobs:
        return
    table = _table(
        "JOB", "TRIGGER", "ITEMS", "INSTANCES", "RUNNING", "QUEUED", "NEXT FIRE", "HEALTH"
    )
    for job in overview.jobs:
        s = job.summary
        table.add_row(
            s.name,
            s.trigger,
            str(s.sharding_total_count),
            str(len(s.instances)),
            str(job.running_items),
            str(job.failover_queued),
            _next(s.next_fire, s.next_fire_reason),
            job.health,
        )
    _out.print(table)


def _jobs_table(summaries: list[JobSummary]) -> Table:
    table = _table("NAME", "TRIGGER", "ITEMS", "INSTANCES", "LEADER", "ENABLED", "FAILOVER", "NEXT")
    for s in summaries:
        table.add_row(
            s.name,
            s.trigger,
            str(s.sharding_total_count),
            _ids(s.instances),
            s.leader or "-",
            _yes(s.enabled),
            _yes(s.failover),
            _next(s.next_fire, s.next_fire_reason),
        )
    return table


@app.command("jobs")
def jobs_cmd(registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """List every registered job."""
    with _ops(registry) as ops:
        summaries = ops.jobs()
    if as_json:
        _emit_json({"jobs": [s.to_dict() for s in summaries]})
    elif summaries:
        _out.print(_jobs_table(summaries))
    else:
        _out.print("no jobs registered")


def _items_table(items: list[ItemView]) -> Table:
    table = _table(
        "ITEM",
        "PARAMETER",
        "OWNER",
        "RUNNING ON",
        "FAILOVER",
        "MISFIRE",
        "DISABLED",
        "LAST RUN",
        "DURATION",
        "LAST OK",
        "LAST ERROR",
    )
    for i in items:
        failover = f"queued (from {i.failover_from})" if i.failover_queued else "-"
        if i.running_as_failover:
            failover = "running"
        table.add_row(
            str(i.item),
            i.parameter or "-",
            i.owner or "-",
            i.running_on or "-",
            failover,
            _yes(i.misfire),
            _yes(i.disabled),
            _when(i.last_run) + (" (stale)" if i.health == "stale" else ""),
            _seconds(i.last_duration),
            _when(i.last_ok),
            _short(i.last_error),
        )
    return table


@app.command("job")
def job_cmd(name: JobArg, registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """Everything about one job: config, leader, instances, items."""
    with _ops(registry) as ops:
        detail = ops.job(name)
    if as_json:
        _emit_json(detail.to_dict())
        return
    head = _table("FIELD", "VALUE")
    head.show_header = False
    rows = [
        ("job", detail.name),
        ("trigger", detail.trigger),
        ("enabled", _yes(detail.enabled)),
        ("leader", detail.leader or "-"),
        ("instances", _ids(detail.instances)),
        ("disabled instances", _ids(detail.disabled_instances)),
        ("reshard pending", detail.reshard_reason or "no"),
        ("generation", str(detail.assignment_generation or "-")),
        ("next fire", _next(detail.next_fire, detail.next_fire_reason)),
        ("health", detail.health),
    ]
    if detail.config_error:
        rows.append(("config error", detail.config_error))
    for key, value in rows:
        head.add_row(key, value)
    _out.print(head)
    _out.print(_items_table(detail.items))


@app.command()
def shards(name: JobArg, registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """The items of a job: owner, where each runs, failover, misfire, switches."""
    with _ops(registry) as ops:
        detail = ops.job(name)
    if as_json:
        _emit_json(
            {
                "job": detail.name,
                "reshard_pending": detail.reshard_pending,
                "assignment_generation": detail.assignment_generation,
                "items": [i.to_dict() for i in detail.items],
            }
        )
        return
    _out.print(_items_table(detail.items))


def _instances_table(views: list[InstanceView]) -> Table:
    table = _table("INSTANCE", "HOST", "PID", "VERSION", "STARTED", "ITEMS", "LEADER OF", "LABELS")
    for v in views:
        items = "; ".join(
            f"{job}: {','.join(map(str, its)) or '-'}{' (disabled)' if v.disabled[job] else ''}"
            for job, its in v.items.items()
        )
        table.add_row(
            v.instance_id,
            v.host,
            str(v.pid or "-"),
            v.version,
            _when(v.started_at),
            items or "-",
            _ids(v.leader_of),
            ", ".join(f"{k}={val}" for k, val in v.labels.items()) or "-",
        )
    return table


@app.command()
def instances(
    job: Annotated[str | None, typer.Option("--job", help="Only instances of this job.")] = None,
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List live instances with their items per job."""
    with _ops(registry) as ops:
        views = ops.instances(job)
    if as_json:
        _emit_json({"instances": [v.to_dict() for v in views]})
    elif views:
        _out.print(_instances_table(views))
    else:
        _out.print("no live instances")


@app.command()
def dump(
    path: Annotated[str, typer.Argument(help="Subtree to show.")] = "/",
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every stored node under PATH with its value and kind (for debugging)."""
    with _ops(registry) as ops:
        nodes = ops.dump(path)
    if not nodes and path != "/":
        raise _Failed(f"nothing is stored at {path}")
    if as_json:
        _emit_json({"path": path, "nodes": {p: e.to_dict() for p, e in nodes.items()}})
        return
    # plain lines, never wrapped: values are long JSON documents that people grep
    sys.stdout.write("".join(_dump_line(entry) + "\n" for entry in nodes.values()))


def _dump_line(entry: DumpEntry) -> str:
    kind = "E" if entry.kind == "ephemeral" else "P"
    value = entry.value if entry.encoding == "utf-8" else f"base64:{entry.value}"
    return f"{entry.path} [{kind}] {value}" if value else f"{entry.path} [{kind}]"


@app.command()
def history(
    name: JobArg,
    item: Annotated[int | None, typer.Option("--item", metavar="N", help="Only item N.")] = None,
    instance: Annotated[
        str | None, typer.Option("--instance", metavar="ID", help="Only runs on this instance.")
    ] = None,
    failed: Annotated[bool, typer.Option("--failed", help="Only failed/timed-out runs.")] = False,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="DURATION", help="Only runs started since: 30s, 1h, 2d."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many rows.")] = 50,
    execution: Annotated[
        str | None,
        typer.Option("--execution", metavar="ID", help="Every run of one execution id."),
    ] = None,
    show_traceback: Annotated[
        bool, typer.Option("--show-traceback", help="Print tracebacks below the table.")
    ] = False,
    history_url: HistoryUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per row.")] = False,
) -> None:
    """Recorded executions of a job, newest first (from the execution history)."""
    from shardkeeper.history import HistoryQuery, HistoryReader, parse_since
    from shardkeeper.history.render import history_table, json_lines, tracebacks

    query = HistoryQuery(
        job=name,
        item=item,
        instance=instance,
        failed_only=failed,
        since=parse_since(since) if since is not None else None,
        execution_id=execution,
        limit=limit,
    )
    with HistoryReader(history_url) as reader:
        entries = reader.query(query)
        where = reader.describe()
    if as_json:
        sys.stdout.write(json_lines(entries))
    elif not entries:
        _out.print(f"no executions of {name!r} match in {where}", markup=False)
    else:
        _out.print(history_table(entries))
        if show_traceback or execution is not None:
            sys.stdout.write(tracebacks(entries))


# -- writes ----------------------------------------------------------------------------


@app.command()
def trigger(
    name: JobArg,
    instance: Annotated[
        str | None, typer.Option("--instance", help="Only this instance (default: all).")
    ] = None,
    registry: RegistryOpt = None,
) -> None:
    """Run a job's items now on its live instances (or on one)."""
    with _ops(registry) as ops:
        asked = ops.trigger(name, instance)
    _out.print(f"triggered {name} on {', '.join(asked)}", markup=False)


def _switch(
    enable: bool, name: str | None, item: int | None, instance: str | None, registry: str | None
) -> str:
    verb = "enabled" if enable else "disabled"
    if item is not None and name is None:
        raise ConfigError("--item needs the job NAME")
    if item is not None and instance is not None:
        raise ConfigError("give --item or --instance, not both")
    if name is None and instance is None:
        raise ConfigError("give a job NAME, or --instance ID (for every job it runs)")
    with _ops(registry) as ops:
        if item is not None:
            assert name is not None  # checked above: --item needs a job
            (ops.enable_item if enable else ops.disable_item)(name, item)
            return f"{verb} item {item} of {name}"
        if instance is not None:
            fn = ops.enable_instance if enable else ops.disable_instance
            jobs = fn(instance, name)
            where = ", ".join(jobs) if jobs else "no job (nothing to change)"
            return f"{verb} instance {instance} for {where}"
        assert name is not None
        (ops.enable_job if enable else ops.disable_job)(name)
        return f"{verb} job {name}"


ItemOpt = Annotated[int | None, typer.Option("--item", metavar="N", help="One item of the job.")]
InstanceOpt = Annotated[
    str | None,
    typer.Option("--instance", metavar="ID", help="One instance (every job it runs if no NAME)."),
]
OptionalJobArg = Annotated[
    str | None, typer.Argument(metavar="NAME", help="Job name (optional with --instance).")
]


@app.command()
def disable(
    name: OptionalJobArg = None,
    item: ItemOpt = None,
    instance: InstanceOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Switch off a job, one of its items (--item) or an instance (--instance)."""
    _out.print(_switch(False, name, item, instance, registry), markup=False)


@app.command()
def enable(
    name: OptionalJobArg = None,
    item: ItemOpt = None,
    instance: InstanceOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Switch on again what `disable` switched off."""
    _out.print(_switch(True, name, item, instance, registry), markup=False)


@app.command()
def shutdown(
    instance: Annotated[str, typer.Argument(metavar="INSTANCE", help="Instance id.")],
    wait: Annotated[
        float | None,
        typer.Option("--wait", metavar="SECONDS", min=0, help="Wait until it is gone."),
    ] = None,
    registry: RegistryOpt = None,
) -> None:
    """Ask an instance to stop gracefully (it finishes its running items first)."""
    with _ops(registry) as ops:
        gone = ops.shutdown(instance, wait=wait)
    if wait is None:
        _out.print(f"shutdown requested for {instance}", markup=False)
    elif gone:
        _out.print(f"{instance} stopped", markup=False)
    else:
        raise _Failed(f"{instance} is still running after {wait:g} s")


@app.command()
def remove(
    name: JobArg,
    force: Annotated[
        bool, typer.Option("--force", help="Remove even while instances run it.")
    ] = False,
    registry: RegistryOpt = None,
) -> None:
    """Delete everything stored for a job (refused while instances run it)."""
    with _ops(registry) as ops:
        members = ops.remove_job(name, force=force)
    note = f" (still run by {', '.join(members)}: stop them)" if members else ""
    _out.print(f"removed job {name}{note}", markup=False)


# -- config ----------------------------------------------------------------------------


@config_app.command("get")
def config_get(name: JobArg, registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """Show a job's stored configuration (an invalid one: its raw text and why)."""
    with _ops(registry) as ops:
        stored = ops.stored_config(name)
    if stored.config is None:
        # Show what is there, so the operator can repair it; fail all the same.
        if as_json:
            _emit_json({"name": name, "config_error": stored.error, "raw": stored.text})
        else:
            sys.stdout.write(stored.text + "\n")
        raise _Failed(
            f"{stored.error} (repair it: shardkeeper config set {name} KEY=VALUE..., or "
            f"shardkeeper config replace {name} --file FILE)"
        )
    data = config_to_dict(stored.config)
    if as_json:
        _emit_json(data)
        return
    table = _table("FIELD", "VALUE")
    for key, value in data.items():
        table.add_row(key, json.dumps(value, ensure_ascii=False))
    _out.print(table)
    if stored.by:
        edits = f"; operator edits: {', '.join(stored.edits)}" if stored.edits else ""
        _out.print(
            f"written by {stored.writer} {stored.by} at {_when(stored.at)} "
            f"(revision {stored.revision}){edits}",
            markup=False,
        )


def _print_changes(
    name: str, before: dict[str, Any] | None, after: dict[str, Any], as_json: bool
) -> None:
    if as_json:
        _emit_json(after)
        return
    if before is None:
        _out.print(f"{name}: the invalid stored config was replaced", markup=False)
        return
    changed = [k for k in after if before.get(k) != after[k]]
    if not changed:
        _out.print(f"{name}: nothing changed", markup=False)
    for key in changed:
        old, new = json.dumps(before.get(key)), json.dumps(after[key])
        _out.print(f"{name}: {key} {old} -> {new}", markup=False)
    if before["sharding_total_count"] != after["sharding_total_count"]:
        _out.print(f"{name}: items are resharded at the next trigger", markup=False)


@config_app.command("set")
def config_set(
    name: JobArg,
    assignments: Annotated[
        list[str], typer.Argument(metavar="KEY=VALUE...", help="Fields to change.")
    ],
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change fields of a job's stored configuration (validated; instances reload it).
    Also repairs an invalid stored config: its readable fields are kept."""
    changes = parse_assignments(assignments)
    with _ops(registry) as ops:
        stored = ops.stored_config(name)
        before = config_to_dict(stored.config) if stored.config is not None else None
        after = config_to_dict(ops.update_config(name, **changes))
    _print_changes(name, before, after, as_json)


@config_app.command("replace")
def config_replace(
    name: JobArg,
    file: Annotated[
        Path,
        typer.Option("--file", "-f", help="YAML/TOML job file holding a job of this NAME."),
    ],
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replace a job's whole stored configuration with the job NAME of a job file
    (also an invalid stored config)."""
    configs = [c for c in load_job_configs(file) if c.name == name]
    if not configs:
        raise ConfigError(f"{file} has no job named {name!r}")
    with _ops(registry) as ops:
        new, old = ops.replace_config(name, configs[0])
    _print_changes(name, config_to_dict(old) if old else None, config_to_dict(new), as_json)


# -- registry --------------------------------------------------------------------------

DirOpt = Annotated[
    Path, typer.Option("--dir", help="State and data directory of the local registry.")
]
_DEFAULT_DIR = Path("registry/data")


@registry_app.command("up")
def registry_up(
    backend: Annotated[Backend, typer.Option("--backend", help="Which store.")] = (
        Backend.zookeeper
    ),
    nodes: Annotated[int, typer.Option("--nodes", help="1 or 3 members.")] = 1,
    directory: DirOpt = _DEFAULT_DIR,
    namespace: Annotated[
        str, typer.Option("--namespace", help="Namespace of the printed URL.")
    ] = "default",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for ready.")] = 60.0,
) -> None:
    """Start a detached local registry and print its URL (only the URL, on stdout)."""
    from shardkeeper.testing.local import up

    if nodes not in (1, 3):
        raise ConfigError(f"--nodes {nodes}: give 1 or 3")
    state = _local(
        lambda: up(backend.value, nodes, directory, namespace=namespace, timeout=timeout)
    )
    verb = "already running" if state["already_running"] else "started"
    typer.echo(
        f"{state['nodes']}-node {state['backend']} {verb} "
        f"(pids {', '.join(map(str, state['pids']))}; data in {directory})",
        err=True,
    )
    typer.echo(state["url"])


@registry_app.command("down")
def registry_down(directory: DirOpt = _DEFAULT_DIR) -> None:
    """Stop the local registry (every process it started)."""
    from shardkeeper.testing.local import down

    pids = _local(lambda: down(directory))
    typer.echo(f"stopped pids {', '.join(map(str, pids))}" if pids else "nothing was running")


@registry_app.command("status")
def registry_status(directory: DirOpt = _DEFAULT_DIR, as_json: JsonOpt = False) -> None:
    """Show the local registry and whether every member serves (exit 1 if not)."""
    from shardkeeper.testing.local import status as local_status

    info = _local(lambda: local_status(directory))
    keys = ("backend", "nodes", "url", "hosts", "pids", "logs", "started_at", "healthy")
    data: dict[str, Any] = {"running": info is not None, "dir": str(directory)}
    if info is not None:
        data.update({k: info.get(k) for k in keys})
        data["url"] = redact(str(info.get("url", "")))
        data["members"] = [
            {k: m.get(k) for k in ("index", "client_port", "pid", "running", "serving", "role")}
            for m in info["members"]
        ]
    else:
        data["healthy"] = False
    if as_json:
        _emit_json(data)
    elif info is None:
        typer.echo(f"no registry runs in {directory}")
    else:
        health = "healthy" if data["healthy"] else "UNHEALTHY"
        typer.echo(f"{data['nodes']}-node {data['backend']} registry: {health}")
        typer.echo(f"url: {data['url']}")
        for m in data["members"]:
            word = "serving" if m["serving"] else "running, not serving" if m["running"] else "down"
            role = f" ({m['role']})" if m["role"] else ""
            typer.echo(
                f"  member {m['index']}: port {m['client_port']} pid {m['pid']} {word}{role}"
            )
    if not data["healthy"]:
        raise typer.Exit(1)


@registry_app.command("fix-acl")
def registry_fix_acl(registry: RegistryOpt = None) -> None:
    """ZooKeeper: give every node of the namespace the URL user's digest ACL."""
    from shardkeeper.registry.url import RegistrySettings
    from shardkeeper.registry.zookeeper import ZooKeeperStore

    settings = RegistrySettings.from_env(registry)
    if settings.backend != "zookeeper":
        raise ConfigError(
            "fix-acl applies to ZooKeeper only; etcd access is granted by roles "
            "(see docs/registry-backends.md)"
        )
    if not settings.username:
        raise ConfigError(
            f"fix-acl needs the credentials to protect namespace {settings.namespace!r} "
            "with: give user:password in the registry URL"
        )
    # acl_repair: start() repairs an open namespace instead of refusing it
    store = ZooKeeperStore(settings.model_copy(update={"acl_repair": True}))
    try:
        store.start()
        count = store.acl_repaired or store.repair_acl()
    finally:
        store.close()
    typer.echo(
        f"namespace {settings.namespace!r}: ACL of {count} node(s) set to "
        f"digest:{settings.username} (all rights)"
    )


def _local(fn: Callable[[], T]) -> T:
    from shardkeeper.testing.servers import ClusterError

    try:
        return fn()
    except (ClusterError, RuntimeError, ValueError, OSError) as exc:
        raise _Failed(str(exc)) from None


# -- entry point -----------------------------------------------------------------------


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
    except _Failed as exc:
        _error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
