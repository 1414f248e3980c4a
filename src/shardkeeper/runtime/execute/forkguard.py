"""Keeps the process executor's forkserver alive through the signals of a stop.

The pool (runtime/execute/procpool.py) preloads this module in multiprocessing's forkserver,
the process its worker processes are forked from. A service manager stops a service
by signalling every process of it at once: systemd's default ``KillMode=control-group``
sends SIGTERM to the whole cgroup, ``kill -TERM -- -PGID`` to a process group; a
closing terminal sends SIGHUP. The forkserver used to die of that SIGTERM, and the
kernel then killed each worker process (its ``PR_SET_PDEATHSIG``): every running item
crashed while the instance was only beginning its graceful stop.

So the forkserver blocks SIGTERM and SIGHUP (multiprocessing makes it ignore SIGINT
itself), with a handler that does nothing for a thread that would not block them.
It still ends with its instance: it exits once every process holding its "alive"
pipe (the instance and the worker processes, which end with the instance) is gone.
Each process it forks gets the default dispositions back and unblocks them at once
(an ``os.register_at_fork`` hook): a multiprocessing child of another library that
shares this forkserver still ends on SIGTERM, even one sent before the hook ran (it
waits, blocked, until then; an ignored signal would have been lost). Imported
anywhere else, the module does nothing.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["IGNORED", "guard"]

#: the signals the forkserver holds off (SIGINT: multiprocessing ignores it already)
IGNORED: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


def _in_forkserver() -> bool:
    """Whether this import runs in multiprocessing's forkserver (its ``main``, which
    imports the preloaded modules, is on the stack)."""
    main = getattr(sys.modules.get("multiprocessing.forkserver"), "main", None)
    code = getattr(main, "__code__", None)
    if code is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _nothing(signum: int, frame: object) -> None:
    """The forkserver's handler of :data:`IGNORED` (module docstring)."""


def _defaults() -> None:
    """(in a process the forkserver just forked) The default dispositions back, and
    the signals unblocked (one that came since the fork is delivered now)."""
    for sig in IGNORED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, IGNORED)


def guard() -> bool:
    """In the forkserver: hold :data:`IGNORED` off there, give them back in what it
    forks; whether it did (False anywhere else)."""
    if not _in_forkserver():
        return False
    for sig in IGNORED:
        signal.signal(sig, _nothing)
    signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED)
    os.register_at_fork(after_in_child=_defaults)
    return True


guard()
