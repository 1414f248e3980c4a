"""Test harness: instances of tests/jobs/worker.py as separate OS processes."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = str(Path(__file__).with_name("worker.py"))


@dataclass
class Instance:
    """One worker process."""

    proc: subprocess.Popen[bytes]
    log: Path
    errlog: Path
    instance_id: str = ""

    def kill(self) -> None:
        """kill -9."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def term(self, timeout: float = 20) -> int:
        """Graceful stop; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@dataclass
class Cluster:
    """Starts workers against one registry URL and reads what they executed."""

    url: str
    workdir: Path
    defaults: dict[str, Any] = field(default_factory=dict)
    instances: list[Instance] = field(default_factory=list)

    def start(
        self,
        ready_timeout: float = 30,
        *,
        prefix: Sequence[str] = (),
        url: str | None = None,
        **options: Any,
    ) -> Instance:
        """Start one worker and wait for its READY line.

        ``prefix`` is prepended to the command (``ip netns exec NAME`` runs the worker
        in a network namespace; the pid stays the worker's); ``url`` overrides the
        cluster's registry URL for this worker (e.g. through slow proxies).
        """
        n = len(self.instances)
        log = self.workdir / f"exec-{n}.jsonl"
        errlog = self.workdir / f"worker-{n}.log"
        args = [*prefix, sys.executable, WORKER, "--url", url or self.url, "--log", str(log)]
        for key, value in {**self.defaults, **options}.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False and value is not None:
                args += [flag, str(value)]
        err = open(errlog, "w")  # noqa: SIM115 - the child owns it for its lifetime
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        inst = Instance(proc, log, errlog)
        self.instances.append(inst)
        deadline = time.monotonic() + ready_timeout
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                buf += os.read(fd, 4096).decode(errors="replace")
            if "READY " in buf:
                inst.instance_id = buf.split("READY ", 1)[1].split()[0]
                return inst
            if "ERROR " in buf or proc.poll() is not None:
                raise RuntimeError(f"worker failed to start: {buf.strip()}\n{errlog.read_text()}")
        raise TimeoutError(f"worker not ready in {ready_timeout}s:\n{errlog.read_text()}")

    def records(self, phase: str = "end") -> list[dict[str, Any]]:
        """Every execution record of every instance so far."""
        out: list[dict[str, Any]] = []
        for path in sorted(self.workdir.glob("exec-*.jsonl")):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line torn by kill -9
                if rec.get("phase") == phase:
                    out.append(rec)
        return out

    def by_fire(
        self, phase: str = "end", *, misfire: bool = False
    ) -> dict[float, list[dict[str, Any]]]:
        """Records grouped by fire time (normal runs only, no failover; ``misfire``:
        misfire re-runs too, under the missed fire time they run for)."""
        out: dict[float, list[dict[str, Any]]] = {}
        for rec in self.records(phase):
            if rec["failover"] or (rec["misfire"] and not misfire):
                continue
            out.setdefault(round(rec["fire"], 3), []).append(rec)
        return out

    def stop(self) -> None:
        """Stop every worker still running (SIGTERM, then kill)."""
        for inst in self.instances:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for inst in self.instances:
            try:
                inst.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                inst.kill()
            if inst.proc.stdout:
                inst.proc.stdout.close()

    def logs(self) -> str:
        """Tail of every worker's log, for failure messages."""
        parts = []
        for path in sorted(self.workdir.glob("worker-*.log")):
            lines = path.read_text().splitlines()[-40:]
            parts.append(f"== {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)
