"""docker-compose.yml and the Dockerfile are valid, checked offline.

No Docker engine runs here, so the compose file is validated with Debian's
``docker-compose`` v1 (``config`` parses, interpolates and validates the file
against the Compose schema without a daemon); ``make system-deps`` installs it.
The resolved configuration must keep the promises docs/getting-started.md makes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"


def _compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (make system-deps installs it)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    return subprocess.run(
        [binary, "-f", str(COMPOSE), *args],
        cwd=ROOT,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _resolved(env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = _compose("config", env=env)
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load(proc.stdout)
    assert isinstance(data, dict)
    return data


def test_compose_file_validates() -> None:
    proc = _compose("config", "-q")
    assert proc.returncode == 0, f"docker-compose config -q failed:\n{proc.stderr}"


def test_compose_services() -> None:
    services = _resolved().get("services", {})
    assert set(services) == {"zookeeper", "etcd", "worker"}
    worker = services["worker"]
    assert worker["build"]["context"] == str(ROOT)
    registry = worker["environment"]["SHARDKEEPER_REGISTRY"]
    assert registry.startswith("zk://zookeeper:2181/"), registry
    # scaling needs unpublished host ports and no fixed container name
    assert "container_name" not in worker
    assert all("published" not in port for port in worker.get("ports", []))
    assert worker["depends_on"]["zookeeper"]["condition"] == "service_healthy"
    assert services["etcd"]["build"]["target"] == "etcd"


def test_registry_can_be_switched_to_etcd() -> None:
    env = {"SHARDKEEPER_REGISTRY": "etcd://etcd:2379/examples"}
    worker = _resolved(env)["services"]["worker"]
    assert worker["environment"]["SHARDKEEPER_REGISTRY"] == "etcd://etcd:2379/examples"


def test_dockerfile_runs_the_example_service() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, flags=re.MULTILINE)
    assert stages[-1][0] == "python:3.11-slim"  # the default target: the worker
    assert ("debian:bookworm-slim", "etcd") in stages
    # the package with the etcd extra (the compose file's store), pinned as tested
    assert "pip install -c constraints.txt '.[etcd]'" in text
    assert (ROOT / "constraints.txt").is_file()
    assert "constraints.txt" in text.split("COPY pyproject.toml", 1)[1].splitlines()[0]
    cmd = re.findall(r"^CMD\s+(\[.*\])\s*$", text, flags=re.MULTILINE)[-1]
    assert cmd == '["python", "examples/embedded_service.py"]'
    assert (ROOT / "examples" / "embedded_service.py").is_file()


def _names_host(image: str) -> bool:
    """Whether an image reference starts with a registry host (``host.tld/...``)."""
    first, slash, _ = image.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def test_no_registry_host_names() -> None:
    # images by their short names, pip by its default: nothing pins a registry host
    for path in (DOCKERFILE, COMPOSE):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            for image in re.findall(r"(?:^FROM\s+|image:\s*)(\S+)", line.strip()):
                assert not _names_host(image), f"{path.name}: {image!r} names a registry host"
            assert "--index-url" not in line and "--extra-index-url" not in line
    assert _names_host("example.org/etcd:3") and not _names_host("zookeeper:3.8")
