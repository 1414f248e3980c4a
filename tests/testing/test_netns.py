"""The fault tools themselves: network namespaces (partitions) and the slow proxy,
against real ZooKeeper and etcd servers."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkeeper.registry import ConnectionState, CoordinationStore, open_store
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.netns import NetworkLab, remove_stale, unavailable_reason
from shardkeeper.testing.proxy import SlowProxy, slow_proxies
from shardkeeper.testing.servers import ClusterError, ServerCluster, cluster_class

pytestmark = pytest.mark.timeout(180)

REASON = unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")

# A client in a namespace: prints every connection state change of its store, one per
# line, keeps an ephemeral node /alive while it has a session, and exits by itself
# after 120 s (or when its stdin closes).
CLIENT = """
import sys, threading, time
from shardkeeper.registry import open_store
store = open_store(sys.argv[1])
def on_state(s):
    print("STATE", s.value, flush=True)
    if s.value == "connected":  # a new session: put the ephemeral node back
        threading.Thread(target=store.put, args=("/alive", b""), kwargs={"ephemeral": True}).start()
store.add_state_listener(on_state)
store.start()
store.put("/probe", b"from-namespace")
store.put("/alive", b"", ephemeral=True)
print("READY", flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), store.close(), sys.exit(0)), daemon=True).start()
time.sleep(120)
"""


@pytest.fixture
def lab() -> Iterator[NetworkLab]:
    """A network lab removed after the test, whatever happened."""
    with NetworkLab() as made:
        yield made


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


class _Lines:
    """Lines a child process printed, read without blocking."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._buf = ""

    def poll(self) -> list[str]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 4096).decode(errors="replace")
            if not chunk:
                break
            self._buf += chunk
        *done, self._buf = self._buf.split("\n")
        self.lines += done
        return self.lines


@needs_netns
def test_lab_removes_everything_it_made() -> None:
    """Namespaces, veths and the bridge are gone after close, even after an error."""
    with pytest.raises(RuntimeError, match="boom"), NetworkLab() as lab:
        a = lab.namespace()
        b = lab.namespace()
        assert a.address != b.address and a.address.startswith("10.200.")
        assert a.name in _netns() and lab.bridge in _links()
        raise RuntimeError("boom")
    assert a.name not in _netns() and b.name not in _netns()
    assert lab.bridge not in _links() and a.host_if not in _links()


