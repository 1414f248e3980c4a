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
"""

from __future__ import annotations

from typing import Any

import httpx

from shardkeeper.alerts.message import Alert
from shardkeeper.alerts.sender import SendError

__all__ = ["DEFAULT_TIMEOUT", "WebhookTransport", "webhook_body"]

#: seconds for each of connect, write, read (a hanging endpoint costs the sender
#: thread this much per attempt, never a worker)
DEFAULT_TIMEOUT = 5.0


def webhook_body(alert: Alert) -> dict[str, Any]:
    """The JSON body of ``alert`` (module docstring)."""
    return {"text": alert.summary, "shardkeeper": alert.fields()}


class WebhookTransport:
    """POSTs alerts to ``url``; raises SendError (with ``retry``) when it fails."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.url = url
        self._client = httpx.Client(timeout=timeout, follow_redirects=False)

    def __call__(self, alert: Alert) -> None:
        """Send one alert."""
        try:
            reply = self._client.post(self.url, json=webhook_body(alert))
        except httpx.HTTPError as exc:
            raise SendError(f"POST {self.url}: {type(exc).__name__}: {exc}", retry=True) from None
        if reply.is_success:
            return
        retry = reply.status_code == 429 or reply.status_code >= 500
        raise SendError(f"POST {self.url}: HTTP {reply.status_code}", retry=retry)
