"""Job files: several job configurations in one YAML or TOML file."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from shardkeeper._imports import needs_extra
from shardkeeper.errors import JobConfigError

from .model import JobConfig, build_config, config_label

__all__ = ["load_job_configs"]

_YAML_SUFFIXES = (".yaml", ".yml")
_TOML_SUFFIXES = (".toml",)


def _read_document(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in _YAML_SUFFIXES + _TOML_SUFFIXES:
        raise JobConfigError(
            f"{path}: unknown file type {suffix or '(none)'!r}; use .yaml, .yml or .toml"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise JobConfigError(f"{path}: cannot read the job file: {exc.strerror or exc}") from None
    if suffix in _TOML_SUFFIXES:
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise JobConfigError(f"{path}: invalid TOML: {exc}") from None
    # imported here: PyYAML comes with the optional 'cli' extra (TOML needs nothing)
    with needs_extra("cli", f"{path}: a YAML job file"):
        import yaml
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise JobConfigError(f"{path}: invalid YAML: {exc}") from None


def load_job_configs(path: str | os.PathLike[str]) -> list[JobConfig]:
    """Every job in a YAML or TOML job file, validated, in file order.

    YAML: a list of jobs, or a mapping with a ``jobs`` list. TOML: ``[[jobs]]``
    tables. An empty file has no jobs. Raises
    :class:`~shardkeeper.errors.JobConfigError` naming the file and the job (by name
    and position) for a syntax error, a wrong layout, an invalid job, or a name used
    twice.
    """
    file = Path(path)
    document = _read_document(file)
    if document is None:
        return []
    if isinstance(document, dict):
        extra = sorted(str(k) for k in document if k != "jobs")
        if extra:
            raise JobConfigError(
                f"{file}: unknown top-level key {extra[0]!r}; the file holds a 'jobs' list "
                "(YAML: jobs: [...] or a bare list; TOML: [[jobs]] tables)"
            )
        document = document.get("jobs", [])
    if not isinstance(document, list):
        raise JobConfigError(
            f"{file}: expected a list of jobs, got a {type(document).__name__} "
            "(YAML: jobs: [...] or a bare list; TOML: [[jobs]] tables)"
        )
    configs: list[JobConfig] = []
    seen: dict[str, int] = {}
    for position, entry in enumerate(document, start=1):
        if not isinstance(entry, dict):
            raise JobConfigError(
                f"{file}: job #{position} is a {type(entry).__name__}; expected a mapping "
                "of field names to values"
            )
        label = f"{config_label(entry)} (#{position})"
        config = build_config(entry, label, prefix=f"{file}: ")
        if config.name in seen:
            raise JobConfigError(
                f"{file}: job name {config.name!r} is used by job #{seen[config.name]} "
                f"and job #{position}; names must be unique"
            )
        seen[config.name] = position
        configs.append(config)
    return configs
