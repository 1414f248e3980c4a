"""The tour's job: one report per city, a few seconds each, every 3 seconds."""

import os
import time

from shardkeeper import JobConfig, ShardedJob, ShardingContext

# how long each city's report takes: long enough to kill an instance in the middle
WORK_SECONDS = float(os.environ.get("CITY_REPORT_SECONDS", "2"))


class CityReport(ShardedJob):
    """One city per item; each instance runs some of the cities."""

    config = JobConfig.parse(
        name="city-report",
        cron="*/3 * * * * *",  # seconds first: every 3 s
        sharding_total_count=4,
        sharding_item_parameters="0=amsterdam,1=berlin,2=cairo,3=delhi",
        failover=True,
    )

    def execute(self, ctx: ShardingContext) -> None:
        """Report one city: say which run this is, then work WORK_SECONDS."""
        covers = ",".join(f"{t:%H:%M:%S}" for t in ctx.covers) or "-"
        run = (
            f"{ctx.instance_id} item {ctx.item} {ctx.item_parameter} "
            f"fired {ctx.fire_time:%H:%M:%S} is_failover={ctx.is_failover} covers={covers}"
        )
        # one write per line: the lines of items running side by side never interleave
        print(f"{run} started\n", end="", flush=True)
        time.sleep(WORK_SECONDS)
        print(f"{run} done\n", end="", flush=True)
