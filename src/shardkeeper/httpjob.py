"""HttpJob: one HTTP request per item (ElasticJob's HTTP job type).

Set the request on the class, or in the job's ``props`` (so that a job defined only
in YAML can use ``job_class: shardkeeper.httpjob:HttpJob``); props win:

================  =====================  ===========================================
class attribute   prop                   meaning
================  =====================  ===========================================
``url``           ``http.url``           the URL (a template, see below); required
``method``        ``http.method``        GET, POST, PUT, PATCH or DELETE (POST)
``body``          ``http.data``          the body template (None: the context as JSON)
``content_type``  ``http.content.type``  the body's Content-Type (application/json)
``connect_timeout`` ``http.connect.timeout``  seconds to connect (5)
``read_timeout``  ``http.read.timeout``  seconds to wait for the answer (30)
``headers``       (none)                 extra request headers
================  =====================  ===========================================

Templates use ``str.format`` fields: ``{item}``, ``{item_parameter}``,
``{sharding_total_count}``, ``{job_name}``, ``{job_parameter}``, ``{fire_time}``
(ISO 8601), ``{execution_id}``, ``{fencing_token}``, ``{instance_id}``. A status
outside 2xx, a timeout or a connection error fails the item (:class:`HttpJobError`,
with the status and the start of the answer); the job's error handler and failover
treat it like any failure. The request carries the execution id and the fencing
token as ``X-Shardkeeper-Execution-Id`` / ``X-Shardkeeper-Fencing-Token`` so the
server can deduplicate retries and reject a cut-off instance's late request. With
OpenTelemetry (docs/monitoring.md, Tracing), it carries the item span's trace context
too (``traceparent``), so the server's spans join the item's trace.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from shardkeeper import tracing
from shardkeeper._imports import needs_extra
from shardkeeper.errors import JobConfigError, ShardkeeperError
from shardkeeper.job import ShardedJob, ShardingContext

__all__ = ["HttpJob", "HttpJobError"]

log = logging.getLogger(__name__)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: how much of a failed answer the error keeps
ANSWER_LIMIT = 500


class HttpJobError(ShardkeeperError):
    """An item's HTTP request failed: a status outside 2xx, a timeout, no connection."""

    def __init__(self, method: str, url: str, status: int | None, detail: str) -> None:
        self.method, self.url, self.status = method, url, status
        what = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"{method} {url}: {what}: {detail}")


class HttpJob(ShardedJob):
    """Sends one HTTP request per item (module docstring)."""

    url: ClassVar[str] = ""
    method: ClassVar[str] = "POST"
    body: ClassVar[str | None] = None
    content_type: ClassVar[str] = "application/json"
    connect_timeout: ClassVar[float] = 5.0
    read_timeout: ClassVar[float] = 30.0
    headers: ClassVar[Mapping[str, str]] = {}

    def request_of(self, ctx: ShardingContext) -> tuple[str, str, bytes | None, dict[str, str]]:
        """(method, url, body, headers) of ``ctx``'s request. Raises JobConfigError
        naming the bad setting (no URL, unknown method, unknown template field)."""
        props = ctx.props
        url_template = props.get("http.url", self.url)
        if not url_template:
            raise JobConfigError(
                f"{type(self).__name__} of job {ctx.job_name!r} has no URL: set the class "
                "attribute url or the prop http.url"
            )
        method = props.get("http.method", self.method).upper()
        if method not in METHODS:
            raise JobConfigError(
                f"HTTP method {method!r} of job {ctx.job_name!r} is not one of {', '.join(METHODS)}"
            )
        fields = _fields(ctx)
        url = _render(url_template, fields, "url", ctx.job_name)
        body_template = props.get("http.data", self.body)
        if body_template is None:
            body = json.dumps(ctx.to_dict()).encode() if method != "GET" else None
            content_type = "application/json"
        else:
            body = _render(body_template, fields, "body", ctx.job_name).encode()
            content_type = props.get("http.content.type", self.content_type)
        headers = {
            **dict(self.headers),
            "X-Shardkeeper-Execution-Id": ctx.execution_id,
            "X-Shardkeeper-Fencing-Token": str(ctx.fencing_token),
        }
        if body is not None:
            headers["Content-Type"] = content_type
        return method, url, body, headers

    def run_item(self, ctx: ShardingContext) -> None:
        """Send the request; raise HttpJobError unless the answer is 2xx."""
        # imported here: httpx is the optional 'http' extra
        with needs_extra("http", "HttpJob"):
            import httpx

        method, url, body, headers = self.request_of(ctx)
        # the item's span (shardkeeper/tracing.py) is current here: the server's spans
        # join its trace (W3C traceparent; nothing without OpenTelemetry)
        tracing.inject(headers)
        props = ctx.props
        timeout = httpx.Timeout(
            _seconds(props.get("http.read.timeout"), self.read_timeout, "http.read.timeout"),
            connect=_seconds(
                props.get("http.connect.timeout"), self.connect_timeout, "http.connect.timeout"
            ),
        )
        try:
            answer = httpx.request(method, url, content=body, headers=headers, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise HttpJobError(method, url, None, f"timed out ({type(exc).__name__})") from None
        except httpx.HTTPError as exc:
            raise HttpJobError(method, url, None, f"{type(exc).__name__}: {exc}") from None
        if not 200 <= answer.status_code < 300:
            raise HttpJobError(method, url, answer.status_code, answer.text[:ANSWER_LIMIT])
        log.debug(
            "%s item %d: %s %s -> %d", ctx.job_name, ctx.item, method, url, answer.status_code
        )


def _fields(ctx: ShardingContext) -> dict[str, Any]:
    return {
        "item": ctx.item,
        "item_parameter": ctx.item_parameter,
        "sharding_total_count": ctx.sharding_total_count,
        "job_name": ctx.job_name,
        "job_parameter": ctx.job_parameter,
        "fire_time": ctx.fire_time.isoformat(),
        "execution_id": ctx.execution_id,
        "fencing_token": ctx.fencing_token,
        "instance_id": ctx.instance_id,
    }


def _render(template: str, fields: dict[str, Any], what: str, job: str) -> str:
    try:
        return template.format_map(fields)
    except KeyError as exc:
        raise JobConfigError(
            f"HTTP {what} template of job {job!r} uses unknown field {{{exc.args[0]}}}; "
            f"valid fields: {', '.join('{' + f + '}' for f in fields)}"
        ) from None
    except (ValueError, IndexError) as exc:
        raise JobConfigError(f"HTTP {what} template of job {job!r} is malformed: {exc}") from None


def _seconds(raw: str | None, default: float, name: str) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise JobConfigError(f"prop {name}={raw!r} must be a positive number of seconds")
    return value
