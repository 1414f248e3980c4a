"""A throwaway PostgreSQL server on a free loopback port, for tests.

:class:`PostgresServer` runs ``initdb`` into a private temporary directory (trust
authentication, superuser ``postgres``, the unix socket in that directory too), then
``pg_ctl start``/``stop`` with bounded waits. :meth:`PostgresServer.create_database`
gives each test its own database. :meth:`stop` then :meth:`start` is a database that
goes down and comes back on the same port with its data (the history writer's
outage test)::

    with PostgresServer() as pg:
        url = pg.create_database("t1")   # postgresql://postgres@127.0.0.1:PORT/t1

PostgreSQL refuses to run as root: as root, every server command runs as the
``postgres`` system user (``runuser -u postgres``), which owns the directory. The
binaries are found in ``$SHARDKEEPER_PG_BIN``, else ``/usr/lib/postgresql/<newest>/bin``,
else on ``PATH``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self

from shardkeeper.testing.servers import LOOPBACK, free_ports

__all__ = ["PostgresError", "PostgresServer", "find_bin_dir"]

SUPERUSER = "postgres"
#: the system user server commands run as when we are root
RUN_AS = "postgres"


class PostgresError(RuntimeError):
    """The server could not be set up, started or stopped."""


def find_bin_dir() -> Path:
    """Where ``initdb`` and ``pg_ctl`` are (see module docstring)."""
    env = os.environ.get("SHARDKEEPER_PG_BIN")
    if env:
        return Path(env)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise PostgresError(
        "PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or on PATH): "
        "apt-get install postgresql-15, or set SHARDKEEPER_PG_BIN to its bin directory"
    )


class PostgresServer:
    """One PostgreSQL server in a temporary directory (see module docstring)."""

    def __init__(self, *, bin_dir: Path | None = None, start_timeout: float = 60.0) -> None:
        self.bin_dir = bin_dir or find_bin_dir()
        self.start_timeout = start_timeout
        self.port = 0
        self._root: Path | None = None
        self._running = False

    # -- paths ------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The temporary directory (data, socket and log)."""
        if self._root is None:
            raise PostgresError("the server was never started")
        return self._root

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.root / "server.log"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server log (for failure reports)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Create the cluster on first start, then start it and wait until it serves
        (bounded by ``start_timeout``). Later starts reuse the data and the port."""
        if self._running:
            return self
        if self._root is None:
            self._init()
        self._pg_ctl("start", "-w", "-t", str(int(self.start_timeout)), "-l", str(self.log_path))
        self._running = True
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server (fast shutdown: clients are disconnected), keeping its data."""
        if not self._running:
            return
        self._pg_ctl("stop", "-m", "fast", "-w", "-t", str(int(timeout)))
        self._running = False

    def destroy(self) -> None:
        """Stop the server and remove its directory."""
        with contextlib.suppress(PostgresError):
            self.stop()
        if self._running:  # a fast stop failed: do not leave a server behind
            with contextlib.suppress(PostgresError):
                self._pg_ctl("stop", "-m", "immediate", "-w", "-t", "10")
            self._running = False
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._running

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    # -- databases ----------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """A ``postgresql://`` URL of ``database`` on this server (trust: no password)."""
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` (letters, digits, underscores); returns its URL."""
        if not name.replace("_", "").isalnum() or not name.isascii():
            raise PostgresError(f"database name {name!r}: use letters, digits and underscores")
        import psycopg

        with psycopg.connect(
            host=LOOPBACK, port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # name checked above
        return self.url(name)

    # -- internals ----------------------------------------------------------------------

    def _init(self) -> None:
        as_root = os.geteuid() == 0
        if as_root:
            try:
                owner = pwd.getpwnam(RUN_AS)
            except KeyError:
                raise PostgresError(
                    f"running as root, and PostgreSQL refuses to run as root; there is no "
                    f"{RUN_AS!r} system user to run it as (install postgresql-15, which "
                    "creates it, or run the tests as a non-root user)"
                ) from None
        root = Path(tempfile.mkdtemp(prefix="sk-postgres-"))
        if as_root:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        self._root = root
        self.port = free_ports(1)[0]
        self._run(
            str(self.bin_dir / "initdb"),
            "-D",
            str(root / "data"),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
            timeout=120,
        )
        (root / "sock").mkdir()
        if as_root:
            os.chown(root / "sock", owner.pw_uid, owner.pw_gid)
        settings = {
            "port": str(self.port),
            "listen_addresses": f"'{LOOPBACK}'",
            "unix_socket_directories": f"'{root / 'sock'}'",
            # a test server: durability does not matter, speed does
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": "60",
        }
        with (root / "data" / "postgresql.conf").open("a") as conf:
            conf.write("\n# shardkeeper test server\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        atexit.register(self.destroy)

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), *args)

    def _run(self, *cmd: str, timeout: float | None = None) -> None:
        argv = list(cmd)
        if os.geteuid() == 0:
            argv = ["runuser", "-u", RUN_AS, "--", *argv]
        limit = timeout if timeout is not None else self.start_timeout + 30
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=limit,
                cwd=self.root,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PostgresError(
                f"{Path(cmd[0]).name} {' '.join(cmd[1:3])} did not finish in {limit:.0f}s; "
                f"log tail:\n{self.log_tail()}"
            ) from None
        if done.returncode != 0:
            raise PostgresError(
                f"{' '.join(argv)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-800:]}\nlog tail:\n{self.log_tail()}"
            )
