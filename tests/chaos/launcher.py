"""Starting chaos instances (tests/chaos/worker.py) as OS processes.

The same contract as tests/jobs/cluster.py's :class:`~tests.jobs.cluster.Cluster`
(``exec-N.jsonl`` and ``worker-N.log`` per process in ``workdir``, a READY line with
the instance id), for the multi-job worker: every instance runs every job of
``jobs``.
"""

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

from tests.chaos.worker import JobSpec
from tests.jobs.cluster import Instance

WORKER = str(Path(__file__).with_name("worker.py"))

__all__ = ["ChaosCluster"]


@dataclass
class ChaosCluster:
    """Starts multi-job workers against one registry URL."""

    url: str
    workdir: Path
    jobs: Sequence[JobSpec]
    grace: float = 10.0
    instances: list[Instance] = field(default_factory=list)

    def start(
        self, ready_timeout: float = 30, *, prefix: Sequence[str] = (), url: str | None = None
    ) -> Instance:
        """Start one worker and wait for its READY line (``prefix``: e.g. ``ip netns
        exec NAME``; ``url``: this worker's registry URL, e.g. through proxies)."""
        n = len(self.instances)
        log = self.workdir / f"exec-{n}.jsonl"
        errlog = self.workdir / f"worker-{n}.log"
        spec = json.dumps([j.to_dict() for j in self.jobs])
        args = [*prefix, sys.executable, WORKER, "--url", url or self.url, "--log", str(log)]
        args += ["--jobs", spec, "--grace", str(self.grace)]
        err = open(errlog, "w")  # noqa: SIM115 - the child owns it for its lifetime
        # the worker imports tests.chaos.worker's siblings: the repository root on the path
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH", "")) if x)
        proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=err, start_new_session=True, env=env
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

    def stop(self) -> None:
        """Stop every worker still running (SIGTERM, then kill)."""
        for inst in self.instances:
            if inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 15
        for inst in self.instances:
            try:
                inst.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                inst.kill()
            if inst.proc.stdout:
                inst.proc.stdout.close()
