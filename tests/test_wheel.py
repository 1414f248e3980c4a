"""The wheel ships the library only: the shardkeeper package and its metadata (no
tests, benchmarks, demo, examples or registry scripts)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_the_wheel_contains_only_the_library(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [wheel] = list(tmp_path.glob("shardkeeper-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"shardkeeper"}, sorted(top)
    assert "shardkeeper/py.typed" in names
    assert not [n for n in names if "/bench/" in n or "/demo/" in n or "/tests/" in n]
    assert any(n.endswith("shardkeeper/registry/zookeeper/store.py") for n in names)
