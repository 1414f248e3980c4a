"""Read commands: status, jobs, job, shards, instances, dump, history."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from shardkeeper._imports import needs_extra
from shardkeeper.cli.common import Failed, HistoryUrlOpt, JobArg, JsonOpt, RegistryOpt, app, connect
from shardkeeper.cli.render import (
    emit_json,
    fmt_ids,
    fmt_next,
    fmt_progress,
    fmt_seconds,
    fmt_short,
    fmt_time,
    fmt_yes,
    new_table,
    out,
)
from shardkeeper.errors import ConfigError

if TYPE_CHECKING:  # the views are imported with the store's answers, not for --help
    from shardkeeper.history import HistoryReader
    from shardkeeper.ops import DumpEntry, InstanceView, ItemView, JobSummary

__all__ = ["dump", "history", "instances", "job_cmd", "jobs_cmd", "shards", "status"]


@app.command()
def status(registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """Overview: live instances and every job with its health."""
    with connect(registry) as ops:
        overview = ops.status()
    if as_json:
        emit_json(overview.to_dict())
        return
    out.print(
        f"{overview.backend} namespace {overview.namespace!r}: "
        f"{len(overview.instances)} live instance(s), {len(overview.jobs)} job(s)"
    )
    if not overview.jobs:
        return
    table = new_table(
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
            fmt_next(s.next_fire, s.next_fire_reason),
            job.health,
        )
    out.print(table)


def _jobs_table(summaries: list[JobSummary]) -> Table:
    table = new_table(
        "NAME", "TRIGGER", "ITEMS", "INSTANCES", "LEADER", "ENABLED", "FAILOVER", "NEXT"
    )
    for s in summaries:
        table.add_row(
            s.name,
            s.trigger,
            str(s.sharding_total_count),
            fmt_ids(s.instances),
            s.leader or "-",
            fmt_yes(s.enabled),
            fmt_yes(s.failover),
            fmt_next(s.next_fire, s.next_fire_reason),
        )
    return table


@app.command("jobs")
def jobs_cmd(registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """List every registered job."""
    with connect(registry) as ops:
        summaries = ops.jobs()
    if as_json:
        emit_json({"jobs": [s.to_dict() for s in summaries]})
    elif summaries:
        out.print(_jobs_table(summaries))
    else:
        out.print("no jobs registered")


def _items_table(items: list[ItemView]) -> Table:
    # the progress columns only when some item reports progress: most jobs never do,
    # and three empty columns wrapped every row of an 80-column terminal
    shown = any(i.progress is not None for i in items)
    table = new_table(
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
        *(("PROGRESS", "RATE", "ETA") if shown else ()),
    )
    for i in items:
        failover = f"queued (from {i.failover_from})" if i.failover_queued else "-"
        if i.running_as_failover:
            failover = "running"
        table.add_row(
            str(i.item),
            i.parameter or "-",
            i.owner or "-",
            # ended while its batch's slower items run: not running any more
            f"- (finished {i.last_outcome})" if i.finished else (i.running_on or "-"),
            failover,
            fmt_yes(i.misfire),
            fmt_yes(i.disabled),
            fmt_time(i.last_run) + (" (stale)" if i.health == "stale" else ""),
            fmt_seconds(i.last_duration),
            fmt_time(i.last_ok),
            fmt_short(i.last_error),
            *(fmt_progress(i.progress) if shown else ()),
        )
    return table


@app.command("job")
def job_cmd(name: JobArg, registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """Everything about one job: config, leader, instances, items."""
    with connect(registry) as ops:
        detail = ops.job(name)
    if as_json:
        emit_json(detail.to_dict())
        return
    head = new_table("FIELD", "VALUE")
    head.show_header = False
    rows = [
        ("job", detail.name),
        ("trigger", detail.trigger),
        ("enabled", fmt_yes(detail.enabled)),
        ("leader", detail.leader or "-"),
        ("instances", fmt_ids(detail.instances)),
        ("disabled instances", fmt_ids(detail.disabled_instances)),
        ("reshard pending", detail.reshard_reason or "no"),
        ("generation", str(detail.assignment_generation or "-")),
        ("next fire", fmt_next(detail.next_fire, detail.next_fire_reason)),
        ("health", detail.health),
    ]
    if detail.config_error:
        rows.append(("config error", detail.config_error))
    for key, value in rows:
        head.add_row(key, value)
    out.print(head)
    out.print(_items_table(detail.items))


@app.command()
def shards(name: JobArg, registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """The items of a job: owner, where each runs, failover, misfire, switches."""
    with connect(registry) as ops:
        detail = ops.job(name)
    if as_json:
        emit_json(
            {
                "job": detail.name,
                "reshard_pending": detail.reshard_pending,
                "assignment_generation": detail.assignment_generation,
                "items": [i.to_dict() for i in detail.items],
            }
        )
        return
    out.print(_items_table(detail.items))


def _instances_table(views: list[InstanceView]) -> Table:
    from shardkeeper.ops.views import item_ranges  # with the views: not for --help

    table = new_table(
        "INSTANCE",
        "HOST",
        "PID",
        "VERSION",
        "STARTED",
        "CLOCK OFFSET",
        "ITEMS",
        "LEADER OF",
        "LABELS",
    )
    for v in views:
        # ranges: 2,000 items in a job are "0-999", not a line of 5,000 characters
        items = "; ".join(
            f"{job}: {item_ranges(its) or '-'}{' (disabled)' if v.disabled[job] else ''}"
            for job, its in v.items.items()
        )
        table.add_row(
            v.instance_id,
            v.host,
            str(v.pid or "-"),
            v.version,
            fmt_time(v.started_at),
            fmt_clock(v),
            items or "-",
            fmt_ids(v.leader_of),
            ", ".join(f"{k}={val}" for k, val in v.labels.items()) or "-",
        )
    return table


def fmt_clock(view: InstanceView) -> str:
    """The instance's clock offset against the store (store - its clock) with its
    bound, and the jobs whose ``max_time_diff_seconds`` it is past; ``-`` when it
    published none (no job of it has the check on)."""
    if view.clock_offset is None:
        return "-"
    text = f"{view.clock_offset:+.3f}s ±{view.clock_error or 0.0:.3f}"
    if view.clock_skewed:
        text += f" SKEWED ({', '.join(view.clock_skewed)})"
    return text


@app.command()
def instances(
    job: Annotated[str | None, typer.Option("--job", help="Only instances of this job.")] = None,
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List live instances with their items per job and their clock offset."""
    with connect(registry) as ops:
        views = ops.instances(job)
    if as_json:
        emit_json({"instances": [v.to_dict() for v in views]})
    elif views:
        out.print(_instances_table(views))
    else:
        out.print("no live instances")


