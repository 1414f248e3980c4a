"""The shardkeeper exception tree.

Library errors (kazoo, grpc/etcd3, pydantic) are translated into these at the
boundary where they occur, so callers only ever catch shardkeeper's own types::

    ShardkeeperError
     +-- ConfigError (ValueError)             bad input: names the value and what is valid
     |    +-- InvalidRegistryURLError         a registry URL that cannot be parsed
     |    +-- JobConfigError                  an invalid job configuration
     |    +-- JobConflictError                the job name belongs to another job class
     |    +-- SecretReferenceError            an env:/file: reference that cannot be resolved
     +-- StoreError                           anything that went wrong talking to the store
     |    +-- StoreUnavailableError (ConnectionError)
     |    |                                   cannot reach the store within the timeout
     |    +-- StoreAuthError (PermissionError) wrong or missing credentials
     |    +-- SessionLostError                the store session expired; ephemerals are gone
     |    +-- OperationTimeoutError (TimeoutError)
     |    |                                   no answer in time: the outcome is UNKNOWN
     |    +-- NodeExistsError                 create of a node that already exists
     |    +-- NoNodeError (LookupError)       a node that had to exist does not
     |    +-- StoreLimitError                 a request over the store's size/op limits
     +-- JobLookupError (LookupError)         unknown job name
     +-- InstanceLookupError (LookupError)    unknown instance id
     +-- OperationRefusedError                an operator request that is not allowed now
     +-- ClockSkewError                       this instance's clock is off the store's by
     |                                        more than a job's max_time_diff_seconds
     +-- CheckpointError                      a checkpoint that cannot be taken
          +-- CheckpointStateError (ValueError)
          |                                   not JSON-serialisable, or over the size limit
          +-- CheckpointFencedError           refused: this execution is no longer the
          |                                   item's (strict mode; else False is returned)
          +-- CheckpointUnavailableError      no running mark to fence on, or the store
                                              could not be read for the resume state
"""

from __future__ import annotations

__all__ = [
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
    "NoNodeError",
    "NodeExistsError",
    "OperationRefusedError",
    "OperationTimeoutError",
    "SecretReferenceError",
    "SessionLostError",
    "ShardkeeperError",
    "StoreAuthError",
    "StoreError",
    "StoreLimitError",
    "StoreUnavailableError",
]


class ShardkeeperError(Exception):
    """Base of every error raised by shardkeeper."""


class ConfigError(ShardkeeperError, ValueError):
    """A value given by the user is invalid; the message names it and what is valid."""


class InvalidRegistryURLError(ConfigError):
    """A registry URL that cannot be used."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"invalid registry URL {url!r}: {reason}")


class JobConfigError(ConfigError):
    """An invalid job configuration."""


class JobConflictError(ConfigError):
    """The job name is registered in the store by a different job class."""


class SecretReferenceError(ConfigError):
    """A secret-valued setting's ``env:NAME`` or ``file:PATH`` reference that is malformed
    or cannot be resolved on this instance: ``setting`` and ``reference`` name it,
    ``missing`` says what is missing (never the secret itself)."""

    def __init__(self, setting: str, reference: str, missing: str) -> None:
        self.setting = setting
        self.reference = reference
        self.missing = missing
        super().__init__(f"{setting}: secret reference {reference!r} cannot be resolved: {missing}")


class StoreError(ShardkeeperError):
    """Something went wrong talking to the coordination store."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store cannot be reached (within the connection timeout)."""


class StoreAuthError(StoreError, PermissionError):
    """The store refused the credentials, or the node needs credentials we lack."""


class SessionLostError(StoreError):
    """The store session expired: every ephemeral node of it is gone."""


class OperationTimeoutError(StoreError, TimeoutError):
    """The store did not answer in time. The operation may or may not have been applied."""


class NodeExistsError(StoreError):
    """A create found the node already there."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"node already exists: {path}")


class NoNodeError(StoreError, LookupError):
    """A node that had to exist does not."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"no such node: {path}")


class StoreLimitError(StoreError):
    """A request exceeds a limit of the store (size of a value, operations per commit)."""


class JobLookupError(ShardkeeperError, LookupError):
    """No job of that name is registered in the namespace."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown job {name!r}")


class InstanceLookupError(ShardkeeperError, LookupError):
    """No live instance has that id."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"unknown instance {instance_id!r}")


class OperationRefusedError(ShardkeeperError):
    """An operator request that is refused in the current state (the message says why)."""


class ClockSkewError(ShardkeeperError):
    """This instance's clock is off the store's by more than a job's
    ``max_time_diff_seconds``: it runs none of that job's items until it is back
    within the limit. ``offset`` = store time - local time, true within ``error``."""

    def __init__(self, job: str, offset: float, error: float, limit: int, source: str) -> None:
        self.job = job
        self.offset = offset
        self.error = error
        self.limit = limit
        self.source = source
        super().__init__(
            f"job {job!r}: this instance's clock is off the store's by {offset:+.3f} s "
            f"(± {error:.3f} s, from the {source}), more than max_time_diff_seconds={limit}; "
            "it runs none of the job's items until it is back within the limit (sync the "
            "clock with NTP)"
        )


class CheckpointError(ShardkeeperError):
    """A checkpoint or progress call of a running item that cannot be honoured."""


class CheckpointStateError(CheckpointError, ValueError):
    """The state given to ``ctx.checkpoint`` is not JSON-serialisable, or its JSON is
    over the job's ``checkpoint_max_bytes`` (the message names the size and the
    limit)."""


class CheckpointFencedError(CheckpointError):
    """The store refused a checkpoint because this execution is no longer the item's
    (its running mark was taken over or cleared): raised instead of returning False
    when the job asks for it (``checkpoint_strict``, or ``strict=True``)."""


class CheckpointUnavailableError(CheckpointError):
    """Checkpoints cannot be used here: the job runs without running marks
    (``monitor_execution`` off: nothing to fence a write on), or the store did not
    answer the read of the resume state (the attempt fails and is retried per the
    job's policy; the stored state is untouched)."""
