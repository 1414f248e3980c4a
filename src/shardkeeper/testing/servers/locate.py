"""Where the server programs are: etcd, etcdctl, ZooKeeper's jars and a Java runtime.

Looked up when a server is launched, in this order (the first that exists wins):

* **etcd**: ``$SHARDKEEPER_ETCD`` (the binary, or the directory holding it), ``etcd`` on
  the ``PATH`` (Debian's ``etcd-server``, Homebrew, an unpacked release tarball put on
  the ``PATH``), then Debian's ``/usr/bin/etcd``.
* **etcdctl** (only for ``--auth``): ``$SHARDKEEPER_ETCDCTL``, the ``etcdctl`` beside
  the etcd found (a release tarball ships both), ``etcdctl`` on the ``PATH``, Debian's
  ``/usr/bin/etcdctl``.
* **ZooKeeper**: ``$SHARDKEEPER_ZOOKEEPER_JAR`` (Debian-style: the server jar, its
  dependencies beside it), ``$SHARDKEEPER_ZOOKEEPER_HOME`` or ``$ZOOKEEPER_HOME`` (an
  unpacked release tarball: ``lib/*.jar``), the installation of a ``zkServer.sh`` or
  ``zkServer`` on the ``PATH`` (a tarball's ``bin``, Homebrew's ``libexec``), then
  Debian's ``/usr/share/java/zookeeper.jar``. A release directory counts only if one of
  its ``lib/zookeeper-*.jar`` holds the server class (``QuorumPeerMain``): one named by a
  variable is an error saying so, one found by the ``PATH`` is skipped (the reason is in
  the not-found message).
* **java**: ``$JAVA_HOME/bin/java``, then ``java`` on the ``PATH``.

What is missing raises :class:`ServerNotFoundError` (a :class:`ClusterError`) saying
where it looked and the exact line that installs it, before any process starts: never
a raw ``[Errno 2]`` or a Java ``ClassNotFoundException``.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from shardkeeper.testing.servers.processes import ClusterError

__all__ = [
    "DEBIAN_ETCD",
    "DEBIAN_ETCDCTL",
    "DEBIAN_ZOOKEEPER_JAR",
    "SERVER_CLASS",
    "ServerNotFoundError",
    "ZooKeeperInstall",
    "find_etcd",
    "find_etcdctl",
    "find_java",
    "find_zookeeper",
    "require",
]

DEBIAN_ETCD = "/usr/bin/etcd"
DEBIAN_ETCDCTL = "/usr/bin/etcdctl"
#: Debian's server jar; its manifest pulls its own dependencies, but the slf4j binding
#: must be on the class path or the server logs nothing at all
DEBIAN_ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
_DEBIAN_SLF4J = ("slf4j-api.jar", "slf4j-simple.jar")
#: what Debian's Netty connection factory (needed for TLS) loads beyond the manifest
_DEBIAN_NETTY = ("netty-codec.jar", "netty-resolver.jar")

ETCD_INSTALL = (
    "install etcd (a single binary, no root needed):\n"
    "  Debian/Ubuntu:    sudo apt-get install etcd-server etcd-client\n"
    "  macOS (Homebrew): brew install etcd\n"
    "  without root:     unpack an etcd release tarball (etcd-v3.5.*-linux-amd64.tar.gz "
    "from github.com/etcd-io/etcd/releases) and put its directory on the PATH, or set "
    "SHARDKEEPER_ETCD=/path/to/etcd"
)
ZOOKEEPER_INSTALL = (
    "install ZooKeeper (it needs a Java runtime too), or use --backend etcd, which needs "
    "no Java:\n"
    "  Debian/Ubuntu:    sudo apt-get install zookeeper default-jre-headless\n"
    "  macOS (Homebrew): brew install zookeeper\n"
    "  without root:     unpack a ZooKeeper release tarball "
    "(apache-zookeeper-3.8.*-bin.tar.gz) and set SHARDKEEPER_ZOOKEEPER_HOME to its "
    "directory, or put its bin/ (zkServer.sh) on the PATH"
)
JAVA_INSTALL = (
    "install a Java runtime (11 or newer), or use --backend etcd, which needs no Java:\n"
    "  Debian/Ubuntu:    sudo apt-get install default-jre-headless\n"
    "  macOS (Homebrew): brew install openjdk\n"
    "  without root:     unpack a JDK and set JAVA_HOME to its directory"
)


class ServerNotFoundError(ClusterError):
    """A server program (etcd, ZooKeeper, java) is not installed where it was looked
    for; the message says where it looked and how to install it."""


def _executable(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def find_etcd() -> str:
    """The etcd binary to run (see the module docstring for the order)."""
    given = _env("SHARDKEEPER_ETCD")
    if given:
        path = Path(given).expanduser()
        if path.is_dir():
            path = path / "etcd"
        if _executable(path):
            return str(path)
        raise ServerNotFoundError(
            f"SHARDKEEPER_ETCD={given!r} is not an etcd binary (no executable file "
            f"{str(path)!r}); set it to the etcd program or the directory holding it, "
            f"or unset it to use the PATH; {ETCD_INSTALL}"
        )
    found = shutil.which("etcd")
    if found:
        return found
    if _executable(DEBIAN_ETCD):
        return DEBIAN_ETCD
    raise ServerNotFoundError(
        f"etcd not found: not on the PATH, not at {DEBIAN_ETCD}, SHARDKEEPER_ETCD unset; "
        + ETCD_INSTALL
    )


def find_etcdctl() -> str:
    """The etcdctl to run: ``$SHARDKEEPER_ETCDCTL``, the one beside the etcd found,
    the ``PATH``, Debian's."""
    given = _env("SHARDKEEPER_ETCDCTL")
    if given:
        if _executable(Path(given).expanduser()):
            return str(Path(given).expanduser())
        raise ServerNotFoundError(
            f"SHARDKEEPER_ETCDCTL={given!r} is not an executable file; set it to the "
            f"etcdctl program, or unset it; {ETCD_INSTALL}"
        )
    try:
        beside = Path(find_etcd()).with_name("etcdctl")
    except ServerNotFoundError:
        beside = None
    if beside is not None and _executable(beside):
        return str(beside)
    found = shutil.which("etcdctl") or (DEBIAN_ETCDCTL if _executable(DEBIAN_ETCDCTL) else None)
    if found:
        return found
    raise ServerNotFoundError(
        "etcdctl not found (needed for --auth): not beside etcd, not on the PATH, "
        f"SHARDKEEPER_ETCDCTL unset; {ETCD_INSTALL}"
    )


