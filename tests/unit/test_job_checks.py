"""Job classes that would fail every item are refused by ``Runtime.add_job``
(review newcomer-2 N19: a class without execute() started and failed every item at
every fire)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.errors import JobConfigError
from shardkeeper.job import DataflowJob, ScriptJob, ShardedJob, ShardingContext
from shardkeeper.runtime import Runtime

CONFIG = JobConfig(name="checked", interval=5, sharding_total_count=1)


class NoExecute(ShardedJob):
    """Misspelt its method."""

    def exceute(self, ctx: ShardingContext) -> None:
        pass


class AsyncJob(ShardedJob):
    async def execute(self, ctx: ShardingContext) -> None:
        pass


class OwnRunItem(ShardedJob):
    def run_item(self, ctx: ShardingContext) -> None:
        pass


class FetchOnly(DataflowJob):
    def fetch_data(self, ctx: ShardingContext) -> Sequence[Any]:
        return []


class Flow(DataflowJob):
    def fetch_data(self, ctx: ShardingContext) -> Sequence[Any]:
        return []

    def process_data(self, ctx: ShardingContext, data: Sequence[Any]) -> None:
        pass


class NoCommand(ScriptJob):
    pass


class Echo(ScriptJob):
    command = ("echo",)


@pytest.mark.parametrize(
    ("job", "fragment"),
    [
        (NoExecute, "does not define execute(self, ctx)"),
        (FetchOnly, "does not define process_data(self, ctx, data)"),
        (NoCommand, "has no command"),
    ],
)
def test_a_job_that_would_fail_every_item_is_refused(job: type[ShardedJob], fragment: str) -> None:
    rt = Runtime("memory://unused/ns")
    with pytest.raises(JobConfigError) as info:
        rt.add_job(job, CONFIG)
    assert fragment in str(info.value)
    assert f"{job.__module__}:{job.__qualname__}" in str(info.value)


@pytest.mark.parametrize("job", [AsyncJob, OwnRunItem, Flow, Echo])
def test_a_job_that_does_its_work_is_added(job: type[ShardedJob]) -> None:
    assert Runtime("memory://unused/ns").add_job(job, CONFIG).name == "checked"
