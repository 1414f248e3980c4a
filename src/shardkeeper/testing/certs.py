"""Certificates for TLS tests: a CA, a server certificate and a client certificate.

:func:`make_certificates` writes a fresh set of PEM files into a directory::

    certs = make_certificates(tmp / "tls")
    with EtcdCluster(base_dir=tmp / "etcd", tls=certs) as etcd:
        store = open_store(etcd.url("ns"))          # carries ca=, cert=, key=

The server certificate names ``127.0.0.1``, ``::1`` and ``localhost`` (the addresses
the test clusters bind), the client certificate too (ZooKeeper may check a client's
address against its certificate). Keys are EC P-256 in unencrypted PKCS#8, which Go
(etcd), Java (ZooKeeper's PEM key store), OpenSSL (kazoo) and gRPC all read. A second
call gives an unrelated CA: the "wrong CA" of the tests.

Needs the ``cryptography`` package (in the ``dev`` extra).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TLSFiles", "load_certificates", "make_certificates"]

DEFAULT_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class TLSFiles:
    """The PEM files of one test PKI (all absolute paths)."""

    #: the CA certificate (what clients and servers trust)
    ca: Path
    #: the CA's private key (to sign more certificates)
    ca_key: Path
    #: the server certificate and its key
    server_cert: Path
    server_key: Path
    #: the server key followed by its certificate: a ZooKeeper PEM key store
    server_bundle: Path
    #: the client certificate and its key
    client_cert: Path
    client_key: Path

    def url_options(self, *, client_cert: bool = True) -> dict[str, str]:
        """Registry URL options for a client of a server using these files."""
        options = {"ca": str(self.ca)}
        if client_cert:
            options.update(cert=str(self.client_cert), key=str(self.client_key))
        return options


def _files(out: Path) -> TLSFiles:
    return TLSFiles(
        ca=out / "ca.pem",
        ca_key=out / "ca.key",
        server_cert=out / "server.pem",
        server_key=out / "server.key",
        server_bundle=out / "server-bundle.pem",
        client_cert=out / "client.pem",
        client_key=out / "client.key",
    )


def load_certificates(directory: str | os.PathLike[str]) -> TLSFiles:
    """The files :func:`make_certificates` wrote into ``directory`` (checked to exist)."""
    files = _files(Path(directory).resolve())
    missing = [str(p) for p in vars(files).values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{directory}: no test certificates ({', '.join(missing)} missing); "
            "make them with make_certificates()"
        )
    return files


def make_certificates(
    directory: str | os.PathLike[str],
    *,
    names: Sequence[str] = DEFAULT_NAMES,
    days: int = 2,
    label: str = "shardkeeper test",
) -> TLSFiles:
    """Write a CA, a server and a client certificate (PEM) into ``directory``.

    ``names`` are the DNS names and IP addresses the server certificate holds.
    Certificates are valid from an hour ago (clock skew) for ``days`` days.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if days < 1:
        raise ValueError(f"days must be at least 1, not {days!r}")
    out = Path(directory).resolve()
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def cert_pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    def subject(cn: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, label),
                x509.NameAttribute(NameOID.COMMON_NAME, cn),
            ]
        )

    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = subject(f"{label} CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: list[x509.ObjectIdentifier]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject(cn))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        return cert_pem(cert), key_pem(key)

    # the server's certificate is also a client's: etcd's HTTP gateway dials its own
    # gRPC port with it, which --client-cert-auth refuses without the client usage
    server_cert, server_key = leaf(
        "server", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    client_cert, client_key = leaf("client", [ExtendedKeyUsageOID.CLIENT_AUTH])
    files = _files(out)
    contents = {
        files.ca: cert_pem(ca_cert),
        files.ca_key: key_pem(ca_key),
        files.server_cert: server_cert,
        files.server_key: server_key,
        files.server_bundle: server_key + server_cert,
        files.client_cert: client_cert,
        files.client_key: client_key,
    }
    for path, data in contents.items():
        # private keys readable by their owner only, as real deployments keep them
        mode = 0o600 if path.suffix == ".key" or path == files.server_bundle else 0o644
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(path, mode)
    return files
