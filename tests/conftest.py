"""Shared fixtures: real ZooKeeper/etcd servers, registry URLs and started stores.

Servers (all started lazily on first use, stopped at session end, data and logs in
one temporary directory per session):

* ``zk_server`` / ``etcd_server``: single-node servers (session scope).
* ``zk_ensemble`` / ``etcd_cluster``: 3-node clusters (session scope). After every test
  that used one, each member is made to serve again (paused ones resumed, killed ones
  restarted), so fault tests can share them.
* ``cluster``: the 3-node cluster of the current ``backend``.
* ``memory_server``: a per-test in-process :class:`MemoryServer` (``memory://`` URLs),
  shut down after the test.

Stores:

* ``backend``: parametrized over ``"zookeeper"`` and ``"etcd"`` (ids ``zk``/``etcd``). A
  test module may override it to add ``"memory"`` (id ``mem``, the reference store on
  ``memory_server``): the fixtures below then build MemoryStores.
* ``registry_url``: a URL on the single-node server of ``backend``, with a namespace
  unique to the test and short timeouts (session 2 s, connection 5 s, operation 2 s).
* ``store_factory(url=None, **options)``: a started store (``registry_url`` unless a
  URL is given; options override the URL's), closed at teardown.
* ``store``: one started store on ``registry_url``.

``--chaos-duration N`` (seconds, default 600) is read by the chaos tests.

Every test that needs a real server (ZooKeeper, etcd, PostgreSQL, a browser) or root
is marked ``external_service`` at collection (:func:`pytest_collection_modifyitems`),
so ``pytest -m "not external_service"`` is the fast tier that runs anywhere
(docs/testing.md).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from shardkeeper.registry import CoordinationStore, RegistrySettings, open_store
from shardkeeper.registry.memory import MemoryServer, named_server
from shardkeeper.testing.servers import ClusterError, EtcdCluster, ServerCluster, ZooKeeperCluster

# the plugin is opt-in (no pytest11 entry point): the suite enables it as a user would
pytest_plugins = ["shardkeeper.testing.pytest_plugin"]

StoreFactory = Callable[..., CoordinationStore]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-duration",
        type=int,
        default=600,
        help="seconds each chaos test runs (default 600; make chaos DURATION=...)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failure, attach the tail of every used server's log to the report: most
    coordination failures are only explained by what the server saw."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "call" or not report.failed:
        return
    seen: set[int] = set()
    for value in getattr(item, "funcargs", {}).values():
        if not isinstance(value, ServerCluster) or id(value) in seen:
            continue
        seen.add(id(value))
        for m in value.members:
            report.sections.append(
                (f"{value.backend} member {m.index} log ({m.log_path})", m.log_tail(30))
            )


#: fixtures that start (or hand out) a real server: a test whose fixture closure holds
#: one needs it
SERVER_FIXTURES = frozenset(
    {
        "shardkeeper_zookeeper",
        "shardkeeper_etcd",
        "zk_server",
        "etcd_server",
        "_zk_ensemble_session",
        "_etcd_cluster_session",
        "zk_ensemble",
        "etcd_cluster",
        "cluster",
        "postgres_server",
        # the test modules' own servers (tests/registry/test_etcd_backend.py,
        # test_tls.py, tests/console/test_secrets.py)
        "own_server",
        "tls_zookeeper",
        "tls_etcd",
        "tls_server",
        "secured",
    }
)
#: parameters (or fixtures of that name) that choose the store or database of a test,
#: and the value naming the in-process stand-in: any other value, or a module's own
#: unparametrized override (these always name a real store), needs a real server
BY_PARAMETER = {
    "backend": "memory",
    "shardkeeper_backend": "memory",
    "db_kind": "sqlite",
}
#: tests that start a server, a browser or a network namespace (root) in their own
#: body, where no fixture shows it: a module, or a module and a test name
EXTERNAL_TESTS = frozenset(
    {
        "tests/chaos/test_chaos.py",
        "tests/cli/test_cli.py::test_registry_up_status_down",
        "tests/cli/test_cli.py::test_wrong_credentials",
        "tests/console/test_browser.py",
        "tests/demo/test_demo.py",
        "tests/history/test_recorder.py::test_database_down_then_back",
        "tests/registry/test_contract.py::test_etcd_auth_refuses_wrong_credentials",
        "tests/registry/test_etcd_backend.py::test_auth_right_wrong_and_missing_credentials",
        "tests/registry/test_etcd_backend.py::test_commits_packed_by_bytes_fit_etcds_request_limit",
        "tests/registry/test_etcd_backend.py::test_max_txn_ops_raises_the_client_limit_with_the_servers",
        "tests/registry/test_security.py::test_etcd_tight_prefix_grant_runs_everything_and_isolates_tenants",
        "tests/registry/test_zookeeper_backend.py::test_tree_watch_resyncs_changes_made_while_its_watches_were_gone",
        # docker-compose validates the compose file: a system package
        "tests/test_compose.py::test_compose_file_validates",
        "tests/test_compose.py::test_compose_services",
        "tests/test_compose.py::test_registry_can_be_switched_to_etcd",
        "tests/testing/test_netns.py",
        "tests/testing/test_pytest_plugin.py::test_plugin_fixtures_in_a_users_project",
        "tests/testing/test_servers.py",
    }
)

_TESTS_ROOT = Path(__file__).resolve().parent.parent


def _needs_external_service(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    if names & SERVER_FIXTURES:
        return True
    module = Path(str(item.path)).resolve().relative_to(_TESTS_ROOT).as_posix()
    test = f"{module}::{getattr(item, 'originalname', item.name)}"
    if module in EXTERNAL_TESTS or test in EXTERNAL_TESTS:
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    return any(
        name in names and params.get(name) != stand_in for name, stand_in in BY_PARAMETER.items()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``external_service`` every test that needs a real server (see the module
    docstring): at collection, so ``-m`` selects on it (a fixture's own
    ``request.node.add_marker`` would come after the selection)."""
    for item in items:
        if _needs_external_service(item):
            item.add_marker(pytest.mark.external_service)


