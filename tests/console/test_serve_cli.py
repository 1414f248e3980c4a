"""``shardkeeper serve``: a real process serving the console; its errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from shardkeeper.testing.faults import wait_until
from tests.console.conftest import OPERATOR_TOKEN

pytestmark = pytest.mark.timeout(90)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cli(
    *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SHARDKEEPER_CONSOLE")}
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**full, **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.fixture
def served(registry_url: str, tmp_path: object) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "SHARDKEEPER_REGISTRY": registry_url,
        "SHARDKEEPER_CONSOLE_PORT": str(port),
        "SHARDKEEPER_CONSOLE_TOKENS": f"bot:operator:{OPERATOR_TOKEN}",
        "SHARDKEEPER_HISTORY_URL": "off",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardkeeper.cli", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            return httpx.get(f"{base}/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(up, 30, message="shardkeeper serve did not answer")
        yield base
    finally:
        proc.terminate()
        proc.wait(15)
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.parametrize("backend", ["zookeeper"], ids=["zk"])
def test_serve_answers_with_options_from_the_environment(served: str) -> None:
    status = httpx.get(
        f"{served}/api/status", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    )
    assert status.status_code == 200 and status.json()["jobs"] == []
    assert httpx.get(f"{served}/api/status").status_code == 401
    login = httpx.get(f"{served}/login")
    assert login.status_code == 200 and login.headers["x-frame-options"] == "DENY"


def test_serve_refuses_to_start_without_an_account() -> None:
    result = cli("serve", "--registry", "zk://127.0.0.1:1/x")
    assert result.returncode == 2
    assert "no console account" in result.stderr and "--anonymous-read" in result.stderr


def test_hash_password() -> None:
    # a narrow terminal width (COLUMNS) must not wrap the hash over two lines
    result = cli("serve", "--hash-password", stdin="a-long-password\n", env={"COLUMNS": "40"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1, result.stdout
    hashed = result.stdout.strip()
    assert hashed.startswith("pbkdf2_sha256$") and "a-long-password" not in hashed
    from shardkeeper.console.auth import AuthConfig

    auth = AuthConfig()
    auth.add_user("x", "viewer", password_hash=hashed)
    assert auth.check_password("x", "a-long-password", "basic") is not None
    assert cli("serve", "--hash-password", stdin="short\n").returncode == 2


def test_a_missing_extra_is_named() -> None:
    # the console's libraries hidden as if the extra were not installed
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.modules['jinja2'] = None\n"
        "from shardkeeper.cli import main; sys.exit(main(['serve']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2  # a missing extra exits 2, as everywhere (docs/cli.md)
    assert "'console' extra (missing: fastapi, jinja2)" in result.stderr
    assert "pip install 'shardkeeper[console]'" in result.stderr
