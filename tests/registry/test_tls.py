"""TLS to the stores (issue 14): real ZooKeeper and etcd servers started with
certificates this module generates, reached through ``ca``/``cert``/``key`` URL options.

Both servers require a client certificate (ZooKeeper ``ssl.clientAuth=need``, etcd
``--client-cert-auth``). Checked on each store: the behaviour the runtime relies on
(put/get, commit, a watch event, an ephemeral node ending with its session), a Runtime
running a job's items, the CLI, and the refusals: a wrong CA, no CA (the system's CAs
do not know the test CA), no client certificate, a TLS client on a plaintext port;
each fails within the connection timeout with a message that says why. Plus the
checks of the options themselves and that the key's path is never shown.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.errors import ConfigError, InvalidRegistryURLError, StoreUnavailableError
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry import (
    Check,
    Create,
    EventKind,
    RegistrySettings,
    WatchEvent,
    open_store,
    parse_registry_url,
)
from shardkeeper.registry.url import redact
from shardkeeper.runtime import Runtime
from shardkeeper.testing.certs import TLSFiles, make_certificates
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import EtcdCluster, ServerCluster, ZooKeeperCluster

pytestmark = pytest.mark.timeout(90)

#: short timeouts: a refused client must fail within CONNECT seconds (+ the probe)
CONNECT = 2.0
FAST = {"session_timeout": 2.0, "connection_timeout": CONNECT, "operation_timeout": 2.0}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """The CA, server and client certificates the servers of this module use."""
    return make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """An unrelated CA (and its certificates): the wrong CA."""
    return make_certificates(tmp_path_factory.mktemp("other-pki"), label="someone else")


@pytest.fixture(scope="module")
def tls_zookeeper(
    pki: TLSFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerCluster]:
    """A standalone ZooKeeper with a secure client port that needs a client certificate."""
    cluster = ZooKeeperCluster(base_dir=tmp_path_factory.mktemp("zk-tls"), tls=pki)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def tls_etcd(pki: TLSFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerCluster]:
    """A single etcd member on https client URLs with --client-cert-auth."""
    cluster = EtcdCluster(base_dir=tmp_path_factory.mktemp("etcd-tls"), tls=pki)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def tls_server(backend: str, request: pytest.FixtureRequest) -> ServerCluster:
    """The TLS server of ``backend``."""
    name = "tls_zookeeper" if backend == "zookeeper" else "tls_etcd"
    cluster: ServerCluster = request.getfixturevalue(name)
    return cluster


def _refused(url: str) -> tuple[str, float]:
    """Start a store on ``url``, which must fail: (the message, seconds it took)."""
    began = time.monotonic()
    store = open_store(url)
    with pytest.raises(StoreUnavailableError) as info:
        store.start()
    store.close()
    return str(info.value), time.monotonic() - began


# ---- a store over TLS ------------------------------------------------------------------


def test_a_store_over_tls_reads_writes_commits_watches_and_ends_its_session(
    tls_server: ServerCluster, namespace: str
) -> None:
    """The operations the runtime relies on, through the TLS port: put/get, an atomic
    commit with a check, a watch event, and an ephemeral node another TLS client
    sees go when its owner's session ends."""
    url = tls_server.url(namespace, **FAST)
    settings = parse_registry_url(url)
    assert settings.tls and settings.tls_cert is not None
    owner, observer = open_store(url), open_store(url)
    owner.start()
    observer.start()
    try:
        owner.put("/config", b"v1")
        node = observer.get("/config")
        assert node is not None and node.value == b"v1"

        result = owner.commit([Check("/config", version=node.version), Create("/a", b"1")])
        assert result.succeeded
        stale = owner.commit([Check("/config", version=node.version + 12345), Create("/b")])
        assert not stale.succeeded and not observer.exists("/b")

        events: list[WatchEvent] = []
        lock = threading.Lock()

        def seen(event: WatchEvent) -> None:
            with lock:
                events.append(event)

        sub = observer.watch("/", seen)
        owner.put("/config", b"v2")
        wait_until(
            lambda: any(
                e.kind is EventKind.CHANGED and e.path == "/config" and e.value == b"v2"
                for e in list(events)
            ),
            10,
            message=lambda: f"no CHANGED event for /config over TLS; events {events}",
        )
        sub.cancel()

        owner.put("/instances/me", b"alive", ephemeral=True)
        mine = observer.get("/instances/me")
        assert mine is not None and mine.ephemeral
    finally:
        owner.close()
    try:
        wait_until(
            lambda: not observer.exists("/instances/me"),
            10,
            message="the ephemeral node outlived its owner's session over TLS",
        )
        assert observer.exists("/a")
    finally:
        observer.close()