@pytest.fixture(scope="session")
def chaos_duration(request: pytest.FixtureRequest) -> int:
    """The ``--chaos-duration`` option in seconds."""
    return int(request.config.getoption("--chaos-duration"))


# ---- servers ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def server_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory per test session holding every server's data and log."""
    return tmp_path_factory.mktemp("servers")


C = TypeVar("C", bound=ServerCluster)


def _running(cluster: C) -> Iterator[C]:
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def zk_server(shardkeeper_zookeeper: ZooKeeperCluster) -> ZooKeeperCluster:
    """A standalone ZooKeeper for the whole session (the shardkeeper pytest plugin's)."""
    return shardkeeper_zookeeper


@pytest.fixture(scope="session")
def etcd_server(shardkeeper_etcd: EtcdCluster) -> EtcdCluster:
    """A single-member etcd for the whole session (the shardkeeper pytest plugin's)."""
    return shardkeeper_etcd


@pytest.fixture(scope="session")
def _zk_ensemble_session(server_root: Path) -> Iterator[ZooKeeperCluster]:
    yield from _running(ZooKeeperCluster(size=3, base_dir=server_root / "zk-ensemble"))


@pytest.fixture(scope="session")
def _etcd_cluster_session(server_root: Path) -> Iterator[EtcdCluster]:
    yield from _running(EtcdCluster(size=3, base_dir=server_root / "etcd-cluster"))


def _repaired(cluster: C) -> Iterator[C]:
    yield cluster
    # Put every member back so the next test starts from a healthy cluster. If that
    # fails (a member will not come back), start a fresh cluster rather than let every
    # later test fail for this test's sake; it gets new ports, so tests must ask the
    # cluster for its URL rather than cache it across tests.
    try:
        cluster.ensure_all_up()
    except ClusterError:
        cluster.stop()
        cluster.start()


