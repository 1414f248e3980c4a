"""Job configuration: one validated, immutable :class:`JobConfig` per job.

A configuration is checked completely when it is built, so that a typo is reported
at start-up with the field, the value and what would be valid, not hours later when
the trigger fires. Names of user code (strategy, error handler, listeners, job class)
are checked for form only and imported when used, so that tools that merely read a
configuration need not import the job's code.

The same configuration is stored in the registry (:meth:`JobConfig.to_json`) so that
every instance of a job, and the operator tools, see one shared definition.

Ways to build one::

    JobConfig.parse(name="order-sync", cron="*/5 * * * *", sharding_total_count=4)
    load_job_configs("jobs.yaml")       # a YAML or TOML file with several jobs
    JobConfig.from_json(stored_bytes)   # what to_json() wrote

All of them, and ``JobConfig(...)`` itself, raise
:class:`~shardkeeper.errors.JobConfigError` (a ``ValueError``) with one readable line
naming every bad field and its value (``invalid job 'x': sharding_total_count=-3:
Input should be greater than 0``); ``JobConfig.model_validate`` keeps pydantic's
``ValidationError`` with its per-field errors. Every field is described in
``docs/configuration.md``.

Modules: :mod:`~shardkeeper.config.fields` (checks of single fields, the trigger
fields among them), :mod:`~shardkeeper.config.model` (:class:`JobConfig`) and
:mod:`~shardkeeper.config.files` (job files).
"""

from __future__ import annotations

from .fields import (
    BUILTIN_ERROR_HANDLER_NAMES,
    BUILTIN_STRATEGY_NAMES,
    MAX_SHARDING_TOTAL_COUNT,
    MIN_INTERVAL_SECONDS,
    parse_item_parameters,
)
from .files import load_job_configs
from .model import JobConfig, make_job_config

__all__ = [
    "BUILTIN_ERROR_HANDLER_NAMES",
    "BUILTIN_STRATEGY_NAMES",
    "MAX_SHARDING_TOTAL_COUNT",
    "MIN_INTERVAL_SECONDS",
    "JobConfig",
    "load_job_configs",
    "make_job_config",
    "parse_item_parameters",
]
