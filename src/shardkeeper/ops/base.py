"""What every part of the operations API shares: the store, its lifecycle, and the
lookups that turn a job name, an instance id or an item number into an error that
names it when it is unknown (:class:`OperationsBase`)."""

from __future__ import annotations

import re
import socket
import time
from typing import Any, Self

from shardkeeper.coordination.model import encode
from shardkeeper.coordination.paths import INSTANCES, JobPaths, instance_path
from shardkeeper.coordination.snapshot import JobSnapshot, read_snapshot
from shardkeeper.errors import ConfigError, InstanceLookupError, JobLookupError
from shardkeeper.registry import open_store
from shardkeeper.registry.base import CoordinationStore
from shardkeeper.registry.url import RegistrySettings

__all__ = ["OperationsBase", "operator", "stamp", "valid_job_name"]

# Same rules as JobConfig names / instance ids: anything else cannot be a node name,
# so it is reported as unknown instead of as an invalid path.
_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}\Z")
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9._@:=+\-]+\Z")


def valid_job_name(job: str) -> bool:
    """Whether ``job`` could name a job (so it is safe in a registry path)."""
    return bool(_JOB_NAME.match(job)) and job not in (".", "..")


def operator() -> str:
    """Who makes a request from this process (``shardkeeper-ops@host``)."""
    return f"shardkeeper-ops@{socket.gethostname().split('.')[0] or 'host'}"


def stamp(action: str, **extra: Any) -> bytes:
    """The value of a request node: who, when, what (and ``extra`` fields)."""
    # For a person reading the node with zkCli/etcdctl (a trigger request's "at" and
    # "params" are also read by the instances).
    return encode({"by": operator(), "at": time.time(), "action": action, **extra})


class OperationsBase:
    """The store an :class:`~shardkeeper.ops.Operations` works on, and its lookups.

    ``store`` must be started; it is not closed by :meth:`close` unless this object
    opened it (:meth:`connect`).
    """

    def __init__(self, store: CoordinationStore, *, owns_store: bool = False) -> None:
        self.store = store
        self._owns_store = owns_store

    # -- lifecycle ------------------------------------------------------------------

    @classmethod
    def connect(cls, url: str | RegistrySettings | None = None) -> Self:
        """Open and start a store for ``url`` (None: ``SHARDKEEPER_REGISTRY``) and wrap
        it; close it with :meth:`close` or use the result as a context manager.
        Raises InvalidRegistryURLError, StoreUnavailableError or StoreAuthError."""
        store = open_store(url)
        store.start()
        return cls(store, owns_store=True)

    def close(self) -> None:
        """Close the store if this object opened it (idempotent)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lookups --------------------------------------------------------------------

    def _job_state(self, job: str) -> JobSnapshot:
        if not valid_job_name(job):
            raise JobLookupError(job)
        snap = read_snapshot(self.store, job)
        if snap is None:
            raise JobLookupError(job)
        return snap

    def _require_job(self, job: str) -> JobPaths:
        if not valid_job_name(job):
            raise JobLookupError(job)
        paths = JobPaths(job)
        node = self.store.get(paths.config)
        if node is None or not node.value:
            raise JobLookupError(job)
        return paths

    def _require_live(self, instance_id: str) -> None:
        if not _INSTANCE_ID.match(instance_id) or not self.store.exists(instance_path(instance_id)):
            raise InstanceLookupError(instance_id)

    @staticmethod
    def _check_item(state: JobSnapshot, item: int) -> None:
        total = state.total
        if not 0 <= item < total:
            valid = f"0..{total - 1}" if total else "none (the stored config is unreadable)"
            raise ConfigError(
                f"item {item} is out of range for job {state.name!r}: valid items are {valid} "
                f"(sharding_total_count={total})"
            )

    def _live_instances(self) -> list[str]:
        return self.store.children(INSTANCES)
