"""Registry URL parsing and settings: every accepted form and every error message."""

from __future__ import annotations

import pytest

from shardkeeper.errors import ConfigError, InvalidRegistryURLError
from shardkeeper.registry import open_store
from shardkeeper.registry.url import (
    ENV_VAR,
    RegistrySettings,
    parse_registry_url,
    redact,
)

# ---- accepted URLs -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "backend"),
    [
        ("zk://127.0.0.1:2181/app", "zookeeper"),
        ("zookeeper://127.0.0.1:2181/app", "zookeeper"),
        ("ZK://127.0.0.1:2181/app", "zookeeper"),
        ("etcd://127.0.0.1:2379/app", "etcd"),
    ],
)
def test_schemes_select_the_backend(url: str, backend: str) -> None:
    """zk, zookeeper (any case) select ZooKeeper; etcd selects etcd."""
    settings = parse_registry_url(url)
    assert settings.backend == backend
    assert settings.hosts == (("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])),)
    assert settings.namespace == "app"


def test_several_hosts_keep_their_order_and_ports() -> None:
    """A comma-separated host list is kept in order, each with its own port."""
    settings = parse_registry_url("zk://zk1:2181,zk2:2182,10.0.0.3:2183/prod/orders")
    assert settings.hosts == (("zk1", 2181), ("zk2", 2182), ("10.0.0.3", 2183))
    assert settings.hosts_string == "zk1:2181,zk2:2182,10.0.0.3:2183"
    assert settings.namespace == "prod/orders"


@pytest.mark.parametrize(("scheme", "port"), [("zk", 2181), ("etcd", 2379)])
def test_default_port_per_backend(scheme: str, port: int) -> None:
    """A host without a port gets the backend's default port."""
    settings = parse_registry_url(f"{scheme}://a,b:1000/ns")
    assert settings.hosts == (("a", port), ("b", 1000))


@pytest.mark.parametrize(
    "host", ["zk-1.prod.example", "localhost", "10.0.0.3", "zk.example.", f"{'x' * 63}.org"]
)
def test_host_names_with_valid_labels(host: str) -> None:
    """Host names, IPv4 addresses and a fully qualified name with its final dot pass."""
    assert parse_registry_url(f"zk://{host}:2181/ns").hosts == ((host, 2181),)


def test_longest_timeout_is_accepted() -> None:
    """3600 s is the longest timeout a URL may give."""
    assert parse_registry_url("etcd://h:1/ns?connection_timeout=3600").connection_timeout == 3600


def test_defaults_for_timeouts_and_credentials() -> None:
    """Without options: session 4 s, connection 5 s, operation 2 s, no credentials."""
    settings = parse_registry_url("etcd://h:2379/ns")
    assert settings.session_timeout == 4.0
    assert settings.connection_timeout == 5.0
    assert settings.operation_timeout == 2.0
    assert settings.username is None
    assert settings.password is None


def test_timeout_options_are_parsed_as_seconds() -> None:
    """session/connection/operation timeouts are read as float seconds."""
    settings = parse_registry_url(
        "zk://h:1/ns?session_timeout=2.5&connection_timeout=0.75&operation_timeout=1.5"
    )
    assert settings.session_timeout == 2.5
    assert settings.connection_timeout == 0.75
    assert settings.operation_timeout == 1.5


def test_credentials_in_userinfo_are_percent_decoded() -> None:
    """user:password@ in the URL is decoded (so ':' and '@' can be in the password)."""
    settings = parse_registry_url("zk://alice:p%3Aw%40rd@h:2181/ns")
    assert settings.username == "alice"
    assert settings.password == "p:w@rd"
    assert settings.hosts == (("h", 2181),)


def test_user_without_password_in_userinfo() -> None:
    """user@ without ':' gives a user name and no password."""
    settings = parse_registry_url("zk://alice@h:2181/ns")
    assert settings.username == "alice"
    assert settings.password is None


def test_credentials_as_options() -> None:
    """username/password may also be given as query options."""
    settings = parse_registry_url("etcd://h:2379/ns?username=bob&password=s3cret")
    assert (settings.username, settings.password) == ("bob", "s3cret")


def test_ipv6_hosts_are_bracketed_for_the_clients() -> None:
    """[::1]:2181 parses to host ::1 and is re-bracketed in hosts_string and url()."""
    settings = parse_registry_url("zk://[::1]:2181,[fe80::2]/ns")
    assert settings.hosts == (("::1", 2181), ("fe80::2", 2181))
    assert settings.hosts_string == "[::1]:2181,[fe80::2]:2181"
    assert parse_registry_url(settings.url()) == settings


def test_url_round_trips_and_hides_credentials_by_default() -> None:
    """url() re-parses to the same settings; credentials only when asked for."""
    settings = parse_registry_url("zk://u:p%2Fx@a:1,b:2/x/y?session_timeout=2")
    plain = settings.url()
    assert "u:" not in plain and "p%2Fx" not in plain
    assert parse_registry_url(plain).username is None
    assert parse_registry_url(settings.url(with_credentials=True)) == settings


def test_max_txn_ops_is_an_etcd_count_kept_in_the_url() -> None:
    """``max_txn_ops`` (etcd only) defaults to etcd's 128, is parsed as a count and
    survives ``url()``; the default is left out of it."""
    assert parse_registry_url("etcd://h:1/ns").max_txn_ops == 128
    settings = parse_registry_url("etcd://h:1/ns?max_txn_ops=4096")
    assert settings.max_txn_ops == 4096
    assert "max_txn_ops=4096" in settings.url()
    assert parse_registry_url(settings.url()) == settings
    assert "max_txn_ops" not in parse_registry_url("etcd://h:1/ns").url()


def test_from_env_reads_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """RegistrySettings.from_env() reads SHARDKEEPER_REGISTRY when no URL is given."""
    monkeypatch.setenv(ENV_VAR, "etcd://e1:2379,e2/envns?session_timeout=3")
    settings = RegistrySettings.from_env()
    assert settings.backend == "etcd"
    assert settings.hosts == (("e1", 2379), ("e2", 2379))
    assert settings.namespace == "envns"
    assert settings.session_timeout == 3.0


def test_from_env_prefers_an_explicit_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit URL wins over the environment variable."""
    monkeypatch.setenv(ENV_VAR, "etcd://e1:2379/envns")
    assert RegistrySettings.from_env("zk://z:1/explicit").namespace == "explicit"


@pytest.mark.parametrize("value", [None, ""])
def test_from_env_without_a_url_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    """No URL and no (or an empty) variable: the error tells how to give one."""
    if value is None:
        monkeypatch.delenv(ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(InvalidRegistryURLError, match=ENV_VAR):
        RegistrySettings.from_env()


def test_from_env_with_a_bad_variable_names_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed SHARDKEEPER_REGISTRY fails with a message naming the bad value."""
    monkeypatch.setenv(ENV_VAR, "redis://h:1/ns")
    with pytest.raises(InvalidRegistryURLError, match="'redis'"):
        RegistrySettings.from_env()


def test_settings_are_immutable() -> None:
    """Parsed settings are frozen (shared safely between components)."""
    settings = parse_registry_url("zk://h:1/ns")
    with pytest.raises(ValueError):
        setattr(settings, "namespace", "other")  # noqa: B010 (mypy knows it is frozen)


def test_open_store_rejects_a_bad_url_without_connecting() -> None:
    """open_store() validates the URL before any backend is involved."""
    with pytest.raises(InvalidRegistryURLError, match="'mysql'"):
        open_store("mysql://h:1/ns")


# ---- rejected URLs: each message names the bad value ---------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        # malformed
        ("", "empty URL"),
        ("   ", "empty URL"),
        ("127.0.0.1:2181/ns", "missing scheme"),
        ("zk:/h:1/ns", "missing scheme"),
        ("zk:///ns", "no host"),
        ("zk://h:1,,h2:2/ns", "empty host"),
        ("zk://h 1:2/ns", "invalid host 'h 1'"),
        ("zk://...:2181/ns", "invalid host '...'"),
        ("etcd://.../ns", "invalid host '...'"),
        ("zk://a..b:1/ns", "invalid host 'a..b'"),
        ("zk://.h:1/ns", "invalid host '.h'"),
        (f"zk://{'x' * 64}.com:1/ns", "invalid host"),
        ("zk://:secret@h:1/ns", "empty user name"),
        ("zk://h:1/ns#frag", "'#frag'"),
        # unknown scheme
        ("http://h:1/ns", "unknown scheme 'http'"),
        ("consul://h:1/ns", "unknown scheme 'consul'"),
        # namespace
        ("zk://h:1", "empty namespace"),
        ("zk://h:1/", "empty namespace"),
        ("etcd://h:1///", "empty namespace"),
        ("zk://h:1/a b", "invalid segment 'a b'"),
        ("zk://h:1/app/../other", "invalid segment '..'"),
        ("zk://h:1/app/./x", "invalid segment '.'"),
        ("zk://h:1/a//b", "invalid segment ''"),
        ("zk://h:1/a*b", "invalid segment 'a\\*b'"),
        ("etcd://h:1/caf%C3%A9", "invalid segment"),
        # timeouts
        ("zk://h:1/ns?session_timeout=0", "session_timeout='0'"),
        ("zk://h:1/ns?session_timeout=-2", "session_timeout='-2'"),
        ("zk://h:1/ns?connection_timeout=soon", "connection_timeout='soon'"),
        ("zk://h:1/ns?operation_timeout=", "operation_timeout=''"),
        ("zk://h:1/ns?operation_timeout=nan", "operation_timeout='nan'"),
        ("etcd://h:1/ns?session_timeout=inf", "session_timeout='inf'"),
        ("zk://h:1/ns?connection_timeout=1e12", "connection_timeout='1e12' is too long"),
        ("etcd://h:1/ns?operation_timeout=3601", "at most 3600 seconds"),
        # options
        ("zk://h:1/ns?sesion_timeout=2", "unknown option 'sesion_timeout'"),
        ("etcd://h:1/ns?tlz=1", "unknown option 'tlz'"),
        ("zk://h:1/ns?password=x", "password was given without a user name"),
        ("zk://h:1/ns?username=", "username is empty"),
        ("etcd://h:1/ns?max_txn_ops=many", "max_txn_ops='many' is not a whole number"),
        ("etcd://h:1/ns?max_txn_ops=64", "max_txn_ops=64 is out of range; give 128 to 65536"),
        ("etcd://h:1/ns?max_txn_ops=70000", "max_txn_ops=70000 is out of range"),
        ("zk://h:1/ns?max_txn_ops=4096", "max_txn_ops applies to etcd only"),
        # ports
        ("zk://h:abc/ns", "invalid port 'abc'"),
        ("zk://h:/ns", "invalid port ''"),
        ("zk://h:-1/ns", "invalid port '-1'"),
        ("zk://h:1_0/ns", "invalid port '1_0'"),
        ("zk://h:0/ns", "port 0 out of range"),
        ("etcd://a:1,b:65536/ns", "port 65536 out of range"),
    ],
)
def test_bad_urls_are_rejected_naming_the_bad_value(url: str, fragment: str) -> None:
    """Every invalid URL raises InvalidRegistryURLError (a ConfigError) naming the bad part."""
    with pytest.raises(InvalidRegistryURLError, match=fragment) as info:
        parse_registry_url(url)
    assert isinstance(info.value, ConfigError)
    assert isinstance(info.value, ValueError)
    assert info.value.url == redact(url)


