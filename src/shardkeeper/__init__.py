"""shardkeeper: elastic sharded job coordination for Python services on ZooKeeper or etcd.

The public API::

    from shardkeeper import JobConfig, Runtime, ShardedJob, ShardingContext

    class MyJob(ShardedJob):
        config = JobConfig(name="my-job", interval=10, sharding_total_count=4)

        def execute(self, ctx: ShardingContext) -> None:
            print(f"item {ctx.item} of fire {ctx.fire_time:%H:%M:%S}", flush=True)

    runtime = Runtime("zk://127.0.0.1:2181/my-app")
    runtime.add_job(MyJob())  # every job is added before the runtime starts
    runtime.run_forever()  # start; stop gracefully on SIGTERM/SIGINT or a remote shutdown

Embedded in a service instead of ``run_forever()``: ``with runtime:`` starts it on
entering the block and stops it (gracefully) on leaving it; add the jobs first.
(tests/test_package_docstring.py runs this example against real stores.)
"""

from __future__ import annotations

from shardkeeper._version import __version__
from shardkeeper.config import JobConfig, load_job_configs
from shardkeeper.errors import (
    ConfigError,
    JobConfigError,
    JobConflictError,
    ShardkeeperError,
    StoreError,
    StoreUnavailableError,
)
from shardkeeper.job import (
    ClusterOnceListener,
    DataflowJob,
    JobListener,
    ScriptFailedError,
    ScriptJob,
    ShardedJob,
    ShardingContext,
)
from shardkeeper.registry import RegistrySettings, open_store
from shardkeeper.runtime import Runtime

__all__ = [
    "ClusterOnceListener",
    "ConfigError",
    "DataflowJob",
    "JobConfig",
    "JobConfigError",
    "JobConflictError",
    "JobListener",
    "RegistrySettings",
    "Runtime",
    "ScriptFailedError",
    "ScriptJob",
    "ShardedJob",
    "ShardingContext",
    "ShardkeeperError",
    "StoreError",
    "StoreUnavailableError",
    "__version__",
    "load_job_configs",
    "open_store",
]