def find_java() -> str:
    """The java to run ZooKeeper with: ``$JAVA_HOME/bin/java``, else the ``PATH``."""
    home = _env("JAVA_HOME")
    if home:
        java = Path(home).expanduser() / "bin" / "java"
        if _executable(java):
            return str(java)
        raise ServerNotFoundError(
            f"JAVA_HOME={home!r} holds no bin/java; point it at a Java runtime, or unset "
            f"it to use the java on the PATH; {JAVA_INSTALL}"
        )
    found = shutil.which("java")
    if found:
        return found
    raise ServerNotFoundError(
        "ZooKeeper needs Java: no java on the PATH and JAVA_HOME unset; " + JAVA_INSTALL
    )


@dataclass(frozen=True)
class ZooKeeperInstall:
    """A ZooKeeper installation: the class path of its server, and where it was found."""

    classpath: tuple[str, ...]
    #: the class path entries the Netty connection factory (TLS) needs beyond it
    netty: tuple[str, ...]
    source: str


#: the class every ZooKeeper server is started with: a lib/ whose zookeeper-*.jar files
#: lack it (stubs, a client-only or half-copied lib) would die with ClassNotFoundException
SERVER_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def _holds_server(jar: Path) -> bool:
    try:
        with zipfile.ZipFile(jar) as archive:
            archive.getinfo(SERVER_CLASS.replace(".", "/") + ".class")
    except (OSError, zipfile.BadZipFile, KeyError):
        return False
    return True


def _home_problem(home: Path) -> str | None:
    """Why ``home`` is not a runnable ZooKeeper release (None: it is one)."""
    jars = sorted((home / "lib").glob("zookeeper-*.jar"))
    if not jars:
        return f"holds no lib/zookeeper-*.jar ({str(home)!r})"
    if not any(_holds_server(jar) for jar in jars):
        names = ", ".join(jar.name for jar in jars)
        return f"has no jar in lib/ holding ZooKeeper's server {SERVER_CLASS} ({names})"
    return None


