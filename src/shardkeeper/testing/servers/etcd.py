"""Real etcd servers for tests: :class:`EtcdCluster` (one member or a cluster,
optionally with authentication and TLS), its ``/health`` probe and ``etcdctl`` access.

With ``tls=`` (a :class:`~shardkeeper.testing.certs.TLSFiles`) the members serve
``https`` client URLs (``--cert-file``, ``--key-file``, ``--trusted-ca-file``) and,
unless ``client_cert_auth=False``, require a client certificate signed by the CA
(``--client-cert-auth``). Peer traffic stays plaintext on loopback. The probes and
``etcdctl`` use the client certificate; :meth:`EtcdCluster.url` carries ``ca``,
``cert`` and ``key``.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from shardkeeper.testing.servers.base import ServerCluster
from shardkeeper.testing.servers.locate import find_etcd, find_etcdctl
from shardkeeper.testing.servers.members import Member
from shardkeeper.testing.servers.processes import (
    LOOPBACK,
    Backend,
    ClusterError,
    _child_env,
)

if TYPE_CHECKING:
    from shardkeeper.testing.certs import TLSFiles

__all__ = [
    "COMPACTION_RETENTION",
    "ETCDCTL_BINARY",
    "ETCD_BINARY",
    "REGISTRY_QUOTA_BYTES",
    "TEST_QUOTA_BYTES",
    "EtcdCluster",
    "etcd_health",
]

#: Debian's paths; the servers run the etcd that
#: :func:`~shardkeeper.testing.servers.locate.find_etcd` finds
#: (``$SHARDKEEPER_ETCD``, the ``PATH``, then these)
ETCD_BINARY = "/usr/bin/etcd"
ETCDCTL_BINARY = "/usr/bin/etcdctl"

#: a test server's ``--quota-backend-bytes``: past it etcd refuses every write
#: (NOSPACE alarm) until an operator compacts, defragments and disarms it
TEST_QUOTA_BYTES = 256 * 2**20

#: ``shardkeeper registry up``'s quota: etcd's own default (2 GiB)
REGISTRY_QUOTA_BYTES = 2 * 2**30

#: ``--auto-compaction-retention`` (periodic mode): history older than this is
#: compacted away. Without it every revision stays and a job of thousands of items
#: a fire fills the quota in minutes; a watch needs seconds of history to resume.
COMPACTION_RETENTION = "5m"


def etcd_health(
    host: str, port: int, timeout: float = 1.0, context: ssl.SSLContext | None = None
) -> bool:
    """Whether ``GET /health`` of an etcd member reports ``"health":"true"``
    (over https with ``context``)."""
    scheme = "https" if context is not None else "http"
    try:
        with urllib.request.urlopen(
            f"{scheme}://{host}:{port}/health", timeout=timeout, context=context
        ) as resp:
            body = json.loads(resp.read().decode())
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return str(body.get("health")).lower() == "true"


class EtcdCluster(ServerCluster):
    """A real etcd 3.4 member (``size=1``) or cluster (``size=3``) on loopback.

    ``heartbeat_ms``/``election_ms`` default to 20/200, which lets 1 s leases work
    (the minimum lease TTL is about 1.5 x the election timeout). With ``auth=True``
    a ``root`` user with :attr:`password` is created and authentication enabled;
    :attr:`credentials` and :meth:`url` then carry them. ``tls``: serve https client
    URLs with these certificates; ``client_cert_auth``: require a client certificate.
    ``max_txn_ops``: the server's ``--max-txn-ops`` (etcd's default 128); a client may
    use as many with the URL option of the same name. ``quota_bytes``: the server's
    ``--quota-backend-bytes`` (default :data:`TEST_QUOTA_BYTES`); history older than
    :data:`COMPACTION_RETENTION` is compacted automatically.
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
        tls: TLSFiles | None = None,
        client_cert_auth: bool = True,
        max_txn_ops: int = 128,
        quota_bytes: int = TEST_QUOTA_BYTES,
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
        #: the certificates of the https client URLs (None: http)
        self.tls = tls
        self.client_cert_auth = client_cert_auth
        #: the server's --max-txn-ops
        self.max_txn_ops = max_txn_ops
        #: the server's --quota-backend-bytes
        self.quota_bytes = quota_bytes

    @property
    def _scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The probes' client context (CA and client certificate) with ``tls``."""
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def url(self, namespace: str = "default", **options: float | str | None) -> str:
        """A registry URL on this cluster; with ``tls`` it carries ``ca``, ``cert`` and
        ``key`` (the client certificate), each replaceable or, given None, left out."""
        if self.tls is not None:
            options = {**self.tls.url_options(), **options}
        return super().url(namespace, **options)

    @property
    def credentials(self) -> tuple[str, str] | None:
        """``("root", password)`` when auth is enabled, else None."""
        return (self.username, self.password) if self.auth else None

    @property
    def endpoints(self) -> list[str]:
        """Client URLs (``http://127.0.0.1:PORT``, https with TLS) of every member."""
        return [f"{self._scheme}://{m.host}:{m.client_port}" for m in self.members]

    def leader(self) -> int:
        """Index of the current raft leader."""
        for m in self.members:
            if m.alive() and not m.paused and self._probe(m) == "leader":
                return m.index
        raise ClusterError(f"{self!r} has no leader right now")

    def etcdctl(self, *args: str, timeout: float = 10.0) -> str:
        """Run ``etcdctl`` (API v3) against every member with the root credentials."""
        cmd = [find_etcdctl(), f"--endpoints={','.join(self.endpoints)}", "--dial-timeout=3s"]
        if self.auth and self._auth_enabled:
            cmd.append(f"--user={self.username}:{self.password}")
        if self.tls is not None:
            cmd += [
                f"--cacert={self.tls.ca}",
                f"--cert={self.tls.client_cert}",
                f"--key={self.tls.client_key}",
            ]
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
            "tls_dir": str(self.tls.ca.parent) if self.tls is not None else None,
            "client_cert_auth": self.client_cert_auth,
            "max_txn_ops": self.max_txn_ops,
            "quota_bytes": self.quota_bytes,
        }

    def _load_extra_state(self, extra: Mapping[str, Any]) -> None:
        self.auth = bool(extra.get("auth"))
        self._auth_enabled = self.auth
        if extra.get("password"):
            self.password = str(extra["password"])
        self.cluster_token = str(extra.get("cluster_token") or self.cluster_token)
        self.heartbeat_ms = int(extra.get("heartbeat_ms") or self.heartbeat_ms)
        self.election_ms = int(extra.get("election_ms") or self.election_ms)
        self.max_txn_ops = int(extra.get("max_txn_ops") or self.max_txn_ops)
        self.quota_bytes = int(extra.get("quota_bytes") or self.quota_bytes)
        if extra.get("tls_dir"):
            from shardkeeper.testing.certs import load_certificates

            self.tls = load_certificates(Path(str(extra["tls_dir"])))
            self.client_cert_auth = bool(extra.get("client_cert_auth", True))

    def _command(self, m: Member) -> list[str]:
        name = f"member-{m.index}"
        client = f"{self._scheme}://{m.host}:{m.client_port}"
        peer = f"http://{m.host}:{m.peer_port}"
        initial = ",".join(f"member-{o.index}=http://{o.host}:{o.peer_port}" for o in self.members)
        return [
            find_etcd(),
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
            f"--quota-backend-bytes={self.quota_bytes}",
            "--auto-compaction-mode=periodic",
            f"--auto-compaction-retention={COMPACTION_RETENTION}",
            f"--max-txn-ops={self.max_txn_ops}",
            *self._tls_flags(),
        ]

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        flags = [
            f"--cert-file={self.tls.server_cert}",
            f"--key-file={self.tls.server_key}",
            f"--trusted-ca-file={self.tls.ca}",
        ]
        return [*flags, "--client-cert-auth"] if self.client_cert_auth else flags

    def _probe(self, m: Member) -> str:
        if not etcd_health(m.host, m.client_port, timeout=0.5, context=self._ssl_context()):
            return ""
        return self._role(m) or "member"

    def _role(self, m: Member) -> str:
        # /v3/maintenance/status through the HTTP gateway: no client library needed,
        # and it works without credentials even when auth is enabled
        try:
            req = urllib.request.Request(
                f"{self._scheme}://{m.host}:{m.client_port}/v3/maintenance/status",
                data=b"{}",
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=0.5, context=self._ssl_context()) as resp:
                body = json.loads(resp.read().decode())
        except (OSError, ValueError, urllib.error.URLError):
            return ""
        header = body.get("header") or {}
        member_id, leader = header.get("member_id"), body.get("leader")
        if member_id is None or leader is None:
            return ""
        return "leader" if str(member_id) == str(leader) else "follower"
