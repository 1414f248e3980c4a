"""Start-up: one instance registers 5,000 jobs, next to a raw batched commit of the
same nodes.

The instance is a child process (``python -m bench.startup --child URL``): it adds
N idle jobs (a once-a-year cron, one item, the defaults otherwise: monitor_execution
on) and times ``Runtime.start()`` (connect, register every job, arm every trigger),
counting the requests its store sent (``round_trips``, the namespace watch's re-reads
included). It then checks, from its own state and one read of the namespace, that
every job is registered: a membership node and a stored config per job, and a leader
per job (this instance is alone). The child is killed afterwards: a graceful stop of
thousands of jobs is not what is measured.

The baseline, in the same run against the same server: one client writes the nodes a
registration ends up with (the job's node and its ``instances`` parent, config,
membership, leader, reshard flag: 6 nodes a job, with values of the same size) as
``Create`` commits as large as the store's operation and byte limits allow, the
fastest the store takes them. On etcd both are measured again with ``max_txn_ops`` as
high as the bench's server allows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from bench.common import (
    BENCH_ETCD_TXN_OPS,
    BenchContext,
    BenchTimeoutError,
    proc_threads,
    repo_pythonpath,
)
from bench.scale import YEARLY, IdleJob, _last_error, _read_line
from shardkeeper.config import JobConfig
from shardkeeper.coordination.config_service import encode_document
from shardkeeper.coordination.paths import JobPaths
from shardkeeper.registry.base import Create, Op
from shardkeeper.registry.counting import request_count
from shardkeeper.registry.packing import pack_groups

#: jobs registered by the instance (quick and full run alike: the issue's figure)
JOBS = 5000
#: seconds the child gets to start and report
START_DEADLINE = 300.0


def _config(n: int) -> JobConfig:
    return JobConfig.parse(name=f"idle-{n:05d}", cron=YEARLY, sharding_total_count=1)


def child(url: str, jobs: int) -> int:
    """One instance: register ``jobs`` jobs, time it, check the result, report."""
    from shardkeeper.runtime import Runtime

    rt = Runtime(url)
    idle = IdleJob()
    for n in range(jobs):
        rt.add_job(idle, _config(n))
    t0 = time.monotonic()
    rt.start()
    startup = time.monotonic() - t0
    requests = request_count(rt.store)
    runners = rt.runners.values()
    report = {
        "startup_s": startup,
        "round_trips": requests,
        "threads": proc_threads(),
        "registered": sum(1 for r in runners if r.state.registered),
        "leading": sum(1 for r in runners if r.election.is_leader),
        # the registration alone (the rest of start(): runners and triggers)
        "register_s": rt.registrar.seconds if rt.registrar else None,
        **(rt.registrar.stats if rt.registrar else {}),
    }
    # what the store holds (one listing per level: the child is alone in its namespace)
    jobs_seen = rt.store.children("/jobs")
    report["stored_jobs"] = len(jobs_seen)
    print("STARTED " + json.dumps(report), flush=True)
    os._exit(0)  # the parent kills us anyway


def baseline(
    ctx: BenchContext, backend: str, jobs: int, options: dict[str, int] | None = None
) -> dict[str, Any]:
    """The raw batched commit of the nodes ``jobs`` registrations write."""
    url = ctx.url(backend, f"startup-raw{jobs}", **(options or {}))
    config = encode_document(_config(0), writer="instance", by="bench@1", revision=1)
    member = b'{"instance_id":"bench@1@x","host":"bench","pid":1,"version":"0","labels":{}}'
    with ctx.store(url) as store:
        me = "bench@1@x"
        groups: list[list[Op]] = []
        for n in range(jobs):
            p = JobPaths(f"idle-{n:05d}")
            groups.append(
                [
                    # the parents: ZooKeeper needs real ones (a commit makes the missing
                    # parents of few paths only), etcd stores them as keys
                    Create(p.root),
                    Create(p.instances),
                    Create(p.config, config),
                    Create(p.instance(me), member, ephemeral=True),
                    Create(p.leader, me.encode(), ephemeral=True),
                    Create(p.necessary, b"instance joined"),
                ]
            )
        # as many jobs a commit as the store's operation and byte limits allow
        chunks = pack_groups(store, groups)
        rt0 = request_count(store)
        t0 = time.monotonic()
        for n, (_, ops) in enumerate(chunks):
            if not store.commit(ops):
                raise RuntimeError(f"baseline commit {n} failed")
        seconds = time.monotonic() - t0
        return {
            "seconds": seconds,
            "round_trips": request_count(store) - rt0,
            "nodes": sum(len(g) for g in groups),
            "commits": len(chunks),
        }


def instance(
    ctx: BenchContext, backend: str, jobs: int, options: dict[str, int] | None = None
) -> dict[str, Any]:
    """The child instance's start-up (see module docstring)."""
    url = ctx.url(backend, f"startup{jobs}", **(options or {}))
    scratch = ctx.scratch(f"startup-{backend}")
    with open(scratch / "child.log", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.startup", "--child", url, "--jobs", str(jobs)],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": repo_pythonpath()},
        )
    try:
        try:
            line = _read_line(proc, "STARTED ", time.monotonic() + START_DEADLINE, [])
        except BenchTimeoutError as exc:
            why = _last_error(scratch / "child.log")
            raise BenchTimeoutError(f"{exc}: {why}" if why else str(exc)) from None
        started: dict[str, Any] = json.loads(line)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    return started


