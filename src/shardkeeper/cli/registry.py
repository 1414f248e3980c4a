"""``shardkeeper registry up|down|status|fix-acl``: a local registry, ZooKeeper ACLs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from shardkeeper.cli.common import Backend, Failed, JsonOpt, RegistryOpt, registry_app
from shardkeeper.cli.render import emit_json
from shardkeeper.errors import ConfigError

__all__ = ["registry_down", "registry_fix_acl", "registry_status", "registry_up", "sizing"]

T = TypeVar("T")

DirOpt = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        help=(
            "State and data directory of the local registry (default: per user, "
            "$SHARDKEEPER_LOCAL_REGISTRY_DIR, else $XDG_STATE_HOME/shardkeeper/registry, "
            "else ~/.local/state/shardkeeper/registry)."
        ),
        show_default=False,
    ),
]


def _directory(given: Path | None) -> Path:
    """``--dir``, else the per-user default (localregistry.default_dir)."""
    if given is not None:
        return given
    from shardkeeper.localregistry import default_dir

    return default_dir()


@registry_app.command("up")
def registry_up(
    backend: Annotated[
        Backend,
        typer.Option("--backend", help="Which store (etcd needs no Java: one binary)."),
    ] = Backend.etcd,
    nodes: Annotated[int, typer.Option("--nodes", help="1 or 3 members.")] = 1,
    directory: DirOpt = None,
    namespace: Annotated[
        str, typer.Option("--namespace", help="Namespace of the printed URL.")
    ] = "default",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for ready.")] = 60.0,
    auth: Annotated[
        bool,
        typer.Option("--auth", help="etcd only: enable auth (root user, password in state.json)."),
    ] = False,
) -> None:
    """Start a detached local registry and print its URL (only the URL, on stdout).

    It runs the etcd (or ZooKeeper and java) found on the PATH or through
    SHARDKEEPER_ETCD, SHARDKEEPER_ZOOKEEPER_HOME, SHARDKEEPER_ZOOKEEPER_JAR or
    JAVA_HOME; when none is installed it says what to install (exit 1). Run again, from
    any directory, it prints the URL of the registry already running."""
    from shardkeeper.localregistry import up

    if nodes not in (1, 3):
        raise ConfigError(f"--nodes {nodes}: give 1 or 3")
    if auth and backend is not Backend.etcd:
        raise ConfigError(f"--auth applies to --backend etcd only, not {backend.value}")
    directory = _directory(directory)
    state = _local(
        lambda: up(backend.value, nodes, directory, namespace=namespace, auth=auth, timeout=timeout)
    )
    verb = "already running" if state["already_running"] else "started"
    if state.get("data_kept"):
        verb += " again on its data"
    typer.echo(
        f"{state['nodes']}-node {state['backend']} {verb} "
        f"(pids {', '.join(map(str, state['pids']))}; data in {directory})",
        err=True,
    )
    typer.echo(sizing(state), err=True)
    typer.echo(state["url"])


def sizing(state: dict[str, Any]) -> str:
    """One line saying what the local registry of ``state`` is sized for (its heap
    or quota), so that its limits are never a silent surprise."""
    extra = (state.get("cluster") or {}).get("extra") or {}
    where = "see docs/registry-backends.md#sizing-the-store"
    if state.get("backend") == "zookeeper":
        heap = extra.get("heap_mb")
        return (
            f"sizing: JVM heap up to {heap} MB a member (ZooKeeper keeps its last 500-700 "
            f"commits in memory, up to 1 MB each); size a production ensemble: {where}"
        )
    quota = int(extra.get("quota_bytes") or 0) // 2**20
    return (
        f"sizing: --quota-backend-bytes {quota} MB, history compacted after 5 minutes; "
        f"past the quota etcd refuses every write: {where}"
    )


@registry_app.command("down")
def registry_down(directory: DirOpt = None) -> None:
    """Stop the local registry (every process it started)."""
    from shardkeeper.localregistry import down

    directory = _directory(directory)
    pids = _local(lambda: down(directory))
    typer.echo(f"stopped pids {', '.join(map(str, pids))}" if pids else "nothing was running")


@registry_app.command("status")
def registry_status(directory: DirOpt = None, as_json: JsonOpt = False) -> None:
    """Show the local registry and whether every member serves (exit 1 if not)."""
    from shardkeeper.localregistry import status as local_status
    from shardkeeper.registry.url import redact  # here: --help needs no pydantic

    directory = _directory(directory)
    info = _local(lambda: local_status(directory))
    keys = ("backend", "nodes", "url", "hosts", "pids", "logs", "started_at", "healthy")
    data: dict[str, Any] = {"running": info is not None, "dir": str(directory)}
    if info is not None:
        data.update({k: info.get(k) for k in keys})
        data["url"] = redact(str(info.get("url", "")))
        data["members"] = [
            {
                k: m.get(k)
                for k in ("index", "client_port", "pid", "running", "paused", "serving", "role")
            }
            for m in info["members"]
        ]
    else:
        data["healthy"] = False
    if as_json:
        emit_json(data)
    elif info is None:
        typer.echo(f"no registry runs in {directory}")
    else:
        health = "healthy" if data["healthy"] else "UNHEALTHY"
        typer.echo(f"{data['nodes']}-node {data['backend']} registry: {health}")
        typer.echo(f"url: {data['url']}")
        for m in data["members"]:
            word = (
                "paused"
                if m["paused"]
                else "serving"
                if m["serving"]
                else "running, not serving"
                if m["running"]
                else "down"
            )
            role = f" ({m['role']})" if m["role"] else ""
            typer.echo(
                f"  member {m['index']}: port {m['client_port']} pid {m['pid']} {word}{role}"
            )
    if not data["healthy"]:
        raise typer.Exit(1)


@registry_app.command("fix-acl")
def registry_fix_acl(registry: RegistryOpt = None) -> None:
    """ZooKeeper: give every node of the namespace the URL user's digest ACL."""
    from shardkeeper.registry.url import RegistrySettings
    from shardkeeper.registry.zookeeper import ZooKeeperStore

    settings = RegistrySettings.from_env(registry)
    if settings.backend != "zookeeper":
        raise ConfigError(
            "fix-acl applies to ZooKeeper only; etcd access is granted by roles "
            "(see docs/registry-backends.md)"
        )
    if not settings.username:
        raise ConfigError(
            f"fix-acl needs the credentials to protect namespace {settings.namespace!r} "
            "with: give user:password in the registry URL"
        )
    # acl_repair: start() repairs an open namespace instead of refusing it
    store = ZooKeeperStore(settings.model_copy(update={"acl_repair": True}))
    try:
        store.start()
        count = store.acl_repaired or store.repair_acl()
        from shardkeeper.cli.audit import record_done

        record_done(store, "fix-acl", {"nodes": count, "user": settings.username})
    finally:
        store.close()
    typer.echo(
        f"namespace {settings.namespace!r}: ACL of {count} node(s) set to "
        f"digest:{settings.username} (all rights)"
    )


def _local(fn: Callable[[], T]) -> T:
    """Run a local-registry call; its failures become one error line (exit 1), a
    missing server program the line and, below it, the lines that install it."""
    from shardkeeper.testing.servers.locate import ServerNotFoundError

    try:
        return fn()
    except ServerNotFoundError as exc:
        # kept on their lines: each install line is meant to be copied as it is
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    # RuntimeError covers the servers' ClusterError (a subclass)
    except (RuntimeError, ValueError, OSError) as exc:
        raise Failed(str(exc)) from None
