"""A worker process's end of its pipe to the instance (runtime/execute/child.py's transport).

* **One reader.** A daemon thread is the only reader of the pipe: it routes each
  answer to the call that asked for it (by call id) and queues the instance's orders
  (``run``, ``exit``) for the child's main loop. Two threads never read the pipe (a
  thread an item left behind used to wait in ``recv`` beside the main loop, and take
  the next item's ``run`` off the pipe).
* **The instance's death ends the child.** The reader sees the pipe's end as soon as
  the instance process is gone (the kernel closes its end, whatever killed it) and
  kills the child's process group with SIGKILL: the child and whatever the item
  started, at once, even while the item is deep in its own code and never asks its
  context anything. (Only C code holding the GIL for its whole length delays it
  until the GIL is released.)
* **Each item is its own.** The context of each item talks through an
  :class:`ItemLink` with the item's number. When the item ends, the link is closed
  before ``done`` is sent, under the lock of the pipe's writes: a call of the item is
  either sent before ``done`` (and the instance answers it with that item's own
  context) or refused here, never sent to the instance while another item runs. A
  refused call answers as a context that has ended does: ``is_valid()`` False (so
  ``should_stop()``, with ``stop_reason()`` ``fenced``), ``checkpoint()`` False or
  CheckpointFencedError when strict, ``progress()`` dropped; ``resume_state``/``state``
  raise :class:`ItemEndedError`.

Values that cross the pipe in either direction (a call's arguments, its answer, an
exception) travel pickled inside the message, so that one that cannot be rebuilt on
the other side fails that call with a clear error and leaves the pipe in step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from shardkeeper.errors import CheckpointFencedError, ShardkeeperError
from shardkeeper.job import ShardingContext

__all__ = ["FORWARDED", "ItemEndedError", "ItemLink", "Link"]

#: the calls of a :class:`ShardingContext` that a child's context answers by asking
#: the instance, which makes the same call on the item's own context: a callable field
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


class ItemEndedError(ShardkeeperError):
    """A call on the context of an item that has ended, in a worker process (a thread
    the item left behind): the context no longer answers it."""


def die() -> NoReturn:
    """End this child and everything in its process group (what its items started)
    now: the instance is gone, nothing may run on unsupervised."""
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(1)  # not reached


class _Pending:
    """A call waiting for its answer."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: tuple[Any, ...] = ()


class Link:
    """The child's end of the pipe (module docstring). Sends from any thread are
    serialised; only the reader thread reads."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._orders: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, name="sk-child-reader", daemon=True)
        self._reader.start()

    def send(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` to the instance (the child dies if it is gone)."""
        with self._send_lock:
            self._send(message)

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self._conn.send(message)
        except (OSError, EOFError):
            die()

    def order(self) -> tuple[Any, ...]:
        """The instance's next order (``("run", ...)``, ``("exit",)``), waiting for it."""
        return self._orders.get()

    def finish(self, item: ItemLink, message: tuple[Any, ...]) -> None:
        """Close ``item`` and send ``message`` (its ``done``) in one step: no call of
        the item can be sent after it."""
        with self._send_lock:
            item.closed = True
            self._send(message)

    def call(self, item: ItemLink, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Make the context call ``name`` of ``item`` in the instance and return its
        answer, or ``item``'s refusal once it has ended."""
        packed = pickle.dumps((args, kwargs))  # what does not pickle fails here, in the caller
        pending = _Pending()
        with self._send_lock:
            ended = item.closed
            if not ended:
                with self._lock:
                    cid = next(self._ids)
                    self._pending[cid] = pending
                self._send(("call", item.number, cid, name, packed))
        if ended:
            return item.refuse(name, args, kwargs)
        pending.done.wait()
        kind, payload = pending.answer
        if kind == "refused":
            return item.refuse(name, args, kwargs)
        try:
            value = pickle.loads(payload)
        except Exception as exc:
            raise ShardkeeperError(
                f"context call {name}: the instance's answer cannot be rebuilt in the "
                f"worker process ({type(exc).__name__}: {exc})"
            ) from None
        if kind == "raise":
            raise value
        return value

    def _read(self) -> None:
        while True:
            try:
                message: tuple[Any, ...] = self._conn.recv()
            except BaseException:
                # the instance is gone (EOF), or the pipe is out of step (a message
                # that does not decode: nothing would answer the item's calls)
                die()
            if message[0] in ("reply", "raise", "refused"):
                with self._lock:
                    pending = self._pending.pop(message[1], None)
                if pending is not None:
                    pending.answer = (message[0], message[2] if len(message) > 2 else b"")
                    pending.done.set()
            else:
                self._orders.put(message)


class ItemLink:
    """One item's identity on the pipe: the proxies of its context, and its refusals
    once it has ended (module docstring). ``strict`` is the job's
    ``checkpoint_strict`` (a refused ``checkpoint(strict=None)`` raises with it)."""

    def __init__(self, link: Link, number: int, strict: bool = False) -> None:
        self.link = link
        self.number = number
        self.strict = strict
        self.label = f"item run {number}"
        #: set (under the link's write lock) as the item's ``done`` is sent
        self.closed = False

    def proxy(self, name: str) -> Callable[..., Any]:
        """A stand-in for the context call ``name`` of this item."""
        return lambda *args, **kwargs: self.link.call(self, name, args, kwargs)

    def proxies(self) -> dict[str, Any]:
        """The private fields of the item's context: stand-ins for :data:`FORWARDED`."""
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

    def refuse(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The answer of an ended item's context to the call ``name``."""
        if name == "_valid":
            return False
        if name in ("_stop", "_item_state.progress"):
            return None  # stop_reason() then says fenced (not valid); progress is dropped
        if name == "_item_state.checkpoint":
            strict = args[1] if len(args) > 1 else kwargs.get("strict")
            if self.strict if strict is None else strict:
                raise CheckpointFencedError(
                    f"{self.label}: checkpoint refused: the run has ended (a call from a "
                    "thread the item left behind)"
                )
            return False
        raise ItemEndedError(
            f"{self.label}: context call {name} refused: the run has ended (a call from a "
            "thread the item left behind)"
        )


class _Forwarded:
    """An object field of a child's context whose methods ask the instance."""
