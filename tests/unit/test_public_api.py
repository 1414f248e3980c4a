"""The public API is what ``shardkeeper.__all__`` says: no more, no less.

Every name in it resolves and is documented, and every error users handle is
exported. The package docstring's example is run by tests/test_package_docstring.py,
against ZooKeeper and etcd.
"""

from __future__ import annotations

from types import ModuleType

import shardkeeper
import shardkeeper.errors


def _public_names() -> set[str]:
    """What the package defines or re-exports: no private names, no submodules
    (``import shardkeeper.x`` sets them as attributes), no ``__future__`` feature, no
    ``TYPE_CHECKING`` flag. ``dir()`` lists the names imported lazily (PEP 562) too;
    ``getattr`` imports them, so a name that does not resolve fails here."""
    names = {
        name
        for name in dir(shardkeeper)
        if not name.startswith("_")
        and name not in ("annotations", "TYPE_CHECKING")
        and not isinstance(getattr(shardkeeper, name), ModuleType)
    }
    return names | {"__version__"}


def test_all_is_exactly_the_public_names() -> None:
    exported = shardkeeper.__all__
    assert len(exported) == len(set(exported)), "a name is listed twice in __all__"
    public = _public_names()
    assert not public - set(exported), f"public but not in __all__: {public - set(exported)}"
    assert not set(exported) - public, f"in __all__ but not defined: {set(exported) - public}"


def test_every_error_is_exported() -> None:
    """Callers catch shardkeeper's errors by name from the package itself."""
    missing = set(shardkeeper.errors.__all__) - set(shardkeeper.__all__)
    assert not missing, f"errors not exported from shardkeeper: {sorted(missing)}"
    for name in shardkeeper.errors.__all__:
        assert getattr(shardkeeper, name) is getattr(shardkeeper.errors, name)
    # the ones the docs tell users to handle, by name (a rename must show up here)
    for name in ("OperationTimeoutError", "SessionLostError", "StoreUnavailableError"):
        assert issubclass(getattr(shardkeeper, name), shardkeeper.StoreError)


def test_all_names_exist_and_have_docstrings() -> None:
    """Each exported name resolves and carries its own docstring (except the version)."""
    for name in shardkeeper.__all__:
        obj = getattr(shardkeeper, name)
        if name == "__version__":
            assert isinstance(obj, str) and obj
            continue
        assert obj.__doc__ and obj.__doc__.strip(), f"{name} has no docstring"


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
