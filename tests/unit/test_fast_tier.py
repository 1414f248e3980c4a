"""The fast tier: ``-m "not external_service"`` leaves out every test that needs a
real server, and keeps the ones on the in-process stand-ins (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collected(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_fast_tier_keeps_the_memory_store_and_leaves_out_real_servers() -> None:
    """Of the contract suite (parametrized over zk, etcd and mem) and the SQL
    history (sqlite and pg), only the in-process cases are left; a test starting
    its own server in its body is left out too."""
    fast = _collected(
        "-m",
        "not external_service",
        "tests/registry/test_contract.py",
        "tests/history/test_recorder.py",
        "tests/registry/test_zookeeper_backend.py",
    )
    every = _collected(
        "tests/registry/test_contract.py",
        "tests/history/test_recorder.py",
        "tests/registry/test_zookeeper_backend.py",
    )
    assert any("[mem" in t for t in fast) and any("[sqlite" in t for t in fast)
    real = [t for t in fast if any(p in t for p in ("[zk", "[etcd", "-zk", "-etcd", "[pg", "-pg"))]
    assert not real, real
    assert any("[zk" in t for t in every) and any("[pg" in t for t in every)
    own_server = "test_tree_watch_resyncs_changes_made_while_its_watches_were_gone"
    assert any(own_server in t for t in every)
    assert not any(own_server in t for t in fast)
