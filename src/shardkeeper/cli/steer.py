"""Write commands: trigger, disable/enable, shutdown, remove, config get/set/replace.

Every write goes through :func:`~shardkeeper.cli.audit.audited`, which records it in
the audit trail (``shardkeeper audit``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shardkeeper.cli.audit import audited
from shardkeeper.cli.common import Failed, JobArg, JsonOpt, RegistryOpt, app, config_app, connect
from shardkeeper.cli.render import emit_json, fmt_time, new_table, out
from shardkeeper.errors import ConfigError

if TYPE_CHECKING:
    from shardkeeper.config import JobConfig

__all__ = [
    "config_diff",
    "config_get",
    "config_replace",
    "config_set",
    "disable",
    "enable",
    "remove",
    "shutdown",
    "trigger",
]


@app.command()
def trigger(
    name: JobArg,
    instance: Annotated[
        str | None, typer.Option("--instance", help="Only this instance (default: all).")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            metavar="KEY=VALUE",
            help="A one-off parameter KEY=VALUE for this run (ctx.params); repeatable.",
        ),
    ] = None,
    item: Annotated[
        list[int] | None,
        typer.Option(
            "--item",
            metavar="N",
            help="Only this item (run by whichever instance owns it); repeatable.",
        ),
    ] = None,
    registry: RegistryOpt = None,
) -> None:
    """Run a job's items now on its live instances (or on one, or only some items)."""
    params: dict[str, str] = {}
    for pair in param or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {pair!r} is not KEY=VALUE")
        params[key] = value
    with audited(registry) as ops:
        asked = ops.trigger(name, instance, params=params, items=item)
    with_params = f" with {', '.join(f'{k}={v}' for k, v in params.items())}" if params else ""
    which = ""
    if item:
        items = sorted(set(item))
        which = f" item{'s' if len(items) > 1 else ''} {', '.join(map(str, items))} of"
    out.print(f"triggered{which} {name} on {', '.join(asked)}{with_params}", markup=False)


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
    with audited(registry) as ops:
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
    out.print(_switch(False, name, item, instance, registry), markup=False)


@app.command()
def enable(
    name: OptionalJobArg = None,
    item: ItemOpt = None,
    instance: InstanceOpt = None,
    registry: RegistryOpt = None,
) -> None:
    """Switch on again what `disable` switched off."""
    out.print(_switch(True, name, item, instance, registry), markup=False)


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
    with audited(registry) as ops:
        gone = ops.shutdown(instance, wait=wait)
    if wait is None:
        out.print(f"shutdown requested for {instance}", markup=False)
    elif gone:
        out.print(f"{instance} stopped", markup=False)
    else:
        raise Failed(f"{instance} is still running after {wait:g} s")


