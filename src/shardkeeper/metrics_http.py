"""The runtime's small HTTP server: ``/metrics``, ``/healthz`` and ``/readyz``.

One port serves Prometheus and the Kubernetes probes:

``/metrics``
    the runtime's registry in the Prometheus text format (:mod:`shardkeeper.metrics`).
``/healthz``
    liveness: 200 while the process serves requests at all.
``/readyz``
    readiness: 200 when the runtime runs, every job is registered and the store
    session is fresh; 503 otherwise, with the reasons in the body (one per line).

The server is a standard-library WSGI server on its own daemon threads (one per
request), bound to 127.0.0.1 unless told otherwise; it never touches the store, so a
probe costs nothing on the coordination side.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from shardkeeper.errors import ConfigError
from shardkeeper.registry.base import ConnectionState

if TYPE_CHECKING:
    from shardkeeper.runtime.runtime import Runtime

__all__ = ["MetricsServer", "readiness"]

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def readiness(runtime: Runtime) -> list[str]:
    """Why ``runtime`` is not ready (empty when it is): not running or stopping, the
    store connection down or the session not fresh, a job not registered, its clock
    past a job's ``max_time_diff_seconds``."""
    if not runtime.running:
        return ["runtime not running"]
    if runtime.stopping:
        return ["runtime stopping"]
    why: list[str] = []
    if runtime.store.state not in (ConnectionState.CONNECTED, ConnectionState.RECONNECTED):
        why.append(f"store connection {runtime.store.state.value}")
    if not runtime.liveness.fresh():
        why.append(f"store session not fresh (no answer for {runtime.liveness.age():.1f}s)")
    for name, runner in sorted(runtime.runners.items()):
        if not runner.state.registered:
            why.append(f"job {name} not registered")
    if runtime.clock is not None:
        why.extend(runtime.clock.problems())  # ClockSkewError texts: no items run
    return why


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` for one runtime (module
    docstring). ``port`` 0 picks a free port (see :attr:`port` after :meth:`start`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], list[str]],
        *,
        port: int,
        host: str = "127.0.0.1",
    ) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics port {port!r} is out of range; give 0..65535 (0 = any)")
        self._registry = registry
        self._ready = ready
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port served (the one chosen when 0 was asked for)."""
        return self._server.server_port if self._server is not None else self._port

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. ``http://127.0.0.1:9464``."""
        return f"http://{self._host}:{self.port}"

    def start(self) -> None:
        """Bind and serve on a daemon thread; ConfigError naming the address when the
        port cannot be bound."""
        if self._server is not None:
            return
        try:
            server = make_server(
                self._host, self._port, self._app, server_class=_Server, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from None
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="sk-metrics"
        )
        self._thread.daemon = True
        self._thread.start()
        log.info("serving /metrics, /healthz and /readyz on %s", self.url)

    def stop(self) -> None:
        """Stop serving and release the port (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body = generate_latest(self._registry)
            start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok\n")
        if path == "/readyz":
            why = self._ready()
            if why:
                return _text(start_response, "503 Service Unavailable", "\n".join(why) + "\n")
            return _text(start_response, "200 OK", "ready\n")
        return _text(
            start_response, "404 Not Found", "not found; try /metrics, /healthz or /readyz\n"
        )


def _text(start_response: StartResponse, status: str, text: str) -> list[bytes]:
    body = text.encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]
