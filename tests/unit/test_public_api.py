"""The public API is what ``shardkeeper.__all__`` says: no more, no less.

Every name in it resolves and is documented, every error users handle is exported,
and the package docstring's example runs (here against an in-process ``memory://``
store; tests/test_package_docstring.py runs it against ZooKeeper and etcd).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import ModuleType

import shardkeeper
import shardkeeper.errors
from shardkeeper.testing.faults import wait_until

DOC_URL = "zk://127.0.0.1:2181/my-app"


def _public_names() -> set[str]:
    """What the package defines or re-exports: no private names, no submodules
    (``import shardkeeper.x`` sets them as attributes), no ``__future__`` feature."""
    names = {
        name
        for name, value in vars(shardkeeper).items()
        if not name.startswith("_") and not isinstance(value, ModuleType) and name != "annotations"
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


def _docstring_example() -> str:
    doc = shardkeeper.__doc__ or ""
    match = re.search(r"The public API::\n\n((?:    .*\n|\n)+)", doc)
    assert match, "no code block after 'The public API::' in the package docstring"
    return textwrap.dedent(match.group(1))


def test_package_docstring_example_runs_on_a_memory_store(tmp_path: Path) -> None:
    """The example, with only its URL and interval changed, runs items and stops
    cleanly on SIGTERM (``memory://`` is in-process: the program is its own store)."""
    code = _docstring_example()
    assert DOC_URL in code and "interval=10" in code
    code = code.replace(DOC_URL, "memory://docs/my-app").replace("interval=10", "interval=1")
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.Popen(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
    reader.start()
    try:
        # four items of one fire: every item of the job ran on this one instance
        wait_until(
            lambda: (
                {m.group(1) for ln in lines if (m := re.match(r"item (\d) of fire ", ln))}
                == {"0", "1", "2", "3"}
            ),
            30,
            message=lambda: f"the example did not run items 0-3; stdout: {lines}",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        proc.stderr.close()
        stdout.close()
    assert "Traceback" not in stderr, stderr
