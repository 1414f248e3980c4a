"""Requests as the servers count them, next to the client-side counters.

ZooKeeper: ``zk_packets_received`` of the ``mntr`` four-letter command (every request
packet the member received, pings included). etcd: the sum of
``grpc_server_started_total`` over unary calls from ``/metrics`` (Range, Txn, Put,
LeaseGrant...; the watch and lease keep-alive streams are not unary calls and do not
count). Both are read over side channels that are not counted themselves.
"""

from __future__ import annotations

import urllib.request

from shardkeeper.testing.servers import ServerCluster
from shardkeeper.testing.servers.zookeeper import four_letter_word

__all__ = ["server_requests"]


def server_requests(cluster: ServerCluster) -> int:
    """Requests received so far by every member of ``cluster`` (-1 when unreadable)."""
    total = 0
    for host, port in cluster.hosts:
        if cluster.backend == "zookeeper":
            value = _mntr_value(four_letter_word(host, port, "mntr", timeout=5.0))
        else:
            value = _unary_started(host, port)
        if value < 0:
            return -1
        total += value
    return total


def _mntr_value(text: str, key: str = "zk_packets_received") -> int:
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if name == key:
            return int(value.strip())
    return -1


def _unary_started(host: str, port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5.0) as resp:
            text = resp.read().decode()
    except OSError:
        return -1
    total = 0.0
    for line in text.splitlines():
        if line.startswith("grpc_server_started_total{") and 'grpc_type="unary"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
