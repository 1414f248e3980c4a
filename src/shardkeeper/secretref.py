"""Secret-valued settings: where a secret is (a reference), how it is read, and how a
value is shown without its secret.

A secret-valued setting (a webhook URL, the SMTP password, a history or registry URL
with a password) takes either the secret itself (a *literal*) or a *reference* to it:

``env:NAME``
    the value of the environment variable ``NAME`` of the process that uses it;
``file:PATH``
    the content of the file at the absolute ``PATH`` (one trailing line break is
    dropped), read each time the setting is used, so a rotated file is picked up.

A reference is what gets stored (in the registry, a job file, a runtime file) and
shown: it names where the secret is, not the secret. It is resolved by
:func:`resolve_secret` where and when the setting is used, on the instance; one that
cannot be resolved raises :class:`~shardkeeper.errors.SecretReferenceError` naming
the setting, the reference and what is missing. A literal that begins with ``env:``
or ``file:`` cannot be given as such: put it in a file and give ``file:PATH``.

A literal is never shown: :func:`mask_webhook_url` keeps a URL's scheme and host and
hides its user-info, path, query and fragment (a Slack-style URL's token is its
path); :func:`mask_url_password` hides only a URL's password (user-info or a
``password``-like query option); :func:`mask_urls_in_text` does the former to every
http(s) URL in free text. Masks hold :data:`MASK`, which :func:`is_masked` finds.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from shardkeeper.errors import SecretReferenceError

__all__ = [
    "ENV_PREFIX",
    "FILE_PREFIX",
    "MASK",
    "check_reference",
    "is_masked",
    "is_reference",
    "mask_url_password",
    "mask_urls_in_text",
    "mask_webhook_url",
    "resolve_secret",
]

ENV_PREFIX = "env:"
"""A reference to an environment variable: ``env:NAME``."""

FILE_PREFIX = "file:"
"""A reference to a file: ``file:/absolute/path``."""

MASK = "***"
"""What stands in a shown value for the secret part of it."""

#: POSIX's portable environment variable names (what a shell can export)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
#: a secret file is a password or a URL: anything larger is the wrong file
_MAX_FILE_BYTES = 64 * 1024
_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*:)[^@/?#]*@")
_QUERY_SECRET = re.compile(
    r"([?&](?:password|passwd|pwd|secret|token|key|api_key|apikey|sig|signature)=)[^&#]*",
    re.IGNORECASE,
)
_HTTP_URL = re.compile(r"https?://[^\s'\"<>]+", re.IGNORECASE)


def is_reference(value: object) -> bool:
    """Whether ``value`` is an ``env:`` or ``file:`` reference (well formed or not)."""
    return isinstance(value, str) and value.startswith((ENV_PREFIX, FILE_PREFIX))


def check_reference(setting: str, value: str) -> str:
    """``value`` when it is a well-formed reference (what it points to is not read:
    that happens where the setting is used); SecretReferenceError otherwise."""
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        if not _ENV_NAME.match(name):
            raise SecretReferenceError(
                setting,
                value,
                f"{name!r} is not an environment variable name (letters, digits and '_', "
                "not starting with a digit), e.g. 'env:ALERT_WEBHOOK_URL'",
            )
        return value
    if value.startswith(FILE_PREFIX):
        path = value[len(FILE_PREFIX) :]
        # relative to what? the working directory of every instance differs
        if not path or not Path(path).is_absolute():
            raise SecretReferenceError(
                setting,
                value,
                f"{path!r} is not an absolute path, e.g. 'file:/run/secrets/alert-webhook'",
            )
        return value
    raise SecretReferenceError(setting, value, "it is neither env:NAME nor file:PATH")


def resolve_secret(setting: str, value: str, env: Mapping[str, str] | None = None) -> str:
    """The secret ``value`` stands for: a literal as it is, a reference read now from
    ``env`` (default: this process's environment) or its file.

    SecretReferenceError names ``setting``, the reference and what is missing: an
    unset or empty variable, a file that is absent, unreadable, too large or empty.
    """
    if not is_reference(value):
        return value
    check_reference(setting, value)
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX) :]
        found = (os.environ if env is None else env).get(name)
        if found is None:
            raise SecretReferenceError(
                setting, value, f"the environment variable {name} is not set on this instance"
            )
        if not found.strip():
            raise SecretReferenceError(
                setting, value, f"the environment variable {name} is empty on this instance"
            )
        return found
    return _read_file(setting, value, Path(value[len(FILE_PREFIX) :]))


def _read_file(setting: str, value: str, path: Path) -> str:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SecretReferenceError(
            setting, value, f"the file {path} does not exist on this instance"
        ) from None
    except OSError as exc:
        raise SecretReferenceError(
            setting, value, f"the file {path} cannot be read ({exc.strerror or exc})"
        ) from None
    if len(data) > _MAX_FILE_BYTES:
        raise SecretReferenceError(
            setting, value, f"the file {path} is larger than {_MAX_FILE_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretReferenceError(setting, value, f"the file {path} is not UTF-8 text") from None
    # editors and `echo` end a file with a line break that is no part of the secret
    text = text.removesuffix("\n").removesuffix("\r")
    if not text.strip():
        raise SecretReferenceError(setting, value, f"the file {path} is empty")
    return text


def is_masked(value: object) -> bool:
    """Whether ``value`` is (or holds) a mask, i.e. was read from a view, not typed."""
    return isinstance(value, str) and MASK in value


def mask_webhook_url(url: str) -> str:
    """``url`` with only its scheme, host and port left (``https://hooks.example.com/***``):
    a webhook's token may be anywhere in its path or query. A reference is shown as
    is; text that is no URL is hidden whole."""
    if is_reference(url):
        return url
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return MASK
    if not parts.scheme or not host:
        return MASK
    where = f"[{host}]" if ":" in host else host
    if port is not None:
        where += f":{port}"
    auth = f"{MASK}@" if "@" in parts.netloc else ""
    hidden = parts.path.strip("/") or parts.query or parts.fragment
    return f"{parts.scheme}://{auth}{where}" + (f"/{MASK}" if hidden else "")


def mask_url_password(url: str) -> str:
    """``url`` with its password hidden (user-info ``user:***@`` and ``password``-like
    query options), everything else as it is. A reference is shown as is."""
    if is_reference(url):
        return url
    url = _USERINFO_PASSWORD.sub(rf"\1{MASK}@", url)
    return _QUERY_SECRET.sub(rf"\1{MASK}", url)


def mask_urls_in_text(text: str) -> str:
    """``text`` with every http(s) URL in it masked as :func:`mask_webhook_url` does
    (for free text that may quote a secret URL: an error message, a corrupt document)."""
    return _HTTP_URL.sub(lambda m: mask_webhook_url(m.group(0)), text)
