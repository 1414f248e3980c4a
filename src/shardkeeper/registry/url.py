"""Registry URLs and settings: which store, where, which namespace, which timeouts.

Format::

    zk://host:port[,host:port...]/namespace[?option=value&...]
    etcd://host:port[,host:port...]/namespace[?option=value&...]
    memory://name/namespace[?option=value&...]

``memory://name/...`` is the in-process reference store (``registry/memory/``) on the
process-wide server called ``name``: for tests and experiments, never for several
processes. It takes no credentials; only ``session_timeout`` means anything to it.

Credentials go in the user-info part (``zk://user:secret@host:2181/ns``) or as
``username``/``password`` options. The password is a secret: it may be a reference,
``password=env:NAME`` or ``password=file:/run/secrets/zk`` (``env:NAME`` also in the
user-info: ``zk://user:env:ZK_PASSWORD@host:2181/ns``), and so may the whole URL
(``SHARDKEEPER_REGISTRY=file:/run/secrets/registry-url``); see
:mod:`shardkeeper.secretref`. A reference is read when the URL is parsed, on the
instance or tool that connects; one that cannot be read is a
:class:`~shardkeeper.errors.SecretReferenceError` naming it and what is missing.

Options (seconds, floats > 0 and at most 3600):

* ``session_timeout`` (default 4): how long the store waits after the last
  heartbeat before it declares the session dead and deletes its ephemeral nodes.
  This is the floor of failover latency.
* ``connection_timeout`` (default 5): how long :meth:`start` waits for a session.
* ``operation_timeout`` (default 2, or the session timeout when that is shorter):
  how long one request may take. At most ``session_timeout`` (ZooKeeper and etcd; a
  URL giving more is refused): a request stuck in a store leader election then ends
  within the session it was sent in, and the housekeeping probe is answered or given
  up on before the freshness clock (0.9 x the session timeout) runs out. A job's
  ``sharding_wait_timeout`` must also leave room for two such requests, a start
  commit that timed out and its retry (see :mod:`shardkeeper.config.timing`).

One count, etcd only:

* ``max_txn_ops`` (default 128, etcd's own default): the most operations the client
  puts in one transaction; a commit with more is split by the runtime (the start or
  completion of a large batch). Raise it only together with the server's
  ``--max-txn-ops`` (the server refuses larger transactions): with 4096 on both, the
  start and the completion of a 1,000-item batch are one transaction each. Integer from
  128 to 65536.

One switch (``true``/``false``), ZooKeeper with credentials only:

* ``acl_repair`` (default false): when the store's ``start()`` finds nodes of an existing
  namespace readable or writable by any client (``world:anyone``, e.g. a namespace
  first created without credentials), set the user's digest ACL on the whole
  namespace instead of refusing to start (see ``docs/operations.md``).

TLS (ZooKeeper and etcd; see ``registry/tls.py`` and ``docs/security.md``):

* ``tls`` (``true``/``false``, default false): talk TLS to the store. For ZooKeeper,
  give the server's ``secureClientPort``; for etcd, the port of its ``https`` client URL.
* ``ca=PATH``: PEM file of the CA certificate(s) that verify the server (default: the
  system's CAs). ``cert=PATH`` and ``key=PATH``: the client certificate and its
  private key (PEM, unencrypted), both or neither, for servers that require one.
  Paths are absolute. Any of the three implies ``tls=true``.
* ``verify`` (default true), ZooKeeper only: ``verify=false`` accepts any server
  certificate and host name (encryption without authentication; for tests only).

The namespace is one or more segments of ``[A-Za-z0-9_.-]`` separated by ``/``.
The environment variable ``SHARDKEEPER_REGISTRY`` holds a URL for the CLI and the
runtime when none is given.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shardkeeper.errors import InvalidRegistryURLError
from shardkeeper.registry.tls import URL_OPTION, check_tls_options
from shardkeeper.secretref import is_reference, resolve_secret

__all__ = [
    "DEFAULT_OPERATION_TIMEOUT",
    "DEFAULT_SESSION_TIMEOUT",
    "ENV_VAR",
    "MAX_TIMEOUT_SECONDS",
    "RegistrySettings",
    "parse_registry_url",
    "redact",
    "timeout_problem",
]

ENV_VAR = "SHARDKEEPER_REGISTRY"

MAX_TIMEOUT_SECONDS = 3600
"""The longest session, connection or operation timeout a URL may give."""

DEFAULT_SESSION_TIMEOUT = 4.0
"""The session timeout when a URL gives none (seconds): the floor of failover latency."""

DEFAULT_OPERATION_TIMEOUT = 2.0
"""The operation timeout when a URL gives none (seconds), or the session timeout when
that is shorter. Half the default session timeout, so that a commit that timed out
and its retry (2 x 2 s) fit in the default ``sharding_wait_timeout`` (5 s)."""

DEFAULT_TXN_OPS = 128
"""etcd's default ``--max-txn-ops``, and the least ``max_txn_ops`` a URL may give."""

