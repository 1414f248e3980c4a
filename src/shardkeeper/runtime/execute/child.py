"""The child side of the process executor (``executor="process"``, runtime/execute/procpool.py).

A child is started by the pool with forkserver or spawn, never forked from the
threaded instance (a fork copies locks other threads held: the store client's, the
logging module's). It runs items one at a time, as the instance asks, and nothing
else: the coordination (marks, fencing, completion commits) stays in the instance.

The pipe to the instance (runtime/execute/childlink.py: one reader thread, each item's calls
under its own number) carries tuples:

* instance -> child: ``("run", n, payload)`` (run item run ``n``; ``payload`` is the
  pickled ``(ref, fields, traceparent, checkpoint_strict)``, under the instance's item
  span when ``traceparent`` is not ""), ``("reply", cid, value)``, ``("raise", cid,
  exc)`` or ``("refused", cid)`` (the answer to the call ``cid``, its value pickled),
  ``("exit",)``;
* child -> instance: ``("ready", pid, pgid)`` once at its start, ``("call", n, cid,
  name, args)`` (a request of item run ``n``: the instance makes the call ``name`` on
  that item's context and answers), ``("taken", n)`` (it has the order, and no code
  of the item has run yet), ``("log", record)`` (a log record, handled by the
  instance's logging, stamped here with the item's fields:
  logcontext.ItemContextFilter), ``("done", n, outcome, error, rss)``.

The context the item gets is rebuilt here from its plain fields; each of its
callable fields named in :data:`~shardkeeper.runtime.execute.childlink.FORWARDED` becomes a
proxy that asks the instance, so ``ctx.is_valid()`` and ``ctx.should_stop()`` give the
instance's answer at the time of the call (it computes validity lazily from its
session, so a flag pushed ahead of time could be stale).

Signals and lifetime:

* The child leads a process group of its own, so a signal to the instance's group
  (Ctrl-C in a terminal, ``kill -- -PGID``) does not reach it, and the instance can
  end the child with everything its item started (the execution timeout, a crash, a
  hard stop: the group is killed).
* SIGTERM, SIGINT and SIGHUP reaching the child itself (a service manager signals
  every process of its cgroup) do nothing: the instance's graceful stop decides how
  its items end. They are caught by a handler that does nothing, not ignored: a
  program the item starts gets the default dispositions back at exec (an ignored
  signal stays ignored across exec), and a process it forks gets them back at once.
* The child dies with its instance: its pipe's reader kills the child's group as soon
  as the instance is gone (runtime/execute/childlink.py), and with the forkserver as its
  parent (whose only thread forked it) ``PR_SET_PDEATHSIG`` kills it if the
  forkserver dies: the instance would read that as the death of every child.
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
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from shardkeeper import tracing
from shardkeeper._imports import import_object
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.logcontext import ItemContextFilter, item_context
from shardkeeper.runtime.execute.childlink import ItemLink, Link

__all__ = ["STOP_SIGNALS", "JobRef", "RemoteTraceback", "context_fields", "serve"]

#: the signals a child lets its instance decide about (module docstring)
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

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


class _LogForwarder(logging.Handler):
    """Sends the child's log records to the instance, whose handlers format and write
    them (the child has none of its own: the instance's logging is the configured one).
    Each record is stamped with the item's fields here, where the item runs: in the
    instance it is handled by a thread whose context knows no item, and the instance's
    ItemContextFilter keeps the attributes a record already has."""

    def __init__(self, link: Link) -> None:
        super().__init__()
        self._link = link
        self._stamp = ItemContextFilter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._stamp.filter(record)
            data = {k: v if _plain(v) else repr(v) for k, v in record.__dict__.items()}
            # rendered here: the arguments may not pickle, the message always does
            data["msg"] = record.getMessage()
            data["args"] = None
            if record.exc_info:
                data["exc_text"] = _FORMATTER.formatException(record.exc_info)
            data["exc_info"] = None
            data.pop("message", None)
            self._link.send(("log", data))
        except Exception:
            self.handleError(record)


def _plain(value: object) -> bool:
    """Whether ``value`` is rebuilt as it is in any process (an attribute given with
    ``extra=`` may be an object that is not: it is sent as its repr)."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return True
    if isinstance(value, (list, tuple)) and kind in (list, tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict) and kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    return False


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when its parent (the forkserver) ends."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


def _leave_it_to_the_instance(signum: int, frame: object) -> None:
    """The handler of :data:`STOP_SIGNALS` in a child: nothing (module docstring)."""


def _defaults() -> None:
    """(in a process an item forked) The default dispositions of :data:`STOP_SIGNALS`."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def _settle(die_with_parent: bool) -> None:
    """A process group of its own, the stop signals left to the instance, and (under
    the forkserver) death with the parent (module docstring)."""
    with contextlib.suppress(OSError):
        os.setpgrp()
    if die_with_parent:
        _die_with_parent()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _leave_it_to_the_instance)
    os.register_at_fork(after_in_child=_defaults)


def _rss_kib() -> int:
    """This process's resident memory now, KiB (Linux), else its peak."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _error_payload(exc: BaseException) -> tuple[bytes | None, str, str, str]:
    """(the pickled exception when it round-trips here, its type name, message,
    traceback). The instance rebuilds it, or reports the type name and message."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_TEXT_LIMIT:]
    message = str(exc)[:_TEXT_LIMIT]
    sendable: bytes | None
    try:
        sendable = pickle.dumps(exc)
        pickle.loads(sendable)
    except Exception:  # an exception type that does not round-trip: sent as text
        sendable = None
    return sendable, type(exc).__qualname__, message, text


def serve(conn: Connection, die_with_parent: bool = False) -> None:
    """The child's main loop: run the items the instance sends until told to exit or
    the instance goes away. ``die_with_parent``: the parent is the forkserver (module
    docstring)."""
    _settle(die_with_parent)
    link = Link(conn)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_LogForwarder(link))
    root.setLevel(logging.DEBUG)  # the instance's loggers and handlers filter
    jobs: dict[str, tuple[JobRef, ShardedJob]] = {}
    link.send(("ready", os.getpid(), os.getpgrp()))
    while True:
        message = link.order()
        if message[0] == "exit":
            return
        if message[0] != "run":
            continue
        _kind, number, payload = message
        link.send(("taken", number))  # before any code of the item (procpool retries)
        item = ItemLink(link, number)
        error: tuple[bytes | None, str, str, str] | None = None
        try:
            ref, fields, parent_span, item.strict = pickle.loads(payload)
            item.label = (
                f"job {ref.name!r} item {fields.get('item')} "
                f"(execution {fields.get('execution_id')})"
            )
            known = jobs.get(ref.name)
            if known is None or known[0] != ref:
                jobs[ref.name] = (ref, ref.build())
            job = jobs[ref.name][1]
            ctx = ShardingContext(**fields, **item.proxies())
            with item_context(ctx), tracing.attached(parent_span):
                job.run_item(ctx)
        except BaseException as exc:  # user code: reported to the instance
            error = _error_payload(exc)
        outcome = "ok" if error is None else "failed"
        link.finish(item, ("done", number, outcome, error, _rss_kib()))
