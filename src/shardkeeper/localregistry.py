"""A local registry for development: real ZooKeeper or etcd servers on loopback.

* :func:`up`, :func:`down`, :func:`status`: a *detached* registry that outlives the
  command that started it, behind ``shardkeeper registry up|down|status`` and the
  ``registry/up``, ``registry/down``, ``registry/status`` scripts that wrap it. A
  state file (``<dir>/state.json``) records the servers' pids, ports and registry URL
  so that ``down`` and ``status`` find them again. The directory is per user
  (:func:`default_dir`: ``$SHARDKEEPER_LOCAL_REGISTRY_DIR``, else
  ``$XDG_STATE_HOME/shardkeeper/registry``, else
  ``~/.local/state/shardkeeper/registry``), so every terminal of the user finds the
  same registry whatever its working directory. Data and logs live under
  ``<dir>/<backend>/`` and outlive ``down``: the next ``up`` of the same backend and
  size in that directory starts the servers again on that data (on the same ports
  when they are free), so jobs, configs and the audit trail are still there.
* :func:`local_cluster`: the same servers bound to this process (stopped with it),
  for tools such as the demo that start a registry of their own.

The server processes themselves are those of :mod:`shardkeeper.testing.servers`, so
that development and tests run the same servers: the etcd binary and ZooKeeper
installation found on the ``PATH`` or through an environment variable
(:mod:`shardkeeper.testing.servers.locate`); a missing one is reported with the line
that installs it before anything starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shardkeeper.testing.servers import ClusterError, ServerCluster, cluster_class
from shardkeeper.testing.servers.etcd import REGISTRY_QUOTA_BYTES
from shardkeeper.testing.servers.locate import ServerNotFoundError, require
from shardkeeper.testing.servers.zookeeper import REGISTRY_HEAP_MB

__all__ = [
    "DIR_ENV",
    "STATE_FILE",
    "STOPPED_FILE",
    "ClusterError",
    "ServerCluster",
    "ServerNotFoundError",
    "default_dir",
    "down",
    "load_state",
    "local_cluster",
    "status",
    "up",
]

#: the environment variable that overrides :func:`default_dir`
DIR_ENV = "SHARDKEEPER_LOCAL_REGISTRY_DIR"
STATE_FILE = "state.json"
#: the state of the last registry stopped by :func:`down`, kept in ``<dir>/<backend>/``
#: so that the next :func:`up` restarts it on its data
STOPPED_FILE = "stopped.json"


def default_dir() -> Path:
    """Where the local registry keeps its state, data and logs unless told otherwise:
    ``$SHARDKEEPER_LOCAL_REGISTRY_DIR``, else ``$XDG_STATE_HOME/shardkeeper/registry``,
    else ``~/.local/state/shardkeeper/registry``. Per user, not per working directory:
    a second terminal elsewhere finds the registry the first one started."""
    given = os.environ.get(DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    # XDG: a relative XDG_STATE_HOME is invalid and must be ignored
    state_home = os.environ.get("XDG_STATE_HOME", "").strip()
    base = (
        Path(state_home)
        if state_home and os.path.isabs(state_home)
        else Path.home() / ".local" / "state"
    )
    return base / "shardkeeper" / "registry"


def _resolve(directory: str | os.PathLike[str] | None) -> Path:
    return Path(directory if directory is not None else default_dir()).expanduser().resolve()


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    # two `up`s racing in one directory would start two registries and lose one
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def load_state(directory: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The state written by :func:`up` in ``directory`` (default :func:`default_dir`),
    or None if there is none."""
    path = _resolve(directory) / STATE_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise RuntimeError(f"unreadable state file {path}: {exc}; remove it") from None
    return data if isinstance(data, dict) else None


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, directory / STATE_FILE)  # atomic: a reader never sees half a file


def _attach(state: dict[str, Any]) -> ServerCluster:
    return ServerCluster.from_state(state["cluster"])


def local_cluster(
    backend: str,
    directory: str | os.PathLike[str],
    *,
    nodes: int = 1,
    auth: bool = False,
    detached: bool = False,
    timeout: float = 60.0,
) -> ServerCluster:
    """A not yet started ``backend`` registry of ``nodes`` members with its data and
    logs in ``directory``; call ``start()`` and ``stop()`` on it (or use it as a
    context manager). Unless ``detached``, its processes die with this one.
    ``backend`` is ``zookeeper`` or ``etcd`` (ValueError naming it otherwise);
    ``auth`` (etcd only) enables authentication with a root user."""
    cls = cluster_class(backend)
    if auth and cls.backend != "etcd":
        raise ValueError(f"auth is only supported for the etcd backend, not {backend!r}")
    # sized for real jobs, not the test servers' small defaults (docs/registry-backends.md)
    kwargs: dict[str, Any] = (
        {"auth": auth, "quota_bytes": REGISTRY_QUOTA_BYTES}
        if cls.backend == "etcd"
        else {"heap_mb": REGISTRY_HEAP_MB}
    )
    return cls(
        size=nodes,
        base_dir=Path(directory),
        detached=detached,
        start_timeout=timeout,
        **kwargs,
    )