MAX_TXN_OPS = 65536
"""The most ``max_txn_ops`` a URL may give."""

_SCHEMES = {"zk": "zookeeper", "zookeeper": "zookeeper", "etcd": "etcd", "memory": "memory"}
_NS_SEGMENT = re.compile(r"^[A-Za-z0-9_.\-]+$")
_HOST = re.compile(r"^[A-Za-z0-9.\-]+$|^\[[0-9A-Fa-f:]+\]$")
_OPTIONS = {
    "session_timeout",
    "connection_timeout",
    "operation_timeout",
    "username",
    "password",
    "acl_repair",
    "tls",
    "ca",
    "cert",
    "key",
    "verify",
    "max_txn_ops",
}
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_DEFAULT_PORT = {"zookeeper": 2181, "etcd": 2379}
_PORT = re.compile(r"^[0-9]{1,5}$")
_SECRET_IN_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^:@/]*:)[^@/]*@")
_SECRET_IN_QUERY = re.compile(r"([?&](?:password|key)=)[^&#]*")


def redact(url: str) -> str:
    """``url`` with any password (user-info or ``password`` option) and the path of the
    private key (``key`` option) replaced by ``***``."""
    url = _SECRET_IN_USERINFO.sub(r"\1***@", url)
    return _SECRET_IN_QUERY.sub(r"\1***", url)


