"""Alerts for failed items: the ``webhook`` and ``email`` error handlers.

Select one per job with ``error_handler: webhook`` (and ``alert_webhook_url``) or
``error_handler: email`` (and ``alert_email_to``; the SMTP server comes from the
``SHARDKEEPER_SMTP_*`` environment, :mod:`shardkeeper.alerts.smtp`). Either handler
logs the failure as the ``log`` handler does, then queues one alert for a background
sender (:mod:`shardkeeper.alerts.sender`): the worker that ran the item never waits
for the network. A full queue drops the alert (counted and logged), a failed send is
retried with backoff a bounded number of times, then dropped.
"""

from __future__ import annotations

from shardkeeper.alerts.handlers import AlertHandler, email_handler, webhook_handler
from shardkeeper.alerts.message import Alert
from shardkeeper.alerts.sender import AlertSender, SendError
from shardkeeper.alerts.smtp import SmtpSettings

__all__ = [
    "Alert",
    "AlertHandler",
    "AlertSender",
    "SendError",
    "SmtpSettings",
    "email_handler",
    "webhook_handler",
]
