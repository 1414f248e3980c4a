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
it. A file job that names no ``job_class`` and matches no class is an error too (a
misspelt name would otherwise leave the file without effect, silently): it names the
job, the closest valid name and every valid one. A file job whose ``job_class`` names
a class this process does not run is another process's (a shared file): those are
reported back, and the caller logs them.
"""

from __future__ import annotations

import difflib
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
    without: list[str] = []
    for spec in specs:
        cls = load_job_class(spec)
        matched = _match([c for c in file_jobs if c.name not in claimed], spec, cls)
        if not matched:
            without.append(spec)
        for config in matched:
            claimed.add(config.name)
            result.append((cls, config))
    # a misspelt file job first: it is often why a class found no configuration
    _refuse_unmatched(
        [c for c in file_jobs if c.name not in claimed and c.job_class is None],
        specs,
        config_file,
    )
    if without:
        where = f" or add a job for it to {config_file}" if config_file else ""
        raise JobConfigError(
            f"no configuration for job class {without[0]!r}: set its class attribute "
            f"config = JobConfig(...){where} (matched by job_class, or by name)"
        )
    names = [c.name for _, c in result]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise JobConfigError(f"job name {twice[0]!r} is given to more than one job class")
    return result, [c.name for c in file_jobs if c.name not in claimed]


def _refuse_unmatched(
    unmatched: list[JobConfig], specs: Sequence[str], config_file: object
) -> None:
    """JobConfigError for file jobs that name no job_class and match no class by name
    (see the module docstring), naming the valid names."""
    if not unmatched:
        return
    valid: dict[str, str] = {}
    for spec in specs:
        cls = load_job_class(spec)  # (imported already: a lookup in sys.modules)
        if cls.config is not None:
            valid.setdefault(cls.config.name, f"the name of {spec}'s config")
        valid.setdefault(cls.__name__, f"the class name of {spec}")
    problems = []
    for job in unmatched:
        close = difflib.get_close_matches(job.name, list(valid), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"job {job.name!r} matches no job class of this run{hint}")
    names = ", ".join(f"{name!r} ({why})" for name, why in valid.items())
    raise JobConfigError(
        f"{config_file}: {'; '.join(problems)}; the valid names are {names}. A job "
        "that another process runs names its class: add job_class: "
        "'package.module:Class' to it"
    )
