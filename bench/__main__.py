"""``python -m bench [--quick]``: run the benchmarks, write JSON, docs and plots.

Results go to ``.bench/<benchmark>.json`` (one file per benchmark, both backends);
the markdown table is written into docs/benchmarks.md between the markers and the
plots into docs/img/. ``--only`` picks benchmarks, ``--backend`` one backend,
``--report-only`` re-renders the docs from the JSON already in ``.bench/``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    busy_failover,
    coordination_cost,
    failover,
    jitter,
    many_jobs,
    overload,
    report,
    resharding,
    scale,
    startup,
    throughput,
)
from bench.common import BACKENDS, BenchContext, Servers

BenchFn = Callable[[BenchContext, str], dict[str, Any]]

#: name -> function, in the order they run (cheap and precise first)
BENCHMARKS: dict[str, BenchFn] = {
    "coordination_cost": coordination_cost.run,
    "resharding": resharding.run,
    "throughput": throughput.run,
    "jitter": jitter.run,
    "failover": failover.run,
    "busy_failover": busy_failover.run,
    "overload": overload.run,
    "startup": startup.run,
    "scale": scale.run,
    "many_jobs": many_jobs.run,
}


def environment() -> dict[str, Any]:
    """What the numbers were measured on."""
    import os

    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def run_all(
    names: list[str],
    backends: list[str],
    *,
    quick: bool,
    out_dir: Path,
    log: Callable[[str], None] = print,
) -> dict[str, dict[str, Any]]:
    """Run ``names`` on ``backends``; write one JSON file per benchmark; return them.

    A benchmark that fails on one backend records its error and the others still run.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="shardkeeper-bench-"))
    servers = Servers(workdir / "servers")
    ctx = BenchContext(quick=quick, servers=servers, workdir=workdir, log=log)
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            doc: dict[str, Any] = {
                "benchmark": name,
                "quick": quick,
                "environment": environment(),
                "backends": {},
            }
            for backend in backends:
                began = time.monotonic()
                log(f"[{name}] {backend} ...")
                try:
                    doc["backends"][backend] = BENCHMARKS[name](ctx, backend)
                except Exception as exc:
                    log(f"[{name}] {backend} FAILED: {exc}")
                    doc["backends"][backend] = {
                        "error": f"{type(exc).__name__}: {exc}",
                        "traceback": traceback.format_exc(),
                    }
                doc["backends"][backend]["seconds"] = time.monotonic() - began
                log(f"[{name}] {backend} done in {time.monotonic() - began:.1f}s")
            (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
            results[name] = doc
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small cases only (about 6 minutes)")
    p.add_argument("--only", action="append", choices=list(BENCHMARKS), help="repeatable")
    p.add_argument("--backend", action="append", choices=list(BACKENDS), help="repeatable")
    p.add_argument("--out", default=".bench", help="directory of the JSON results")
    p.add_argument("--docs", default="docs/benchmarks.md", help="markdown file to update")
    p.add_argument("--img", default="docs/img", help="directory of the plots")
    p.add_argument("--no-docs", action="store_true", help="write the JSON only")
    p.add_argument("--report-only", action="store_true", help="re-render docs from --out")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    out_dir = Path(args.out)
    names = args.only or list(BENCHMARKS)
    began = time.monotonic()
    if not args.report_only:
        run_all(names, args.backend or list(BACKENDS), quick=args.quick, out_dir=out_dir)
    if not args.no_docs:
        loaded = report.load(out_dir)
        report.write_docs(loaded, Path(args.docs), Path(args.img))
        print(f"wrote {args.docs} and plots under {args.img}/")
    print(f"bench finished in {time.monotonic() - began:.0f}s; results in {out_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
