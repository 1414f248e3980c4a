"""``python -m shardkeeper.testing up|down|status``: a local registry for development.

    python -m shardkeeper.testing up --backend zookeeper --nodes 3 [--dir registry/data]
    python -m shardkeeper.testing status [--dir registry/data] [--json]
    python -m shardkeeper.testing down [--dir registry/data]

``up`` prints the registry URL on stdout (and only that, so
``export SHARDKEEPER_REGISTRY=$(registry/up)`` works); messages go to stderr.
Exit codes: 0 ok; 1 failure or (status) unhealthy; 3 (status) nothing running.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from shardkeeper.testing.local import DEFAULT_DIR, down, status, up
from shardkeeper.testing.servers import ClusterError


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m shardkeeper.testing", description="Run a local ZooKeeper or etcd."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start a detached registry and print its URL")
    p_up.add_argument("--backend", choices=["zookeeper", "etcd"], default="zookeeper")
    p_up.add_argument("--nodes", type=int, choices=[1, 3], default=1)
    p_up.add_argument("--namespace", default="default", help="namespace of the printed URL")
    p_up.add_argument("--auth", action="store_true", help="etcd: enable auth (root user)")
    p_up.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for ready")
    p_down = sub.add_parser("down", help="stop the registry (no process is left behind)")
    p_status = sub.add_parser("status", help="show what runs and whether it is healthy")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    for p in (p_up, p_down, p_status):
        p.add_argument("--dir", default=str(DEFAULT_DIR), help="state/data directory")
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            state = up(
                args.backend,
                args.nodes,
                args.dir,
                namespace=args.namespace,
                auth=args.auth,
                timeout=args.timeout,
            )
            verb = "already running" if state["already_running"] else "started"
            print(
                f"{state['nodes']}-node {state['backend']} {verb} "
                f"(pids {', '.join(map(str, state['pids']))}; logs under {args.dir})",
                file=sys.stderr,
            )
            print(state["url"])
            return 0
        if args.command == "down":
            pids = down(args.dir)
            print(
                f"stopped pids {', '.join(map(str, pids))}" if pids else "nothing was running",
                file=sys.stderr,
            )
            return 0
        info = status(args.dir)
        if args.json:
            print(json.dumps(info, indent=2))
        elif info is None:
            print(f"no registry runs in {args.dir}")
        else:
            health = "healthy" if info["healthy"] else "UNHEALTHY"
            print(f"{info['nodes']}-node {info['backend']} registry: {health}")
            print(f"url: {info['url']}")
            for m in info["members"]:
                state_word = (
                    "paused"
                    if m["paused"]
                    else "serving"
                    if m["serving"]
                    else "running, not serving"
                    if m["running"]
                    else "down"
                )
                print(
                    f"  member {m['index']}: port {m['client_port']} pid {m['pid'] or '-'} "
                    f"{state_word}{' (' + m['role'] + ')' if m['role'] else ''}"
                )
        if info is None:
            return 3
        return 0 if info["healthy"] else 1
    except (ClusterError, RuntimeError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
