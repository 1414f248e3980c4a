"""Every example runs for real against a real store (both backends).

Each example's job is added to a Runtime exactly as the example defines it, asked
to run now through the registry (the same "trigger" node ``shardkeeper trigger``
writes), and the test waits, with a deadline, for an execution and its effect.
The programs themselves (script, CLI, embedded service) run as subprocesses and
must stop gracefully on SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shardkeeper._imports import import_object
from shardkeeper.config import load_job_configs
from shardkeeper.coordination.paths import job_paths
from shardkeeper.job import ShardedJob
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import free_ports

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example(name: str) -> ModuleType:
    """Import ``examples.<name>`` from the repository root."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"examples.{name}")


@contextlib.contextmanager
def running(registry_url: str, job: ShardedJob) -> Iterator[Runtime]:
    """A started runtime with ``job`` (its own class config); stopped afterwards."""
    runtime = Runtime(registry_url, worker_threads=4, shutdown_grace=5.0)
    runtime.add_job(job)
    runtime.start()
    try:
        yield runtime
    finally:
        runtime.stop()


def run_now(store: CoordinationStore, runtime: Runtime, job_name: str) -> None:
    """Ask the instance to fire the job now, rather than wait for its cron."""
    store.put(job_paths(job_name).trigger(runtime.instance_id), b"")


def stats(runtime: Runtime, job_name: str) -> dict[str, int]:
    """The runner's counters of one job."""
    return runtime.runners[job_name].stats


# -- the jobs, in process ------------------------------------------------------------


def test_simple_job(registry_url: str, store: CoordinationStore) -> None:
    mod = example("simple_job")
    job = mod.CityReport()
    with running(registry_url, job) as runtime:
        run_now(store, runtime, "city-report")
        wait_until(
            lambda: len(job.reported) == 4,
            timeout=20,
            message=lambda: f"all 4 cities reported once; got {job.reported}",
        )
        assert sorted(job.reported) == ["amsterdam", "berlin", "cairo", "delhi"]
        assert stats(runtime, "city-report")["failed"] == 0


def test_dataflow_job_streams_until_drained(registry_url: str, store: CoordinationStore) -> None:
    mod = example("dataflow_job")
    job = mod.OrderStream(orders=40)
    with running(registry_url, job) as runtime:
        run_now(store, runtime, "order-stream")
        # one trigger drains everything: streaming keeps fetching until a fetch is empty
        wait_until(
            lambda: len(job.backlog) == 0,
            timeout=20,
            message=lambda: f"backlog drained; {len(job.backlog)} orders left",
        )
        wait_until(lambda: stats(runtime, "order-stream")["executed"] == 4, timeout=10)
        assert sorted(job.processed) == list(range(40))
        assert stats(runtime, "order-stream")["failed"] == 0


