"""The cyclic garbage collector paused while an instance starts.

Start-up builds the long-lived state of every job at once: runners, triggers,
configs, the operations of the registration commits, thousands of objects a job.
CPython's collector runs by allocation counts, so a start-up of thousands of jobs
triggers collection after collection, the full ones scanning the whole growing heap
each time; on a 5,000-job start-up they took a fifth of the registering thread's time
and found next to nothing (the state is alive). Pausing the collector for the start
defers that work to the first collection after it: one pass, not dozens.

Only automatic collection is paused, and only when it was on; reference counting
still frees everything as usual. The pause is process-wide (the collector has no
other switch), bounded by ``start()`` itself, and the earliest of overlapping pauses
to end turns collection back on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collection_paused"]


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Pause automatic cyclic garbage collection for the ``with`` block (see the
    module docstring)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
