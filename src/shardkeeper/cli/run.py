"""``shardkeeper run``: run job classes as one instance."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from shardkeeper.cli.common import HistoryUrlOpt, LogLevel, RegistryOpt, app
from shardkeeper.errors import ConfigError
from shardkeeper.ops.launch import resolve_jobs

__all__ = ["run"]


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
