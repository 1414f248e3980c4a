"""The public API is what __all__ says, and every name in it exists and is documented."""

from __future__ import annotations

import shardkeeper


def test_all_names_exist_and_have_docstrings() -> None:
    """Each exported name resolves and carries a docstring (except the version)."""
    for name in shardkeeper.__all__:
        obj = getattr(shardkeeper, name)
        if name != "__version__":
            assert obj.__doc__, f"{name} has no docstring"


def test_job_api_as_users_write_it() -> None:
    """A job written the documented way builds a context and runs."""
    from datetime import UTC, datetime

    seen: list[int] = []

    class Job(shardkeeper.ShardedJob):
        config = shardkeeper.JobConfig(name="api-job", interval=5, sharding_total_count=2)

        def execute(self, ctx: shardkeeper.ShardingContext) -> None:
            seen.append(ctx.item)

    ctx = shardkeeper.ShardingContext(
        job_name="api-job",
        item=1,
        item_parameter="",
        sharding_total_count=2,
        job_parameter="",
        fire_time=datetime.now(UTC),
        instance_id="h@1@x",
        execution_id="api-job@0#1",
    )
    Job().run_item(ctx)
    assert seen == [1]
    assert ctx.is_valid() and not ctx.should_stop()
