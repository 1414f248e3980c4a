"""ZooKeeper security helpers of :class:`~shardkeeper.registry.zookeeper.ZooKeeperStore`.

Two concerns, both about credentials:

Credentials in logs
    kazoo logs every request it sends at DEBUG, the digest ``Auth`` request with the
    user's password in clear among them, and the session password at its BLATHER
    level. :class:`CredentialFilter`, installed on kazoo's loggers by
    :func:`install_credential_filter` (the store does it when it is built), rewrites
    such records before any handler sees them: the ``auth=`` value of an ``Auth``
    request, ``passwd``/``session_passwd`` values, the hash part of a digest ACL id
    and every password a store of this process registered are replaced by ``***``,
    and every http(s) URL (a stored job config's webhook URL is a secret) keeps only
    its scheme and host. It never drops a record.

ACLs of an existing namespace
    A store with credentials creates every node with the user's digest ACL, but a
    namespace first created without credentials keeps ``world:anyone`` ACLs on the
    nodes that already exist: any client could delete an instance's node or create
    ``/control/shutdown/<id>``. :func:`find_open_nodes` reads the ACL of the
    namespace node and of its direct children (one pipelined batch); the store
    refuses to start when one grants anything to ``world:anyone``, unless the
    registry URL says ``acl_repair=true``, in which case :func:`repair_acls` sets the
    digest ACL on every node of the namespace, top-down.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from kazoo import exceptions as kz

from shardkeeper.errors import StoreAuthError
from shardkeeper.secretref import mask_urls_in_text

__all__ = [
    "KAZOO_LOGGERS",
    "CredentialFilter",
    "describe_acl",
    "find_open_nodes",
    "install_credential_filter",
    "register_secret",
    "repair_acls",
]

#: the loggers kazoo writes to (a filter on a logger does not see its children's records)
KAZOO_LOGGERS = (
    "kazoo",
    "kazoo.client",
    "kazoo.protocol.connection",
    "kazoo.handlers.threading",
    "kazoo.retry",
)

#: how many requests of one level are in flight at once during a repair
_BATCH = 500

_QUOTED = r"""(?:b?'(?:[^'\\]|\\.)*'|b?"(?:[^"\\]|\\.)*")"""
#: ``Auth(auth_type=0, scheme='digest', auth='user:password')``
_AUTH = re.compile(r"(\bauth=)(" + _QUOTED + ")")
#: ``Connect(..., passwd=b'...')`` and "session_passwd: b'...'" (the session's secret)
_PASSWD = re.compile(r"(\b(?:session_)?passwd(?:=|:\s*))(" + _QUOTED + ")")
#: ``Id(scheme='digest', id='user:base64-hash')``: the hash can be attacked offline
_DIGEST_ID = re.compile(r"""(scheme=['"]digest['"],\s*id=['"])([^:'"]*):[^'"]*(['"])""")

_secrets: set[str] = set()
_secrets_lock = threading.Lock()
#: shorter passwords are not searched for literally (they would blank out common
#: words); the patterns above still catch them where kazoo logs them
_MIN_LITERAL = 4


def register_secret(secret: str | None) -> None:
    """Have :class:`CredentialFilter` also blank out ``secret`` wherever it appears."""
    if secret and len(secret) >= _MIN_LITERAL:
        with _secrets_lock:
            _secrets.add(secret)


def _keep_user(match: re.Match[str]) -> str:
    quoted = match.group(2)
    quote = quoted[-1]
    body = quoted.lstrip("b")[1:-1]
    user, colon, _ = body.partition(":")
    return f"{match.group(1)}{quote}{user + ':' if colon else ''}***{quote}"


def redact_text(text: str) -> str:
    """``text`` with the credentials described in the module docstring replaced."""
    text = _AUTH.sub(_keep_user, text)
    text = _PASSWD.sub(r"\1'***'", text)
    text = _DIGEST_ID.sub(r"\1\2:***\3", text)
    # request and reply data carry stored documents: a job config's webhook URL is a
    # secret (its host is not)
    text = mask_urls_in_text(text)
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, "***")
        escaped = repr(secret)[1:-1]  # as it appears inside a logged repr()
        if escaped != secret and escaped in text:
            text = text.replace(escaped, "***")
    return text


