"""TLS to the stores: checking the TLS options of a registry, and what each client needs.

The options (see ``docs/security.md``)::

    zk://host:2281/ns?tls=true&ca=/etc/sk/ca.pem&cert=/etc/sk/client.pem&key=/etc/sk/client.key
    etcd://host:2379/ns?ca=/etc/sk/ca.pem            # ca/cert/key imply tls=true

map to :class:`~shardkeeper.registry.url.RegistrySettings` fields ``tls``, ``tls_ca``,
``tls_cert``, ``tls_key`` and ``tls_verify``. Every file is PEM; the checks here run
when the settings are made (parsing a URL or building the settings), so a missing file
or a certificate without its key fails before any connection is tried.

The path of the private key is kept out of ``repr``, of :meth:`RegistrySettings.url`
without credentials, of :func:`~shardkeeper.registry.url.redact` and of the messages
of this module (only its file name is shown).

The backends take the client objects from here: :func:`grpc_credentials` (etcd, whose
gRPC channel always verifies the server's certificate and host name) and
:func:`kazoo_options` (ZooKeeper: kazoo's ``use_ssl``, ``ca``, ``certfile``,
``keyfile``, ``verify_certs`` and ``check_hostname``). When a store cannot connect
within its connection timeout, :func:`handshake_problem` tries one TLS handshake itself
so that the error says why (an unknown CA, a host name the certificate does not name,
a server that wants a client certificate, a server that does not speak TLS).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardkeeper.errors import ConfigError

if TYPE_CHECKING:
    import grpc

    from shardkeeper.registry.url import RegistrySettings

__all__ = [
    "check_tls_options",
    "grpc_credentials",
    "handshake_problem",
    "kazoo_options",
    "ssl_context",
    "unreachable_note",
]

#: the URL option of each settings field (for messages)
URL_OPTION = {"tls_ca": "ca", "tls_cert": "cert", "tls_key": "key", "tls_verify": "verify"}

#: the hint for a server that drops or ignores the handshake
_NOT_TLS = (
    "the server did not complete the handshake: is this its TLS port "
    "(ZooKeeper's secureClientPort, etcd's https client URL)?"
)

#: a PEM file larger than this is not a certificate or key file
_MAX_PEM_BYTES = 1 << 20

#: what each option's file must hold, as (PEM marker, description)
_WANTED = {
    "ca": (
        "-----BEGIN CERTIFICATE-----",
        "the PEM certificate(s) of the CA that signed the server",
    ),
    "cert": ("-----BEGIN CERTIFICATE-----", "the PEM client certificate"),
    "key": ("PRIVATE KEY-----", "the PEM private key of the client certificate"),
}


def _shown(option: str, path: str) -> str:
    # the key's path is not repeated in messages (they end up in logs): its file name is
    return f"{option}=.../{Path(path).name}" if option == "key" else f"{option}={path!r}"


def _check_file(option: str, path: str) -> str | None:
    marker, what = _WANTED[option]
    shown = _shown(option, path)
    if not path:
        return f"option {option} is empty; give the path of {what}"
    p = Path(path)
    if not p.is_absolute():
        return (
            f"option {shown} is a relative path; give the absolute path of {what} "
            "(a relative one would depend on the working directory)"
        )
    try:
        if not p.is_file():
            problem = "is not a file" if p.exists() else "names no existing file"
            return f"option {shown} {problem}; give the path of {what}"
        with p.open("rb") as fh:
            head = fh.read(_MAX_PEM_BYTES + 1)
    except OSError as exc:
        return f"option {shown} cannot be read ({exc.strerror}); give a readable file with {what}"
    text = head.decode("ascii", errors="replace")
    if len(head) > _MAX_PEM_BYTES or marker not in text:
        return f"option {shown} does not hold {what} (no {marker.strip('-')} block)"
    if option == "key" and ("ENCRYPTED" in text):
        return (
            f"option {shown} holds an encrypted private key, which the clients cannot use; "
            "give an unencrypted PEM key (e.g. openssl pkey -in KEY -out PLAIN_KEY) and "
            "protect it by file permissions"
        )
    return None


def check_tls_options(
    backend: str,
    *,
    tls: bool,
    ca: str | None,
    cert: str | None,
    key: str | None,
    verify: bool,
) -> str | None:
    """Why these TLS options cannot be used with ``backend``, or None when they can.

    Option names in the message are the URL's (``ca``, ``cert``, ``key``, ``verify``).
    """
    files = {"ca": ca, "cert": cert, "key": key}
    given = [name for name, value in files.items() if value is not None]
    if backend == "memory":
        if tls or given or not verify:
            return "a memory:// registry is in-process and takes no TLS options"
        return None
    if given and not tls:
        return f"option(s) {', '.join(given)} need TLS; leave out tls=false (they imply tls=true)"
    if not verify and not tls:
        return "option verify=false only applies with TLS; give tls=true or leave it out"
    if not verify and backend == "etcd":
        return (
            "option verify=false is not available for etcd: its gRPC client always "
            "verifies the server; give the CA that signed the server certificate with ca=PATH"
        )
    if (cert is None) != (key is None):
        have, missing = ("cert", "key") if cert is not None else ("key", "cert")
        return (
            f"option {have} was given without {missing}; a client certificate needs both "
            "cert=PATH (the PEM certificate) and key=PATH (its PEM private key), or neither"
        )
    for name, value in files.items():
        if value is not None:
            problem = _check_file(name, value)
            if problem is not None:
                return problem
    return None


def _read(option: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        # checked when the settings were made: the file went away or lost its rights since
        raise ConfigError(
            f"option {_shown(option, path)} cannot be read now ({exc.strerror}); "
            f"give a readable file with {_WANTED[option][1]}"
        ) from None


def grpc_credentials(settings: RegistrySettings) -> grpc.ChannelCredentials:
    """The channel credentials of an etcd store over TLS (the system's CAs without ca).

    Raises ConfigError naming the option when a file can no longer be read."""
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=_read("ca", settings.tls_ca),
        private_key=_read("key", settings.tls_key),
        certificate_chain=_read("cert", settings.tls_cert),
    )


def kazoo_options(settings: RegistrySettings) -> dict[str, Any]:
    """The ``KazooClient`` keyword arguments for TLS (none without TLS).

    The host name is checked whenever the certificate is verified, as gRPC does for etcd
    (kazoo itself checks only the certificate chain by default). Raises ConfigError
    naming the option when a file can no longer be read (kazoo would only log it from
    its connection thread, again at every attempt).
    """
    if not settings.tls:
        return {}
    for option, path in (
        ("ca", settings.tls_ca),
        ("cert", settings.tls_cert),
        ("key", settings.tls_key),
    ):
        _read(option, path)
    return {
        "use_ssl": True,
        "ca": settings.tls_ca,
        "certfile": settings.tls_cert,
        "keyfile": settings.tls_key,
        "verify_certs": settings.tls_verify,
        "check_hostname": settings.tls_verify,
    }


def ssl_context(settings: RegistrySettings) -> ssl.SSLContext:
    """An ``ssl`` client context with the settings' CA, client certificate and checks."""
    context = ssl.create_default_context(cafile=settings.tls_ca)
    if not settings.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if settings.tls_cert is not None and settings.tls_key is not None:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


def handshake_problem(settings: RegistrySettings, timeout: float = 1.0) -> str | None:
    """Try a TLS handshake with each host of ``settings``; the first failure, or None.

    Takes at most about ``timeout`` seconds in all (hosts left when it is spent are
    not tried). After the handshake, waits up to a quarter of ``timeout`` for an alert: under
    TLS 1.3 a server that wants a client certificate says so only after the client
    finished its side. ``None`` also when no host could be reached at all (that is
    not a TLS problem) or TLS is off.
    """
    if not settings.tls:
        return None
    try:
        context = ssl_context(settings)
    except ssl.SSLError as exc:
        return f"the TLS files cannot be loaded: {exc.reason or exc.strerror}"
    except OSError as exc:  # (its text could name the key's path: only the reason)
        return f"the TLS files cannot be loaded: {exc.strerror or type(exc).__name__}"
    deadline = time.monotonic() + timeout
    for host, port in settings.hosts:
        left = deadline - time.monotonic()
        if left <= 0.05:
            break
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            raw = socket.create_connection((host, port), timeout=left)
        except OSError:
            continue
        try:
            with context.wrap_socket(raw, server_hostname=host) as conn:
                conn.settimeout(max(min(timeout / 4, deadline - time.monotonic()), 0.01))
                with contextlib.suppress(TimeoutError):
                    conn.recv(1)
        except ssl.SSLCertVerificationError as exc:
            return (
                f"TLS handshake with {where} failed: {exc.verify_message} ({_hint(exc, settings)})"
            )
        except ssl.SSLError as exc:
            return (
                f"TLS handshake with {where} failed: {exc.reason or exc} ({_hint(exc, settings)})"
            )
        except OSError as exc:
            return f"TLS handshake with {where} failed: {exc.strerror or exc} ({_NOT_TLS})"
        finally:
            raw.close()
    return None


def unreachable_note(settings: RegistrySettings, timeout: float = 1.0) -> str:
    """``"; TLS handshake with ... failed: ..."`` to append to a "cannot reach" error
    when a TLS problem explains it, else ``""`` (also without TLS)."""
    problem = handshake_problem(settings, timeout)
    return f"; {problem}" if problem else ""


def _hint(exc: ssl.SSLError, settings: RegistrySettings) -> str:
    text = str(exc).lower()
    has_cert = settings.tls_cert is not None
    if isinstance(exc, ssl.SSLCertVerificationError):
        if "hostname" in text or "ip address mismatch" in text:
            return "the server certificate does not name this host; dial a name it holds"
        return "the server certificate is not signed by the CA given with ca=PATH"
    refused = ("certificate required", "handshake failure", "bad certificate", "unknown ca")
    if not has_cert and any(word in text for word in refused):
        return "the server requires a client certificate: give cert=PATH and key=PATH"
    if has_cert and any(word in text for word in (*refused, "certificate unknown")):
        return "the server refused the client certificate: is it signed by a CA the server trusts?"
    if any(w in text for w in ("wrong version number", "record layer failure", "eof")):
        return _NOT_TLS
    return "see the server log for its side"
