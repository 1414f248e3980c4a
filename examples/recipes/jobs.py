"""The job every recipe runs, and the runtime they build for it.

``Heartbeat`` has four items and fires every two seconds; each execution prints one
line (``recipe-heartbeat item=N instance=ID``) so a reader (or a test) sees which
instance ran which item. A real application adds its own jobs the same way.
"""

from __future__ import annotations

import os

from shardkeeper import JobConfig, Runtime, ShardedJob, ShardingContext

__all__ = ["ITEMS", "Heartbeat", "build_runtime"]

#: the number of items of the recipe job
ITEMS = 4


class Heartbeat(ShardedJob):
    """Prints which instance ran which item (stands in for real work)."""

    config = JobConfig.parse(
        name="recipe-heartbeat",
        cron="*/2 * * * * *",
        sharding_total_count=ITEMS,
        failover=True,
        description="recipes: a job run inside a web or Django process",
        job_class="examples.recipes.jobs:Heartbeat",  # same name however it is started
    )

    def execute(self, ctx: ShardingContext) -> None:
        """Print one line per execution (flush: the line must not wait in a buffer)."""
        print(f"{ctx.job_name} item={ctx.item} instance={ctx.instance_id}", flush=True)


def build_runtime(app: str) -> Runtime:
    """A runtime with the recipe job; the registry comes from ``SHARDKEEPER_REGISTRY``.

    ``SHARDKEEPER_GRACE`` (seconds, default 10) is the grace running items get at a
    graceful stop: keep the server's own shutdown timeout longer than it.
    """
    grace = float(os.environ.get("SHARDKEEPER_GRACE", "10"))
    runtime = Runtime(None, worker_threads=4, shutdown_grace=grace, labels={"app": app})
    runtime.add_job(Heartbeat())
    return runtime
