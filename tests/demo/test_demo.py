"""``python -m demo`` (what ``make demo`` runs) tells its whole story.

The demo runs as a subprocess, as a user would start it, and must end by itself
with exit code 0 well within the timeout; its own checks (every item covered at
the trigger that resharded, failover seen, graceful stop, clean registry) make
it exit non-zero otherwise, so the exit code and the key lines are what this
test asserts. It runs in ``make test`` (not marked slow): about 10 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DEMO_TIMEOUT = 110.0


@pytest.mark.timeout(DEMO_TIMEOUT + 10)
def test_demo_tells_the_whole_story() -> None:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "demo", "--backend", "zookeeper"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=DEMO_TIMEOUT,
            # a plain, wide console: no colour codes, no wrapped story lines
            env={**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "160"},
            cwd=Path(__file__).resolve().parents[2],  # the demo is run from the repo
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        # run() has killed the demo; its workers and server die with it (parent watch)
        out = (exc.stdout or b"").decode(errors="replace")
        pytest.fail(f"the demo did not end within {DEMO_TIMEOUT:g}s; output so far:\n{out}")
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, f"demo exited with {proc.returncode}:\n{out}"
    expected = [
        "OK zookeeper serves on",
        "OK w1 registered as instance",
        "OK w4 registered as instance",
        "after w1, w2, w3 started",
        "after w4 joined",
        "kill -9 w",
        "taken over by",
        "same execution id: yes",
        "died, written by leader",
        "ran every item on its assigned instance",
        "stopped gracefully",
        "OK registry is clean",
        "executions per item",
        "failover time observed",
        "demo complete",
    ]
    missing = [line for line in expected if line not in out]
    assert not missing, f"missing from the demo's output: {missing}\n{out}"
    assert "PROBLEM" not in out and "DEMO FAILED" not in out, out
    assert out.count("stopped gracefully") == 3, out
