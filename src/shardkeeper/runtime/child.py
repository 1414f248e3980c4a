"""The child side of the process executor (``executor="process"``, runtime/procpool.py).

A child is started by the pool with forkserver or spawn, never forked from the
threaded parent (a fork copies locks other threads held: the store client's, the
logging module's). It runs items one at a time, as the parent asks, and nothing
else: the coordination (marks, fencing, completion commits) stays in the parent.

The pipe to the parent carries tuples:

* parent -> child: ``("run", ref, fields, traceparent)`` (run one item, under the
  parent's item span when ``traceparent`` is not ""), ``("reply", value)`` or
  ``("raise", exc)`` (the answer to a call), ``("exit",)``;
* child -> parent: ``("ready", pid)`` once at its start, ``("call", name, args,
  kwargs)`` (a request: the parent makes the call ``name`` on the item's context there
  and answers), ``("log", record)`` (a log record, handled by the parent's logging,
  stamped here with the item's fields: logcontext.ItemContextFilter),
  ``("done", outcome, error, rss)``.

The context the item gets is rebuilt here from its plain fields; each of its
callable fields named in :data:`FORWARDED` becomes a proxy that asks the parent over
the pipe, so ``ctx.is_valid()`` and ``ctx.should_stop()`` give the parent's answer at
the time of the call (the parent computes validity lazily from its session, so a
flag pushed ahead of time could be stale). Forwarding another context call is one
entry in :data:`FORWARDED`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from shardkeeper import tracing
from shardkeeper._imports import import_object
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.logcontext import ItemContextFilter, item_context

__all__ = ["FORWARDED", "JobRef", "RemoteTraceback", "context_fields", "serve"]

#: the calls of a :class:`ShardingContext` that a child's context answers by asking
#: the parent, which makes the same call on the item's own context: a callable field
#: (``_valid``), or a method of an object field (``_item_state.checkpoint``). A path
#: whose field the context does not have is skipped.
FORWARDED: tuple[str, ...] = (
    "_valid",  # ctx.is_valid()
    "_stop",  # ctx.should_stop(), ctx.stop_reason()
    "_item_state.checkpoint",  # ctx.checkpoint(state)
    "_item_state.progress",  # ctx.progress(done, total, note)
    "_item_state.resume",  # ctx.resume_state, ctx.resumed, ctx.last_state
    "_item_state.current",  # ctx.state
)

_FORMATTER = logging.Formatter()

#: largest message (bytes) of an error or a traceback sent to the parent
_TEXT_LIMIT = 64 * 1024


@dataclass(frozen=True)
class JobRef:
    """How a child rebuilds a job: its class's import path, and the pickled instance
    when the job was given as an instance (else the class is called with no argument).
    ``name`` is the job's name (a child keeps one object per job)."""

    name: str
    class_path: str
    pickled: bytes | None = None

    def build(self) -> ShardedJob:
        """The job object, in the child."""
        if self.pickled is not None:
            job = pickle.loads(self.pickled)
        else:
            cls = import_object(self.class_path, "job class")
            if not isinstance(cls, type):
                raise TypeError(f"{self.class_path} is not a class")
            job = cls()
        if not isinstance(job, ShardedJob):
            raise TypeError(f"{self.class_path} did not give a ShardedJob")
        return job


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child process, as text: set as the
    ``__cause__`` of the exception the parent reports, so that the history and the
    logs show where in the child it was raised (as ``concurrent.futures`` does)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def context_fields(ctx: ShardingContext) -> dict[str, Any]:
    """The plain fields of ``ctx`` to send to a child: every field but the private
    ones (callables of the parent, which do not cross a process boundary)."""
    return {
        f.name: getattr(ctx, f.name)
        for f in dataclasses.fields(ctx)
        if f.init and not f.name.startswith("_")
    }


