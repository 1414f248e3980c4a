"""What one alert says: a failed item, bounded in size, as text and as JSON fields."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shardkeeper.observe import format_traceback

__all__ = ["MESSAGE_LIMIT", "TRACEBACK_LIMIT", "Alert"]

#: longest error message in an alert
MESSAGE_LIMIT = 500
#: longest traceback text in an alert (its tail: the raise site)
TRACEBACK_LIMIT = 3_000


@dataclass(frozen=True)
class Alert:
    """A failed execution of one item, as an alert reports it."""

    job: str
    item: int
    error_type: str
    error: str
    traceback: str
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    at: float = field(default_factory=time.time)

    @classmethod
    def of(cls, job: str, item: int, exc: BaseException) -> Alert:
        """The alert for ``exc`` ending ``job``'s ``item`` (message and traceback cut)."""
        err_type, message, trace = format_traceback(exc)
        if len(message) > MESSAGE_LIMIT:
            message = message[: MESSAGE_LIMIT - 3] + "..."
        if len(trace) > TRACEBACK_LIMIT:
            trace = "...\n" + trace[-TRACEBACK_LIMIT:]
        return cls(job=job, item=item, error_type=err_type, error=message, traceback=trace)

    @property
    def when(self) -> str:
        """The failure time, ISO 8601 UTC."""
        return datetime.fromtimestamp(self.at, UTC).isoformat(timespec="seconds")

    @property
    def summary(self) -> str:
        """One line: job, item, host and the error."""
        return (
            f"shardkeeper: job {self.job!r} item {self.item} failed on {self.host} "
            f"(pid {self.pid}): {self.error_type}: {self.error}"
        )

    def fields(self) -> dict[str, Any]:
        """The structured fields (JSON-friendly)."""
        return {
            "job": self.job,
            "item": self.item,
            "host": self.host,
            "pid": self.pid,
            "time": self.when,
            "error_type": self.error_type,
            "error": self.error,
            "traceback": self.traceback,
        }

    def text(self) -> str:
        """A plain-text body: the summary, the fields, the traceback."""
        return (
            f"{self.summary}\n\n"
            f"job:   {self.job}\nitem:  {self.item}\nhost:  {self.host} (pid {self.pid})\n"
            f"time:  {self.when}\nerror: {self.error_type}: {self.error}\n\n{self.traceback}"
        )
