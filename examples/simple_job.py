"""The smallest sharded job: 4 items (one per city), every 5 seconds.

Run it with the Runtime API (start it in two or three terminals and watch the
cities move between the instances). In each terminal, from the repository root (a
second ``registry up``, from any directory, prints the URL of the registry already
running: its state is per user)::

    export SHARDKEEPER_REGISTRY=$(shardkeeper registry up --namespace examples)
    python examples/simple_job.py

or with the command line, from the repository root::

    shardkeeper run examples.simple_job:CityReport
"""

from __future__ import annotations

import logging
import os
import sys

from shardkeeper import JobConfig, Runtime, ShardedJob, ShardingContext

__all__ = ["CityReport", "main", "registry_url"]


class CityReport(ShardedJob):
    """Builds the report of one city per item; each instance gets some of the cities."""

    config = JobConfig.parse(
        name="city-report",
        # seconds first: fires at :00, :05, :10... on every instance at the same time
        cron="*/5 * * * * *",
        sharding_total_count=4,
        sharding_item_parameters="0=amsterdam,1=berlin,2=cairo,3=delhi",
        # a crashed instance's unfinished cities are re-run by the survivors at once
        failover=True,
        description="example: one report per city",
        # The registry records which class runs a job and refuses another one. Naming
        # it here keeps `python examples/simple_job.py` (module __main__) and
        # `shardkeeper run examples.simple_job:CityReport` interchangeable.
        job_class="examples.simple_job:CityReport",
    )

    def __init__(self) -> None:
        #: cities reported by this process (the tests look at it)
        self.reported: list[str] = []

    def execute(self, ctx: ShardingContext) -> None:
        """Report one city. ``ctx.execution_id`` is the key to use when a report must
        not be written twice: a failover re-run keeps it."""
        self.reported.append(ctx.item_parameter)
        print(
            f"{ctx.instance_id}: item {ctx.item}/{ctx.sharding_total_count} "
            f"city={ctx.item_parameter} fired={ctx.fire_time:%H:%M:%S} "
            f"execution={ctx.execution_id}",
            flush=True,
        )


def registry_url() -> str:
    """The registry URL from ``SHARDKEEPER_REGISTRY`` (exits with a hint when unset)."""
    url = os.environ.get("SHARDKEEPER_REGISTRY", "").strip()
    if not url:
        sys.exit(
            "set SHARDKEEPER_REGISTRY to a registry URL, e.g. the one "
            "`shardkeeper registry up --namespace examples` prints (it starts a local "
            "registry on a free port)"
        )
    return url


def main() -> None:
    """Run CityReport as one instance until SIGTERM or Ctrl-C (graceful stop)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    runtime = Runtime(registry_url(), shutdown_grace=10.0)
    runtime.add_job(CityReport)
    print(f"instance {runtime.instance_id}: running city-report; Ctrl-C stops", flush=True)
    runtime.run_forever()


if __name__ == "__main__":
    main()
