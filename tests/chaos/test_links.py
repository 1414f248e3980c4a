"""The chaos driver's instance links carry each store's traffic in the run's gray mode.

A 600 s etcd run ended in its first 40 s: with the etcd gray link made inside the
worker, the driver still gave the links the proxy's ZooKeeper frame reading, which
carries no gRPC, and no worker reached etcd. The short chaos runs of ``make test`` have
no gray mode, so only this test sees the links of the long runs.
"""

from __future__ import annotations

import pytest

from shardkeeper.registry import open_store
from shardkeeper.testing.proxy import slow_proxies
from shardkeeper.testing.pytest_plugin import FAST_OPTIONS
from shardkeeper.testing.servers import ServerCluster
from tests.chaos.test_chaos import SIGNAL_GRAY, gray_mode, link_options

pytestmark = pytest.mark.timeout(60)


def test_the_link_of_each_store_carries_its_traffic_in_the_gray_mode(
    backend: str, server: ServerCluster, namespace: str
) -> None:
    """A store opened through the run's link proxies writes and reads back."""
    gray = gray_mode(backend)
    assert gray is not None, f"no gray link for {backend}"
    proxies = slow_proxies(server.hosts, max_seconds=60, **link_options(gray))
    try:
        hosts = ",".join(f"{h}:{p}" for h, p in (x.address for x in proxies))
        url = server.url(namespace, **FAST_OPTIONS).replace(server.hosts_string, hosts, 1)
        store = open_store(url)
        store.start()
        try:
            store.put("/link", b"through")
            node = store.get("/link")
            assert node is not None and node.value == b"through"
        finally:
            store.close()
    finally:
        for x in proxies:
            x.close()


def test_only_the_proxys_own_gray_switch_reads_zookeeper_frames() -> None:
    """etcd's gray link is made in the worker, so its links are plain byte pipes."""
    assert link_options(SIGNAL_GRAY) == {}
    assert link_options(None) == {}
    assert link_options(gray_mode("zookeeper")) == {"zookeeper_frames": True}