def up(
    backend: str = "zookeeper",
    nodes: int = 1,
    directory: str | os.PathLike[str] | None = None,
    *,
    namespace: str = "default",
    auth: bool = False,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Start a detached ``backend`` registry of ``nodes`` members in ``directory``
    (default :func:`default_dir`); return its state.

    The state (also written to ``<directory>/state.json``) has ``url``, ``backend``,
    ``nodes``, ``pids``, ``hosts`` and ``start_seconds``. If the same kind of registry
    already runs there, it is returned unchanged (``already_running`` is True); a
    different one raises RuntimeError (run :func:`down` first). ``auth`` (etcd only)
    enables authentication with a root user whose password is in the state.

    The data stays across :func:`down` and ``up``: a registry of this backend and size
    stopped by :func:`down` (or one that died) in ``directory`` is started again on its
    data, with its credentials, on the same ports if they are free (``data_kept`` is
    True). A different size, or ``auth`` asked for a registry made without it (or the
    reverse), starts an empty one (``data_kept`` False): the old members' data would
    not fit it.

    A server program that is not installed raises :class:`ServerNotFoundError` naming
    the line that installs it, before anything starts (unless the registry already
    runs).
    """
    directory = _resolve(directory)
    cls = cluster_class(backend)
    if auth and cls.backend != "etcd":
        raise ValueError(f"auth is only supported for the etcd backend, not {backend!r}")
    with _locked(directory):
        old = load_state(directory)
        if old is not None:
            cluster = _attach(old)
            if any(m.pid is not None for m in cluster.members):
                if old["backend"] == cls.backend and int(old["nodes"]) == nodes:
                    return {**old, "already_running": True}
                raise RuntimeError(
                    f"a {old['nodes']}-node {old['backend']} registry already runs in "
                    f"{directory} ({old['url']}); stop it first with `down`"
                )
            # it died: its data is resumed below like that of a stopped one
            _keep_stopped_state(directory, old)
            (directory / STATE_FILE).unlink(missing_ok=True)
        require(cls.backend)  # what to install, not a raw errno or a JVM's class error
        cluster, kept = _start(cls.backend, directory, nodes=nodes, auth=auth, timeout=timeout)
        state: dict[str, Any] = {
            "backend": cls.backend,
            "nodes": nodes,
            "url": cluster.url(namespace),
            "hosts": [f"{h}:{p}" for h, p in cluster.hosts],
            "pids": [m.pid for m in cluster.members],
            "logs": [str(m.log_path) for m in cluster.members],
            "credentials": list(cluster.credentials) if cluster.credentials else None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "start_seconds": round(cluster.start_seconds or 0.0, 3),
            "cluster": cluster.to_state(),
        }
        _write_state(directory, state)
        return {**state, "already_running": False, "data_kept": kept}


def _keep_stopped_state(directory: Path, state: dict[str, Any]) -> None:
    """Remember ``state`` in ``<dir>/<backend>/`` for the next :func:`up` (its ports,
    size and credentials: what restarting on the same data needs)."""
    backend_dir = directory / str(state["backend"])
    backend_dir.mkdir(parents=True, exist_ok=True)
    tmp = backend_dir / (STOPPED_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, backend_dir / STOPPED_FILE)


def _start(
    backend: str, directory: Path, *, nodes: int, auth: bool, timeout: float
) -> tuple[ServerCluster, bool]:
    """A started detached registry, and whether it runs on the data of the last one."""
    stopped_path = directory / backend / STOPPED_FILE
    try:
        stopped = json.loads(stopped_path.read_text())
    except (FileNotFoundError, ValueError):
        stopped = None
    fits = (
        isinstance(stopped, dict)
        and int(stopped.get("nodes") or 0) == nodes
        and bool(stopped.get("credentials")) == auth
        and isinstance(stopped.get("cluster"), dict)
    )
    if fits:
        assert isinstance(stopped, dict)
        cluster = ServerCluster.from_state(stopped["cluster"])
        cluster.start_timeout = timeout
        try:
            # the same ports and data: an ensemble's members (and etcd's stored peer
            # addresses) find each other again only there
            cluster.ensure_all_up(timeout)
            return cluster, True
        except ClusterError:
            cluster.stop()  # a port taken meanwhile, say; every member killed
        if nodes == 1 and not auth:
            # one member needs no peers: its data is good on any port (with auth, the
            # start would create the root user its data already has)
            cluster = local_cluster(
                backend, directory / backend, nodes=1, detached=True, timeout=timeout
            )
            cluster.keep_data = True
            cluster.start()
            return cluster, True
    cluster = local_cluster(
        backend, directory / backend, nodes=nodes, auth=auth, detached=True, timeout=timeout
    )
    cluster.start()  # fresh: any old member data is removed first
    stopped_path.unlink(missing_ok=True)
    return cluster, False


def down(directory: str | os.PathLike[str] | None = None) -> list[int]:
    """Stop every process the state file in ``directory`` (default
    :func:`default_dir`) lists; return their pids.

    Each process group is SIGKILLed and awaited, so nothing is left behind. The state
    file is removed; data and logs stay (``make clean`` removes them), and the next
    :func:`up` of the same backend and size starts the registry again on that data.
    Returns an empty list when nothing was running.
    """
    directory = _resolve(directory)
    with _locked(directory):
        state = load_state(directory)
        if state is None:
            return []
        cluster = _attach(state)
        pids = [m.pid for m in cluster.members if m.pid is not None]
        cluster.stop()
        _keep_stopped_state(directory, state)
        (directory / STATE_FILE).unlink(missing_ok=True)
        return pids


def status(directory: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """What runs in ``directory`` (default :func:`default_dir`): the state plus
    ``members`` (probed now) and ``healthy`` (every member serves); None when no state
    file exists."""
    state = load_state(_resolve(directory))
    if state is None:
        return None
    cluster = _attach(state)
    members = [s.as_dict() for s in cluster.status()]
    return {
        **state,
        "members": members,
        "healthy": bool(members) and all(s["serving"] for s in members),
    }