def test_bad_timeout_message_says_what_is_valid() -> None:
    """A timeout that is not a number says a number of seconds > 0 is expected."""
    with pytest.raises(InvalidRegistryURLError, match="seconds > 0"):
        parse_registry_url("zk://h:1/ns?session_timeout=two")


def test_unknown_option_message_lists_the_valid_options() -> None:
    """An unknown option error lists every valid option."""
    with pytest.raises(InvalidRegistryURLError) as info:
        parse_registry_url("zk://h:1/ns?retries=3")
    for name in ("session_timeout", "connection_timeout", "operation_timeout", "username"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "zk://alice:hunter2@h:1/ns?bogus=1",
        "etcd://h:1/ns?username=alice&password=hunter2&bogus=1",
        "zk://alice:hunter2@h:1/a b",
    ],
)
def test_error_messages_never_show_the_password(url: str) -> None:
    """A rejected URL is quoted in the error with its password replaced by ***."""
    with pytest.raises(InvalidRegistryURLError) as info:
        parse_registry_url(url)
    assert "hunter2" not in str(info.value)
    assert "hunter2" not in info.value.url
    assert "***" in str(info.value)


def test_redact_keeps_everything_but_the_password() -> None:
    """redact() replaces only the password, in user-info and in options."""
    assert redact("zk://u:pw@h:1/ns") == "zk://u:***@h:1/ns"
    assert redact("zk://u@h:1/ns") == "zk://u@h:1/ns"
    assert redact("zk://h:1/ns?username=u&password=pw&x=1") == (
        "zk://h:1/ns?username=u&password=***&x=1"
    )