def test_checkpointed_job_carries_its_cursor_across_fires(
    registry_url: str, store: CoordinationStore, tmp_path: Path
) -> None:
    """The checkpointed example in worker processes: each run-now imports the next
    three batches of each shard, starting where the previous fire's last checkpoint
    left it (``checkpoint_carry``), so no batch is imported twice or skipped."""
    mod = example("checkpointed_job")
    per_fire = 3  # short batches: the defaults are sized for killing one by hand

    def imported(item: int) -> list[int]:
        log = tmp_path / f"shard-{item}.log"
        return (
            [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []
        )

    # the instance (and its output directory) is pickled for the worker processes
    job = mod.LedgerImport(out=tmp_path, batches=per_fire, batch_seconds=0.2)
    with running(registry_url, job) as runtime:
        for fire in (1, 2):
            run_now(store, runtime, "ledger-import")
            done = fire * per_fire

            def caught_up(done: int = done) -> bool:
                return all(len(imported(i)) >= done for i in (0, 1))

            wait_until(
                caught_up,
                timeout=40,
                message=lambda: f"imported {imported(0)} / {imported(1)}",
            )
        assert imported(0) == imported(1) == list(range(2 * per_fire))
        assert stats(runtime, "ledger-import").get("failed", 0) == 0


def test_checkpointed_job_leaves_time_to_kill_an_import_by_hand(tmp_path: Path) -> None:
    """By default an import runs 10 s of every 20 s (5 batches of 2 s; before: 0.6 s a
    minute, too short to kill by hand); LEDGER_BATCHES and LEDGER_BATCH_SECONDS tune
    it; a bad value is refused naming it."""
    show = (
        "import examples.checkpointed_job as m; j = m.LedgerImport(out=__import__('pathlib')"
        f".Path({str(tmp_path)!r})); print(j.batches, j.batch_seconds, j.config.cron)"
    )

    def shown(**env: str) -> list[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
        done = subprocess.run(
            [sys.executable, "-c", show],
            cwd=ROOT,
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.split(maxsplit=2)

    batches, seconds, cron = shown()
    assert cron.strip() == "*/20 * * * * *"
    assert int(batches) * float(seconds) >= 10.0
    assert shown(LEDGER_BATCHES="2", LEDGER_BATCH_SECONDS="0.5")[:2] == ["2", "0.5"]
    mod = example("checkpointed_job")
    with pytest.raises(ValueError, match=r"batch_seconds=-1\.0: give 0 or more"):
        mod.LedgerImport(out=tmp_path, batch_seconds=-1.0)
    with pytest.raises(ValueError, match="batches=0: give 1 or more"):
        mod.LedgerImport(out=tmp_path, batches=0)


def test_script_job_runs_the_command(registry_url: str, store: CoordinationStore) -> None:
    mod = example("script_job")
    job = mod.Thumbnailer()
    with running(registry_url, job) as runtime:
        run_now(store, runtime, "thumbnailer")
        wait_until(
            lambda: stats(runtime, "thumbnailer")["executed"] >= 1,
            timeout=20,
            message="one execution of the thumbnailer command",
        )
        assert stats(runtime, "thumbnailer")["failed"] == 0
        assert "thumbnails of bucket images-" in getattr(job, "last_output", "")


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_embedded_service_runs_job_and_serves(registry_url: str, store: CoordinationStore) -> None:
    mod = example("embedded_service")
    job = mod.CacheWarmer()
    with (
        running(registry_url, job) as runtime,
        mod.serving(mod.build_server(runtime, job, "127.0.0.1", 0)) as server,
    ):
        base = f"http://127.0.0.1:{server.server_port}"
        assert _get(base + "/healthz") == (200, {"ok": True})
        run_now(store, runtime, "cache-warmer")
        wait_until(
            lambda: len(job.snapshot()) == len(mod.REGIONS),
            timeout=20,
            message=lambda: f"every region warmed; got {sorted(job.snapshot())}",
        )
        code, body = _get(base + "/")
        assert code == 200
        assert body["instance"] == runtime.instance_id
        assert sorted(body["owned_regions"]) == sorted(mod.REGIONS)  # the only instance
        assert sorted(body["warmed"]) == sorted(mod.REGIONS)
        assert _get(base + "/nowhere")[0] == 404


def test_jobs_yaml_matches_the_example_classes() -> None:
    example("simple_job")  # makes the examples package importable
    configs = load_job_configs(EXAMPLES / "jobs.yaml")
    assert [c.name for c in configs] == ["city-report", "order-stream", "thumbnailer"]
    for config in configs:
        assert config.job_class is not None
        cls = import_object(config.job_class, "job class")
        assert isinstance(cls, type) and issubclass(cls, ShardedJob)
        own = cls.config
        assert own is not None and own.name == config.name
        assert own.job_class == config.job_class


# -- the programs, as processes ------------------------------------------------------


@contextlib.contextmanager
def process(cmd: list[str], output: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd`` in the repository root with output to a file; killed if still
    running at the end (a test that fails must not leave it behind)."""
    with output.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _registered(store: CoordinationStore, job_name: str) -> str | None:
    members = store.children(job_paths(job_name).instances)
    return members[0] if members else None


def _stop_gracefully(proc: subprocess.Popen[bytes], output: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 20 s of SIGTERM; output:\n{output.read_text()}")
    assert code == 0, output.read_text()


@pytest.mark.parametrize("how", ["script", "cli"])
def test_simple_job_as_a_program(
    how: str, registry_url: str, store: CoordinationStore, tmp_path: Path
) -> None:
    if how == "cli" and importlib.util.find_spec("shardkeeper.cli") is None:
        pytest.skip("shardkeeper.cli is not in this checkout")
    cmd = {
        "script": [sys.executable, "examples/simple_job.py"],
        "cli": [
            sys.executable,
            "-m",
            "shardkeeper.cli",
            "run",
            "examples.simple_job:CityReport",
            "--grace",
            "5",
        ],
    }[how]
    output = tmp_path / "out.txt"
    with process(cmd, output, SHARDKEEPER_REGISTRY=registry_url) as proc:
        instance = wait_until(
            lambda: proc.poll() is None and _registered(store, "city-report"),
            timeout=30,
            message=lambda: f"registration of the instance; output:\n{output.read_text()}",
        )
        store.put(job_paths("city-report").trigger(instance), b"")
        wait_until(
            lambda: output.read_text().count("city=") >= 4,
            timeout=20,
            message=lambda: f"4 cities reported; output:\n{output.read_text()}",
        )
        _stop_gracefully(proc, output)
    assert _registered(store, "city-report") is None  # left the job on the way out


def test_embedded_service_as_a_program(
    registry_url: str, store: CoordinationStore, tmp_path: Path
) -> None:
    port = free_ports(1)[0]
    output = tmp_path / "out.txt"
    cmd = [sys.executable, "examples/embedded_service.py"]
    env = {"SHARDKEEPER_REGISTRY": registry_url, "HOST": "127.0.0.1", "PORT": str(port)}
    with process(cmd, output, **env) as proc:

        def healthy() -> bool:
            assert proc.poll() is None, output.read_text()
            try:
                return _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
            except OSError:
                return False  # not listening yet

        wait_until(healthy, timeout=30, message=lambda: f"/healthz; output:\n{output.read_text()}")
        instance = _registered(store, "cache-warmer")
        assert instance is not None
        store.put(job_paths("cache-warmer").trigger(instance), b"")
        wait_until(
            lambda: len(_get(f"http://127.0.0.1:{port}/")[1]["warmed"]) == 10,
            timeout=20,
            message=lambda: f"10 regions warmed; output:\n{output.read_text()}",
        )
        _stop_gracefully(proc, output)
    assert _registered(store, "cache-warmer") is None
