"""The coordination services of one job, bundled for injection into the runner's parts."""

from __future__ import annotations

from dataclasses import dataclass

from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.election import LeaderElection
from shardkeeper.coordination.execution import ExecutionService
from shardkeeper.coordination.failover import FailoverService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.coordination.runnow import RunNowService
from shardkeeper.coordination.sharding import ShardingService
from shardkeeper.registry.base import CoordinationStore

__all__ = ["JobServices"]


@dataclass(frozen=True)
class JobServices:
    """Election, sharding, execution marks, failover, config and run-now requests of
    one job over one store, for one instance. Tests build one over a MemoryStore;
    the runtime over the real store."""

    store: CoordinationStore
    paths: JobPaths
    instance_id: str
    election: LeaderElection
    sharding: ShardingService
    execution: ExecutionService
    failover: FailoverService
    configs: ConfigService
    runnow: RunNowService

    @classmethod
    def build(cls, store: CoordinationStore, job: str, instance_id: str) -> JobServices:
        """The services of ``job`` for ``instance_id`` on ``store``."""
        paths = JobPaths(job)
        return cls(
            store=store,
            paths=paths,
            instance_id=instance_id,
            election=LeaderElection(store, paths, instance_id),
            sharding=ShardingService(store, paths, instance_id),
            execution=ExecutionService(store, paths, instance_id),
            failover=FailoverService(store, paths, instance_id),
            configs=ConfigService(store, paths),
            runnow=RunNowService(store, paths, instance_id),
        )
