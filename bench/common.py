"""Shared machinery of the benchmarks: servers, statistics, bounded waits, /proc probes.

Every benchmark module exposes ``run(ctx: BenchContext, backend: str) -> dict``; the
dict is JSON-ready and holds the raw samples next to the summaries, so the markdown
report and the plots can be regenerated from ``.bench/*.json`` alone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from shardkeeper.registry import CoordinationStore, open_store
from shardkeeper.testing.servers import EtcdCluster, ServerCluster, ZooKeeperCluster

__all__ = [
    "BACKENDS",
    "BenchContext",
    "BenchTimeoutError",
    "Servers",
    "Worker",
    "proc_rss_mb",
    "proc_threads",
    "repo_pythonpath",
    "summary",
    "wait_until",
]

BACKENDS = ("zookeeper", "etcd")
#: the bench's ZooKeeper heap: one server holds every case's nodes (the 5,000-job
#: start-up alone writes 60,000), and the test servers' 96 MB makes a full heap's
#: garbage collection, not the client, the measured cost; a production ensemble has
#: gigabytes
BENCH_ZK_HEAP_MB = 1024

#: the bench's etcd server allows this many operations per transaction
#: (``--max-txn-ops``); clients use etcd's default 128 unless their URL says
#: ``max_txn_ops`` (the coordination-cost case measures both)
BENCH_ETCD_TXN_OPS = 4096

T = TypeVar("T")


class BenchTimeoutError(RuntimeError):
    """A bounded wait of the harness ran out (the message says what it waited for)."""


def wait_until(
    what: str, predicate: Callable[[], T | None], timeout: float, poll: float = 0.02
) -> T:
    """Poll ``predicate`` until it returns a truthy value; raise after ``timeout`` s.

    Every wait in the harness goes through here so that no benchmark can hang.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchTimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; NaN when empty."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(samples: Sequence[float]) -> dict[str, float]:
    """n, median, p95, p99, min, max and the interquartile spread of ``samples``."""
    if not samples:
        return {"n": 0}
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "p95": percentile(samples, 95),
        "p99": percentile(samples, 99),
        "min": min(samples),
        "max": max(samples),
        "iqr": percentile(samples, 75) - percentile(samples, 25),
    }


def proc_status(pid: int | str = "self") -> dict[str, str]:
    """The fields of /proc/PID/status."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def proc_rss_mb(pid: int | str = "self") -> float:
    """Resident set size of a process in MiB (0 if it is gone)."""
    raw = proc_status(pid).get("VmRSS", "0 kB").split()[0]
    return int(raw) / 1024.0


def proc_threads(pid: int | str = "self") -> int:
    """OS threads of a process (Python threads plus native ones, e.g. gRPC's)."""
    return int(proc_status(pid).get("Threads", "0"))


@dataclass
class Servers:
    """One single-member server per backend, started on first use, all stopped at exit."""

    base_dir: Path
    clusters: dict[str, ServerCluster] = field(default_factory=dict)

    def get(self, backend: str) -> ServerCluster:
        """The started server of ``backend``."""
        found = self.clusters.get(backend)
        if found is not None:
            return found
        cluster: ServerCluster = (
            ZooKeeperCluster(size=1, base_dir=self.base_dir / backend, heap_mb=BENCH_ZK_HEAP_MB)
            if backend == "zookeeper"
            else EtcdCluster(
                size=1, base_dir=self.base_dir / backend, max_txn_ops=BENCH_ETCD_TXN_OPS
            )
        )
        cluster.start()
        self.clusters[backend] = cluster
        return cluster

    def stop(self) -> None:
        """Stop every server (idempotent)."""
        for cluster in self.clusters.values():
            with contextlib.suppress(Exception):
                cluster.stop()
        self.clusters.clear()


@dataclass
class BenchContext:
    """What every benchmark gets: the mode, the servers and a scratch directory."""

    quick: bool
    servers: Servers
    workdir: Path
    log: Callable[[str], None] = print

    def url(self, backend: str, prefix: str, **options: float | str) -> str:
        """A registry URL on a fresh namespace of ``backend``'s server."""
        namespace = f"bench-{prefix}-{uuid.uuid4().hex[:8]}"
        return self.servers.get(backend).url(namespace, **options)

    @contextlib.contextmanager
    def store(self, url: str) -> Iterator[CoordinationStore]:
        """A started store on ``url``, closed on exit."""
        store = open_store(url)
        store.start()
        try:
            yield store
        finally:
            store.close()

    def scratch(self, name: str) -> Path:
        """A new empty directory under the work directory."""
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))


def repo_pythonpath() -> str:
    """PYTHONPATH for child processes: the harness lives next to the package, not in
    it, so they find it from the repository root."""
    root = str(Path(__file__).resolve().parents[1])
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)


@dataclass
class Worker:
    """One bench worker process (``python -m bench.worker``)."""

    proc: subprocess.Popen[bytes]
    records: Path
    errlog: Path
    instance_id: str = ""
    #: wall time at which the worker's runtime had started (registered)
    ready_at: float = 0.0

    @classmethod
    def start(
        cls,
        url: str,
        records: Path,
        *,
        record: bool = True,
        ready_timeout: float = 60.0,
        **options: Any,
    ) -> Worker:
        """Launch a worker and wait (bounded) until its runtime has started.

        ``records`` names the execution record file (written only when ``record``);
        the worker's stderr goes next to it (``.log``).
        """
        args = [sys.executable, "-m", "bench.worker", "--url", url]
        if record:
            args += ["--records", str(records)]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False and value is not None:
                args += [flag, str(value)]
        errlog = records.with_suffix(".log")
        with open(errlog, "wb") as err:
            proc = subprocess.Popen(
                args,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": repo_pythonpath()},
            )
        worker = cls(proc, records, errlog)
        try:
            worker._wait_ready(ready_timeout)
        except BaseException:
            worker.kill()
            raise
        return worker

    def _wait_ready(self, timeout: float) -> None:
        import select

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096).decode(errors="replace")
                buf += chunk
                if not chunk and self.proc.poll() is not None:
                    break
            if "READY " in buf and "\n" in buf.split("READY ", 1)[1]:
                fields = buf.split("READY ", 1)[1].split()
                self.instance_id = fields[0]
                self.ready_at = float(fields[1]) if len(fields) > 1 else time.time()
                return
            if self.proc.poll() is not None:
                break
        raise BenchTimeoutError(
            f"bench worker not ready within {timeout:g}s (exit {self.proc.poll()}): "
            f"{buf.strip()} {self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        """The end of the worker's stderr, for error messages."""
        with contextlib.suppress(OSError):
            return "\n".join(self.errlog.read_text(errors="replace").splitlines()[-lines:])
        return ""

    @property
    def alive(self) -> bool:
        """The process has not exited."""
        return self.proc.poll() is None

    def kill(self) -> float:
        """kill -9 the worker's process group; returns the wall time of the signal."""
        at = time.time()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self._close()
        return at

    def term(self, timeout: float = 20.0) -> None:
        """Graceful stop (SIGTERM), then kill -9 if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close()

    def _close(self) -> None:
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()


def read_records(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every JSON line of the workers' record files (torn lines skipped)."""
    out: list[dict[str, Any]] = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


@contextlib.contextmanager
def workers_cleanup(workers: list[Worker]) -> Iterator[list[Worker]]:
    """Kill every worker in ``workers`` on exit, whatever happened."""
    try:
        yield workers
    finally:
        for w in workers:
            w.kill()