class _Channel:
    """The child's end of the pipe: one call to the parent at a time (its reply is the
    next message), sends from any thread of the child serialised."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._call_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, EOFError):
                os._exit(0)  # the parent is gone: nothing to report to, nobody to run for

    def recv(self) -> tuple[Any, ...]:
        try:
            message: tuple[Any, ...] = self._conn.recv()
        except (OSError, EOFError):
            os._exit(0)
        return message

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Ask the parent to call the context field ``name`` and return its answer."""
        with self._call_lock:
            self.send(("call", name, args, kwargs))
            reply = self.recv()
        if reply[0] == "raise":
            raise reply[1]
        return reply[1]

    def proxy(self, name: str) -> Callable[..., Any]:
        """A stand-in for the context call ``name``."""
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def proxies(self) -> dict[str, Any]:
        """The private fields of a child's context: stand-ins for :data:`FORWARDED`."""
        known = {f.name for f in dataclasses.fields(ShardingContext)}
        out: dict[str, Any] = {}
        for path in FORWARDED:
            name, _, method = path.partition(".")
            if name not in known:
                continue
            if not method:
                out[name] = self.proxy(path)
            else:
                setattr(out.setdefault(name, _Forwarded()), method, self.proxy(path))
        return out


class _Forwarded:
    """An object field of a child's context whose methods ask the parent."""


class _LogForwarder(logging.Handler):
    """Sends the child's log records to the parent, whose handlers format and write
    them (the child has none of its own: the parent's logging is the configured one).
    Each record is stamped with the item's fields here, where the item runs: in the
    parent it is handled by a thread whose context knows no item, and the parent's
    ItemContextFilter keeps the attributes a record already has."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self._channel = channel
        self._stamp = ItemContextFilter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._stamp.filter(record)
            data = dict(record.__dict__)
            # rendered here: the arguments may not pickle, the message always does
            data["msg"] = record.getMessage()
            data["args"] = None
            if record.exc_info:
                data["exc_text"] = _FORMATTER.formatException(record.exc_info)
            data["exc_info"] = None
            data.pop("message", None)
            self._channel.send(("log", data))
        except Exception:
            self.handleError(record)


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when its parent (the forkserver, or the process that
    spawned it) ends, even when the item never calls back: no orphan keeps running
    an item that the cluster has handed to another instance."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _rss_kib() -> int:
    """This process's resident memory now, KiB (Linux), else its peak."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _error_payload(exc: BaseException) -> tuple[BaseException | None, str, str, str]:
    """(the exception when it survives pickling, type name, message, traceback)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_TEXT_LIMIT:]
    message = str(exc)[:_TEXT_LIMIT]
    sendable: BaseException | None = exc
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # an exception type that does not round-trip: sent as text
        sendable = None
    return sendable, type(exc).__qualname__, message, text


def serve(conn: Connection) -> None:
    """The child's main loop: run the items the parent sends until told to exit or
    the parent goes away."""
    _die_with_parent()
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the
    # parent decides how its items end (a graceful stop waits for them), so a child
    # does not die under an item on its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = _Channel(conn)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_LogForwarder(channel))
    root.setLevel(logging.DEBUG)  # the parent's loggers and handlers filter
    jobs: dict[str, tuple[JobRef, ShardedJob]] = {}
    proxies = channel.proxies()
    channel.send(("ready", os.getpid()))
    while True:
        message = channel.recv()
        if message[0] == "exit":
            return
        if message[0] != "run":
            continue
        _kind, ref, fields, parent_span = message
        error: tuple[BaseException | None, str, str, str] | None = None
        try:
            known = jobs.get(ref.name)
            if known is None or known[0] != ref:
                jobs[ref.name] = (ref, ref.build())
            job = jobs[ref.name][1]
            ctx = ShardingContext(**fields, **proxies)
            with item_context(ctx), tracing.attached(parent_span):
                job.run_item(ctx)
        except BaseException as exc:  # user code: reported to the parent
            error = _error_payload(exc)
        channel.send(("done", "ok" if error is None else "failed", error, _rss_kib()))
