"""Real etcd servers for tests: :class:`EtcdCluster` (one member or a cluster,
optionally with authentication), its ``/health`` probe and ``etcdctl`` access.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from shardkeeper.testing.servers.base import ServerCluster
from shardkeeper.testing.servers.members import Member
from shardkeeper.testing.servers.processes import (
    LOOPBACK,
    Backend,
    ClusterError,
    _child_env,
)

__all__ = ["ETCDCTL_BINARY", "ETCD_BINARY", "EtcdCluster", "etcd_health"]

ETCD_BINARY = "/usr/bin/etcd"
ETCDCTL_BINARY = "/usr/bin/etcdctl"


def etcd_health(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether ``GET /health`` of an etcd member reports ``"health":"true"``."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=timeout) as resp:
            body = json.loads(resp.read().decode())
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return str(body.get("health")).lower() == "true"


class EtcdCluster(ServerCluster):
    """A real etcd 3.4 member (``size=1``) or cluster (``size=3``) on loopback.

    ``heartbeat_ms``/``election_ms`` default to 20/200, which lets 1 s leases work
    (the minimum lease TTL is about 1.5 x the election timeout). With ``auth=True``
    a ``root`` user with :attr:`password` is created and authentication enabled;
    :attr:`credentials` and :meth:`url` then carry them.
    """

    backend: ClassVar[Backend] = "etcd"
    scheme: ClassVar[str] = "etcd"

    def __init__(
        self,
        size: int = 1,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        auth: bool = False,
        password: str | None = None,
        detached: bool = False,
        start_timeout: float = 30.0,
        keep_data: bool = False,
        heartbeat_ms: int = 20,
        election_ms: int = 200,
        host: str | Sequence[str] = LOOPBACK,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> None:
        super().__init__(
            size,
            base_dir,
            detached=detached,
            start_timeout=start_timeout,
            keep_data=keep_data,
            host=host,
            prefixes=prefixes,
        )
        self.auth = auth
        #: user name of the root account when ``auth`` is on
        self.username = "root"
        #: password of the root account when ``auth`` is on
        self.password = password or ("sk-" + uuid.uuid4().hex[:16])
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        # a unique token keeps a stray member of another test cluster from joining ours
        self.cluster_token = "shardkeeper-" + uuid.uuid4().hex[:12]

    @property
    def credentials(self) -> tuple[str, str] | None:
        """``("root", password)`` when auth is enabled, else None."""
        return (self.username, self.password) if self.auth else None

    @property
    def endpoints(self) -> list[str]:
        """Client URLs (``http://127.0.0.1:PORT``) of every member."""
        return [f"http://{m.host}:{m.client_port}" for m in self.members]

    def leader(self) -> int:
        """Index of the current raft leader."""
        for m in self.members:
            if m.alive() and not m.paused and self._probe(m) == "leader":
                return m.index
        raise ClusterError(f"{self!r} has no leader right now")

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl`` (API v3) against every member with the root credentials."""
        cmd = [ETCDCTL_BINARY, f"--endpoints={','.join(self.endpoints)}", "--dial-timeout=3s"]
        if self.auth and self._auth_enabled:
            cmd.append(f"--user={self.username}:{self.password}")
        env = _child_env()
        env["ETCDCTL_API"] = "3"
        proc = subprocess.run(
            [*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        if proc.returncode != 0:
            raise ClusterError(f"etcdctl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    _auth_enabled = False

    def _after_start(self) -> None:
        if not self.auth:
            return
        self._auth_enabled = False
        self.etcdctl("user", "add", f"{self.username}:{self.password}", "--interactive=false")
        self.etcdctl("user", "grant-role", self.username, "root")
        self.etcdctl("auth", "enable")
        self._auth_enabled = True

    def _extra_state(self) -> dict[str, Any]:
        return {
            "auth": self.auth,
            "password": self.password if self.auth else None,
            "cluster_token": self.cluster_token,
            "heartbeat_ms": self.heartbeat_ms,
            "election_ms": self.election_ms,
        }

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        self.auth = bool(extra.get("auth"))
        self._auth_enabled = self.auth
        if extra.get("password"):
            self.password = str(extra["password"])
        self.cluster_token = str(extra.get("cluster_token") or self.cluster_token)
        self.heartbeat_ms = int(extra.get("heartbeat_ms") or self.heartbeat_ms)
        self.election_ms = int(extra.get("election_ms") or self.election_ms)

    def _command(self, m: Member) -> list[str]:
        name = f"member-{m.index}"
        client = f"http://{m.host}:{m.client_port}"
        peer = f"http://{m.host}:{m.peer_port}"
        initial = ",".join(f"member-{o.index}=http://{o.host}:{o.peer_port}" for o in self.members)
        return [
            ETCD_BINARY,
            f"--name={name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",  # ignored on restart: the data dir wins
            f"--initial-cluster-token={self.cluster_token}",
            f"--heartbeat-interval={self.heartbeat_ms}",
            f"--election-timeout={self.election_ms}",
            "--logger=zap",
            "--log-outputs=stderr",
            # small WAL/snapshot footprint for short-lived test servers
            "--snapshot-count=10000",
            "--quota-backend-bytes=268435456",
        ]

    def _probe(self, m: Member) -> str:
        if not etcd_health(m.host, m.client_port, timeout=0.5):
            return ""
        return self._role(m) or "member"

    def _role(self, m: Member) -> str:
        # /v3/maintenance/status through the HTTP gateway: no client library needed,
        # and it works without credentials even when auth is enabled
        try:
            req = urllib.request.Request(
                f"http://{m.host}:{m.client_port}/v3/maintenance/status",
                data=b"{}",
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=0.5) as resp:
                body = json.loads(resp.read().decode())
        except (OSError, ValueError, urllib.error.URLError):
            return ""
        header = body.get("header") or {}
        member_id, leader = header.get("member_id"), body.get("leader")
        if member_id is None or leader is None:
            return ""
        return "leader" if str(member_id) == str(leader) else "follower"
