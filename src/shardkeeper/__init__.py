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
(tests/test_package_docstring.py runs this example against real stores,
tests/unit/test_public_api.py against an in-process ``memory://`` store.)

Errors: everything shardkeeper raises is a :class:`ShardkeeperError`; the ones callers
handle are exported here too: bad input (:class:`ConfigError` and its
:class:`JobConfigError`, :class:`JobConflictError`, :class:`InvalidRegistryURLError`),
the store (:class:`StoreUnavailableError`, :class:`StoreAuthError`,
:class:`SessionLostError`, :class:`OperationTimeoutError` — the outcome is unknown —,
:class:`NoNodeError`, :class:`NodeExistsError`, :class:`StoreLimitError`, all
:class:`StoreError`), and operator requests (:class:`JobLookupError`,
:class:`InstanceLookupError`, :class:`OperationRefusedError`). The tree is drawn in
:mod:`shardkeeper.errors`.
"""

from __future__ import annotations

import importlib

from shardkeeper._version import __version__

# typing.TYPE_CHECKING without importing typing (type checkers treat the name alike):
# a bare ``import shardkeeper`` then costs a few milliseconds
TYPE_CHECKING = False
if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports
    from shardkeeper.config import JobConfig, load_job_configs
    from shardkeeper.errors import (
        CheckpointError,
        CheckpointFencedError,
        CheckpointStateError,
        CheckpointUnavailableError,
        ClockSkewError,
        ConfigError,
        InstanceLookupError,
        InvalidRegistryURLError,
        JobConfigError,
        JobConflictError,
        JobLookupError,
        NodeExistsError,
        NoNodeError,
        OperationRefusedError,
        OperationTimeoutError,
        SecretReferenceError,
        SessionLostError,
        ShardkeeperError,
        StoreAuthError,
        StoreError,
        StoreLimitError,
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

# Each public name and the module it comes from. The modules are imported on first
# use of a name (PEP 562), not here: ``import shardkeeper`` stays cheap for a process
# that needs one corner of the package (the CLI's ``--help``, an error class), and
# pydantic, APScheduler and the runtime load only when something asks for them.
_ORIGINS: dict[str, str] = {
    **dict.fromkeys(("JobConfig", "load_job_configs"), "shardkeeper.config"),
    **dict.fromkeys(
        (
            "CheckpointError",
            "CheckpointFencedError",
            "CheckpointStateError",
            "CheckpointUnavailableError",
            "ClockSkewError",
            "ConfigError",
            "InstanceLookupError",
            "InvalidRegistryURLError",
            "JobConfigError",
            "JobConflictError",
            "JobLookupError",
            "NodeExistsError",
            "NoNodeError",
            "OperationRefusedError",
            "OperationTimeoutError",
            "SecretReferenceError",
            "SessionLostError",
            "ShardkeeperError",
            "StoreAuthError",
            "StoreError",
            "StoreLimitError",
            "StoreUnavailableError",
        ),
        "shardkeeper.errors",
    ),
    **dict.fromkeys(
        (
            "ClusterOnceListener",
            "DataflowJob",
            "JobListener",
            "ScriptFailedError",
            "ScriptJob",
            "ShardedJob",
            "ShardingContext",
        ),
        "shardkeeper.job",
    ),
    **dict.fromkeys(("RegistrySettings", "open_store"), "shardkeeper.registry"),
    "Runtime": "shardkeeper.runtime",
}


def __getattr__(name: str) -> object:
    """Import a public name's module on first use and keep the name (PEP 562)."""
    origin = _ORIGINS.get(name)
    if origin is None:
        raise AttributeError(f"module 'shardkeeper' has no attribute {name!r}")
    value = getattr(importlib.import_module(origin), name)
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    """The module's names with the lazy public ones (for ``dir()`` and completion)."""
    return sorted({*globals(), *_ORIGINS})


__all__ = [
    "CheckpointError",
    "CheckpointFencedError",
    "CheckpointStateError",
    "CheckpointUnavailableError",
    "ClockSkewError",
    "ClusterOnceListener",
    "ConfigError",
    "DataflowJob",
    "InstanceLookupError",
    "InvalidRegistryURLError",
    "JobConfig",
    "JobConfigError",
    "JobConflictError",
    "JobListener",
    "JobLookupError",
    "NoNodeError",
    "NodeExistsError",
    "OperationRefusedError",
    "OperationTimeoutError",
    "RegistrySettings",
    "Runtime",
    "ScriptFailedError",
    "ScriptJob",
    "SecretReferenceError",
    "SessionLostError",
    "ShardedJob",
    "ShardingContext",
    "ShardkeeperError",
    "StoreAuthError",
    "StoreError",
    "StoreLimitError",
    "StoreUnavailableError",
    "__version__",
    "load_job_configs",
    "open_store",
]
