"""The instance's side of the values that cross a worker process's pipe (the child's
side is runtime/execute/childlink.py; the pool, runtime/execute/procpool.py, holds
the conversation).

A value that might not rebuild on the other side (a call's arguments, its answer, an
exception) travels pickled inside its message: one that does not pickle, or does not
rebuild, fails that call or that attempt with an error that names it, and the pipe
stays in step. Only the envelopes, tuples of plain values, are pickled whole.
"""

from __future__ import annotations

import pickle
from typing import Any

from shardkeeper.errors import ShardkeeperError
from shardkeeper.job import ShardingContext
from shardkeeper.logcontext import item_context
from shardkeeper.runtime.execute.child import RemoteTraceback
from shardkeeper.runtime.execute.childlink import FORWARDED

__all__ = ["RemoteItemError", "answer", "decode", "rebuild"]


class RemoteItemError(ShardkeeperError):
    """An exception raised by an item in a worker process that could not be sent to
    the instance or rebuilt there: ``type_name`` names it, the message is its text
    (and why it could not be rebuilt)."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        super().__init__(f"{type_name}: {message}")


def decode(data: bytes) -> tuple[Any, ...]:
    """A message of a child (the values that might not rebuild here travel pickled
    inside it, so this fails only on a broken pipe's garbage)."""
    try:
        message = pickle.loads(data)
    except Exception as exc:
        raise ShardkeeperError(
            f"a message from it cannot be rebuilt here ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(message, tuple) or not message:
        raise ShardkeeperError(f"it sent {type(message).__name__}, not a message")
    return message


def answer(ctx: ShardingContext, cid: int, name: str, packed: bytes) -> tuple[Any, ...]:
    """Make the context call ``name`` of a child on ``ctx``; the reply to send."""
    try:
        if name not in FORWARDED:
            raise AttributeError(f"context call {name!r} is not forwarded to worker processes")
        try:
            args, kwargs = pickle.loads(packed)
        except Exception as exc:
            raise ShardkeeperError(
                f"context call {name}: its arguments cannot be rebuilt in the instance "
                f"({type(exc).__name__}: {exc})"
            ) from None
        target: Any = ctx
        for part in name.split("."):
            target = getattr(target, part)
        # what the call logs here (a checkpoint's store error) names the item, as it
        # does when the item runs in a thread of this process
        with item_context(ctx):
            value = target(*args, **kwargs)
    except Exception as exc:  # the child raises it in the item's code
        return ("raise", cid, _pack_error(name, exc))
    try:
        return ("reply", cid, pickle.dumps(value))
    except Exception as exc:
        error = ShardkeeperError(
            f"context call {name}: the answer cannot be sent to the worker process "
            f"({type(exc).__name__}: {exc})"
        )
        return ("raise", cid, pickle.dumps(error))


def _pack_error(name: str, exc: Exception) -> bytes:
    """``exc`` pickled for the child, else an error naming it."""
    try:
        return pickle.dumps(exc)
    except Exception as why:
        return pickle.dumps(
            ShardkeeperError(
                f"context call {name}: {type(exc).__name__}: {exc} (the exception cannot "
                f"be sent to the worker process: {type(why).__name__}: {why})"
            )
        )


def rebuild(error: tuple[bytes | None, str, str, str]) -> BaseException:
    """The exception an item raised in a child, with its traceback there as cause: the
    exception itself, or a :class:`RemoteItemError` naming it when it cannot be
    rebuilt here."""
    packed, type_name, text, trace = error
    exc: object = None
    if packed is not None:
        try:
            exc = pickle.loads(packed)
        except Exception as why:
            text = f"{text} (it cannot be rebuilt in the instance: {type(why).__name__}: {why})"
    if not isinstance(exc, BaseException):
        exc = RemoteItemError(type_name, text)
    exc.__cause__ = RemoteTraceback(trace)
    return exc