def _home_install(home: Path, source: str) -> ZooKeeperInstall:
    """The installation of a release tarball (or Homebrew's libexec) at ``home``."""
    # conf/ holds the tarball's logback.xml: without it logback logs at DEBUG
    entries = [str(home / "lib" / "*")] + ([str(home / "conf")] if (home / "conf").is_dir() else [])
    return ZooKeeperInstall(tuple(entries), (), source)


def _jar_install(jar: Path, source: str) -> ZooKeeperInstall:
    folder = jar.parent
    beside = tuple(str(folder / n) for n in _DEBIAN_SLF4J if (folder / n).is_file())
    if beside:  # Debian's layout: the manifest names the rest
        netty = tuple(str(folder / n) for n in _DEBIAN_NETTY if (folder / n).is_file())
        return ZooKeeperInstall((str(jar), *beside), netty, source)
    # a jar among its dependencies (a lib/ directory): take them all
    return ZooKeeperInstall((str(jar), str(folder / "*")), (), source)


def find_zookeeper() -> ZooKeeperInstall:
    """The ZooKeeper installation to run (see the module docstring for the order)."""
    jar = _env("SHARDKEEPER_ZOOKEEPER_JAR")
    if jar:
        path = Path(jar).expanduser()
        if not path.is_file():
            raise ServerNotFoundError(
                f"SHARDKEEPER_ZOOKEEPER_JAR={jar!r} is not a file; set it to ZooKeeper's "
                f"server jar, or unset it; {ZOOKEEPER_INSTALL}"
            )
        return _jar_install(path, "SHARDKEEPER_ZOOKEEPER_JAR")
    for name in ("SHARDKEEPER_ZOOKEEPER_HOME", "ZOOKEEPER_HOME"):
        given = _env(name)
        if not given:
            continue
        home = Path(given).expanduser()
        problem = _home_problem(home)
        if problem is not None:
            raise ServerNotFoundError(
                f"{name}={given!r} {problem}; set it to an unpacked ZooKeeper release "
                f"(apache-zookeeper-3.8.*-bin), or unset it; " + ZOOKEEPER_INSTALL
            )
        return _home_install(home, name)
    skipped: list[str] = []
    for script in ("zkServer.sh", "zkServer"):
        found_script = shutil.which(script)
        if not found_script:
            continue
        # a tarball's bin/zkServer.sh, or Homebrew's bin/zkServer (a symlink into the
        # Cellar, whose libexec holds the jars)
        for path in dict.fromkeys((Path(found_script), Path(found_script).resolve())):
            for prefix in (path.parent.parent, path.parent.parent / "libexec"):
                problem = _home_problem(prefix)
                if problem is None:
                    return _home_install(prefix, f"{script} on the PATH ({found_script})")
                if not problem.startswith("holds no"):  # jars, but not a server: say so
                    skipped.append(f"{script} on the PATH ({found_script}): {prefix} {problem}")
    if Path(DEBIAN_ZOOKEEPER_JAR).is_file():
        return _jar_install(Path(DEBIAN_ZOOKEEPER_JAR), DEBIAN_ZOOKEEPER_JAR)
    passed_over = f" (skipped: {'; '.join(skipped)})" if skipped else ""
    raise ServerNotFoundError(
        "ZooKeeper not found: SHARDKEEPER_ZOOKEEPER_JAR and SHARDKEEPER_ZOOKEEPER_HOME "
        f"unset, no zkServer.sh on the PATH{passed_over}, no {DEBIAN_ZOOKEEPER_JAR}; "
        + ZOOKEEPER_INSTALL
    )


def require(backend: str) -> str:
    """Check that the programs ``backend`` (``etcd`` or ``zookeeper``) runs are
    installed; return a short description of what will run. ServerNotFoundError
    (saying what to install) otherwise."""
    if backend == "etcd":
        return find_etcd()
    install = find_zookeeper()
    return f"{find_java()} with ZooKeeper from {install.source}"