@app.command()
def remove(
    name: JobArg,
    force: Annotated[
        bool, typer.Option("--force", help="Remove even while instances run it.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    registry: RegistryOpt = None,
) -> None:
    """Delete everything stored for a job (refused while instances run it); asks
    for confirmation unless --yes."""
    if not yes:
        _confirm_remove(name)
    with audited(registry) as ops:
        members = ops.remove_job(name, force=force)
    note = f" (still run by {', '.join(members)}: stop them)" if members else ""
    out.print(f"removed job {name}{note}", markup=False)


def _interactive() -> bool:
    """Whether someone at a terminal can answer a question (stdin is a terminal)."""
    return sys.stdin.isatty()


def _confirm_remove(name: str) -> None:
    """Ask on the terminal before a removal; refuse when nobody can answer (no
    terminal on stdin: a script must say --yes)."""
    if not _interactive():
        raise ConfigError(
            f"remove deletes everything stored for job {name!r} (its config, results, "
            "checkpoints and queues) and asks first; stdin is not a terminal to answer: "
            "pass --yes to remove it without asking"
        )
    answer = typer.prompt(
        f"Delete everything stored for job {name!r} (config, results, checkpoints)? "
        "Type the job name to confirm",
        default="",
        show_default=False,
    )
    if answer.strip() != name:
        raise Failed(f"not removed: the answer {answer.strip()!r} is not the job name {name!r}")


# -- config ----------------------------------------------------------------------------


@config_app.command("get")
def config_get(name: JobArg, registry: RegistryOpt = None, as_json: JsonOpt = False) -> None:
    """Show a job's stored configuration (an invalid one: its raw text and why)."""
    with connect(registry) as ops:
        stored = ops.stored_config(name)
    if stored.config is None:
        # Show what is there, so the operator can repair it; fail all the same.
        if as_json:
            emit_json({"name": name, "config_error": stored.error, "raw": stored.text})
        else:
            sys.stdout.write(stored.text + "\n")
        raise Failed(
            f"{stored.error} (repair it: shardkeeper config set {name} KEY=VALUE..., or "
            f"shardkeeper config replace {name} --file FILE)"
        )
    from shardkeeper.ops import config_to_dict

    data = config_to_dict(stored.config)
    if as_json:
        emit_json(data)
        return
    table = new_table("FIELD", "VALUE")
    for key, value in data.items():
        table.add_row(key, json.dumps(value, ensure_ascii=False))
    out.print(table)
    if stored.by:
        edits = f"; operator edits: {', '.join(stored.edits)}" if stored.edits else ""
        out.print(
            f"written by {stored.writer} {stored.by} at {fmt_time(stored.at)} "
            f"(revision {stored.revision}){edits}",
            markup=False,
        )


def _print_changes(
    name: str, before: dict[str, Any] | None, after: dict[str, Any], as_json: bool
) -> None:
    # before and after as stored (a new secret differs from the old one even when
    # both share a mask), shown masked
    from shardkeeper.config.secrets import mask_config_data, mask_value

    if as_json:
        emit_json(mask_config_data(after))
        return
    if before is None:
        out.print(f"{name}: the invalid stored config was replaced", markup=False)
        return
    changed = [k for k in after if before.get(k) != after[k]]
    if not changed:
        out.print(f"{name}: nothing changed", markup=False)
    for key in changed:
        old = json.dumps(mask_value(key, before.get(key)))
        new = json.dumps(mask_value(key, after[key]))
        out.print(f"{name}: {key} {old} -> {new}", markup=False)
    if before["sharding_total_count"] != after["sharding_total_count"]:
        out.print(f"{name}: items are resharded at the next trigger", markup=False)


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
    from shardkeeper.ops import config_to_dict, parse_assignments

    changes = parse_assignments(assignments)
    with audited(registry) as ops:
        stored = ops.ops.stored_config(name)
        current = stored.config
        before = config_to_dict(current, reveal=True) if current is not None else None
        updated = ops.update_config(name, **changes)
        after = config_to_dict(updated, reveal=True)
    _print_changes(name, before, after, as_json)
    _warn_parameters_gap(current, updated)


def _warn_parameters_gap(before: JobConfig | None, after: JobConfig) -> None:
    """On stderr (stdout stays the changes, or --json): items a count raise (or a
    parameters edit) left without a parameter (newcomer review N5)."""
    touched = before is None or (
        before.sharding_total_count != after.sharding_total_count
        or before.sharding_item_parameters != after.sharding_item_parameters
    )
    gap = after.parameters_gap()
    if touched and gap:
        sys.stderr.write(f"warning: {gap}\n")


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
    from shardkeeper.config import load_job_configs
    from shardkeeper.ops import config_to_dict

    configs = [c for c in load_job_configs(file) if c.name == name]
    if not configs:
        raise ConfigError(f"{file} has no job named {name!r}")
    with audited(registry) as ops:
        new, old = ops.replace_config(name, configs[0])
    _print_changes(
        name,
        config_to_dict(old, reveal=True) if old else None,
        config_to_dict(new, reveal=True),
        as_json,
    )
    _warn_parameters_gap(old, new)


@config_app.command("diff")
def config_diff(
    name: JobArg,
    job_class: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:CLASS", help="The job class whose config (class attribute) to compare."
        ),
    ],
    registry: RegistryOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Compare a job's stored configuration with the one a job class carries (what a
    start of that class would find ignored without overwrite). Exit 1 when they differ."""
    code = _class_config(name, job_class)
    with connect(registry) as ops:
        stored = ops.stored_config(name)
    if stored.config is None:
        raise Failed(f"{stored.error} (nothing to compare: repair it with shardkeeper config set)")
    from shardkeeper.ops import config_to_dict

    # compared as they are, shown masked: two secrets may share their mask
    mine, theirs = config_to_dict(code, reveal=True), config_to_dict(stored.config, reveal=True)
    shown_mine, shown_theirs = config_to_dict(code), config_to_dict(stored.config)
    # fields the runtime fills in or that only steer a start are not configuration
    skip = {"job_class", "overwrite"}
    differ = {
        key: {"stored": shown_theirs.get(key), "code": shown_mine.get(key)}
        for key in sorted(set(mine) | set(theirs))
        if key not in skip and mine.get(key) != theirs.get(key)
    }
    if as_json:
        emit_json({"name": name, "job_class": job_class, "differences": differ})
    elif differ:
        table = new_table("FIELD", "STORED", "CODE")
        for key, pair in differ.items():
            table.add_row(
                key,
                json.dumps(pair["stored"], ensure_ascii=False),
                json.dumps(pair["code"], ensure_ascii=False),
            )
        out.print(table)
    else:
        out.print(f"{name}: the stored config matches {job_class}", markup=False)
    if differ:
        raise typer.Exit(1)


def _class_config(name: str, job_class: str) -> Any:
    from shardkeeper._imports import import_object
    from shardkeeper.config import JobConfig

    obj = import_object(job_class, "job class")
    config = getattr(obj, "config", None)
    if isinstance(config, dict):
        config = JobConfig.parse(**config)
    if not isinstance(config, JobConfig):
        raise ConfigError(
            f"{job_class!r} has no config class attribute (a JobConfig): nothing to compare"
        )
    if config.name != name:
        raise ConfigError(f"{job_class!r} configures job {config.name!r}, not {name!r}")
    return config
