"""Recipe: a FastAPI application that runs sharded jobs in its lifespan.

The lifespan starts one :class:`~shardkeeper.runtime.Runtime` when the application
starts and stops it (gracefully) when it shuts down. ``Runtime.start()`` and
``Runtime.stop()`` block (they talk to the registry; a stop waits for running
items), so they run in a worker thread, not on the event loop::

    export SHARDKEEPER_REGISTRY=zk://127.0.0.1:2181/my-app
    uvicorn examples.recipes.fastapi_app:app --port 8000
    curl -s localhost:8000/jobs

SIGTERM (or Ctrl-C) makes uvicorn stop serving, then run the lifespan's shutdown:
the runtime stops, running items get their grace, and the instance leaves the
registry. ``uvicorn --workers N`` runs the lifespan in each worker process: one
instance per process, which is what shardkeeper expects.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, Response

from examples.recipes.jobs import Heartbeat, build_runtime
from shardkeeper import Runtime

__all__ = ["app", "lifespan"]


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the runtime before the first request; stop it after the last."""
    runtime = build_runtime("fastapi")
    # start() connects and registers: off the event loop, so it never blocks requests
    await asyncio.to_thread(runtime.start)
    app.state.runtime = runtime
    try:
        yield
    finally:
        # a graceful stop waits up to the grace period for running items
        await asyncio.to_thread(runtime.stop)


app = FastAPI(title="shardkeeper recipe", lifespan=lifespan)


@app.get("/jobs")
def jobs(request: Request) -> dict[str, Any]:
    """This instance and the items of the recipe job it owns now."""
    runtime: Runtime = request.app.state.runtime
    name = Heartbeat.config.name if Heartbeat.config else ""
    runner = runtime.runners.get(name)
    assignment = runner.assignment() if runner is not None and runtime.running else None
    items = assignment.items_of(runtime.instance_id) if assignment is not None else []
    return {"instance": runtime.instance_id, "running": runtime.running, "items": list(items)}


@app.get("/healthz")
def healthz(request: Request, response: Response) -> dict[str, bool]:
    """200 while the runtime runs, 503 otherwise."""
    ok = bool(request.app.state.runtime.running)
    response.status_code = 200 if ok else 503
    return {"ok": ok}