@app.command()
def dump(
    path: Annotated[str, typer.Argument(metavar="PATH", help="Subtree to show.")] = "/",
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every stored node under PATH with its value and kind (for debugging)."""
    with connect(registry) as ops:
        nodes = ops.dump(path)
    if not nodes and path != "/":
        raise Failed(f"nothing is stored at {path}")
    if as_json:
        emit_json({"path": path, "nodes": {p: e.to_dict() for p, e in nodes.items()}})
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
    registry: RegistryOpt = None,
    all_scopes: Annotated[
        bool,
        typer.Option(
            "--all-scopes",
            help="Rows of every registry and namespace (and from before scoping), "
            "with a SCOPE column; no registry needed.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per row.")] = False,
) -> None:
    """Recorded executions of a job, newest first (from the execution history).

    Only the runs recorded in the registry and namespace of --registry (or
    SHARDKEEPER_REGISTRY) are shown: one history database may hold several
    deployments' runs. --all-scopes shows them all."""
    with needs_extra("history", "shardkeeper history"):
        from shardkeeper.history import ALL_SCOPES, HistoryQuery, HistoryReader, parse_since
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
    with HistoryReader(history_url) as reader:  # a bad or 'off' URL fails first
        reader.scope = _history_scope(registry, all_scopes=all_scopes)
        _require_database(reader)
        scope = reader.scope or ALL_SCOPES
        entries = reader.query(query)
        where = reader.describe()
        elsewhere = 0 if entries or as_json else reader.elsewhere(name)
    if as_json:
        sys.stdout.write(json_lines(entries))
    elif not entries:
        scoped = "" if all_scopes else f" for {scope}"
        out.print(f"no executions of {name!r} match in {where}{scoped}", markup=False)
        if elsewhere:
            out.print(
                f"({elsewhere} row(s) of {name!r} there belong to other registries or "
                "namespaces, or were recorded before scoping: --all-scopes shows them)",
                markup=False,
            )
    else:
        out.print(history_table(entries, show_scope=all_scopes))
        if show_traceback or execution is not None:
            sys.stdout.write(tracebacks(entries))


def _require_database(reader: HistoryReader) -> None:
    """Failed (exit 1) when the SQLite file to read does not exist.

    "No executions match" would be a false answer: nothing was ever recorded there,
    usually because the instances were started without --history-url (they record
    nothing then), record to another URL, or run on another host (a SQLite file is
    per host). An error, not a note with exit 0, so that a script reading --json
    does not take "no runs" for an answer.
    """
    from shardkeeper.history.engine import sqlite_path

    path = sqlite_path(reader.url)
    if path is None or path.exists():
        return
    raise Failed(
        f"no history database at {path}: nothing was ever recorded there. Instances "
        "record history only when started with --history-url URL (or "
        "SHARDKEEPER_HISTORY_URL; 'default' is this file); give this command the same "
        "--history-url as the instances (a SQLite file is per host: read it where they run)"
    )


def _history_scope(registry: str | None, *, all_scopes: bool) -> str | None:
    """The registry identity whose history ``history`` shows (None: every row);
    ConfigError when there is no registry to take it from."""
    from shardkeeper.registry.url import ENV_VAR, RegistrySettings

    if all_scopes:
        return None
    if registry is None and not os.environ.get(ENV_VAR):
        raise ConfigError(
            "history is kept per registry and namespace: give --registry URL or set "
            f"{ENV_VAR} (the registry the instances run on), or --all-scopes for every "
            "deployment's rows"
        )
    return RegistrySettings.from_env(registry).identity()
