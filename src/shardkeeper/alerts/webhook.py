"""The webhook transport: one JSON POST per alert with httpx.

The body is Slack-compatible (a ``text`` line that Slack, Mattermost, Rocket.Chat and
Teams' Slack-style connectors show as is) and carries the structured fields under
``shardkeeper`` for any other receiver::

    {"text": "shardkeeper: job 'order-sync' item 1 failed on host-a (pid 7): ...",
     "shardkeeper": {"job": "order-sync", "item": 1, "host": "host-a", "pid": 7,
                     "time": "...", "error_type": "KeyError", "error": "...",
                     "traceback": "..."}}

A 2xx reply is a delivery; a timeout, a connection error, a 429 or a 5xx is retried
by the sender; any other status is not (the request itself is refused).

The URL is a secret (a Slack-style URL's path is its token): the transport reads an
``env:``/``file:`` reference when it sends, and no message or log line of it (nor
httpx's request log) shows more of the URL than its scheme and host.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlsplit

import httpx

from shardkeeper.alerts.message import Alert
from shardkeeper.alerts.sender import SendError
from shardkeeper.errors import SecretReferenceError
from shardkeeper.secretref import mask_webhook_url, resolve_secret

__all__ = ["DEFAULT_TIMEOUT", "SETTING", "WebhookTransport", "webhook_body"]

#: seconds for each of connect, write, read (a hanging endpoint costs the sender
#: thread this much per attempt, never a worker)
DEFAULT_TIMEOUT = 5.0

SETTING = "alert_webhook_url"
"""The job config field the URL comes from (named by errors about it)."""


def webhook_body(alert: Alert) -> dict[str, Any]:
    """The JSON body of ``alert`` (module docstring)."""
    return {"text": alert.summary, "shardkeeper": alert.fields()}


class _HideWebhookUrls(logging.Filter):
    """Blanks the webhook URLs this process sent to out of httpx's records (it logs
    every request's URL at INFO): the URL is a secret, its host is not."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._urls: dict[str, str] = {}

    def add(self, url: str) -> None:
        masked = mask_webhook_url(url)
        with self._lock:
            # httpx logs the URL as it normalised it, which may differ in spelling
            for spelling in {url, str(httpx.URL(url))}:
                if spelling != masked:
                    self._urls[spelling] = masked

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            urls = sorted(self._urls.items(), key=lambda kv: -len(kv[0]))
        if not urls:
            return True
        text = record.getMessage()
        hidden = text
        for url, masked in urls:
            hidden = hidden.replace(url, masked)
        if hidden != text:
            record.msg, record.args = hidden, None
        return True


_hide = _HideWebhookUrls()
logging.getLogger("httpx").addFilter(_hide)


class WebhookTransport:
    """POSTs alerts to ``url``; raises SendError (with ``retry``) when it fails.

    ``url`` is the job's ``alert_webhook_url`` as configured: a literal URL, or an
    ``env:NAME`` / ``file:PATH`` reference read again at each send (a rotated secret
    is picked up). One that cannot be read, or that reads as no http(s) URL, is a
    SendError that is not retried: the alert is dropped, counted and logged by the
    sender, the instance goes on. Error messages show the URL masked.
    """

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url
        self._client = httpx.Client(timeout=timeout, follow_redirects=False)

    def _target(self) -> str:
        try:
            url = resolve_secret(SETTING, self.url).strip()
        except SecretReferenceError as exc:
            raise SendError(str(exc), retry=False) from None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SendError(
                f"{SETTING} {self.url!r} reads as {mask_webhook_url(url)!r}, which is not an "
                "http(s) URL",
                retry=False,
            )
        _hide.add(url)
        return url

    def __call__(self, alert: Alert) -> None:
        """Send one alert."""
        url = self._target()
        shown = mask_webhook_url(url)
        try:
            reply = self._client.post(url, json=webhook_body(alert))
        except httpx.HTTPError as exc:
            # an exception's text may quote the URL it was about
            detail = str(exc).replace(url, shown)
            raise SendError(f"POST {shown}: {type(exc).__name__}: {detail}", retry=True) from None
        if reply.is_success:
            return
        retry = reply.status_code == 429 or reply.status_code >= 500
        raise SendError(f"POST {shown}: HTTP {reply.status_code}", retry=retry)