class CredentialFilter(logging.Filter):
    """Rewrites a record whose message carries credentials; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the message of ``record`` by its redacted form when that differs."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is the handler's business
            return True
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


_installed = CredentialFilter()


def install_credential_filter() -> None:
    """Put the (one, shared) :class:`CredentialFilter` on every kazoo logger; idempotent."""
    for name in KAZOO_LOGGERS:
        logger = logging.getLogger(name)
        if _installed not in logger.filters:
            logger.addFilter(_installed)


# -- ACLs ------------------------------------------------------------------------------


class AclRequests(Protocol):
    """The requests the ACL checks and repairs send (the store's transport): each
    returns kazoo's async result, to ``get(timeout=...)``."""

    def send_children(self, path: str) -> Any: ...

    def send_get_acls(self, path: str) -> Any: ...

    def send_set_acls(self, path: str, acl: list[Any]) -> Any: ...


def describe_acl(acls: list[Any]) -> str:
    """``world:anyone=ALL, digest:alice=READ|WRITE``: an ACL list as an operator reads
    it (digest hashes left out)."""
    parts = []
    for acl in acls:
        ident = acl.id.id
        if acl.id.scheme == "digest":
            ident = ident.split(":", 1)[0]
        parts.append(f"{acl.id.scheme}:{ident}={'|'.join(acl.acl_list)}")
    return ", ".join(parts) or "(empty)"


def is_open(acls: list[Any]) -> bool:
    """Whether an ACL list grants anything to any client (``world:anyone``)."""
    return any(acl.id.scheme == "world" and acl.perms for acl in acls)


def _child(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


def _gather(
    sent: list[tuple[str, Any]],
    deadline: float,
    skip: tuple[type[Exception], ...] = (kz.NoNodeError,),
) -> list[tuple[str, Any]]:
    """Wait for pipelined requests; a node deleted meanwhile (or failing with another
    error of ``skip``) is left out."""
    out = []
    for path, ar in sent:
        try:
            out.append((path, ar.get(timeout=max(deadline - time.monotonic(), 0.0))))
        except skip:
            continue
    return out


def find_open_nodes(
    client: AclRequests, root: str, timeout: float
) -> tuple[list[tuple[str, list[Any]]], int]:
    """The nodes among ``root`` and its direct children whose ACL is open to any
    client, with their ACLs, and how many nodes were checked.

    A node whose ACL we may not read (neither READ nor ADMIN for us, so not for
    ``world:anyone`` either: another user's) is left out; a repair names it."""
    deadline = time.monotonic() + timeout
    kids = client.send_children(root).get(timeout=timeout)
    paths = [root, *(_child(root, k) for k in sorted(kids))]
    sent = [(p, client.send_get_acls(p)) for p in paths]
    found = _gather(sent, deadline, (kz.NoNodeError, kz.NoAuthError))
    return [(p, acls) for p, (acls, _stat) in found if is_open(acls)], len(found)


def repair_acls(
    client: AclRequests,
    root: str,
    acl: list[Any],
    timeout: float,
    *,
    shown: Callable[[str], str] = lambda p: p,
) -> int:
    """Set ``acl`` on ``root`` and every node below it; return how many nodes.

    Top-down, one level at a time: a node's ACL is set before its children are listed,
    so a child created after that listing needed the new ACL's rights to be created
    (it is ours). ``timeout`` applies to each batch of requests. A node whose ACL we
    may not change (no ADMIN right: another user's) raises StoreAuthError naming it
    (``shown`` turns a path into the name to print)."""
    done = 0
    level = [root]
    while level:
        next_level: list[str] = []
        for i in range(0, len(level), _BATCH):
            batch = level[i : i + _BATCH]
            deadline = time.monotonic() + timeout
            sent = [(p, client.send_set_acls(p, acl)) for p in batch]
            try:
                changed = _gather(sent, deadline)
            except kz.NoAuthError:
                # the first failing node is found again below to name it
                changed = []
                for p in batch:
                    try:
                        client.send_set_acls(p, acl).get(timeout=timeout)
                    except kz.NoNodeError:
                        continue
                    except kz.NoAuthError:
                        raise StoreAuthError(
                            f"cannot repair the ACL of node {shown(p)}: its ACL does not "
                            "give the registry URL's user the ADMIN right (it belongs to "
                            "another user); fix it as that user or as a ZooKeeper superuser"
                        ) from None
                    changed.append((p, None))
            done += len(changed)
            deadline = time.monotonic() + timeout
            listed = _gather([(p, client.send_children(p)) for p, _ in changed], deadline)
            for p, kids in listed:
                next_level.extend(_child(p, k) for k in sorted(kids))
        level = next_level
    return done
