"""Import and CLI start: what ``import shardkeeper`` and the ``shardkeeper`` command cost.

``python -m bench.startup_imports [--runs 10] [--registry URL]`` prints, each as the
median (and min-max) of ``--runs`` fresh processes:

* ``import shardkeeper`` (and ``shardkeeper.Runtime``, which pulls the runtime in): the
  cumulative time ``python -X importtime`` reports for the top-level module, and the
  wall time of the whole process (interpreter start included);
* ``shardkeeper --help`` and ``shardkeeper status`` (the console script next to this
  interpreter): the wall time of the process.

``status`` needs a registry: ``--registry`` (or ``SHARDKEEPER_REGISTRY``), else a
throwaway single-member ZooKeeper is started for the run (the test servers' machinery)
and stopped at the end. Next to each figure it names which of the heavy libraries the
process imported, so a lazy import that stopped being lazy shows as a name, not only
as milliseconds. This is a benchmark that prints numbers (docs/benchmarks.md, "Import
and CLI start"), not a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

#: the libraries whose import is what this benchmark watches
HEAVY = (
    "pydantic",
    "apscheduler",
    "kazoo",
    "etcd3",
    "sqlalchemy",
    "typer",
    "rich",
    "prometheus_client",
    "httpx",
    "yaml",
    "fastapi",
)

#: prints the heavy top-level modules present after the statement ran
_PROBE = (
    "import sys; "
    "print('HEAVY=' + ','.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)"
)


def _importtime_total(stderr: str, module: str) -> float | None:
    """The cumulative microseconds ``-X importtime`` gives ``module``'s own line."""
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = [p.strip() for p in line[len("import time:") :].split("|")]
        if len(parts) == 3 and parts[2] == module:
            return float(parts[1])
    return None


def _heavy(stderr: str) -> str:
    for line in stderr.splitlines():
        if line.startswith("HEAVY="):
            return line[len("HEAVY=") :] or "(none)"
    return "?"


def _fmt(samples: Sequence[float]) -> str:
    return (
        f"median {statistics.median(samples) * 1000:7.1f} ms "
        f"(min {min(samples) * 1000:.1f}, max {max(samples) * 1000:.1f})"
    )


def measure_import(statement: str, module: str, runs: int) -> None:
    """Time ``python -X importtime -c statement`` ``runs`` times; print the medians."""
    code = f"{statement}; {_PROBE.format(heavy=HEAVY)}"
    import_s: list[float] = []
    wall_s: list[float] = []
    heavy = "?"
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        wall_s.append(time.perf_counter() - started)
        total = _importtime_total(done.stderr, module)
        if total is not None:
            import_s.append(total / 1e6)
        heavy = _heavy(done.stderr)
    print(f"{statement!r}")
    if import_s:
        print(f"  -X importtime of {module}: {_fmt(import_s)}")
    print(f"  process wall time:        {_fmt(wall_s)}")
    print(f"  heavy modules imported:   {heavy}")


def measure_command(argv: list[str], runs: int, env: dict[str, str]) -> None:
    """Time the process ``argv`` ``runs`` times; print the median wall time."""
    wall_s: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        wall_s.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
    # which heavy modules the same command imports: run it in-process under a probe
    probe = (
        "import sys; from shardkeeper.cli import main; "
        f"rc = main({argv[1:]!r}); {_PROBE.format(heavy=HEAVY)}"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    print(f"shardkeeper {' '.join(argv[1:])}")
    print(f"  process wall time:        {_fmt(wall_s)}")
    print(f"  heavy modules imported:   {_heavy(done.stderr)}")


@contextlib.contextmanager
def _registry(url: str | None) -> Iterator[str]:
    """``url``, or a throwaway single-member ZooKeeper's for the run."""
    if url:
        yield url
        return
    from shardkeeper.testing.servers import ZooKeeperCluster

    with tempfile.TemporaryDirectory(prefix="bench-startup-imports-") as tmp:
        cluster = ZooKeeperCluster(size=1, base_dir=Path(tmp))
        cluster.start()
        try:
            yield cluster.url("bench-startup-imports")
        finally:
            cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurements and print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.startup_imports")
    parser.add_argument("--runs", type=int, default=10, help="processes per figure")
    parser.add_argument(
        "--registry",
        default=os.environ.get("SHARDKEEPER_REGISTRY"),
        help="the registry URL for `status` (default: a throwaway ZooKeeper)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    script = str(Path(sys.executable).with_name("shardkeeper"))
    print(f"python {sys.version.split()[0]}, {args.runs} runs per figure")
    measure_import("import shardkeeper", "shardkeeper", args.runs)
    measure_import("import shardkeeper; shardkeeper.Runtime", "shardkeeper", args.runs)
    env = dict(os.environ)
    measure_command([script, "--help"], args.runs, env)
    with _registry(args.registry) as url:
        env["SHARDKEEPER_REGISTRY"] = url
        measure_command([script, "status"], args.runs, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
