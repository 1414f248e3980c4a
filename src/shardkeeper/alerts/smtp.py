"""The email transport (smtplib) and its SMTP server settings.

The recipients are part of the job's config (``alert_email_to``); the server is part
of the deployment, so it comes from the environment of each instance:

=============================== ================================================
``SHARDKEEPER_SMTP_HOST``       server host (default ``localhost``)
``SHARDKEEPER_SMTP_PORT``       port (default 25; 587 for STARTTLS is common)
``SHARDKEEPER_SMTP_FROM``       sender address (default ``shardkeeper@<host>``)
``SHARDKEEPER_SMTP_STARTTLS``   ``1``/``true`` to upgrade with STARTTLS
``SHARDKEEPER_SMTP_USER``       login user (with ``..._PASSWORD``), if the server
``SHARDKEEPER_SMTP_PASSWORD``   needs one (a secret: or ``file:PATH``/``env:NAME``)
=============================== ================================================

The password may be a reference, ``file:/run/secrets/smtp`` (or ``env:NAME``, another
variable), read when an alert is sent: one that cannot be read drops the alert
(counted and logged by the sender, naming the setting and what is missing).
"""

from __future__ import annotations

import os
import re
import smtplib
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage

from shardkeeper.alerts.message import Alert
from shardkeeper.alerts.sender import SendError
from shardkeeper.errors import ConfigError, SecretReferenceError
from shardkeeper.secretref import check_reference, is_reference, resolve_secret

__all__ = ["ADDRESS", "PASSWORD_SETTING", "EmailTransport", "SmtpSettings", "email_message"]

PASSWORD_SETTING = "SHARDKEEPER_SMTP_PASSWORD"
"""The setting of the SMTP password (named by errors about its reference)."""

#: what an email address must look like here (one @, no spaces, a dot-free local part
#: is fine; the server has the final word)
ADDRESS = re.compile(r"^[^@\s<>,;]+@[^@\s<>,;]+\Z")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class SmtpSettings:
    """Where email alerts are sent from (module docstring)."""

    host: str = "localhost"
    port: int = 25
    sender: str = ""
    starttls: bool = False
    user: str = ""
    password: str = ""
    timeout: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ConfigError(f"SMTP port {self.port!r} is out of range; give 1..65535")
        if self.sender and not ADDRESS.match(self.sender):
            raise ConfigError(
                f"SMTP sender {self.sender!r} is not an email address; expected name@domain"
            )
        if bool(self.user) != bool(self.password):
            raise ConfigError("give both SHARDKEEPER_SMTP_USER and SHARDKEEPER_SMTP_PASSWORD")
        if is_reference(self.password):
            check_reference(PASSWORD_SETTING, self.password)  # read when an alert is sent

    @property
    def from_address(self) -> str:
        """The sender address (``shardkeeper@<host name>`` unless configured)."""
        return self.sender or f"shardkeeper@{socket.gethostname()}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SmtpSettings:
        """The settings in ``SHARDKEEPER_SMTP_*`` (ConfigError naming a bad value)."""
        env = os.environ if env is None else env
        port_text = env.get("SHARDKEEPER_SMTP_PORT", "25").strip()
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(
                f"SHARDKEEPER_SMTP_PORT={port_text!r} is not a port number; give 1..65535"
            ) from None
        tls_text = env.get("SHARDKEEPER_SMTP_STARTTLS", "").strip().lower()
        if tls_text not in _TRUE | _FALSE:
            raise ConfigError(
                f"SHARDKEEPER_SMTP_STARTTLS={tls_text!r} is not a yes/no value; give 1 or 0"
            )
        return cls(
            host=env.get("SHARDKEEPER_SMTP_HOST", "localhost").strip() or "localhost",
            port=port,
            sender=env.get("SHARDKEEPER_SMTP_FROM", "").strip(),
            starttls=tls_text in _TRUE,
            user=env.get("SHARDKEEPER_SMTP_USER", ""),
            password=env.get("SHARDKEEPER_SMTP_PASSWORD", ""),
        )

    def __repr__(self) -> str:
        # the password never appears in a log line or a traceback
        return (
            f"SmtpSettings(host={self.host!r}, port={self.port}, sender={self.from_address!r}, "
            f"starttls={self.starttls}, user={self.user!r})"
        )


def email_message(alert: Alert, sender: str, to: Sequence[str]) -> EmailMessage:
    """The email for ``alert``: subject = job, item, error type; body = Alert.text()."""
    msg = EmailMessage()
    msg["Subject"] = f"[shardkeeper] job {alert.job} item {alert.item} failed: {alert.error_type}"
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg.set_content(alert.text())
    return msg


class EmailTransport:
    """Sends alerts to ``to`` through the SMTP server of ``settings``."""

    def __init__(self, to: Sequence[str], settings: SmtpSettings) -> None:
        self.to = tuple(to)
        self.settings = settings

    def __call__(self, alert: Alert) -> None:
        """Send one alert; SendError (retry for connection trouble and 4xx replies)."""
        s = self.settings
        try:
            # read at each send: a rotated password file is picked up
            password = resolve_secret(PASSWORD_SETTING, s.password) if s.user else ""
        except SecretReferenceError as exc:
            raise SendError(str(exc), retry=False) from None
        try:
            with smtplib.SMTP(s.host, s.port, timeout=s.timeout) as smtp:
                if s.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if s.user:
                    smtp.login(s.user, password)
                smtp.send_message(email_message(alert, s.from_address, self.to))
        except smtplib.SMTPResponseException as exc:
            # 4xx: temporary (greylisting, busy); 5xx: refused for good
            raise SendError(
                f"SMTP {s.host}:{s.port}: {exc.smtp_code} {exc.smtp_error!r}",
                retry=400 <= exc.smtp_code < 500,
            ) from None
        except smtplib.SMTPRecipientsRefused as exc:
            raise SendError(
                f"SMTP {s.host}:{s.port}: recipients refused: {sorted(exc.recipients)}",
                retry=False,
            ) from None
        except (OSError, smtplib.SMTPException) as exc:
            raise SendError(
                f"SMTP {s.host}:{s.port}: {type(exc).__name__}: {exc}", retry=True
            ) from None
