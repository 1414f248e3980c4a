"""``shardkeeper run`` settings from a file: the options an instance runs with.

Every option of ``shardkeeper run`` can come from three places; the first that gives
it wins: the command line, its ``SHARDKEEPER_*`` environment variable, the runtime
file (``--runtime-config FILE`` or ``SHARDKEEPER_RUNTIME_CONFIG``), the built-in
default. The file is YAML (``.yaml``/``.yml``) or TOML (``.toml``)::

    registry: zk://zk1:2181,zk2:2181/shop
    jobs: [shop.jobs:OrderSync, shop.jobs:Invoices]
    job_file: jobs.yaml
    worker_threads: 16
    executor: process          # jobs whose config names no executor
    max_items_per_child: 1000  # worker processes of the process executor
    max_memory_per_child: 512000  # KiB
    grace: 60
    labels: {zone: eu-1, role: batch}
    log_level: info
    history_url: file:/run/secrets/history-url
    metrics_port: 9108
    metrics_host: 0.0.0.0

``registry`` and ``history_url`` are secrets when they hold a password: either may
be an ``env:NAME`` or ``file:PATH`` reference, whole or for its password alone
(``postgresql://jobs@db/jobs?password=file:/run/secrets/pg``), read when the
instance starts (:mod:`shardkeeper.secretref`); keep literals out of the file.

An unknown key or a value of the wrong type is an error naming it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from shardkeeper._imports import needs_extra
from shardkeeper.errors import ConfigError

__all__ = ["RUNTIME_CONFIG_ENV", "RunSettings", "load_run_settings"]

#: the environment variable naming the runtime file
RUNTIME_CONFIG_ENV = "SHARDKEEPER_RUNTIME_CONFIG"


@dataclass(frozen=True)
class RunSettings:
    """What a runtime file may set (None: not set there)."""

    registry: str | None = None
    jobs: tuple[str, ...] = ()
    job_file: str | None = None
    worker_threads: int | None = None
    executor: str | None = None
    max_items_per_child: int | None = None
    max_memory_per_child: int | None = None
    grace: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    log_level: str | None = None
    history_url: str | None = None
    metrics_port: int | None = None
    metrics_host: str | None = None


_TYPES: dict[str, tuple[type, ...]] = {
    "registry": (str,),
    "jobs": (list,),
    "job_file": (str,),
    "worker_threads": (int,),
    "executor": (str,),
    "max_items_per_child": (int,),
    "max_memory_per_child": (int,),
    "grace": (int, float),
    "labels": (dict,),
    "log_level": (str,),
    "history_url": (str,),
    "metrics_port": (int,),
    "metrics_host": (str,),
}


_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    list: "a list",
    dict: "a mapping",
}


def load_run_settings(path: str | Path) -> RunSettings:
    """Read and check a runtime file; ConfigError naming the file and the bad key."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"runtime config {str(p)!r}: cannot read it ({exc.strerror})") from None
    # imported here: only a YAML file needs PyYAML (the 'cli' extra has it)
    with needs_extra("cli", f"runtime config {str(p)!r}"):
        import yaml
    try:
        if p.suffix in (".yaml", ".yml"):
            data: Any = yaml.safe_load(text) or {}
        elif p.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            raise ConfigError(
                f"runtime config {str(p)!r}: unknown file type {p.suffix or '(none)'!r}; "
                "use .yaml, .yml or .toml"
            )
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"runtime config {str(p)!r} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"runtime config {str(p)!r}: expected a mapping of settings")
    known = {f.name for f in fields(RunSettings)}
    values: dict[str, Any] = {}
    for key, raw in data.items():
        value: Any = raw
        if key not in known:
            raise ConfigError(
                f"runtime config {str(p)!r}: unknown setting {key!r}; valid settings are "
                f"{', '.join(sorted(known))}"
            )
        types = _TYPES[key]
        if isinstance(value, bool) or not isinstance(value, types):
            wanted = " or ".join(_NAMES[t] for t in types)
            raise ConfigError(f"runtime config {str(p)!r}: {key}={value!r} is not {wanted}")
        if key == "jobs":
            jobs: list[Any] = raw
            if not all(isinstance(j, str) for j in jobs):
                raise ConfigError(f"runtime config {str(p)!r}: jobs must be MODULE:CLASS strings")
            value = tuple(jobs)
        if key == "labels":
            labels: dict[Any, Any] = raw
            value = {str(k): str(v) for k, v in labels.items()}
        values[key] = value
    return RunSettings(**values)