def timeout_problem(backend: str, session_timeout: float, operation_timeout: float) -> str | None:
    """Why ``operation_timeout`` does not fit ``session_timeout`` (None when it does).

    A request may take at most the session timeout: one stuck in a store leader
    election longer than that outlives the session it was sent in, and a housekeeping
    probe that takes that long has already let the freshness clock (0.9 T) run out.
    The in-process memory store sends no request anywhere: any value is fine there.
    """
    if backend == "memory" or operation_timeout <= session_timeout:
        return None
    return (
        f"operation_timeout={operation_timeout:g} is longer than session_timeout="
        f"{session_timeout:g}; give an operation_timeout of at most {session_timeout:g} "
        f"seconds (default {DEFAULT_OPERATION_TIMEOUT:g}, or the session timeout when "
        f"shorter), or a longer session_timeout"
    )


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RegistrySettings(BaseModel):
    """Where the coordination store is and how to talk to it (parsed from a URL)."""

    # hide_input_in_errors: a validation error would otherwise quote the password and
    # the key's path
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    backend: Literal["zookeeper", "etcd", "memory"]
    hosts: tuple[tuple[str, int], ...]
    namespace: str
    session_timeout: float = Field(default=DEFAULT_SESSION_TIMEOUT, gt=0)
    connection_timeout: float = Field(default=5.0, gt=0)
    #: at most session_timeout; when not given, DEFAULT_OPERATION_TIMEOUT or the
    #: session timeout when that is shorter (see _default_operation_timeout)
    operation_timeout: float = Field(default=DEFAULT_OPERATION_TIMEOUT, gt=0)
    username: str | None = None
    # kept out of repr (settings end up in logs and tracebacks)
    password: str | None = Field(default=None, repr=False)
    #: ZooKeeper: repair a namespace open to any client instead of refusing to start
    acl_repair: bool = False
    #: talk TLS to the store (URL option ``tls``; implied by ``ca``/``cert``/``key``)
    tls: bool = False
    #: PEM file of the CA certificates that verify the server (None: the system's CAs)
    tls_ca: str | None = None
    #: PEM file of the client certificate (with ``tls_key``), for servers that require one
    tls_cert: str | None = None
    #: PEM file of the client certificate's private key (kept out of repr and url())
    tls_key: str | None = Field(default=None, repr=False)
    #: verify the server's certificate and host name (only ZooKeeper may turn it off)
    tls_verify: bool = True
    #: etcd: operations per transaction, as the server's --max-txn-ops allows
    max_txn_ops: int = Field(default=DEFAULT_TXN_OPS, ge=DEFAULT_TXN_OPS, le=MAX_TXN_OPS)

    @model_validator(mode="before")
    @classmethod
    def _files_imply_tls(cls, data: Any) -> Any:
        # as in a URL: giving a CA, certificate or key means TLS unless tls is given
        files = ("tls_ca", "tls_cert", "tls_key")
        if isinstance(data, dict) and "tls" not in data and any(data.get(f) for f in files):
            return {**data, "tls": True}
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_operation_timeout(cls, data: Any) -> Any:
        # a short session asked for (session_timeout=1 for fast failover) brings the
        # default operation timeout down with it rather than being refused for it
        if isinstance(data, dict) and "operation_timeout" not in data:
            session = data.get("session_timeout", DEFAULT_SESSION_TIMEOUT)
            number = isinstance(session, int | float) and not isinstance(session, bool)
            if number and 0 < session < DEFAULT_OPERATION_TIMEOUT:
                return {**data, "operation_timeout": float(session)}
        return data

    @model_validator(mode="after")
    def _timeouts_fit(self) -> RegistrySettings:
        problem = timeout_problem(self.backend, self.session_timeout, self.operation_timeout)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _tls_usable(self) -> RegistrySettings:
        problem = check_tls_options(
            self.backend,
            tls=self.tls,
            ca=self.tls_ca,
            cert=self.tls_cert,
            key=self.tls_key,
            verify=self.tls_verify,
        )
        if problem is not None:
            names = ", ".join(f"{k} (URL option {v})" for k, v in URL_OPTION.items())
            raise ValueError(f"{problem} [settings fields: tls, {names}]")
        return self

    @classmethod
    def from_url(cls, url: str) -> RegistrySettings:
        """Parse a registry URL (see module docstring); raises InvalidRegistryURLError."""
        return parse_registry_url(url)

    @classmethod
    def from_env(cls, url: str | None = None) -> RegistrySettings:
        """Parse ``url``, or the ``SHARDKEEPER_REGISTRY`` variable when url is None."""
        value = url if url is not None else os.environ.get(ENV_VAR)
        if not value:
            raise InvalidRegistryURLError(
                "", f"no registry URL given: pass --registry or set {ENV_VAR}"
            )
        return parse_registry_url(value)

    @property
    def hosts_string(self) -> str:
        """``host:port,host:port`` as the client libraries want it."""
        return ",".join(_host_port(h, p) for h, p in self.hosts)

    def identity(self) -> str:
        """Which registry and namespace these settings name, as one string with no
        credentials, options or TLS files: ``zk://h1:2181,h2:2181/my-app`` (hosts
        sorted, so that two instances listing one ensemble in another order agree).
        Execution history scopes its rows by it (docs/monitoring.md#history)."""
        scheme = {"zookeeper": "zk", "etcd": "etcd", "memory": "memory"}[self.backend]
        if self.backend == "memory":
            where = self.hosts[0][0]
        else:
            where = ",".join(sorted(_host_port(h, p) for h, p in self.hosts))
        return f"{scheme}://{where}/{self.namespace}"

    def url(self, *, with_credentials: bool = False) -> str:
        """The URL for these settings (credentials left out unless asked)."""
        scheme = {"zookeeper": "zk", "etcd": "etcd", "memory": "memory"}[self.backend]
        auth = ""
        if with_credentials and self.username:
            auth = quote(self.username, safe="")
            if self.password is not None:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        q = (
            f"?session_timeout={self.session_timeout:g}"
            f"&connection_timeout={self.connection_timeout:g}"
            f"&operation_timeout={self.operation_timeout:g}"
        )
        if self.max_txn_ops != DEFAULT_TXN_OPS:
            q += f"&max_txn_ops={self.max_txn_ops}"
        if self.acl_repair and auth:
            q += "&acl_repair=true"  # meaningless (and refused) without credentials
        q += self._tls_query(with_credentials)
        where = self.hosts[0][0] if self.backend == "memory" else self.hosts_string
        return f"{scheme}://{auth}{where}/{self.namespace}{q}"

    def _tls_query(self, with_credentials: bool) -> str:
        # the client certificate is the client's identity: a credential like a password
        if not self.tls:
            return ""
        q = "&tls=true"
        if self.tls_ca is not None:
            q += "&ca=" + quote(self.tls_ca, safe="/")
        if with_credentials and self.tls_cert is not None and self.tls_key is not None:
            q += "&cert=" + quote(self.tls_cert, safe="/") + "&key=" + quote(self.tls_key, safe="/")
        if not self.tls_verify:
            q += "&verify=false"
        return q


