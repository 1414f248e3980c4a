"""A web service that runs a sharded job next to its HTTP endpoints.

The service embeds a :class:`~shardkeeper.runtime.Runtime` (``with runtime:``) and
serves, with the standard library's ``http.server``:

* ``GET /``: this instance, the cache regions it owns now and what it warmed;
* ``GET /healthz``: 200 while the runtime runs, 503 otherwise.

SIGTERM or Ctrl-C stops it gracefully: the web server stops, running items get
the grace period, then the instance leaves the job and the others take its items
at their next trigger. This is what the Docker image runs (see docker-compose.yml:
``docker-compose up --scale worker=5``)::

    export SHARDKEEPER_REGISTRY=$(shardkeeper registry up --namespace examples)
    PORT=8080 python examples/embedded_service.py
    curl -s localhost:8080/
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from shardkeeper import JobConfig, Runtime, ShardedJob, ShardingContext

__all__ = ["CacheWarmer", "build_server", "main", "serving", "status_of"]

log = logging.getLogger("examples.embedded_service")

REGIONS = [
    "eu-west",
    "eu-north",
    "us-east",
    "us-west",
    "sa-east",
    "ap-south",
    "ap-east",
    "ap-north",
    "af-south",
    "me-central",
]


class CacheWarmer(ShardedJob):
    """Warms the cache of one region per item (here: pretends to, for 0.2 s)."""

    config = JobConfig.parse(
        name="cache-warmer",
        cron="*/5 * * * * *",
        sharding_total_count=len(REGIONS),
        sharding_item_parameters=dict(enumerate(REGIONS)),
        failover=True,
        description="example: a job embedded in a web service",
        job_class="examples.embedded_service:CacheWarmer",  # same name however started
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: last warm-up time (ISO) per region, on this instance
        self.warmed: dict[str, str] = {}

    def execute(self, ctx: ShardingContext) -> None:
        """Warm one region's cache and remember when."""
        time.sleep(0.2)  # stands in for the real work
        with self._lock:
            self.warmed[ctx.item_parameter] = datetime.now(UTC).isoformat(timespec="seconds")
        log.info("warmed %s (item %d)", ctx.item_parameter, ctx.item)

    def snapshot(self) -> dict[str, str]:
        """A copy of the last warm-up time per region."""
        with self._lock:
            return dict(self.warmed)


def status_of(runtime: Runtime, job: CacheWarmer) -> dict[str, Any]:
    """What ``GET /`` shows: the instance, the regions it owns and what it warmed."""
    runner = runtime.runners.get(job.config.name if job.config else "")
    owned: list[str] = []
    if runner is not None and runtime.running:
        assignment = runner.assignment()  # one registry read
        if assignment is not None:
            owned = [REGIONS[i] for i in assignment.items_of(runtime.instance_id)]
    warmed = job.snapshot()
    return {
        "instance": runtime.instance_id,
        "running": runtime.running,
        "owned_regions": owned,
        "warmed": warmed,
        "stats": dict(runner.stats) if runner is not None else {},
    }


def build_server(runtime: Runtime, job: CacheWarmer, host: str, port: int) -> ThreadingHTTPServer:
    """The HTTP server of the service (port 0: any free port; see ``server_port``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                ok = runtime.running
                self._reply(200 if ok else 503, {"ok": ok})
            elif self.path == "/":
                self._reply(200, status_of(runtime, job))
            else:
                self._reply(404, {"error": f"no such page: {self.path}"})

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, indent=2).encode() + b"\n"
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), format % args)

    return ThreadingHTTPServer((host, port), Handler)


@contextlib.contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """Serve on a background thread; on exit stop serving and close the socket."""
    thread = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()  # returns once serve_forever has left its loop
        server.server_close()
        thread.join(timeout=5)


def main() -> None:
    """Run the service until SIGTERM/SIGINT or a remote ``shardkeeper shutdown``."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = os.environ.get("SHARDKEEPER_REGISTRY", "").strip()
    if not url:
        sys.exit(
            "set SHARDKEEPER_REGISTRY to a registry URL, e.g. the one "
            "`shardkeeper registry up --namespace examples` prints"
        )
    host = os.environ.get("HOST", "0.0.0.0")
    port = int(os.environ.get("PORT", "8080"))

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # only set a flag: the main loop below does the stopping, outside the handler
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    job = CacheWarmer()
    runtime = Runtime(url, shutdown_grace=10.0, labels={"app": "embedded-service"})
    runtime.add_job(job)
    # Leaving the with-blocks stops the web server first, then the runtime (graceful).
    with runtime, serving(build_server(runtime, job, host, port)) as server:
        log.info("instance %s serving on %s:%d", runtime.instance_id, host, server.server_port)
        # wake up now and then: a remote shutdown stops the runtime without a signal
        while not stop.wait(1.0) and runtime.running:
            pass
    log.info("stopped")


if __name__ == "__main__":
    main()
