"""The test-server launcher itself, against real ZooKeeper and etcd processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import etcd3
import pytest
from kazoo.client import KazooClient

from shardkeeper.registry import ConnectionState, CoordinationStore, open_store
from shardkeeper.testing import EtcdCluster, ZooKeeperCluster, expire_session, wait_until
from shardkeeper.testing.servers import ServerCluster, pid_alive, zookeeper_mode
from shardkeeper.testing.servers.base import _thread_states

REPO = Path(__file__).resolve().parents[2]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _assert_gone(pids: list[int], ports: list[int]) -> None:
    for pid in pids:
        assert not pid_alive(pid), f"pid {pid} still alive"
    for port in ports:
        assert not _port_open(port), f"port {port} still accepts connections"


def _kazoo(hosts: str) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=5.0, connection_retry={"max_tries": 3})
    client.start(timeout=10)
    return client


def _etcd(cluster: EtcdCluster, timeout: float = 5) -> Any:
    endpoints = [etcd3.Endpoint(h, p, secure=False, time_retry=0.5) for h, p in cluster.hosts]
    return etcd3.MultiEndpointEtcd3Client(endpoints=endpoints, timeout=timeout, failover=True)


# ---- single node -------------------------------------------------------------------


def test_zookeeper_single_serves_restarts_and_stops_clean(tmp_path: Path) -> None:
    zk = ZooKeeperCluster(size=1, base_dir=tmp_path)
    with zk:
        assert zk.start_seconds is not None and zk.start_seconds < 30
        (host, port) = zk.hosts[0]
        assert zookeeper_mode(host, port) == "standalone"
        assert zk.url("ns", session_timeout=2.0) == f"zk://127.0.0.1:{port}/ns?session_timeout=2"
        client = _kazoo(zk.hosts_string)
        try:
            client.create("/kept", b"v1")
        finally:
            client.stop()
            client.close()
        pid = zk.members[0].pid
        assert pid is not None
        zk.restart(0)  # same port, same data
        assert zk.hosts[0] == (host, port)
        assert not pid_alive(pid)
        client = _kazoo(zk.hosts_string)
        try:
            assert client.get("/kept")[0] == b"v1"
        finally:
            client.stop()
            client.close()
        pids = [m.pid for m in zk.members if m.pid]
    _assert_gone(pids, [port])
    assert (tmp_path / "member-0" / "server.log").stat().st_size > 0


def test_etcd_single_serves_and_stops_clean(tmp_path: Path) -> None:
    with EtcdCluster(size=1, base_dir=tmp_path) as etcd:
        status = etcd.member_status(0)
        assert status.serving and status.running and status.role == "leader"
        client = _etcd(etcd)
        try:
            client.put("/k", b"v")
            assert client.get("/k")[0] == b"v"
        finally:
            client.close()
        pids = [m.pid for m in etcd.members if m.pid]
        ports = [p for _, p in etcd.hosts] + [m.peer_port for m in etcd.members]
    _assert_gone(pids, ports)


def test_etcd_auth_requires_the_root_credentials(tmp_path: Path) -> None:
    with EtcdCluster(size=1, base_dir=tmp_path, auth=True) as etcd:
        assert etcd.credentials == ("root", etcd.password)
        assert etcd.url("ns").startswith(f"etcd://root:{etcd.password}@127.0.0.1:")
        # etcdctl, not the gRPC client: grpc refuses call credentials on a plaintext
        # channel, so the Python client cannot authenticate against a non-TLS etcd
        anonymous = subprocess.run(
            ["etcdctl", f"--endpoints={etcd.endpoints[0]}", "put", "/k", "v"],
            capture_output=True,
            text=True,
            timeout=20,
            env={**os.environ, "ETCDCTL_API": "3"},
            check=False,
        )
        assert anonymous.returncode != 0
        assert "user name is empty" in anonymous.stderr or "permission" in anonymous.stderr
        etcd.etcdctl("put", "/k", "v")  # as root
        assert "v" in etcd.etcdctl("get", "/k")
        assert etcd.healthy()  # /health still answers with auth on
        assert etcd.member_status(0).role == "leader"


def test_pause_and_resume_a_member(zk_server: ZooKeeperCluster) -> None:
    zk_server.pause(0)
    try:
        # pause() returns once every thread of the member is stopped (a thread still
        # running could answer a request sent right after: a flaky "did not raise")
        pid = zk_server.members[0].pid
        assert pid is not None
        threads = _thread_states(pid)
        assert threads and set(threads) <= {"T", "t"}, threads
        status = zk_server.member_status(0)
        assert status.running and status.paused and not status.serving
        # a stopped JVM accepts the TCP connection (the kernel does) but answers nothing
        assert zookeeper_mode(*zk_server.hosts[0], timeout=0.3) == ""
    finally:
        zk_server.resume(0)
    wait_until(lambda: zk_server.member_status(0).serving, 10, message="resumed member serves")


# ---- three nodes -----------------------------------------------------------------


def test_zookeeper_ensemble_has_one_leader_and_survives_a_kill(
    zk_ensemble: ZooKeeperCluster,
) -> None:
    roles = sorted(s.role or "" for s in zk_ensemble.status())
    assert roles == ["follower", "follower", "leader"]
    leader = zk_ensemble.leader()
    zk_ensemble.kill(leader)
    assert not zk_ensemble.member_status(leader).running
    survivors = [m for m in zk_ensemble.members if m.index != leader]
    # the two survivors still form a quorum: a new leader is elected and writes work
    wait_until(
        lambda: (
            sorted(zookeeper_mode("127.0.0.1", m.client_port) for m in survivors)
            == ["follower", "leader"]
        ),
        20,
        message="survivors elect a new leader",
    )
    client = _kazoo(",".join(f"127.0.0.1:{m.client_port}" for m in survivors))
    try:
        client.create(f"/after-kill-{time.monotonic_ns()}", b"x")
    finally:
        client.stop()
        client.close()
    zk_ensemble.restart(leader)
    assert zk_ensemble.member_status(leader).role in ("follower", "leader")


def test_etcd_cluster_healthy_and_keeps_quorum_after_a_kill(etcd_cluster: EtcdCluster) -> None:
    assert etcd_cluster.healthy()
    assert sorted(s.role or "" for s in etcd_cluster.status()) == [
        "follower",
        "follower",
        "leader",
    ]
    victim = etcd_cluster.leader()
    etcd_cluster.kill(victim)
    # short per-request timeout: a put sent while no leader exists waits that long
    client = _etcd(etcd_cluster, timeout=1)
    try:

        def put_works() -> bool:
            try:
                client.put("/after-kill", b"x")
                return True
            except Exception:  # no leader yet: the remaining two are electing one
                return False

        wait_until(put_works, 20, interval=0.1, message="put succeeds with 2 of 3 members")
    finally:
        client.close()
    # the fixture restarts the killed member at teardown; the next test sees 3 healthy


def test_ensure_all_up_repairs_paused_and_killed_members(zk_ensemble: ZooKeeperCluster) -> None:
    zk_ensemble.pause(0)
    zk_ensemble.kill(1)
    assert not zk_ensemble.healthy()
    assert zk_ensemble.ensure_all_up() == [0, 1]
    assert zk_ensemble.healthy()
    assert all(not s.paused for s in zk_ensemble.status())


# ---- the up/status/down command ------------------------------------------------------


def _cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", "registry", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_cli_up_status_down_round_trip(tmp_path: Path, backend: str) -> None:
    data = tmp_path / "data"
    up = _cli("up", "--backend", backend, "--nodes", "1", "--dir", str(data))
    pids: list[int] = []
    try:
        assert up.returncode == 0, up.stderr
        url = up.stdout.strip()
        assert url.startswith("zk://" if backend == "zookeeper" else "etcd://"), up.stdout
        state = json.loads((data / "state.json").read_text())
        pids = state["pids"]
        assert state["url"] == url and all(pid_alive(p) for p in pids)
        # the servers outlive the command that started them
        st = _cli("status", "--dir", str(data), "--json")
        assert st.returncode == 0, st.stdout + st.stderr
        info = json.loads(st.stdout)
        assert info["healthy"] and info["members"][0]["serving"]
        again = _cli("up", "--backend", backend, "--dir", str(data))
        assert again.returncode == 0 and again.stdout.strip() == url
    finally:
        down = _cli("down", "--dir", str(data))
    assert down.returncode == 0, down.stderr
    _assert_gone(pids, [])
    assert _cli("status", "--dir", str(data)).returncode == 1  # nothing runs


# ---- fault helpers -----------------------------------------------------------------


def test_wait_until_returns_the_value_and_fails_with_the_message() -> None:
    assert wait_until(lambda: 42, 1) == 42
    began = time.monotonic()
    with pytest.raises(AssertionError, match="never true"):
        wait_until(lambda: False, 0.2, message="never true")
    assert time.monotonic() - began < 2


@pytest.fixture
def _backend_module(backend: str) -> Iterator[None]:
    module = (
        "shardkeeper.registry.zookeeper" if backend == "zookeeper" else "shardkeeper.registry.etcd"
    )
    pytest.importorskip(module, reason=f"{module} not written yet")
    yield


@pytest.mark.usefixtures("_backend_module")
def test_expire_session_expires_it_on_the_server(
    store_factory: Any, registry_url: str, server: ServerCluster
) -> None:
    store: CoordinationStore = store_factory()
    observer: CoordinationStore = store_factory()
    states: list[ConnectionState] = []
    store.add_state_listener(states.append)
    store.put("/alive", b"1", ephemeral=True)
    wait_until(lambda: observer.exists("/alive"), 5, message="observer sees the ephemeral node")
    old = expire_session(store, url=registry_url)
    assert old and store.session_id != old
    # the server deleted the ephemeral node of the expired session
    wait_until(lambda: not observer.exists("/alive"), 5, message="ephemeral node deleted")
    wait_until(
        lambda: ConnectionState.LOST in states and states[-1] == ConnectionState.CONNECTED,
        10,
        message=lambda: f"store saw LOST then CONNECTED: {states}",
    )


@pytest.mark.usefixtures("_backend_module")
@pytest.mark.parametrize("backend", ["etcd"])
def test_expire_session_with_etcd_auth(tmp_path: Path, backend: str) -> None:
    with EtcdCluster(size=1, base_dir=tmp_path, auth=True) as etcd:
        store = open_store(etcd.url("auth", session_timeout=2))
        with store:
            old = store.session_id
            assert expire_session(store) == old
            assert store.session_id != old
