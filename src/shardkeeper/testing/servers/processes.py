"""Processes and ports of the test servers: free loopback ports, /proc probes, the
environment servers are started with, and launching and killing a member's process
group. The errors of the whole package (:class:`ClusterError`) live here too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from shardkeeper.testing.servers.members import Member

__all__ = [
    "LOOPBACK",
    "Backend",
    "ClusterError",
    "free_ports",
    "kill_group",
    "pid_alive",
    "spawn",
]

LOOPBACK = "127.0.0.1"

Backend = Literal["zookeeper", "etcd"]


class ClusterError(RuntimeError):
    """A server could not be started, or did not become ready in time.

    The message names the member, the deadline and the tail of its server log.
    """


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago.

    All sockets are held open until every port is chosen, so the ports are distinct;
    another process may still grab one before the server binds it, which is why the
    clusters retry a start that fails on a taken port.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/PID/stat, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # the command name is in parentheses and may itself contain spaces or parentheses
    return raw.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead: it serves nothing).

    Detached servers are re-parented to PID 1, which may never reap them here, so a
    killed server can linger as a zombie; ``os.kill(pid, 0)`` would call it alive.
    """
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _child_env() -> dict[str, str]:
    # ETCD_* / ETCDCTL_* variables override etcd flags; a developer's shell settings
    # must not leak into the servers we start (for example ETCD_DATA_DIR).
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_", "JAVA_TOOL"))
    }


def spawn(m: Member, command: list[str], *, detached: bool) -> None:
    """Start ``command`` for member ``m`` in its own process group, output appended to
    its log; sets ``m.popen``, ``m.pid`` and ``m.log_offset``."""
    # a prefix such as ``ip netns exec NAME`` execs the server: the pid stays its own
    cmd = [*m.prefix, *command]
    # The parent-death signal kills the server if this Python process dies without
    # running atexit (SIGKILL, OOM). The kernel sends it when the spawning *thread*
    # exits, so it is only safe from the main thread, and never for detached servers.
    if (
        not detached
        and threading.current_thread() is threading.main_thread()
        and shutil.which("setpriv")
    ):
        cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
    with m.log_path.open("ab") as log:
        log.write(f"--- launch {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)}\n".encode())
        log.flush()
        m.log_offset = log.tell()
        m.popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=m.base_dir,
            env=_child_env(),
            close_fds=True,
            start_new_session=True,  # own process group: killpg takes everything
        )
    m.pid = m.popen.pid
    m.paused = False


def kill_group(m: Member, timeout: float = 10.0) -> None:
    """SIGKILL member ``m``'s process group and wait (bounded) until its process is gone."""
    if m.pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(m.pid, signal.SIGKILL)
    if m.popen is not None:
        try:
            m.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"member {m.index} (pid {m.pid}) survived SIGKILL") from None
    else:
        deadline = time.monotonic() + timeout
        while pid_alive(m.pid):
            if time.monotonic() > deadline:
                raise ClusterError(f"member {m.index} (pid {m.pid}) survived SIGKILL")
            time.sleep(0.01)
    m.pid = None
    m.popen = None
    m.paused = False
