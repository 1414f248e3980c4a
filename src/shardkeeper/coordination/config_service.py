"""The job configuration kept in the registry (``/jobs/{job}/config``).

The first instance writes it; later instances use the stored one unless their
config says ``overwrite``. A job name already registered by another job class is
refused: two different programs sharing one job's items would corrupt each other.
"""

from __future__ import annotations

import logging

from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.errors import JobConfigError, JobConflictError
from shardkeeper.registry.base import CoordinationStore

__all__ = ["ConfigService"]

log = logging.getLogger(__name__)


class ConfigService:
    """Reads and writes one job's stored configuration."""

    def __init__(self, store: CoordinationStore, paths: JobPaths) -> None:
        self._store = store
        self._paths = paths

    def load(self) -> JobConfig | None:
        """The stored config, or None when absent. JobConfigError if it is invalid."""
        node = self._store.get(self._paths.config)
        if node is None or not node.value:
            return None
        try:
            return JobConfig.from_json(node.value)
        except ValueError as exc:
            raise JobConfigError(
                f"stored config at {self._paths.config} is invalid: {exc}"
            ) from None

    def sync(self, config: JobConfig) -> tuple[JobConfig, bool]:
        """Register ``config``: create it if absent, refuse a different job class, and
        overwrite only when ``config.overwrite``. Returns (effective config, whether the
        sharding total count changed against what was stored)."""
        if self._store.create(self._paths.config, config.to_json()) is not None:
            return config, False
        stored = self.load()
        if stored is None:
            self._store.put(self._paths.config, config.to_json())
            return config, False
        if stored.job_class and config.job_class and stored.job_class != config.job_class:
            raise JobConflictError(
                f"job {config.name!r} is already registered by {stored.job_class!r}; "
                f"refusing to run it as {config.job_class!r} (choose another job name, or "
                "remove the job first)"
            )
        if config.overwrite and stored != config:
            self._store.put(self._paths.config, config.to_json())
            log.info("%s: stored config overwritten", config.name)
            return config, stored.sharding_total_count != config.sharding_total_count
        return stored, False

    def save(self, config: JobConfig) -> None:
        """Replace the stored config (operations API)."""
        self._store.put(self._paths.config, config.to_json())
