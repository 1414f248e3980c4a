"""Accounts, tokens, signed sessions and CSRF tokens (no store needed)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from shardkeeper.console.auth import AuthConfig, hash_password, load_auth
from shardkeeper.console.context import ConsoleContext
from shardkeeper.console.session import Signer
from shardkeeper.console.throttle import LoginThrottle
from shardkeeper.errors import ConfigError
from shardkeeper.testing.faults import wait_until


def test_accounts_from_env_and_file(tmp_path: Path) -> None:
    hashed = hash_password("carol-password", iterations=1000)
    users = tmp_path / "users.yaml"
    users.write_text(
        "users:\n"
        f"  - {{name: carol, role: operator, password_hash: '{hashed}'}}\n"
        "  - {name: dave, role: viewer, password: dave-password}\n"
        "tokens:\n"
        "  - {name: ci, role: operator, token: ci-token-0123456789}\n"
    )
    env = {
        "SHARDKEEPER_CONSOLE_USERS": "alice:operator:pass:with:colons, bob:viewer:bob-password",
        "SHARDKEEPER_CONSOLE_TOKENS": "dash:viewer:dash-token-0123456789",
    }
    auth = load_auth(users, environ=env)
    assert auth.check_password("alice", "pass:with:colons", "basic") is not None
    bob = auth.check_password("bob", "bob-password", "session")
    assert bob is not None and (bob.role, bob.can_write) == ("viewer", False)
    carol = auth.check_password("carol", "carol-password", "basic")
    assert carol is not None and carol.can_write
    assert auth.check_password("carol", "wrong-password", "basic") is None
    assert auth.check_password("nobody", "carol-password", "basic") is None
    assert auth.check_password("dave", "dave-password", "basic") is not None
    ci = auth.check_token("ci-token-0123456789")
    assert ci is not None and (ci.name, ci.via, ci.can_write) == ("ci", "bearer", True)
    assert auth.check_token("dash-token-0123456789") is not None
    assert auth.check_token("ci-token-012345678") is None
    assert not auth.empty and load_auth(environ={}).empty

    toml = tmp_path / "users.toml"
    toml.write_text('[[users]]\nname = "erin"\nrole = "viewer"\npassword = "erin-password"\n')
    assert load_auth(toml, environ={}).role_of("erin") == "viewer"
    from_env = load_auth(environ={"SHARDKEEPER_CONSOLE_USERS_FILE": str(toml)})
    assert from_env.role_of("erin") == "viewer"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHARDKEEPER_CONSOLE_USERS": "alice:admin:password1"}, "role 'admin' is not one of"),
        ({"SHARDKEEPER_CONSOLE_USERS": "alice:operator:short"}, "at least 8 characters"),
        ({"SHARDKEEPER_CONSOLE_USERS": "alice-operator"}, "entry 1 is not name:role:secret"),
        (
            {"SHARDKEEPER_CONSOLE_USERS": "a:viewer:password1,a:viewer:password2"},
            "given twice",
        ),
        ({"SHARDKEEPER_CONSOLE_TOKENS": "ci:operator:tooshort"}, "at least 16 characters"),
    ],
)
def test_bad_entries_are_named_without_their_secret(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_auth(environ=env)
    for value in env.values():
        if value.count(":") >= 2:
            assert value.rsplit(":", 1)[-1] not in str(info.value)


def test_bad_users_files(tmp_path: Path) -> None:
    cases = {
        "a.yaml": ("admins: []\n", "unknown key"),
        "b.yaml": ("users: [{name: x, role: viewer}]\n", "exactly one of password"),
        "c.yaml": ("users: [{name: x, role: viewer, password_hash: md5}]\n", "not valid"),
        "d.yaml": ("users: [{name: x, role: viewer, pw: x}]\n", "entry 1 must be a mapping"),
        "e.yaml": ("tokens: [{name: t, role: viewer, token_sha256: abc}]\n", "64 hex"),
        "f.json": ("{}", "use a .yaml"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_auth(path, environ={})
    with pytest.raises(ConfigError, match="cannot read it"):
        load_auth(tmp_path / "missing.yaml", environ={})


def test_sessions_are_signed_and_expire() -> None:
    signer = Signer(b"k" * 32, max_age=60)
    session = signer.new_session("alice")
    cookie = signer.dump(session)
    assert signer.load(cookie) == session
    assert Signer(b"x" * 32).load(cookie) is None  # another console's key
    _, mac = cookie.split(".")
    forged = Signer(b"x" * 32).dump(signer.new_session("root")).split(".")[0]
    assert signer.load(f"{forged}.{mac}") is None
    assert signer.load("garbage") is None and signer.load(None) is None
    old = signer.new_session("alice")
    stale = type(old)(user=old.user, nonce=old.nonce, issued=time.time() - 61)
    assert signer.load(signer.dump(stale)) is None

    token = signer.csrf_token(session)
    assert signer.check_csrf(session, token)
    assert not signer.check_csrf(signer.new_session("alice"), token)
    assert not signer.check_csrf(None, token) and not signer.check_csrf(session, "")
    with pytest.raises(ValueError, match="16 bytes"):
        Signer(b"short")


def test_scrub_hides_every_secret() -> None:
    ctx = ConsoleContext(
        ops=None,  # type: ignore[arg-type]
        auth=AuthConfig(),
        signer=Signer(b"k" * 32),
        secrets=["pw", "user:pw", ""],
    )
    assert ctx.scrub("zk://user:pw@host failed (pw)") == "zk://***@host failed (***)"


def test_login_throttle_counts_failures_per_name_within_the_window() -> None:
    throttle = LoginThrottle(limit=2, window=0.3)
    throttle.failed("bob")
    assert throttle.wait_for("bob") == 0
    throttle.failed("bob")
    assert 0 < throttle.wait_for("bob") <= 0.3
    assert throttle.wait_for("alice") == 0
    wait_until(lambda: throttle.wait_for("bob") == 0, 5, message="the window did not pass")
    throttle.failed("carol")
    throttle.failed("carol")
    throttle.succeeded("carol")
    assert throttle.wait_for("carol") == 0