@pytest.fixture
def zk_ensemble(_zk_ensemble_session: ZooKeeperCluster) -> Iterator[ZooKeeperCluster]:
    """The session's 3-node ZooKeeper ensemble; every member serves again after the test."""
    yield from _repaired(_zk_ensemble_session)


@pytest.fixture
def etcd_cluster(_etcd_cluster_session: EtcdCluster) -> Iterator[EtcdCluster]:
    """The session's 3-member etcd cluster; every member serves again after the test."""
    yield from _repaired(_etcd_cluster_session)


# ---- backends, URLs, stores ----------------------------------------------------------


@pytest.fixture(params=["zookeeper", "etcd"], ids=["zk", "etcd"])
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test: ``"zookeeper"`` or ``"etcd"``."""
    return str(request.param)


@pytest.fixture
def memory_server() -> Iterator[MemoryServer]:
    """A MemoryServer of this test only (reachable as ``memory://<its name>/ns``)."""
    server = named_server(f"test-{uuid.uuid4().hex[:12]}")
    yield server
    server.shutdown()


@pytest.fixture
def server(backend: str, request: pytest.FixtureRequest) -> ServerCluster | MemoryServer:
    """The single-node server of ``backend`` (started on first use)."""
    name = {"zookeeper": "zk_server", "etcd": "etcd_server", "memory": "memory_server"}[backend]
    cluster: ServerCluster | MemoryServer = request.getfixturevalue(name)
    return cluster


@pytest.fixture
def cluster(backend: str, request: pytest.FixtureRequest) -> ServerCluster:
    """The 3-node cluster of ``backend``, repaired after the test."""
    name = "zk_ensemble" if backend == "zookeeper" else "etcd_cluster"
    result: ServerCluster = request.getfixturevalue(name)
    return result


@pytest.fixture
def namespace(shardkeeper_namespace: str) -> str:
    """A namespace unique to this test (readable: derived from the test name)."""
    return shardkeeper_namespace


@pytest.fixture
def registry_url(server: ServerCluster | MemoryServer, namespace: str) -> str:
    """A registry URL on the single-node server of ``backend`` with a unique namespace
    and short timeouts (see FAST_OPTIONS)."""
    # imported here: a module-level import would come before pytest_plugins loads the
    # plugin, too early for pytest's assertion rewriting of it (a warning, an error here)
    from shardkeeper.testing.pytest_plugin import FAST_OPTIONS

    return server.url(namespace, **FAST_OPTIONS)


@pytest.fixture
def store_factory(registry_url: str) -> Iterator[StoreFactory]:
    """``store_factory(url=None, **options)`` -> a started store, closed at teardown.

    ``url`` defaults to ``registry_url`` (so stores of one test share a namespace);
    ``options`` (session_timeout=..., etc.) override the URL's options.
    """
    stores: list[CoordinationStore] = []

    def factory(url: str | None = None, **options: Any) -> CoordinationStore:
        settings = RegistrySettings.from_url(url or registry_url)
        if options:
            # re-validate through the model so a bad option fails like a bad URL would
            settings = RegistrySettings(**{**settings.model_dump(), **options})
        store = open_store(settings)
        store.start()
        stores.append(store)
        return store

    yield factory
    errors: list[BaseException] = []
    for s in reversed(stores):
        try:
            s.close()
        except Exception as exc:  # close every store even if one misbehaves
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def store(store_factory: StoreFactory) -> CoordinationStore:
    """One started store on ``registry_url``."""
    return store_factory()


@pytest.fixture(autouse=True, scope="session")
def _history_in_the_session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``shardkeeper run`` records history by default in the user's data directory:
    the processes the tests start write it under the session's temporary directory
    instead (tests that test history set their own URL)."""
    saved = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg-data"))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = saved
