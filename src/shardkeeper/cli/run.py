"""``shardkeeper run``: run job classes as one instance."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from shardkeeper._imports import needs_extra
from shardkeeper.cli.common import HistoryUrlOpt, LogLevel, RegistryOpt, app
from shardkeeper.cli.settings import RUNTIME_CONFIG_ENV, RunSettings, load_run_settings
from shardkeeper.errors import ConfigError

__all__ = ["run"]

T = TypeVar("T")


@app.command()
def run(
    jobs: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="MODULE:CLASS...",
            help="Job classes, e.g. myapp.jobs:OrderSync (or 'jobs' in the runtime config).",
        ),
    ] = None,
    registry: RegistryOpt = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            envvar="SHARDKEEPER_JOB_FILE",
            help="YAML/TOML job file; jobs matched by name.",
        ),
    ] = None,
    runtime_config: Annotated[
        Path | None,
        typer.Option(
            "--runtime-config",
            envvar=RUNTIME_CONFIG_ENV,
            help="YAML/TOML file of these options (the command line and env win).",
        ),
    ] = None,
    worker_threads: Annotated[
        int | None,
        typer.Option(
            "--worker-threads",
            min=1,
            envvar="SHARDKEEPER_WORKER_THREADS",
            help="Items run at once. \\[default: 8]",
        ),
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option(
            "--executor",
            envvar="SHARDKEEPER_EXECUTOR",
            help="Where the items of jobs that name no executor run: thread or process "
            "(worker processes). \\[default: thread]",
        ),
    ] = None,
    max_items_per_child: Annotated[
        int | None,
        typer.Option(
            "--max-items-per-child",
            min=0,
            envvar="SHARDKEEPER_MAX_ITEMS_PER_CHILD",
            help="Items a worker process runs before it is replaced; 0 = no limit. \\[default: 0]",
        ),
    ] = None,
    max_memory_per_child: Annotated[
        int | None,
        typer.Option(
            "--max-memory-per-child",
            min=0,
            envvar="SHARDKEEPER_MAX_MEMORY_PER_CHILD",
            help="KiB of resident memory past which a worker process is replaced after "
            "its item; 0 = no limit. \\[default: 0]",
        ),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0,
            envvar="SHARDKEEPER_GRACE",
            help="Seconds running items get at shutdown. \\[default: 30]",
        ),
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            metavar="KEY=VALUE",
            envvar="SHARDKEEPER_LABELS",
            help="Instance label (repeatable; in the env: space-separated).",
        ),
    ] = None,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            "--log-level", envvar="SHARDKEEPER_LOG_LEVEL", help="Log level. \\[default: info]"
        ),
    ] = None,
    history_url: HistoryUrlOpt = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            envvar="SHARDKEEPER_METRICS_PORT",
            help="Serve /metrics, /healthz and /readyz on this port (0 = any free port).",
        ),
    ] = None,
    metrics_host: Annotated[
        str | None,
        typer.Option(
            "--metrics-host",
            envvar="SHARDKEEPER_METRICS_HOST",
            help="Address the metrics port binds to. \\[default: 127.0.0.1]",
        ),
    ] = None,
) -> None:
    """Run job classes as one instance until SIGTERM/SIGINT or a remote shutdown.

    Each option may also come from its environment variable or a runtime config file
    (see docs/cli.md); the command line wins, then the environment, then the file."""
    # imported here, not at the top: --help and the other commands need none of it
    from shardkeeper.ops.launch import resolve_jobs
    from shardkeeper.runtime import Runtime

    file = load_run_settings(runtime_config) if runtime_config is not None else RunSettings()
    level = log_level.value if log_level is not None else (file.log_level or "info")
    if level.lower() not in {lv.value for lv in LogLevel}:
        raise ConfigError(
            f"log_level {level!r} is not one of {', '.join(lv.value for lv in LogLevel)}"
        )
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    labels: dict[str, str] = dict(file.labels)
    for pair in label or []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"--label {pair!r} is not KEY=VALUE")
        labels[key] = value
    classes = list(jobs or file.jobs)
    if not classes:
        raise ConfigError(
            "no job to run: give MODULE:CLASS arguments, or 'jobs' in the runtime config"
        )
    job_file = config if config is not None else (Path(file.job_file) if file.job_file else None)
    specs, unclaimed = resolve_jobs(classes, job_file)
    if unclaimed:
        logging.getLogger("shardkeeper.cli").warning(
            "jobs in %s not run by this instance (their job_class is not one of this "
            "run's classes): %s",
            job_file,
            ", ".join(unclaimed),
        )
    # history is recorded only where configured, as for a Runtime given a
    # HistoryRecorder (docs/configuration.md#history_url): one rule for both, and an
    # instance writes no file nobody asked for. A bad URL fails before anything starts.
    history_value = history_url if history_url is not None else file.history_url
    history = None
    if history_value is not None and history_value.strip():
        with needs_extra("history", "history_url (execution history)"):
            from shardkeeper.history import HistoryRecorder, resolve_url
        history = resolve_url(history_value)
    runtime = Runtime(
        registry if registry is not None else file.registry,
        worker_threads=_first(worker_threads, file.worker_threads, 8),
        executor=_first(executor, file.executor, "thread"),
        max_items_per_child=_first(max_items_per_child, file.max_items_per_child, 0),
        max_memory_per_child=_first(max_memory_per_child, file.max_memory_per_child, 0),
        shutdown_grace=_first(grace, file.grace, 30.0),
        labels=labels,
        metrics_port=metrics_port if metrics_port is not None else file.metrics_port,
        metrics_host=_first(metrics_host, file.metrics_host, "127.0.0.1"),
    )
    for cls, job_config in specs:
        runtime.add_job(cls, job_config)
    recorder = HistoryRecorder(history) if history is not None else None
    if recorder is not None:
        runtime.observers.add(recorder)
    else:
        logging.getLogger("shardkeeper.cli").info(
            "execution history not recorded (give --history-url or set "
            "SHARDKEEPER_HISTORY_URL: 'default' for %s)",
            "$XDG_DATA_HOME/shardkeeper/history.db",
        )
    try:
        runtime.run_forever()
    finally:
        if recorder is not None:
            recorder.close(timeout=10.0)  # flush what the last executions queued


def _first(*values: T | None) -> T:
    """The first value given (the last argument is the default and never None)."""
    for value in values:
        if value is not None:
            return value
    raise AssertionError("no default")
