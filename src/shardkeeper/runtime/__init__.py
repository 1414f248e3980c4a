"""The runtime: wires the store, the scheduler and the job runners of one instance."""

from __future__ import annotations

from shardkeeper.runtime.runner.runner import JobRunner
from shardkeeper.runtime.runtime import Runtime

__all__ = ["JobRunner", "Runtime"]
