"""Recipe: a WSGI application served by gunicorn, one shardkeeper instance per worker.

The runtime is *not* created at import: with ``gunicorn --preload`` this module is
imported once in the master process, which then forks the workers, and threads
(the runtime's, the ZooKeeper or etcd client's) do not survive a fork. Each worker
starts its own runtime in the ``post_worker_init`` hook and stops it in
``worker_exit`` (see ``gunicorn_conf.py``)::

    export SHARDKEEPER_REGISTRY=zk://127.0.0.1:2181/my-app
    gunicorn -c examples/recipes/gunicorn_conf.py --workers 2 examples.recipes.gunicorn_app:app
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from typing import Any

from examples.recipes.jobs import build_runtime
from shardkeeper import Runtime

__all__ = ["app", "current_runtime", "start_runtime", "stop_runtime"]

_lock = threading.Lock()
_runtime: Runtime | None = None


def start_runtime() -> Runtime:
    """Start this process's runtime (once; called in each worker after the fork)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = build_runtime("gunicorn").start()
        return _runtime


def stop_runtime() -> str | None:
    """Stop this process's runtime gracefully, if it was started; its instance id."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is None:
        return None
    runtime.stop()
    return runtime.instance_id


def current_runtime() -> Runtime | None:
    """This process's runtime, or None before ``start_runtime``."""
    return _runtime


StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    """``GET /``: this worker's instance id and whether its runtime runs."""
    runtime = current_runtime()
    body = {
        "instance": runtime.instance_id if runtime else None,
        "running": bool(runtime and runtime.running),
    }
    data = json.dumps(body).encode() + b"\n"
    start_response("200 OK", [("Content-Type", "application/json")])
    return [data]