class _Items(ShardedJob):
    """Records the items it ran."""

    def __init__(self) -> None:
        self.items: set[int] = set()
        self._lock = threading.Lock()

    def execute(self, ctx: ShardingContext) -> None:
        with self._lock:
            self.items.add(ctx.item)


def test_a_runtime_over_tls_runs_every_item(tls_server: ServerCluster, namespace: str) -> None:
    """A Runtime given a TLS registry URL registers, elects, shards and runs all items."""
    job = _Items()
    rt = Runtime(tls_server.url(namespace, **FAST), shutdown_grace=5)
    rt.add_job(job, JobConfig(name="tls-job", interval=1, sharding_total_count=3))
    with rt:
        wait_until(
            lambda: job.items == {0, 1, 2},
            30,
            message=lambda: f"items run over TLS: {sorted(job.items)}",
        )


def test_the_cli_reads_a_store_over_tls(tls_server: ServerCluster, namespace: str) -> None:
    """``shardkeeper status --registry URL`` with the TLS options lists a job an
    instance registered over TLS."""
    job = _Items()
    url = tls_server.url(namespace, **FAST)
    rt = Runtime(url, shutdown_grace=5)
    rt.add_job(job, JobConfig(name="cli-tls", interval=1, sharding_total_count=1))
    with rt:
        wait_until(lambda: job.items == {0}, 30, message="the job never ran over TLS")
        proc = subprocess.run(
            [sys.executable, "-m", "shardkeeper.cli", "status", "--registry", url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            check=False,
        )
    assert proc.returncode == 0, proc.stderr
    assert "cli-tls" in proc.stdout


# ---- refusals --------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["wrong-ca", "no-ca"])
def test_a_client_that_does_not_trust_the_server_fails_clearly_and_in_time(
    tls_server: ServerCluster, other_pki: TLSFiles, namespace: str, which: str
) -> None:
    """A CA that did not sign the server's certificate (another CA, or the system's
    CAs when ``ca`` is left out) fails start() within the connection timeout, and
    the error says the certificate is not signed by the CA given."""
    ca = str(other_pki.ca) if which == "wrong-ca" else None
    message, took = _refused(tls_server.url(namespace, ca=ca, **FAST))
    assert "TLS handshake" in message and "not signed by the CA" in message, message
    assert took < CONNECT + 3, f"took {took:.1f} s"


def test_a_server_that_needs_a_client_certificate_refuses_a_client_without_one(
    tls_server: ServerCluster, namespace: str
) -> None:
    """ZooKeeper (ssl.clientAuth=need) and etcd (--client-cert-auth) refuse a client
    that trusts them but has no certificate; the error says a certificate is needed."""
    message, took = _refused(tls_server.url(namespace, cert=None, key=None, **FAST))
    assert "requires a client certificate" in message, message
    assert took < CONNECT + 3, f"took {took:.1f} s"


def test_a_client_certificate_from_another_ca_is_refused(
    tls_server: ServerCluster, other_pki: TLSFiles, namespace: str
) -> None:
    """A client certificate the server's CA did not sign is refused like none at all."""
    url = tls_server.url(
        namespace, cert=str(other_pki.client_cert), key=str(other_pki.client_key), **FAST
    )
    message, _ = _refused(url)
    assert "refused the client certificate" in message, message


def test_a_tls_client_on_a_plaintext_port_fails_clearly(
    server: ServerCluster, pki: TLSFiles, namespace: str
) -> None:
    """The session's plaintext server, dialled with tls=true: refused in time, and the
    error points at the port."""
    message, took = _refused(server.url(namespace, ca=str(pki.ca), **FAST))
    assert "TLS handshake" in message and "is this its TLS port" in message, message
    assert took < CONNECT + 3, f"took {took:.1f} s"


def test_zookeeper_verify_false_accepts_an_unknown_server_certificate(
    tls_zookeeper: ServerCluster, other_pki: TLSFiles, namespace: str
) -> None:
    """``verify=false`` (ZooKeeper only) encrypts without checking the server: the
    wrong CA then connects (a client certificate is still sent and checked)."""
    store = open_store(tls_zookeeper.url(namespace, ca=str(other_pki.ca), verify="false", **FAST))
    store.start()
    try:
        store.put("/x", b"1")
        node = store.get("/x")
        assert node is not None and node.value == b"1"
    finally:
        store.close()


# ---- settings, options and secrecy -----------------------------------------------------


def test_settings_fields_connect_like_the_url(
    tls_server: ServerCluster, pki: TLSFiles, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RegistrySettings built from fields (no URL) connect too; the key's path is in
    neither repr, url() without credentials, nor any log record of start/close."""
    settings = RegistrySettings(
        backend=tls_server.backend,
        hosts=tuple(tls_server.hosts),
        namespace=namespace,
        tls_ca=str(pki.ca),
        tls_cert=str(pki.client_cert),
        tls_key=str(pki.client_key),
        session_timeout=FAST["session_timeout"],
        connection_timeout=FAST["connection_timeout"],
    )
    assert settings.tls  # implied by the files
    key = str(pki.client_key)
    assert key not in repr(settings) and key not in settings.url()
    assert parse_registry_url(settings.url(with_credentials=True)) == settings
    assert parse_registry_url(settings.url()).tls_cert is None  # the identity is a credential
    caplog.set_level(logging.DEBUG)
    store = open_store(settings)
    store.start()
    try:
        store.put("/fields", b"ok")
        node = store.get("/fields")
        assert node is not None and node.value == b"ok"
    finally:
        store.close()
    leaked = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert not leaked, leaked


def _options(pki: TLSFiles, query: str) -> str:
    text = pki.ca.parent / "notes.txt"  # a file that is no PEM at all
    text.write_text("not a certificate\n")
    query = query.format(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, text=text)
    return f"etcd://127.0.0.1:2379/ns?{query}"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("ca=/no/such/ca.pem", "option ca='/no/such/ca.pem' names no existing file"),
        ("ca=relative/ca.pem", "is a relative path; give the absolute path"),
        ("cert={cert}", "option cert was given without key"),
        ("key={key}", "option key was given without cert"),
        ("ca={text}", "does not hold the PEM certificate(s) of the CA"),
        ("cert={text}&key={key}", "does not hold the PEM client certificate"),
        ("cert={cert}&key={text}", "key=.../notes.txt does not hold the PEM private key"),
        ("tls=false&ca={ca}", "need TLS; leave out tls=false"),
        ("tls=true&verify=false", "verify=false is not available for etcd"),
        ("verify=false", "verify=false only applies with TLS"),
        ("tls=maybe", "option tls='maybe' is not a switch"),
    ],
)
def test_bad_tls_options_name_the_value_and_what_is_valid(
    pki: TLSFiles, query: str, expected: str
) -> None:
    """Each bad TLS option fails at parse time with a message naming it."""
    with pytest.raises(InvalidRegistryURLError) as info:
        parse_registry_url(_options(pki, query))
    assert expected in str(info.value)
    assert str(pki.client_key) not in str(info.value)


def test_the_key_path_is_redacted_and_named_by_file_name_only(
    pki: TLSFiles, tmp_path: Path
) -> None:
    """redact() hides key=; a key error shows the file name, not the directory; an
    encrypted key is refused with the way out; memory:// takes no TLS."""
    url = _options(pki, "ca={ca}&cert={cert}&key={key}")
    assert str(pki.client_key) not in redact(url) and "key=***" in redact(url)
    hidden = tmp_path / "secret-dir"
    hidden.mkdir()
    missing = hidden / "client.key"
    with pytest.raises(InvalidRegistryURLError) as info:
        parse_registry_url(_options(pki, f"cert={{cert}}&key={missing}"))
    assert "key=.../client.key names no existing file" in str(info.value)
    assert "secret-dir" not in str(info.value)
    encrypted = hidden / "enc.key"
    encrypted.write_text(
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"
    )
    with pytest.raises(InvalidRegistryURLError, match="encrypted private key"):
        parse_registry_url(_options(pki, f"cert={{cert}}&key={encrypted}"))
    with pytest.raises(InvalidRegistryURLError, match="takes no TLS options"):
        parse_registry_url("memory://m/ns?tls=true")


def test_tls_options_parse_to_settings_fields(pki: TLSFiles) -> None:
    """ca/cert/key imply tls; tls=true alone uses the system's CAs; zk takes verify."""
    full = parse_registry_url(_options(pki, "ca={ca}&cert={cert}&key={key}"))
    assert (full.tls, full.tls_ca, full.tls_cert, full.tls_key, full.tls_verify) == (
        True,
        str(pki.ca),
        str(pki.client_cert),
        str(pki.client_key),
        True,
    )
    plain = parse_registry_url("etcd://h:2379/ns?tls=true")
    assert plain.tls and plain.tls_ca is None
    assert not parse_registry_url("etcd://h:2379/ns").tls
    zk = parse_registry_url("zk://h:2281/ns?tls=1&verify=false")
    assert zk.tls and not zk.tls_verify


def _docs_recipe() -> str:
    """The bash block of docs/security.md, "Making certificates"."""
    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    section = text.split("### Making certificates", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "no bash block under 'Making certificates' in docs/security.md"
    return match.group(1)


def test_the_openssl_recipe_of_the_docs_makes_certificates_both_stores_accept(
    backend: str, tmp_path: Path
) -> None:
    """The commands of docs/security.md, run as they are: a server started with their
    files serves a store whose URL carries their CA and client certificate."""
    proc = subprocess.run(
        ["bash", "-e", "-c", _docs_recipe()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    files = TLSFiles(
        ca=tmp_path / "ca.pem",
        ca_key=tmp_path / "ca.key",
        server_cert=tmp_path / "server.pem",
        server_key=tmp_path / "server.key",
        server_bundle=tmp_path / "server-bundle.pem",
        client_cert=tmp_path / "client.pem",
        client_key=tmp_path / "client.key",
    )
    cls = ZooKeeperCluster if backend == "zookeeper" else EtcdCluster
    with cls(base_dir=tmp_path / "server", tls=files) as cluster:
        store = open_store(cluster.url("recipe", **FAST))
        store.start()
        try:
            store.put("/from-the-docs", b"ok")
            node = store.get("/from-the-docs")
            assert node is not None and node.value == b"ok"
        finally:
            store.close()


def test_a_tls_cluster_reattached_from_its_state_keeps_tls(tls_server: ServerCluster) -> None:
    """The saved state of a TLS test cluster (``registry up``/``status``) re-attaches
    with its certificates: the probes still see it serve and url() still carries them."""
    again = ServerCluster.from_state(tls_server.to_state())
    assert again.hosts == tls_server.hosts
    assert again.url("x") == tls_server.url("x")
    assert all(s.serving for s in again.status()), again.status()


def test_a_key_file_gone_after_parsing_fails_start_naming_the_option(
    backend: str, pki: TLSFiles, tmp_path: Path
) -> None:
    """Files are checked when the URL is parsed; one removed before start() fails it
    with ConfigError naming the option (the key by its file name), before any
    connection is tried."""
    key = tmp_path / "hidden-dir" / "client.key"
    key.parent.mkdir()
    key.write_bytes(pki.client_key.read_bytes())
    scheme = "zk" if backend == "zookeeper" else "etcd"
    settings = parse_registry_url(
        f"{scheme}://127.0.0.1:1/ns?ca={pki.ca}&cert={pki.client_cert}&key={key}"
    )
    key.unlink()
    store = open_store(settings)
    with pytest.raises(ConfigError) as info:
        store.start()
    store.close()
    assert "option key=.../client.key cannot be read now" in str(info.value)
    assert "hidden-dir" not in str(info.value)
