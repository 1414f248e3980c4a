"""The ``webhook`` and ``email`` error handlers: log, then queue an alert.

One sender thread per destination (a webhook URL, or a recipient list with its SMTP
server) serves every job that alerts there, and lives as long as the process: a job
whose config is reloaded gets the same sender back, not one more thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from shardkeeper._imports import needs_extra
from shardkeeper.alerts.message import Alert
from shardkeeper.alerts.sender import AlertSender
from shardkeeper.alerts.smtp import EmailTransport, SmtpSettings

__all__ = ["AlertHandler", "close_all", "email_handler", "webhook_handler"]

logger = logging.getLogger("shardkeeper.job")

_lock = threading.Lock()
_senders: dict[tuple[object, ...], AlertSender] = {}


class AlertHandler:
    """An error handler that logs the failure (as ``log`` does) and queues an alert
    on ``sender``; it returns at once whatever the destination does."""

    def __init__(self, sender: AlertSender) -> None:
        self.sender = sender

    def __call__(self, job_name: str, item: int, exc: BaseException) -> None:
        """Log the failure and queue its alert."""
        logger.error("job %r item %d failed: %r", job_name, item, exc, exc_info=exc)
        self.sender.submit(Alert.of(job_name, item, exc))

    def __repr__(self) -> str:
        return f"AlertHandler({self.sender.name})"


def _shared(key: tuple[object, ...], make: Callable[[], AlertSender]) -> AlertSender:
    with _lock:
        sender = _senders.get(key)
        if sender is None:
            sender = _senders[key] = make()
        return sender


def webhook_handler(url: str) -> AlertHandler:
    """The handler that POSTs an alert to ``url`` for each failed item (the ``http``
    extra: a ConfigError naming it when httpx is not installed)."""
    # imported here: httpx is the optional 'http' extra, which email alerts do not need
    with needs_extra("http", "the 'webhook' error handler"):
        from shardkeeper.alerts.webhook import WebhookTransport
    return AlertHandler(
        _shared(
            ("webhook", url), lambda: AlertSender(WebhookTransport(url), name="sk-alert-webhook")
        )
    )


def email_handler(to: Sequence[str], settings: SmtpSettings | None = None) -> AlertHandler:
    """The handler that mails an alert to ``to`` for each failed item, through the
    SMTP server of ``settings`` (default: the ``SHARDKEEPER_SMTP_*`` environment)."""
    smtp = settings or SmtpSettings.from_env()
    recipients = tuple(to)
    return AlertHandler(
        _shared(
            ("email", recipients, smtp),
            lambda: AlertSender(EmailTransport(recipients, smtp), name="sk-alert-email"),
        )
    )


def close_all(timeout: float = 5.0) -> None:
    """Send what every sender has queued (within ``timeout`` each) and stop them."""
    with _lock:
        senders = list(_senders.values())
        _senders.clear()
    for sender in senders:
        sender.close(timeout)
