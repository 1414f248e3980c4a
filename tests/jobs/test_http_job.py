"""HttpJob against a local HTTP server the test starts, on both stores."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.errors import JobConfigError
from shardkeeper.httpjob import HttpJob, HttpJobError
from shardkeeper.job import ShardingContext
from shardkeeper.observe import ExecutionRecord, Outcome, SkipRecord
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until

pytestmark = pytest.mark.timeout(60)


class Server:
    """Records requests; answers 500 for item 1 and hangs for path /slow."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size).decode() if size else ""
                with outer.lock:
                    outer.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "body": body,
                            "headers": dict(self.headers),
                        }
                    )
                if self.path.startswith("/slow"):
                    outer.release.wait(10)
                status = 500 if "item=1" in self.path else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"broken" if status == 500 else b"ok")

            do_GET = do_POST = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def http_server() -> Iterator[Server]:
    srv = Server()
    try:
        yield srv
    finally:
        srv.close()


class Outcomes:
    """An observer keeping the outcome and error of each item."""

    def __init__(self) -> None:
        self.records: list[ExecutionRecord] = []
        self.lock = threading.Lock()

    def on_execution(self, record: ExecutionRecord) -> None:
        with self.lock:
            self.records.append(record)

    def on_skip(self, record: SkipRecord) -> None:
        pass

    def by_item(self) -> dict[int, ExecutionRecord]:
        with self.lock:
            return {r.item: r for r in self.records}


def test_http_job_sends_one_request_per_item_and_fails_on_non_2xx(
    registry_url: str, http_server: Server
) -> None:
    class Notify(HttpJob):
        url = f"http://127.0.0.1:{http_server.port}/notify?item={{item}}&city={{item_parameter}}"
        body = '{{"job": "{job_name}", "item": {item}}}'

    seen = Outcomes()
    rt = Runtime(registry_url, shutdown_grace=2, observers=[seen])
    rt.add_job(
        Notify(),
        JobConfig(
            name="http",
            interval=0.5,
            sharding_total_count=2,
            sharding_item_parameters={0: "oslo", 1: "lima"},
            job_class="tests.jobs.test_http_job:Notify",
        ),
    )
    rt.start()
    try:
        wait_until(lambda: {0, 1} <= set(seen.by_item()), 20, message="items did not run")
    finally:
        rt.stop()
    outcomes = seen.by_item()
    assert outcomes[0].outcome is Outcome.OK
    assert outcomes[1].outcome is Outcome.FAILED
    assert outcomes[1].error_type == "HttpJobError"
    assert "HTTP 500" in outcomes[1].error_message and "broken" in outcomes[1].error_message
    with http_server.lock:
        first = next(r for r in http_server.requests if "item=0" in r["path"])
    assert first["method"] == "POST"
    assert first["path"] == "/notify?item=0&city=oslo"
    assert json.loads(first["body"]) == {"job": "http", "item": 0}
    assert first["headers"]["X-Shardkeeper-Execution-Id"].startswith("http@")
    assert int(first["headers"]["X-Shardkeeper-Fencing-Token"]) > 0


def _ctx(**props: str) -> ShardingContext:
    return ShardingContext(
        job_name="h",
        item=3,
        item_parameter="p",
        sharding_total_count=4,
        job_parameter="",
        fire_time=datetime(2026, 1, 1, tzinfo=UTC),
        instance_id="i",
        execution_id="h@1#3",
        props=dict(props),
    )


def test_props_configure_a_plain_http_job_and_timeouts_fail_the_item(
    http_server: Server,
) -> None:
    job = HttpJob()
    ctx = _ctx(
        **{
            "http.url": f"http://127.0.0.1:{http_server.port}/slow/{{item}}",
            "http.method": "get",
            "http.read.timeout": "0.3",
        }
    )
    method, url, body, _headers = job.request_of(ctx)
    assert (method, url, body) == ("GET", f"http://127.0.0.1:{http_server.port}/slow/3", None)
    with pytest.raises(HttpJobError, match="timed out"):
        job.run_item(ctx)


class Broken(HttpJob):
    url: ClassVar[str] = "http://127.0.0.1:1/{nope}"


@pytest.mark.parametrize(
    ("job", "props", "message"),
    [
        (HttpJob(), {}, "has no URL"),
        (Broken(), {}, "unknown field {nope}"),
        (HttpJob(), {"http.url": "http://x/", "http.method": "BREW"}, "'BREW' of job"),
        (HttpJob(), {"http.url": "http://x/", "http.read.timeout": "-1"}, "http.read.timeout"),
    ],
)
def test_bad_http_settings_are_named(job: HttpJob, props: dict[str, str], message: str) -> None:
    with pytest.raises(JobConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        job.run_item(_ctx(**props))