@needs_netns
@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_partitioned_client_goes_suspended_then_lost_and_reconnects_after_heal(
    backend: str, lab: NetworkLab, tmp_path: Path
) -> None:
    """A process in a namespace reaches a real store in another namespace; cutting its
    link makes its store SUSPENDED and the server expires its session (its ephemeral
    node goes); healing it brings LOST (etcd may say it during the cut, ZooKeeper
    says it on reconnecting) and a new session (CONNECTED)."""
    spot = lab.namespace()
    server: ServerCluster = cluster_class(backend)(
        size=1, base_dir=tmp_path / "srv", host=spot.address, prefixes=[spot.prefix]
    )
    with server:
        url = server.url("netns", session_timeout=2.0, connection_timeout=5, operation_timeout=2)
        box = lab.namespace()
        proc = subprocess.Popen(
            [*box.prefix, sys.executable, "-c", CLIENT, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        out = _Lines(proc)
        try:
            wait_until(lambda: "READY" in out.poll(), 30, message=lambda: f"client: {out.lines}")
            # the write from the namespace really reached the server
            with open_store(server.url("netns")) as host_store:
                node = host_store.get("/probe")
                assert node is not None and node.value == b"from-namespace"
                assert host_store.exists("/alive")
                box.cut()
                cut_at = time.monotonic()
                wait_until(
                    lambda: "STATE suspended" in out.poll(),
                    10,
                    message=lambda: f"client: {out.lines}",
                )
                wait_until(
                    lambda: not host_store.exists("/alive"),
                    30,
                    message="the server never expired the partitioned client's session",
                )
                expired_after = time.monotonic() - cut_at
                # not before the session could have expired on the server
                assert expired_after >= 1.0, (expired_after, out.lines)
                seen = out.lines.index("STATE suspended")
                box.heal()
                wait_until(
                    lambda: "STATE connected" in out.poll()[seen:],
                    30,
                    message=lambda: f"client after heal: {out.lines}",
                )
                after = out.lines[seen:]
                assert "STATE lost" in after, out.lines
                assert after.index("STATE lost") < after.index("STATE connected"), out.lines
                wait_until(
                    lambda: host_store.exists("/alive"),
                    10,
                    message="the healed client did not re-create its ephemeral node",
                )
        finally:
            if proc.poll() is None:
                assert proc.stdin is not None
                proc.stdin.close()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


def _endpoint(store: object) -> str:
    """``host:port`` of the member an etcd store sends its requests to now."""
    return str(store._transport.endpoint_in_use().netloc)  # type: ignore[attr-defined]


def _steer(store: object, member: tuple[str, int]) -> None:
    """Make a started etcd store send its requests to ``member`` (its client starts on
    a random one), as a store that connected to it would."""
    store._transport.use("{}:{}".format(*member))  # type: ignore[attr-defined]
    assert _endpoint(store) == "{}:{}".format(*member)


@needs_netns
@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_isolated_store_member_loses_its_peers_not_its_clients(
    backend: str, lab: NetworkLab, tmp_path: Path
) -> None:
    """A member cut off from its two peers stops serving (no quorum) while the other
    two go on with a leader; a client on the three members, connected to the isolated
    one (etcd: steered onto it; ZooKeeper: listed first), keeps working; after rejoin
    the member serves again."""
    spots = lab.store_members(3)
    cluster = cluster_class(backend)(
        size=3,
        base_dir=tmp_path / "ens",
        host=[n.address for n in spots],
        prefixes=[n.prefix for n in spots],
    )
    with cluster:
        victim = cluster.leader()  # type: ignore[attr-defined]
        others = [i for i in range(3) if i != victim]
        # the victim first: a client that starts on its first host starts on it
        order = [victim, *others]
        hosts = ",".join("{}:{}".format(*cluster.hosts[i]) for i in order)
        url = cluster.url("iso", session_timeout=2, operation_timeout=2)
        store = open_store(url.replace(cluster.hosts_string, hosts, 1))
        store.start()
        if backend == "etcd":
            _steer(store, cluster.hosts[victim])
        try:
            lab.isolate(spots[victim], spots)
            # the victim still answers its host (clients reach it) ...
            with socket.create_connection(cluster.hosts[victim], timeout=2):
                pass

            # ... but the majority elects a leader of its own, and the victim no longer
            # serves as leader
            def leader() -> int | None:
                try:
                    return int(cluster.leader())  # type: ignore[attr-defined]
                except ClusterError:  # between two leaders
                    return None

            wait_until(
                lambda: leader() in others,
                30,
                message=lambda: f"roles {[s.role for s in cluster.status()]}",
            )
            wait_until(
                lambda: cluster.member_status(victim).role != "leader",
                20,
                message=lambda: f"roles {[s.role for s in cluster.status()]}",
            )

            def write_ok() -> bool:
                try:
                    store.put("/during", b"x")
                except Exception:  # an operation caught in the move to another member
                    return False
                return True

            wait_until(write_ok, 20, interval=0.2, message="writes never succeeded again")
            lab.rejoin(spots[victim])
            wait_until(
                cluster.healthy, 30, message=lambda: f"roles {[s.role for s in cluster.status()]}"
            )
            assert store.state in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED)
        finally:
            store.close()


@needs_netns
@pytest.mark.parametrize("role", ["leader", "follower"])
def test_etcd_client_on_an_isolated_member_moves_on_and_keeps_its_session(
    role: str, lab: NetworkLab, tmp_path: Path
) -> None:
    """A store connected to the member that gets cut off from its two peers (the
    member still accepts connections, but has no leader and cannot commit) moves to a
    member of the majority in time: same session (lease) throughout, never LOST, its
    ephemeral node outlives several session timeouts, its writes succeed again within
    about the session timeout T, and its watch goes on delivering changes."""
    t = 2.0
    spots = lab.store_members(3)
    cluster = cluster_class("etcd")(
        size=3,
        base_dir=tmp_path / "ens",
        host=[n.address for n in spots],
        prefixes=[n.prefix for n in spots],
    )
    with cluster:
        leader = cluster.leader()  # type: ignore[attr-defined]
        victim = leader if role == "leader" else (leader + 1) % 3
        others = [i for i in range(3) if i != victim]
        majority = ",".join("{}:{}".format(*cluster.hosts[i]) for i in others)
        url = cluster.url("moves", session_timeout=t, operation_timeout=1)
        states: list[ConnectionState] = []
        seen: list[str] = []
        store = open_store(url)
        observer = open_store(url.replace(cluster.hosts_string, majority, 1))
        store.add_state_listener(states.append)
        store.start()
        observer.start()
        try:
            _steer(store, cluster.hosts[victim])
            session = store.session_id
            store.put("/alive", b"", ephemeral=True)
            store.watch("/seen", lambda e: seen.append(e.path))
            lab.isolate(spots[victim], spots)
            cut_at = time.monotonic()

            def write_ok() -> bool:
                try:
                    store.put("/during", b"x")
                except Exception:  # a write caught on the isolated member
                    return False
                return True

            wait_until(write_ok, 10, interval=0.05, message="writes never succeeded again")
            writes_after = time.monotonic() - cut_at
            # the session outlives several timeouts with the member still cut off
            deadline = cut_at + 3 * t
            while time.monotonic() < deadline:
                node = observer.get("/alive")
                assert node is not None and node.ephemeral, (
                    f"the session's ephemeral node is gone {time.monotonic() - cut_at:.2f} s "
                    f"after the isolation; states {states}"
                )
                time.sleep(0.1)
            assert store.session_id == session
            assert ConnectionState.LOST not in states, states
            observer.put("/seen/x", b"1")
            wait_until(lambda: "/seen/x" in seen, 5, message=lambda: f"watch saw {seen}")
            assert _endpoint(store) != "{}:{}".format(*cluster.hosts[victim])
            print(
                f"\n[{role}] writes again {writes_after:.2f} s after the isolation; states {states}"
            )
            assert writes_after <= t + 0.5, (writes_after, states)
            assert store.member_moves >= 1  # type: ignore[attr-defined]
            # the member's return (it may force an election) does not cost the session
            lab.rejoin(spots[victim])
            wait_until(cluster.healthy, 30, message="the cluster did not heal")
            wait_until(write_ok, 10, interval=0.05, message="no write after the rejoin")
            assert store.session_id == session
            assert ConnectionState.LOST not in states, states
        finally:
            store.close()
            observer.close()


def _echo_server() -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        srv.settimeout(30)
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(30)
            while data := conn.recv(4096):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv


def _rtt(sock: socket.socket) -> float:
    t = time.monotonic()
    sock.sendall(b"ping")
    got = b""
    while len(got) < 4:
        got += sock.recv(16)
    assert got == b"ping"
    return time.monotonic() - t


def test_slow_proxy_adds_the_configured_delay_when_on() -> None:
    """Off: forwarded at once. On with delay (0.08, 0.12) per direction: a round trip
    takes 0.16-0.24 s plus scheduling slack. Off again: fast again."""
    srv = _echo_server()
    with SlowProxy(srv.getsockname(), delay=(0.08, 0.12), seed=7) as proxy:
        sock = socket.create_connection(proxy.address, timeout=10)
        with sock:
            assert _rtt(sock) < 0.05
            proxy.slow = True
            rtts = [_rtt(sock) for _ in range(5)]
            assert all(0.16 <= r <= 0.24 + 0.1 for r in rtts), rtts
            proxy.slow = False
            assert _rtt(sock) < 0.05
    srv.close()
    assert proxy.closed


def test_slow_proxy_stalls_a_fraction_and_stops_by_itself() -> None:
    """stall_fraction=1 holds every chunk stall_seconds more; max_seconds closes it."""
    srv = _echo_server()
    proxy = SlowProxy(
        srv.getsockname(),
        delay=(0.0, 0.0),
        stall_fraction=1.0,
        stall_seconds=0.3,
        slow=True,
        max_seconds=3,
    )
    with socket.create_connection(proxy.address, timeout=10) as sock:
        assert 0.6 <= _rtt(sock) <= 0.9
    wait_until(lambda: proxy.closed, 10, message="proxy did not stop after max_seconds")
    with pytest.raises(OSError):
        socket.create_connection(proxy.address, timeout=1).close()
    srv.close()


def test_slow_proxy_rejects_bad_settings() -> None:
    """Bad settings are named in the error."""
    with pytest.raises(ValueError, match="delay"):
        SlowProxy(("127.0.0.1", 1), delay=(0.3, 0.1))
    with pytest.raises(ValueError, match="stall_fraction"):
        SlowProxy(("127.0.0.1", 1), stall_fraction=1.5)


def _timed_put(store: CoordinationStore, value: bytes) -> float:
    """Seconds one put of ``value`` to /a took."""
    t = time.monotonic()
    store.put("/a", value)
    return time.monotonic() - t


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_store_through_slow_proxies_works_and_is_slower(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """A real store through one proxy per member: requests work, and take at least
    the added round trip while slow."""
    server: ServerCluster = request.getfixturevalue(
        "zk_server" if backend == "zookeeper" else "etcd_server"
    )
    proxies = slow_proxies(server.hosts, delay=(0.1, 0.1))
    try:
        hosts = ",".join(f"{h}:{p}" for h, p in (x.address for x in proxies))
        url = f"{server.scheme}://{hosts}/slow-proxy?session_timeout=4&operation_timeout=4"
        with open_store(url) as store:
            # The fastest of a few puts: one put alone can meet a scheduling stall
            # of a loaded machine (CI saw 214 ms for the first), while the slow
            # link's added round trip is a floor that no put can get under.
            fast = min(_timed_put(store, b"1") for _ in range(5))
            for x in proxies:
                x.slow = True
            slow = min(_timed_put(store, b"2") for _ in range(2))
            node = store.get("/a")
            assert node is not None and node.value == b"2"
        assert slow >= 0.2 > fast, (fast, slow)
    finally:
        for x in proxies:
            x.close()


@needs_netns
def test_remove_stale_cleans_up_after_a_killed_test_run() -> None:
    """A process killed with -9 runs no exit handler: remove_stale() removes its
    bridge, veths and namespaces (and nothing of a live process)."""
    code = (
        "import time\n"
        "from shardkeeper.testing.netns import NetworkLab\n"
        "lab = NetworkLab()\n"
        "ns = lab.namespace()\n"
        "print(lab.bridge, ns.name, ns.host_if, flush=True)\n"
        "time.sleep(60)\n"
    )
    with NetworkLab() as mine:
        kept = mine.namespace()
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            bridge, ns_name, host_if = proc.stdout.readline().decode().split()
        finally:
            proc.kill()
            proc.wait(10)
        assert ns_name in _netns() and bridge in _links()
        removed = remove_stale()
        assert {bridge, ns_name} <= set(removed), removed
        # the host end of the veth goes with the namespace (the kernel deletes a veth
        # pair with either end, asynchronously), or remove_stale deletes it itself
        wait_until(lambda: host_if not in _links(), 10, message=f"{host_if} left behind")
        assert ns_name not in _netns() and bridge not in _links()
        assert kept.name in _netns() and mine.bridge in _links()
