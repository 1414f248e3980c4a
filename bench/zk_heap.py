"""How much ZooKeeper heap a large job needs: one job of N no-op items every few
seconds on M instances (separate processes) against a fresh single ZooKeeper server
of a given heap, for a fixed time, with the server's heap and tree sampled.

Run from the repository root (not part of ``make bench``; about 2.5 minutes)::

    .venv/bin/python -m bench.zk_heap --heap-mb 96     # the old test-server heap
    .venv/bin/python -m bench.zk_heap --heap-mb 256

Samples, every ``--sample`` seconds: the JVM heap in use (``jcmd <pid> GC.heap_info``:
young + old generation used, garbage included), and ``mntr``: znodes, approximate
data size (bytes of node paths and values), watches, outstanding requests. Every
``--live-every`` samples a full collection is forced first (``jcmd <pid> GC.run``),
so that sample is the live set: what the server really holds. Prints one JSON
object: the peaks, the live set, bytes of live heap per znode, and the executions
the instances ran (to see the job kept up), and whether the server survived
(``OutOfMemoryError`` in its log, or its process gone).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Worker
from shardkeeper.testing.servers import ZooKeeperCluster
from shardkeeper.testing.servers.zookeeper import four_letter_word

_USED = re.compile(r"(?:new generation|tenured generation)\s+total\s+(\d+)K,\s+used\s+(\d+)K")


def heap_used_kb(pid: int) -> tuple[int, int]:
    """(used, committed) KiB of the serial collector's two generations of ``pid``."""
    out = subprocess.run(
        ["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=20
    ).stdout
    found = _USED.findall(out)
    if not found:
        raise RuntimeError(f"jcmd GC.heap_info of {pid} gave no serial-GC lines: {out[:300]}")
    return sum(int(u) for _t, u in found), sum(int(t) for t, _u in found)


def full_gc(pid: int) -> None:
    """Force a full collection of ``pid`` (the next heap reading is the live set)."""
    subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60, check=False)


def mntr(host: str, port: int) -> dict[str, int]:
    """The numeric ``mntr`` values of the server."""
    values: dict[str, int] = {}
    for line in four_letter_word(host, port, "mntr", 5.0).splitlines():
        key, _, raw = line.partition("\t")
        if raw.strip().lstrip("-").isdigit():
            values[key] = int(raw)
    return values


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; print its JSON summary."""
    p = argparse.ArgumentParser(prog="python -m bench.zk_heap")
    p.add_argument("--heap-mb", type=int, required=True)
    p.add_argument("--items", type=int, default=6000)
    p.add_argument("--interval", type=float, default=3.0)
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--sample", type=float, default=2.0)
    p.add_argument("--live-every", type=int, default=10)
    p.add_argument("--no-failover", action="store_true")
    p.add_argument(
        "--histogram", action="store_true", help="print the live heap's top classes at the end"
    )
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="zk-heap-"))
    cluster = ZooKeeperCluster(size=1, base_dir=work / "zk", heap_mb=args.heap_mb)
    cluster.start()
    member = cluster.members[0]
    pid = member.pid
    assert pid is not None
    host, port = cluster.hosts[0]
    workers: list[Worker] = []
    samples: list[dict[str, Any]] = []
    died_at: float | None = None
    try:
        url = cluster.url("heap")  # the defaults a new user gets
        for i in range(args.instances):
            workers.append(
                Worker.start(
                    url,
                    work / f"w{i}.jsonl",
                    ready_timeout=120,
                    count=args.items,
                    interval=args.interval,
                    failover=not args.no_failover,
                )
            )
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < args.seconds:
            time.sleep(args.sample)  # a sampling period, not a synchronisation
            n += 1
            if not member.alive():
                died_at = time.monotonic() - began
                break
            live = n % args.live_every == 0
            if live:
                full_gc(pid)
            try:
                used, committed = heap_used_kb(pid)
                tree = mntr(host, port)
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
                samples.append({"t": round(time.monotonic() - began, 1), "error": str(exc)})
                continue
            samples.append(
                {
                    "t": round(time.monotonic() - began, 1),
                    "live": live,
                    "heap_used_mb": round(used / 1024, 1),
                    "heap_committed_mb": round(committed / 1024, 1),
                    "znodes": tree.get("zk_znode_count", 0),
                    "data_bytes": tree.get("zk_approximate_data_size", 0),
                    "watches": tree.get("zk_watch_count", 0),
                    "outstanding": tree.get("zk_outstanding_requests", 0),
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    finally:
        if args.histogram and member.alive():
            top = subprocess.run(
                ["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=60
            ).stdout.splitlines()[:14]
            print("\n".join(top), file=sys.stderr, flush=True)
        for w in workers:
            w.term()
        log = member.log_path.read_text(errors="replace") if member.log_path.exists() else ""
        cluster.stop()
    ok = [s for s in samples if "heap_used_mb" in s]
    live = [s for s in ok if s["live"]]
    executions = sum(w.records.read_bytes().count(b"\n") for w in workers if w.records.exists())
    peak_live = max(live, key=lambda s: s["heap_used_mb"]) if live else None
    summary = {
        "heap_mb": args.heap_mb,
        "items": args.items,
        "interval": args.interval,
        "instances": args.instances,
        "seconds": args.seconds,
        "failover": not args.no_failover,
        "server_died_at": died_at,
        "out_of_memory": "OutOfMemoryError" in log,
        "executions": executions,
        "expected_executions": int(args.seconds / args.interval) * args.items,
        "peak_heap_used_mb": max((s["heap_used_mb"] for s in ok), default=None),
        "peak_live_mb": peak_live["heap_used_mb"] if peak_live else None,
        "peak_znodes": max((s["znodes"] for s in ok), default=None),
        "peak_data_bytes": max((s["data_bytes"] for s in ok), default=None),
        "peak_watches": max((s["watches"] for s in ok), default=None),
        "live_bytes_per_znode_at_peak": (
            round(peak_live["heap_used_mb"] * 2**20 / peak_live["znodes"])
            if peak_live and peak_live["znodes"]
            else None
        ),
        "workdir": str(work),
    }
    print(json.dumps(summary, indent=1))
    return 0 if died_at is None and not summary["out_of_memory"] else 1


if __name__ == "__main__":
    sys.exit(main())
