"""What happens when a sharding item's execution raises.

The runtime calls the job's error handler with the job name, the item and the
exception, on the worker thread that ran the item, after the item has ended. Whatever
the handler does, the item counts as failed and the job keeps running: a handler
decides only where the failure is reported.

Built-in handlers, selected by name in ``JobConfig.error_handler``:

``log`` (the default)
    logs the failure with its traceback at ERROR on the ``shardkeeper.job`` logger.
``ignore``
    does nothing (ElasticJob's "ignore"); use it when the job reports its own errors.
``raise``
    re-raises the exception (ElasticJob's "throw"), so that it reaches whatever the
    runtime wraps around an execution (its own logging and failure counters).
``webhook``
    logs as ``log`` does and POSTs an alert (JSON, Slack-compatible) to the job's
    ``alert_webhook_url`` from a background sender (:mod:`shardkeeper.alerts`); a
    secret, it may be an ``env:NAME``/``file:PATH`` reference, read at each send.
``email``
    logs as ``log`` does and mails an alert to the job's ``alert_email_to`` through
    the SMTP server of the ``SHARDKEEPER_SMTP_*`` environment, from a background sender.

Anything else is an import path to a callable following :class:`ErrorHandler`, for
example one that sends the failure to an alerting system.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from shardkeeper._imports import import_object, is_import_path
from shardkeeper.errors import JobConfigError

if TYPE_CHECKING:
    from shardkeeper.config import JobConfig

__all__ = [
    "BUILTIN_ERROR_HANDLERS",
    "ErrorHandler",
    "ignore_error",
    "log_error",
    "raise_error",
    "resolve_error_handler",
]

logger = logging.getLogger("shardkeeper.job")


class ErrorHandler(Protocol):
    """Called once per failed item execution with the exception that ended it."""

    def __call__(self, job_name: str, item: int, exc: BaseException) -> None: ...


def log_error(job_name: str, item: int, exc: BaseException) -> None:
    """Log the failure with its traceback at ERROR on the ``shardkeeper.job`` logger."""
    logger.error("job %r item %d failed: %r", job_name, item, exc, exc_info=exc)


def ignore_error(job_name: str, item: int, exc: BaseException) -> None:
    """Do nothing: the failure is still counted by the runtime, only not reported here."""


def raise_error(job_name: str, item: int, exc: BaseException) -> None:
    """Re-raise ``exc`` (with its original traceback) to the runtime."""
    raise exc


BUILTIN_ERROR_HANDLERS: Mapping[str, ErrorHandler] = {
    "log": log_error,
    "ignore": ignore_error,
    "raise": raise_error,
}
"""The error handlers selectable by name in ``JobConfig.error_handler`` that need no
settings (``webhook`` and ``email`` are built from the job's config)."""

ALERT_HANDLERS = ("webhook", "email")
"""The built-in handlers that send alerts (they need the job's config)."""


def resolve_error_handler(name: str, config: JobConfig | None = None) -> ErrorHandler:
    """The handler named ``name``: ``log``, ``ignore``, ``raise``, ``webhook``,
    ``email`` or an import path. ``webhook`` and ``email`` take their destination
    from ``config`` (the job's config).

    Raises :class:`~shardkeeper.errors.JobConfigError` naming the value and the valid
    choices when it is neither, cannot be imported, or is not callable, and when an
    alert handler has no destination.
    """
    builtin = BUILTIN_ERROR_HANDLERS.get(name)
    if builtin is not None:
        return builtin
    if name in ALERT_HANDLERS:
        return _alert_handler(name, config)
    if not is_import_path(name):
        raise JobConfigError(
            f"unknown error handler {name!r}; valid choices are "
            f"{', '.join((*BUILTIN_ERROR_HANDLERS, *ALERT_HANDLERS))}, or an import path "
            "'package.module:function'"
        )
    obj = import_object(name, "error handler")
    if not callable(obj):
        raise JobConfigError(
            f"error handler {name!r} resolves to a {type(obj).__name__}, which is not "
            "callable; give a function (job_name, item, exc) -> None"
        )
    handler: ErrorHandler = obj  # type: ignore[assignment]
    return handler


def _alert_handler(name: str, config: JobConfig | None) -> ErrorHandler:
    # imported here: httpx and smtplib are loaded only by jobs that alert
    from shardkeeper.alerts import email_handler, webhook_handler

    if name == "webhook":
        if config is None or not config.alert_webhook_url:
            raise JobConfigError(
                "error handler 'webhook' needs the job's alert_webhook_url (the URL alerts "
                "are POSTed to)"
            )
        return webhook_handler(config.alert_webhook_url)
    if config is None or not config.alert_email_to:
        raise JobConfigError(
            "error handler 'email' needs the job's alert_email_to (who receives the alerts)"
        )
    return email_handler(config.alert_email_to)
