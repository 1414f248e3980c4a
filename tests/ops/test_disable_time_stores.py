"""The time an operator's disable stores, on the real stores: the store's own on
ZooKeeper (the ``mtime`` of a second write of the switch), the writer's clock on etcd
(which tells no time); the instances skip the fires due from that time on."""

from __future__ import annotations

import json
import time

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import ConfigService
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore

pytestmark = pytest.mark.timeout(120)

JOB = "distimes"


def _doc(store: CoordinationStore, path: str) -> dict[str, object]:
    node = store.get(path)
    assert node is not None
    doc = json.loads(node.value)
    assert isinstance(doc, dict)
    return doc


def test_a_disable_stores_the_stores_time_or_the_writers(
    store: CoordinationStore, backend: str
) -> None:
    """Job and item switches hold ``at`` (close to now: this host's clock is the
    store server's here) and say whose clock it is."""
    paths = JobPaths(JOB)
    config = JobConfig(name=JOB, interval=60, sharding_total_count=2)
    store.put(paths.config, ConfigService.initial_document(config))
    ops = Operations(store)
    before = time.time()
    ops.disable_item(JOB, 1)
    ops.disable_job(JOB)
    after = time.time()
    clock = "zookeeper mtime" if backend == "zookeeper" else "writer"
    for path in (paths.disabled_item(1), paths.disabled_job):
        doc = _doc(store, path)
        assert doc["clock"] == clock
        at = doc["at"]
        assert isinstance(at, float)
        # the store's clock is this host's here; ZooKeeper's mtime has ms resolution
        assert before - 0.01 <= at <= after + 0.01
    ops.enable_item(JOB, 1)
    ops.enable_job(JOB)
    assert not store.exists(paths.disabled_item(1)) and not store.exists(paths.disabled_job)
