"""Scale: 100, 1,000, 5,000 jobs registered by one instance and by three.

Each instance is a child process (``python -m bench.scale --child``) so
its threads and memory are its own. It adds N jobs: N-1 idle ones (a once-a-year
cron: registered, watched, never fired during the run) and one probe job firing
every 0.5 s, whose lateness (start minus scheduled fire) is the trigger jitter
under that load. The child reports its start-up time (``Runtime.start()``: connect,
register every job, arm every trigger), its OS threads and RSS once started, and
the probe's jitter. While the children run, the parent reads the server's
watch count (ZooKeeper ``wchs``; etcd's ``etcd_debugging_mvcc_watcher_total``
metric) and the number of nodes in the namespace. Children are killed at the end
(a graceful stop of thousands of jobs is not what is measured).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import (
    BenchContext,
    BenchTimeoutError,
    proc_rss_mb,
    proc_threads,
    repo_pythonpath,
    summary,
)
from bench.jitter import LatenessJob
from shardkeeper.config import JobConfig
from shardkeeper.coordination.paths import JOBS
from shardkeeper.job import ShardedJob, ShardingContext
from shardkeeper.registry.base import CoordinationStore, join_path
from shardkeeper.registry.counting import request_count
from shardkeeper.testing.servers import ServerCluster, four_letter_word

YEARLY = "0 0 1 1 *"
PROBE_INTERVAL = 0.5
#: seconds the children of one case get to start (5,000 jobs is slow: see the docs)
START_DEADLINE = 300.0


class IdleJob(ShardedJob):
    """Never fires during a run; exists to be registered."""

    def execute(self, ctx: ShardingContext) -> None:
        """Nothing to do."""


def child(url: str, jobs: int, duration: float) -> int:
    """One instance: register ``jobs`` jobs, report, keep the probe running."""
    from shardkeeper.runtime import Runtime

    rt = Runtime(url)
    idle = IdleJob()
    for n in range(jobs - 1):
        rt.add_job(idle, JobConfig.parse(name=f"idle-{n:05d}", cron=YEARLY, sharding_total_count=1))
    probe = LatenessJob()
    rt.add_job(
        probe, JobConfig.parse(name="probe", interval=PROBE_INTERVAL, sharding_total_count=1)
    )
    t0 = time.monotonic()
    rt.start()
    startup = time.monotonic() - t0
    started = {
        "startup_s": startup,
        "threads": proc_threads(),
        "rss_mb": proc_rss_mb(),
        "startup_round_trips": request_count(rt.store),
    }
    print("STARTED " + json.dumps(started), flush=True)
    began = time.time()
    time.sleep(duration)
    late = [x for fire, x in probe.samples if fire >= began]
    print(
        "RESULT " + json.dumps({**started, "jitter": late, "rss_end_mb": proc_rss_mb()}), flush=True
    )
    os._exit(0)  # the parent kills us anyway; a graceful stop is not measured


def _watches(cluster: ServerCluster) -> int:
    host, port = cluster.hosts[0]
    if cluster.backend == "zookeeper":
        for line in four_letter_word(host, port, "wchs", timeout=5.0).splitlines():
            if line.startswith("Total watches:"):
                return int(line.split(":", 1)[1])
        return -1
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5.0) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
    return -1


def census(store: CoordinationStore) -> tuple[int, int]:
    """Nodes and bytes of values in the namespace, read job by job (one read of the
    whole namespace can exceed the client's 4 MiB message limit at this scale)."""
    nodes = 0
    size = 0
    for top in store.children("/"):
        subtrees = (
            [join_path(JOBS, j) for j in store.children(JOBS)] if "/" + top == JOBS else ["/" + top]
        )
        for sub in subtrees:
            tree = store.get_tree(sub)
            nodes += len(tree)
            size += sum(len(n.value) for n in tree.values())
    return nodes, size


def _read_line(proc: subprocess.Popen[bytes], tag: str, deadline: float, buf: list[str]) -> str:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        text = "".join(buf)
        if tag in text and "\n" in text.split(tag, 1)[1]:
            line = text.split(tag, 1)[1].split("\n", 1)[0]
            buf[:] = [text.split(tag, 1)[1].split("\n", 1)[1]]
            return line
        if select.select([fd], [], [], 0.2)[0]:
            chunk = os.read(fd, 65536).decode(errors="replace")
            if not chunk:  # end of file: the child has exited
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                break
            buf.append(chunk)
    raise BenchTimeoutError(f"scale child: no {tag.strip()} line in time (exit {proc.poll()})")


def _last_error(log: Path) -> str:
    """The last line of a child's stderr that names an exception, if any."""
    with contextlib.suppress(OSError):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if "Error" in ln]
        if lines:
            return lines[-1].strip()[:300]
    return ""


