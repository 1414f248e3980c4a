"""What ``shardkeeper run`` does before the runtime starts: find jobs and their configs.

Each ``module:Class`` argument names a :class:`~shardkeeper.job.ShardedJob`
subclass. Its configuration comes from the job file (``--config``) when the file
has a matching job, else from the class attribute ``config``. A file job matches a
class when, in this order:

1. its ``job_class`` names the class (either import-path form); several file jobs
   may name one class: it then runs as several jobs;
2. its ``name`` equals the name of the class's own ``config``;
3. its ``name`` equals the class name (``OrderSync`` matches ``name: OrderSync``).

A class with no match and no ``config`` attribute is an error that says how to fix
it. File jobs that match no class are reported back (the caller warns): a shared
file may list jobs that other processes run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from shardkeeper._imports import import_object, is_import_path
from shardkeeper.config import JobConfig, load_job_configs
from shardkeeper.errors import ConfigError, JobConfigError
from shardkeeper.job import ShardedJob

__all__ = ["JobSpec", "load_job_class", "resolve_jobs"]

JobSpec = tuple[type[ShardedJob], JobConfig]


def _canonical(path: str) -> str:
    """``pkg.mod.Class`` -> ``pkg.mod:Class`` so both forms compare equal (the dotted
    form is ambiguous for nested classes; the import decides, here we only compare)."""
    if ":" in path:
        return path
    module, _, attr = path.rpartition(".")
    return f"{module}:{attr}"


def load_job_class(spec: str) -> type[ShardedJob]:
    """Import the ShardedJob subclass named by ``spec`` (``module:Class``). The
    current directory is importable, as for ``python -m``. JobConfigError when the
    path is malformed, the import fails, it is not a job class, or its ``config``
    attribute is not a JobConfig."""
    if not is_import_path(spec):
        raise JobConfigError(
            f"job {spec!r} is not an import path; expected 'package.module:JobClass'"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        # a console script's sys.path[0] is its bin directory, not where the user is
        sys.path.insert(0, cwd)
    obj = import_object(spec, "job class")
    if not (isinstance(obj, type) and issubclass(obj, ShardedJob)):
        raise JobConfigError(
            f"job {spec!r} is not a ShardedJob subclass (got {type(obj).__name__}); "
            "subclass shardkeeper.ShardedJob"
        )
    own = getattr(obj, "config", None)
    if own is not None and not isinstance(own, JobConfig):
        raise JobConfigError(
            f"job {spec!r}: its class attribute config is a {type(own).__name__} "
            f"({own!r:.60}); expected config = JobConfig(...) or no attribute"
        )
    return obj


def _match(file_jobs: list[JobConfig], spec: str, cls: type[ShardedJob]) -> list[JobConfig]:
    own = cls.config
    want = _canonical(spec)
    rules = (
        lambda c: c.job_class is not None and _canonical(c.job_class) == want,
        lambda c: own is not None and c.name == own.name,
        lambda c: c.name == cls.__name__,
    )
    for rule in rules:
        matched = [c for c in file_jobs if rule(c)]
        if matched:
            return matched
    return [own] if own is not None else []


def resolve_jobs(
    specs: Sequence[str], config_file: str | os.PathLike[str] | None = None
) -> tuple[list[JobSpec], list[str]]:
    """Pair each job class with its config(s) (see module docstring). Returns the
    pairs and the names of file jobs no class claimed."""
    if not specs:
        raise ConfigError("give at least one job class (module:JobClass)")
    file_jobs = load_job_configs(Path(config_file)) if config_file is not None else []
    claimed: set[str] = set()
    result: list[JobSpec] = []
    for spec in specs:
        cls = load_job_class(spec)
        matched = _match([c for c in file_jobs if c.name not in claimed], spec, cls)
        if not matched:
            where = f" or add a job for it to {config_file}" if config_file else ""
            raise JobConfigError(
                f"no configuration for job class {spec!r}: set its class attribute "
                f"config = JobConfig(...){where} (matched by job_class, or by name)"
            )
        for config in matched:
            claimed.add(config.name)
            result.append((cls, config))
    names = [c.name for _, c in result]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise JobConfigError(f"job name {twice[0]!r} is given to more than one job class")
    unclaimed = [c.name for c in file_jobs if c.name not in claimed]
    return result, unclaimed
