"""The example in ``shardkeeper/__init__.py``'s docstring runs for real (issue 9, §5).

The code block is taken from the docstring as it is, with only the registry URL
replaced by the test store's and the interval shortened; it runs as a program in a
subprocess, which must run an item, then stop gracefully on SIGTERM.
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

import shardkeeper
from shardkeeper.testing.faults import wait_until

EXAMPLE_URL = "zk://127.0.0.1:2181/my-app"


def docstring_example() -> str:
    """The indented block after ``The public API::``."""
    doc = shardkeeper.__doc__ or ""
    match = re.search(r"The public API::\n\n((?:    .*\n|\n)+)", doc)
    assert match, "no code block after 'The public API::' in the package docstring"
    return textwrap.dedent(match.group(1))


def test_the_example_is_complete() -> None:
    """The block adds the job before the runtime starts (the old one started first)."""
    code = docstring_example()
    assert code.index("runtime.add_job(") < code.index("runtime.run_forever()")
    assert EXAMPLE_URL in code and "interval=10" in code


def test_package_docstring_example_runs(registry_url: str, tmp_path: Path) -> None:
    code = docstring_example().replace(EXAMPLE_URL, registry_url)
    code = code.replace("interval=10", "interval=1")
    assert registry_url in code and "interval=1," in code
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.Popen(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # every item of one fire: the one instance runs all four
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
        assert proc.stdout is not None
        proc.stdout.close()
    assert "Traceback" not in stderr, stderr