def case(ctx: BenchContext, backend: str, jobs: int, instances: int) -> dict[str, Any]:
    """N jobs on ``instances`` child processes started at once."""
    cluster = ctx.servers.get(backend)
    url = ctx.url(backend, f"scale{jobs}x{instances}")
    duration = 4.0 if ctx.quick else 10.0
    watches0 = _watches(cluster)
    scratch = ctx.scratch(f"scale-{backend}")
    procs: list[subprocess.Popen[bytes]] = []
    bufs: list[list[str]] = []
    try:
        for k in range(instances):
            with open(scratch / f"child-{k}.log", "wb") as err:
                procs.append(
                    subprocess.Popen(
                        [
                            *(sys.executable, "-m", "bench.scale", "--child", url),
                            *("--jobs", str(jobs), "--duration", str(duration)),
                        ],
                        stdout=subprocess.PIPE,
                        stderr=err,
                        start_new_session=True,
                        env={**os.environ, "PYTHONPATH": repo_pythonpath()},
                    )
                )
            bufs.append([])
        deadline = time.monotonic() + START_DEADLINE
        try:
            started = [
                json.loads(_read_line(p, "STARTED ", deadline, b))
                for p, b in zip(procs, bufs, strict=True)
            ]
        except BenchTimeoutError as exc:
            # say why: the child's own error (a server out of memory, a limit) if any
            why = "; ".join(
                e for k in range(instances) if (e := _last_error(scratch / f"child-{k}.log"))
            )
            raise BenchTimeoutError(f"{exc}: {why}" if why else str(exc)) from None
        watches = _watches(cluster) - watches0
        with ctx.store(url) as store:
            nodes, value_bytes = census(store)
        finals = [
            json.loads(_read_line(p, "RESULT ", time.monotonic() + duration + 120, b))
            for p, b in zip(procs, bufs, strict=True)
        ]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
            if p.stdout:
                p.stdout.close()
    jitter = [x for f in finals for x in f["jitter"]]
    result: dict[str, Any] = {
        "jobs": jobs,
        "instances": instances,
        "startup_s": summary([s["startup_s"] for s in started]),
        "threads": summary([float(s["threads"]) for s in started]),
        "rss_mb": summary([s["rss_mb"] for s in started]),
        "startup_round_trips": summary([float(s["startup_round_trips"]) for s in started]),
        "watches": watches,
        "nodes": nodes,
        "value_bytes": value_bytes,
        "jitter": summary(jitter),
    }
    ctx.log(
        f"  scale {backend} jobs={jobs} instances={instances}: start-up "
        f"{result['startup_s']['median']:.1f}s, threads {result['threads']['median']:.0f}, "
        f"RSS {result['rss_mb']['median']:.0f} MiB, watches {watches}, nodes {nodes} "
        f"({value_bytes / 1e6:.1f} MB), "
        f"probe jitter p50 {result['jitter'].get('median', float('nan')) * 1000:.1f} ms"
    )
    return result


def run(ctx: BenchContext, backend: str) -> dict[str, Any]:
    """Every size on one and on three instances; a case that fails (start-up over
    its deadline, server out of memory) is recorded and the larger ones skipped."""
    sizes = (100,) if ctx.quick else (100, 1000, 5000)
    cases: list[dict[str, Any]] = []
    failed = False
    for jobs in sizes:
        for k in (1, 3):
            if failed:
                cases.append(
                    {"jobs": jobs, "instances": k, "error": "skipped: a smaller case failed"}
                )
                continue
            try:
                cases.append(case(ctx, backend, jobs, k))
            except Exception as exc:
                failed = True
                ctx.log(f"  scale {backend} jobs={jobs} instances={k} FAILED: {exc}")
                cases.append(
                    {"jobs": jobs, "instances": k, "error": f"{type(exc).__name__}: {exc}"}
                )
    return {"cases": cases, "probe_interval": PROBE_INTERVAL}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child processes."""
    p = argparse.ArgumentParser(prog="python -m bench.scale")
    p.add_argument("--child", required=True, metavar="URL")
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--duration", type=float, default=10.0)
    args = p.parse_args(argv)
    return child(args.child, args.jobs, args.duration)


if __name__ == "__main__":
    sys.exit(main())
