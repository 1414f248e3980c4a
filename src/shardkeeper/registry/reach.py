"""Why a store cannot be reached: refused, unknown host, no route, or no answer.

A store's ``start()`` waits up to its connection timeout for a session. Three
failures are certain long before that, and the client libraries only retry them
(kazoo logs them, gRPC folds them into "unavailable"):

* **connection refused**: nothing listens on that port (the server is down, or the
  port is wrong);
* **unknown host**: the name does not resolve (a typo in the URL, no DNS);
* **no route**: the address cannot be reached at all (``EHOSTUNREACH``,
  ``ENETUNREACH``).

When the first session does not come at once, :func:`probe` opens a TCP connection
to every host of the URL (at once, each in its thread, for at most a second) and
closes it. When **every** host fails in one of those three ways, :func:`refusal`
gives the one-line error to raise now, naming each address and what to check. A
host that does not answer at all (a firewall dropping packets, a host that is down:
a *black hole*) may still be slow, not gone, so the store waits its whole
connection timeout as before, and :func:`silence_note` adds which hosts never
answered to its error. A host whose TCP port answers (a server that is starting, a
store without quorum, the wrong backend) changes nothing.

A store that is started while its server is still coming up (a container started
next to it) therefore fails at once with "connection refused" instead of waiting
for it: start the store after its server is up, or retry the start.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PROBE_AFTER", "PROBE_TIMEOUT", "HostAnswer", "probe", "refusal", "silence_note"]

#: seconds a store waits for its first session before it probes the hosts (a store
#: that answers connects in milliseconds: the probe costs it nothing)
PROBE_AFTER = 0.25
#: the longest a probe of one host may take (all hosts are probed at once)
PROBE_TIMEOUT = 1.0

OPEN, REFUSED, UNKNOWN_HOST, NO_ROUTE, NO_ANSWER, OTHER = (
    "open",
    "refused",
    "unknown host",
    "no route",
    "no answer",
    "other",
)
#: the outcomes that no amount of waiting changes
_CERTAIN = frozenset({REFUSED, UNKNOWN_HOST, NO_ROUTE})
_NO_ROUTE_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH})


@dataclass(frozen=True)
class HostAnswer:
    """What a TCP connection to ``host:port`` met (``outcome``; ``detail``: the
    system's words for it)."""

    host: str
    port: int
    outcome: str
    detail: str = ""

    @property
    def address(self) -> str:
        """``host:port`` (``[v6]:port``)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def explain(self) -> str:
        """One clause: the address, what happened, what to check."""
        if self.outcome == REFUSED:
            return (
                f"{self.address}: connection refused (nothing listens there: is the "
                f"server running, and is {self.port} its client port?)"
            )
        if self.outcome == UNKNOWN_HOST:
            return (
                f"{self.address}: unknown host {self.host!r} ({self.detail}: check the "
                "host name in the registry URL)"
            )
        if self.outcome == NO_ROUTE:
            return f"{self.address}: {self.detail} (check the address and the network)"
        return f"{self.address}: {self.outcome}{f' ({self.detail})' if self.detail else ''}"


def _connect(host: str, port: int, timeout: float) -> HostAnswer:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return HostAnswer(host, port, OPEN)
    except socket.gaierror as exc:
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return HostAnswer(host, port, UNKNOWN_HOST, exc.strerror or str(exc))
        # EAI_AGAIN (no DNS server answered) and the like: not certain
        return HostAnswer(host, port, OTHER, exc.strerror or str(exc))
    except ConnectionRefusedError:
        return HostAnswer(host, port, REFUSED, "connection refused")
    except TimeoutError:
        return HostAnswer(host, port, NO_ANSWER, f"nothing answered within {timeout:g}s")
    except OSError as exc:
        outcome = NO_ROUTE if exc.errno in _NO_ROUTE_ERRNOS else OTHER
        return HostAnswer(host, port, outcome, exc.strerror or str(exc))


def probe(hosts: Sequence[tuple[str, int]], timeout: float = PROBE_TIMEOUT) -> list[HostAnswer]:
    """Connect to every host at once (a thread each), within about ``timeout``
    seconds in all; one answer per host, in order. A host whose thread has not ended
    by then (a name lookup that hangs) counts as no answer."""
    answers: list[HostAnswer | None] = [None] * len(hosts)

    def one(i: int, host: str, port: int) -> None:
        answers[i] = _connect(host, port, timeout)

    threads = [
        threading.Thread(target=one, args=(i, h, p), name="shardkeeper-probe", daemon=True)
        for i, (h, p) in enumerate(hosts)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 0.5)
    return [
        answer or HostAnswer(h, p, NO_ANSWER, f"nothing answered within {timeout:g}s")
        for answer, (h, p) in zip(answers, hosts, strict=True)
    ]


def refusal(backend: str, answers: Sequence[HostAnswer]) -> str | None:
    """The error to raise at once when every host failed for certain (refused, unknown
    host, no route), naming each; None when any host may still answer."""
    if not answers or any(a.outcome not in _CERTAIN for a in answers):
        return None
    where = ",".join(a.address for a in answers)
    return f"cannot reach {backend} at {where}: " + "; ".join(a.explain() for a in answers)


def silence_note(answers: Sequence[HostAnswer]) -> str:
    """``"; no answer from h:p (...)"`` for the hosts that never answered the probe
    (a black hole), to append to a "within the connection timeout" error; else ``""``."""
    silent = [a.address for a in answers if a.outcome == NO_ANSWER]
    if not silent:
        return ""
    return (
        f"; no answer from {', '.join(silent)}: packets to it are dropped (a firewall, "
        "or a host that is down or unplugged), or it is overloaded"
    )
