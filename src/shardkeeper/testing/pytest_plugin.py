"""A pytest plugin for projects that test their shardkeeper jobs on real stores.

Opt-in: installing shardkeeper does not load it into every test session. A project
enables it in its top-level ``conftest.py``::

    pytest_plugins = ["shardkeeper.testing.pytest_plugin"]

or on the command line (``pytest -p shardkeeper.testing.pytest_plugin``, or ``-p`` in
the ``addopts`` of its pytest configuration). Its fixtures:

* ``shardkeeper_zookeeper`` / ``shardkeeper_etcd``: a real single-node ZooKeeper or
  etcd on a free loopback port, started on first use and stopped at the end of the
  session (:class:`~shardkeeper.testing.servers.ZooKeeperCluster`,
  :class:`~shardkeeper.testing.servers.EtcdCluster`; ZooKeeper needs Debian's
  ``zookeeper`` package and a JRE, etcd the ``etcd-server`` package and
  ``shardkeeper[etcd]``).
* ``shardkeeper_backend``: ``"zookeeper"`` or ``"etcd"``, from ``--shardkeeper-backend``
  or the ``shardkeeper_backend`` ini option (default ``zookeeper``). Override the
  fixture, or parametrize it, to run tests on both.
* ``shardkeeper_namespace``: a namespace unique to the test (derived from its name),
  so tests sharing a server never see each other's jobs.
* ``shardkeeper_registry_url``: a registry URL on the server of
  ``shardkeeper_backend`` in that namespace, with short timeouts (session 2 s,
  connection 5 s, operation 2 s) so that failover tests run fast.
* ``recording_job``: a fresh :class:`~shardkeeper.testing.jobs.RecordingJob`.

::

    def test_every_item_runs(shardkeeper_registry_url, recording_job):
        rt = Runtime(shardkeeper_registry_url)
        rt.add_job(recording_job, JobConfig(name="sync", interval=1, sharding_total_count=4))
        with rt:
            recording_job.wait_for(lambda runs: {r.item for r in runs} == {0, 1, 2, 3})
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkeeper.testing.jobs import RecordingJob
from shardkeeper.testing.servers import EtcdCluster, ServerCluster, ZooKeeperCluster

__all__ = [
    "FAST_OPTIONS",
    "recording_job",
    "shardkeeper_backend",
    "shardkeeper_etcd",
    "shardkeeper_namespace",
    "shardkeeper_registry_url",
    "shardkeeper_zookeeper",
    "unique_namespace",
]

#: the timeouts of ``shardkeeper_registry_url`` (seconds): short, so that a lost
#: session and its failover take a few seconds in a test; the operation timeout is
#: at most the session timeout, as the registry URL requires
FAST_OPTIONS: dict[str, float] = {
    "session_timeout": 2.0,
    "connection_timeout": 5.0,
    "operation_timeout": 2.0,
}

_BACKENDS = ("zookeeper", "etcd")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--shardkeeper-backend`` and the ``shardkeeper_backend`` ini option."""
    group = parser.getgroup("shardkeeper")
    group.addoption(
        "--shardkeeper-backend",
        choices=_BACKENDS,
        default=None,
        help="store of the shardkeeper_registry_url fixture (default zookeeper)",
    )
    parser.addini(
        "shardkeeper_backend", "store of the shardkeeper_registry_url fixture", default=""
    )


def unique_namespace(test_name: str) -> str:
    """A namespace for a test: its name made safe, plus a random suffix."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", test_name).strip("-.")[:60] or "test"
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def _shardkeeper_servers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shardkeeper-servers")


@pytest.fixture(scope="session")
def shardkeeper_zookeeper(_shardkeeper_servers: Path) -> Iterator[ZooKeeperCluster]:
    """A standalone ZooKeeper for the whole session (started on first use)."""
    cluster = ZooKeeperCluster(size=1, base_dir=_shardkeeper_servers / "zookeeper")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def shardkeeper_etcd(_shardkeeper_servers: Path) -> Iterator[EtcdCluster]:
    """A single-member etcd for the whole session (started on first use)."""
    cluster = EtcdCluster(size=1, base_dir=_shardkeeper_servers / "etcd")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def shardkeeper_backend(request: pytest.FixtureRequest) -> str:
    """The store of ``shardkeeper_registry_url``: ``zookeeper`` or ``etcd``."""
    chosen = request.config.getoption("--shardkeeper-backend") or request.config.getini(
        "shardkeeper_backend"
    )
    backend = str(chosen or "zookeeper")
    if backend not in _BACKENDS:
        raise pytest.UsageError(
            f"shardkeeper_backend = {backend!r}: valid backends are {', '.join(_BACKENDS)}"
        )
    return backend


@pytest.fixture
def shardkeeper_namespace(request: pytest.FixtureRequest) -> str:
    """A namespace unique to this test (readable: derived from the test name)."""
    return unique_namespace(request.node.name)


@pytest.fixture
def shardkeeper_registry_url(
    shardkeeper_backend: str, shardkeeper_namespace: str, request: pytest.FixtureRequest
) -> str:
    """A registry URL on the session's server of ``shardkeeper_backend``, in the
    test's own namespace, with the short timeouts of :data:`FAST_OPTIONS`."""
    name = "shardkeeper_zookeeper" if shardkeeper_backend == "zookeeper" else "shardkeeper_etcd"
    server: ServerCluster = request.getfixturevalue(name)
    return server.url(shardkeeper_namespace, **FAST_OPTIONS)


@pytest.fixture
def recording_job() -> RecordingJob:
    """A fresh :class:`~shardkeeper.testing.jobs.RecordingJob`."""
    return RecordingJob()