def measure(
    ctx: BenchContext, backend: str, jobs: int, options: dict[str, int] | None = None
) -> dict[str, Any]:
    """The raw baseline, then the instance, with ``options`` in both registry URLs."""
    shown = "".join(f" {k}={v}" for k, v in (options or {}).items())
    raw = baseline(ctx, backend, jobs, options)
    ctx.log(
        f"  startup {backend}{shown} baseline: {raw['nodes']:,} nodes in {raw['commits']} "
        f"commits, {raw['seconds']:.2f}s, {raw['round_trips']:,} requests"
    )
    started = instance(ctx, backend, jobs, options)
    result = {
        "jobs": jobs,
        "baseline": raw,
        **started,
        "url_options": dict(options or {}),
        "requests_per_job": started["round_trips"] / jobs,
        "ratio_to_baseline": started["startup_s"] / raw["seconds"] if raw["seconds"] else None,
    }
    ctx.log(
        f"  startup {backend}{shown} jobs={jobs}: {started['startup_s']:.2f}s "
        f"(baseline {raw['seconds']:.2f}s, x{result['ratio_to_baseline']:.1f}), "
        f"{started['round_trips']:,} requests ({result['requests_per_job']:.1f}/job), "
        f"registration alone {started['register_s']:.2f}s in {started['batch_commits']} batch "
        f"commits, registered {started['registered']:,}, leading {started['leading']:,}, "
        f"stored {started['stored_jobs']:,}"
    )
    return result


def run(ctx: BenchContext, backend: str, jobs: int = JOBS) -> dict[str, Any]:
    """:func:`measure` at the store's defaults; on etcd also with ``max_txn_ops`` as
    high as the bench's server allows (``variants``)."""
    result = measure(ctx, backend, jobs)
    if backend == "etcd":
        options = {"max_txn_ops": BENCH_ETCD_TXN_OPS}
        try:
            result["variants"] = [measure(ctx, backend, jobs, options)]
        except Exception as exc:  # reported next to the default's figures, not instead
            ctx.log(f"  startup {backend} max_txn_ops={options['max_txn_ops']}: {exc!r}")
            result["variant_error"] = f"max_txn_ops={options['max_txn_ops']}: {exc!r}"
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child process."""
    p = argparse.ArgumentParser(prog="python -m bench.startup")
    p.add_argument("--child", required=True, metavar="URL")
    p.add_argument("--jobs", type=int, default=JOBS)
    args = p.parse_args(argv)
    return child(args.child, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