def _positive(url: str, name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRegistryURLError(
            url, f"option {name}={raw!r} is not a number; give seconds > 0"
        ) from None
    if not value > 0 or value != value or value == float("inf"):
        raise InvalidRegistryURLError(url, f"option {name}={raw!r} must be a number of seconds > 0")
    if value > MAX_TIMEOUT_SECONDS:
        # Past this the client libraries overflow their timers (a traceback, or a
        # start() that never gives up); no store needs more than an hour anyway.
        raise InvalidRegistryURLError(
            url, f"option {name}={raw!r} is too long; give at most {MAX_TIMEOUT_SECONDS} seconds"
        )
    return value


def _txn_ops(url: str, raw: str) -> int:
    if not raw.strip().isdigit():
        raise InvalidRegistryURLError(
            url,
            f"option max_txn_ops={raw!r} is not a whole number; give {DEFAULT_TXN_OPS} to "
            f"{MAX_TXN_OPS}, no more than the server's --max-txn-ops",
        )
    value = int(raw)
    if not DEFAULT_TXN_OPS <= value <= MAX_TXN_OPS:
        raise InvalidRegistryURLError(
            url,
            f"option max_txn_ops={value} is out of range; give {DEFAULT_TXN_OPS} to "
            f"{MAX_TXN_OPS}, no more than the server's --max-txn-ops",
        )
    return value


def _valid_host(host: str) -> bool:
    """A bracketed IPv6 address, or a DNS name / IPv4 address whose dot-separated
    labels are 1-63 letters, digits or '-' (so no empty label: '...' is no host)."""
    if not _HOST.match(host):
        return False
    if host.startswith("["):
        return True
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    return len(host) <= 253 and all(0 < len(label) <= 63 for label in labels)


def _boolean(url: str, name: str, raw: str) -> bool:
    value = _BOOLEANS.get(raw.strip().lower())
    if value is None:
        raise InvalidRegistryURLError(
            url, f"option {name}={raw!r} is not a switch; give true or false"
        )
    return value


def parse_registry_url(url: str) -> RegistrySettings:
    """Parse and validate a registry URL; every error names the bad part.

    Error messages quote the URL with its password replaced by ``***``. The URL, or
    its password, may be an ``env:``/``file:`` reference (module docstring).
    """
    if isinstance(url, str) and is_reference(url.strip()):
        url = resolve_secret("registry URL", url.strip())
    try:
        return _parse(url)
    except InvalidRegistryURLError as exc:
        if isinstance(url, str) and redact(url) != url:
            raise InvalidRegistryURLError(redact(url), exc.reason) from None
        raise


def _parse(url: str) -> RegistrySettings:
    if not isinstance(url, str) or not url.strip():
        raise InvalidRegistryURLError(str(url), "empty URL; expected zk://host:port/namespace")
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if not scheme or "://" not in url:
        raise InvalidRegistryURLError(
            url, "missing scheme; expected zk://host:port/namespace or etcd://host:port/namespace"
        )
    if scheme not in _SCHEMES:
        raise InvalidRegistryURLError(
            url, f"unknown scheme {scheme!r}; valid schemes are zk, zookeeper, etcd, memory"
        )
    backend = _SCHEMES[scheme]
    if parts.fragment or url.strip().endswith("#"):
        raise InvalidRegistryURLError(
            url, f"unexpected fragment {'#' + parts.fragment!r}; options go after '?'"
        )
    netloc = parts.netloc
    username = password = None
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        user, colon, pw = userinfo.partition(":")
        username, password = unquote(user), (unquote(pw) if colon else None)
        if not username:
            raise InvalidRegistryURLError(url, "empty user name before '@'")
    if not netloc:
        raise InvalidRegistryURLError(url, "no host; expected host:port[,host:port...]")
    hosts: list[tuple[str, int]] = []
    if backend == "memory":
        # the name of an in-process server, not an address (port 0: none)
        if not _NS_SEGMENT.match(netloc) or netloc in (".", ".."):
            raise InvalidRegistryURLError(
                url, f"invalid memory server name {netloc!r}; use letters, digits, '_', '.', '-'"
            )
        hosts.append((netloc, 0))
    for item in netloc.split(",") if backend != "memory" else ():
        if not item:
            raise InvalidRegistryURLError(url, "empty host in the host list")
        if item.startswith("[") and "]" in item:  # [::1]:2181
            host, _, rest = item.partition("]")
            host += "]"
            port_s = rest[1:] if rest.startswith(":") else str(_DEFAULT_PORT[backend])
        elif ":" in item:
            host, _, port_s = item.rpartition(":")
        else:
            host, port_s = item, str(_DEFAULT_PORT[backend])
        if not host or not _valid_host(host):
            raise InvalidRegistryURLError(
                url,
                f"invalid host {host!r}; expected a host name, an IPv4 address or "
                "an [IPv6] address",
            )
        if not _PORT.match(port_s):
            raise InvalidRegistryURLError(
                url, f"invalid port {port_s!r} for host {host!r}; expected 1-65535"
            )
        port = int(port_s)
        if not 0 < port < 65536:
            raise InvalidRegistryURLError(url, f"port {port} out of range 1-65535")
        hosts.append((host.strip("[]"), port))
    namespace = parts.path.strip("/")
    if not namespace:
        raise InvalidRegistryURLError(
            url, "empty namespace; expected a path such as /my-app after the hosts"
        )
    for seg in namespace.split("/"):
        if not _NS_SEGMENT.match(seg) or seg in (".", ".."):
            raise InvalidRegistryURLError(
                url,
                f"namespace {namespace!r} has an invalid segment {seg!r}; "
                "use letters, digits, '_', '.', '-' separated by '/'",
            )
    options: dict[str, float] = {}
    acl_repair = False
    max_txn_ops = DEFAULT_TXN_OPS
    tls: bool | None = None
    tls_verify = True
    files: dict[str, str] = {}
    for name, values in parse_qs(parts.query, keep_blank_values=True).items():
        if name not in _OPTIONS:
            raise InvalidRegistryURLError(
                url, f"unknown option {name!r}; valid options are {', '.join(sorted(_OPTIONS))}"
            )
        raw = values[-1]
        if name == "username":
            if not raw:
                raise InvalidRegistryURLError(url, "option username is empty")
            username = raw
        elif name == "password":
            password = raw
        elif name == "acl_repair":
            acl_repair = _boolean(url, name, raw)
        elif name == "tls":
            tls = _boolean(url, name, raw)
        elif name == "verify":
            tls_verify = _boolean(url, name, raw)
        elif name in ("ca", "cert", "key"):
            files[name] = raw
        elif name == "max_txn_ops":
            max_txn_ops = _txn_ops(url, raw)
        else:
            options[name] = _positive(url, name, raw)
    if backend == "memory" and (username is not None or password is not None):
        raise InvalidRegistryURLError(url, "a memory:// registry takes no credentials")
    if password is not None and not username:
        raise InvalidRegistryURLError(url, "a password was given without a user name")
    if password is not None and is_reference(password):
        password = resolve_secret("registry URL password", password)
    if acl_repair and backend != "zookeeper":
        raise InvalidRegistryURLError(
            url,
            "option acl_repair applies to ZooKeeper only; etcd access is granted by "
            "roles (see docs/registry-backends.md)",
        )
    if max_txn_ops != DEFAULT_TXN_OPS and backend != "etcd":
        raise InvalidRegistryURLError(
            url,
            f"option max_txn_ops applies to etcd only; a {backend} commit's limit is the "
            "store's own",
        )
    if acl_repair and not username:
        raise InvalidRegistryURLError(
            url, "option acl_repair needs credentials: give a user name and password"
        )
    session = options.get("session_timeout", DEFAULT_SESSION_TIMEOUT)
    if "operation_timeout" in options:
        problem = timeout_problem(backend, session, options["operation_timeout"])
        if problem is not None:
            raise InvalidRegistryURLError(url, problem)
    if tls is None:
        tls = bool(files)  # ca, cert or key imply TLS
    problem = check_tls_options(
        backend,
        tls=tls,
        ca=files.get("ca"),
        cert=files.get("cert"),
        key=files.get("key"),
        verify=tls_verify,
    )
    if problem is not None:
        raise InvalidRegistryURLError(url, problem)
    return RegistrySettings(
        backend=backend,  # type: ignore[arg-type]
        hosts=tuple(hosts),
        namespace=namespace,
        username=username,
        password=password,
        acl_repair=acl_repair,
        tls=tls,
        tls_ca=files.get("ca"),
        tls_cert=files.get("cert"),
        tls_key=files.get("key"),
        tls_verify=tls_verify,
        max_txn_ops=max_txn_ops,
        **options,
    )
