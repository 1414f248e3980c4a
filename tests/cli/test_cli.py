"""The ``shardkeeper`` command line as a user runs it: a real process per command,
real stores, real instances (in-process runtimes, and one ``shardkeeper run``).

Most tests use ZooKeeper (the module overrides ``backend``); the JSON schemas and
the unreachable-store message are checked on both backends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.config import JobConfig
from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.runtime import Runtime
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.jobs import RecordingJob
from shardkeeper.testing.servers import EtcdCluster

JOB = "tiny"
NEVER = "0 0 1 1 *"  # 1 January 00:00 UTC: no spontaneous fire during a test
CLI_TIMEOUT = 60


@pytest.fixture
def backend() -> str:
    """ZooKeeper unless a test parametrizes ``backend`` itself."""
    return "zookeeper"


def cli(
    *args: str, registry: str | None = None, env: dict[str, str] | None = None, cwd: Any = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m shardkeeper.cli ARGS`` with the registry in the environment."""
    full_env = {**os.environ, "COLUMNS": "250", **(env or {})}
    full_env.pop("SHARDKEEPER_REGISTRY", None)
    if registry is not None:
        full_env["SHARDKEEPER_REGISTRY"] = registry
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=CLI_TIMEOUT,
        cwd=cwd,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result))


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with ``code`` and exactly one ``error:`` line, no traceback."""
    assert result.returncode == code, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


Start = Callable[[], tuple[Runtime, RecordingJob]]


@pytest.fixture
def start(registry_url: str) -> Iterator[Start]:
    """``start()`` -> a started in-process runtime running job ``tiny`` (4 items)."""
    runtimes: list[Runtime] = []

    def factory() -> tuple[Runtime, RecordingJob]:
        job = RecordingJob()
        rt = Runtime(registry_url, worker_threads=4, coordinator_threads=2, shutdown_grace=1.0)
        rt.add_job(
            job,
            JobConfig.parse(
                name=JOB, cron=NEVER, sharding_total_count=4, sharding_item_parameters="0=a"
            ),
        )
        runtimes.append(rt)
        rt.start()
        return rt, job

    yield factory
    for rt in runtimes:
        rt.stop_now()


@pytest.fixture
def ops(store: CoordinationStore) -> Operations:
    return Operations(store)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- schemas ---------------------------------------------------------------------------

SUMMARY_KEYS = {
    "name",
    "trigger",
    "sharding_total_count",
    "instances",
    "leader",
    "enabled",
    "failover",
    "next_fire",
    "next_fire_reason",
    "config_error",
}
STATUS_JOB_KEYS = SUMMARY_KEYS | {
    "reshard_pending",
    "running_items",
    "failover_queued",
    "misfired_items",
    "disabled_items",
    "disabled_instances",
    "health",
    "failing_items",
    "stale_items",
}
ITEM_KEYS = {
    "item",
    "parameter",
    "owner",
    "running_on",
    "execution_id",
    "fire_time",
    "running_as_failover",
    "failover_queued",
    "failover_from",
    "misfire",
    "misfire_fire_time",
    "disabled",
    "last_run",
    "last_duration",
    "last_outcome",
    "last_ok",
    "last_error",
    "last_instance",
    "failures",
    "health",
    "finished",
    "progress",
}
DETAIL_KEYS = {
    "name",
    "config",
    "config_error",
    "trigger",
    "enabled",
    "disabled_by_operator",
    "leader",
    "instances",
    "disabled_instances",
    "reshard_pending",
    "reshard_reason",
    "assignment_generation",
    "assigned_at",
    "next_fire",
    "next_fire_reason",
    "health",
    "items",
}
INSTANCE_KEYS = {
    "instance_id",
    "host",
    "pid",
    "version",
    "started_at",
    "labels",
    "jobs",
    "items",
    "running",
    "disabled",
    "leader_of",
    "state",
    "health",
    "clock_offset",
    "clock_error",
    "clock_at",
    "clock_skewed",
}
DUMP_KEYS = {"value", "encoding", "kind", "version", "revision", "created_revision"}


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_read_commands_json_schemas(registry_url: str, start: Start, ops: Operations) -> None:
    rt, job = start()
    me = rt.instance_id
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    assert ok(cli("trigger", JOB, registry=registry_url)).strip() == f"triggered {JOB} on {me}"
    wait_until(lambda: job.count() == 4, message="the triggered items did not run")

    status = as_json(cli("status", "--json", registry=registry_url))
    assert set(status) == {"backend", "namespace", "instances", "jobs"}
    assert status["instances"] == [me]
    assert set(status["jobs"][0]) == STATUS_JOB_KEYS
    assert status["jobs"][0]["health"] in ("ok", "reshard-pending")

    jobs = as_json(cli("jobs", "--json", registry=registry_url))
    assert set(jobs) == {"jobs"}
    [summary] = jobs["jobs"]
    assert set(summary) == SUMMARY_KEYS
    assert summary["name"] == JOB and summary["instances"] == [me] and summary["leader"] == me
    assert summary["enabled"] is True and summary["next_fire"].endswith("+00:00")

    detail = as_json(cli("job", JOB, "--json", registry=registry_url))
    assert set(detail) == DETAIL_KEYS
    assert detail["config"]["sharding_total_count"] == 4
    assert [i["owner"] for i in detail["items"]] == [me] * 4
    assert all(set(i) == ITEM_KEYS for i in detail["items"])
    assert detail["items"][0]["parameter"] == "a"

    shards = as_json(cli("shards", JOB, "--json", registry=registry_url))
    assert set(shards) == {"job", "reshard_pending", "assignment_generation", "items"}
    assert shards["items"] == detail["items"]

    insts = as_json(cli("instances", "--json", registry=registry_url))
    assert set(insts) == {"instances"}
    [inst] = insts["instances"]
    assert set(inst) == INSTANCE_KEYS
    assert inst["instance_id"] == me and inst["items"] == {JOB: [0, 1, 2, 3]}
    assert as_json(cli("instances", "--job", JOB, "--json", registry=registry_url)) == insts

    config = as_json(cli("config", "get", JOB, "--json", registry=registry_url))
    assert JobConfig.parse(**config).name == JOB

    dumped = as_json(cli("dump", f"/jobs/{JOB}", "--json", registry=registry_url))
    assert dumped["path"] == f"/jobs/{JOB}"
    assert dumped["nodes"][f"/jobs/{JOB}/instances/{me}"]["kind"] == "ephemeral"
    assert all(set(n) == DUMP_KEYS for n in dumped["nodes"].values())


def test_human_output(registry_url: str, start: Start, ops: Operations) -> None:
    rt, _ = start()
    me = rt.instance_id
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    assert "1 live instance(s), 1 job(s)" in ok(cli("status", registry=registry_url))
    out = ok(cli("jobs", registry=registry_url))
    assert JOB in out and "cron '0 0 1 1 *' (UTC)" in out and me in out
    out = ok(cli("job", JOB, registry=registry_url))
    assert "reshard pending" in out and "ITEM" in out
    assert "PARAMETER" in ok(cli("shards", JOB, registry=registry_url))
    assert me in ok(cli("instances", registry=registry_url))
    assert "sharding_total_count" in ok(cli("config", "get", JOB, registry=registry_url))
    out = ok(cli("dump", registry=registry_url))
    assert f"/jobs/{JOB}/config [P] " in out and f"/instances/{me} [E] " in out


@pytest.mark.parametrize("command", [["instances"], ["jobs"], ["job", JOB]])
def test_piped_tables_never_wrap_ids(
    registry_url: str, start: Start, ops: Operations, command: list[str]
) -> None:
    """Piped with COLUMNS unset (rich would assume 80 columns), a long instance id
    stays whole on one line, so ``| grep ID`` and ``| awk`` see it."""
    rt, _ = start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    env = {**os.environ, "SHARDKEEPER_REGISTRY": registry_url}
    env.pop("COLUMNS", None)
    result = subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", *command],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if rt.instance_id in line]
    assert rows, f"no line holds the whole id {rt.instance_id!r}:\n{result.stdout}"
    assert max(len(line) for line in result.stdout.splitlines()) > 80  # really unwrapped


def test_switches(registry_url: str, start: Start, ops: Operations) -> None:
    rt, _ = start()
    me = rt.instance_id
    wait_until(lambda: ops.job(JOB).leader, message="no leader")

    assert ok(cli("disable", JOB, "--item", "1", registry=registry_url)).strip() == (
        f"disabled item 1 of {JOB}"
    )
    assert [i.disabled for i in ops.job(JOB).items] == [False, True, False, False]
    ok(cli("enable", JOB, "--item", "1", registry=registry_url))
    assert not any(i.disabled for i in ops.job(JOB).items)

    out = ok(cli("disable", "--instance", me, registry=registry_url))
    assert out.strip() == f"disabled instance {me} for {JOB}"
    assert ops.job(JOB).disabled_instances == [me]
    ok(cli("enable", JOB, "--instance", me, registry=registry_url))
    assert ops.job(JOB).disabled_instances == []

    ok(cli("disable", JOB, registry=registry_url))
    assert not ops.jobs()[0].enabled
    line = one_error_line(cli("trigger", JOB, registry=registry_url), 1)
    assert "disabled" in line
    ok(cli("enable", JOB, registry=registry_url))
    assert ops.jobs()[0].enabled

    # usage errors: exit 2, one line
    line = one_error_line(cli("disable", JOB, "--item", "9", registry=registry_url), 2)
    assert "item 9" in line and "0..3" in line
    one_error_line(cli("disable", JOB, "--item", "1", "--instance", me, registry=registry_url), 2)
    one_error_line(cli("disable", "--item", "1", registry=registry_url), 2)
    one_error_line(cli("enable", registry=registry_url), 2)
    assert cli("disable", JOB, "--item", "x", registry=registry_url).returncode == 2


def test_config_set(registry_url: str, start: Start, ops: Operations) -> None:
    rt, _ = start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    out = ok(
        cli(
            "config",
            "set",
            JOB,
            "sharding_total_count=6",
            "description=hello world",
            "job_parameter=007",
            'props={"k": 1}',
            registry=registry_url,
        )
    )
    assert "sharding_total_count 4 -> 6" in out and "resharded at the next trigger" in out
    config = ops.get_config(JOB)
    assert config.sharding_total_count == 6 and config.description == "hello world"
    assert config.job_parameter == "007" and config.props == {"k": "1"}
    assert ops.job(JOB).reshard_pending
    wait_until(
        lambda: rt.runners[JOB].config.sharding_total_count == 6,
        message="the instance did not reload the config",
    )

    new = as_json(
        cli("config", "set", JOB, "cron=null", "interval=30", "--json", registry=registry_url)
    )
    assert new["interval"] == 30 and new["cron"] is None
    assert ops.jobs()[0].trigger == "every 30s"

    assert "did you mean" in one_error_line(
        cli("config", "set", JOB, "sharding_total_cont=3", registry=registry_url), 2
    )
    one_error_line(cli("config", "set", JOB, "sharding_total_count=0", registry=registry_url), 2)
    one_error_line(cli("config", "set", JOB, "name=other", registry=registry_url), 2)
    one_error_line(cli("config", "set", JOB, "novalue", registry=registry_url), 2)
    one_error_line(cli("config", "set", "nope", "description=x", registry=registry_url), 1)


def test_unknown_job_and_instance(registry_url: str, start: Start, ops: Operations) -> None:
    start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    for args in (
        ["job", "nope"],
        ["shards", "nope"],
        ["trigger", "nope"],
        ["remove", "nope", "--yes"],
    ):
        line = one_error_line(cli(*args, registry=registry_url), 1)
        assert line == "error: unknown job 'nope'"
    line = one_error_line(cli("shutdown", "ghost@1@abc", registry=registry_url), 1)
    assert line == "error: unknown instance 'ghost@1@abc'"
    one_error_line(cli("trigger", JOB, "--instance", "ghost@1@abc", registry=registry_url), 1)
    one_error_line(cli("instances", "--job", "nope", registry=registry_url), 1)
    one_error_line(cli("dump", "/nothing/here", registry=registry_url), 1)
    one_error_line(cli("dump", "bad path", registry=registry_url), 2)
    # a missing argument is a usage error
    assert cli("job", registry=registry_url).returncode == 2


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"], ids=["zk", "etcd"])
def test_unreachable_store_and_bad_urls(backend: str) -> None:
    scheme = "zk" if backend == "zookeeper" else "etcd"
    url = f"{scheme}://127.0.0.1:{free_port()}/ns?connection_timeout=1"
    for args in (["jobs"], ["status", "--json"], ["trigger", JOB]):
        line = one_error_line(cli(*args, registry=url), 1)
        assert "cannot reach" in line
    line = one_error_line(cli("jobs", "--registry", f"{scheme}://127.0.0.1:99999/ns"), 2)
    assert "invalid registry URL" in line
    line = one_error_line(cli("jobs"), 2)
    assert "SHARDKEEPER_REGISTRY" in line


def test_remove(registry_url: str, start: Start, ops: Operations) -> None:
    rt, _ = start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    line = one_error_line(cli("remove", JOB, "--yes", registry=registry_url), 1)
    assert rt.instance_id in line and "force" in line
    out = ok(cli("remove", JOB, "--force", "--yes", registry=registry_url))
    assert out.startswith(f"removed job {JOB}") and rt.instance_id in out
    assert as_json(cli("jobs", "--json", registry=registry_url)) == {"jobs": []}


JOBS_MODULE = textwrap.dedent(
    """
    from shardkeeper.job import ShardedJob
    from shardkeeper.config import JobConfig

    class WithConfig(ShardedJob):
        config = JobConfig.parse(name="with-config", cron="0 0 1 1 *", sharding_total_count=2)

        def execute(self, ctx):
            pass

    class FromFile(ShardedJob):
        def execute(self, ctx):
            pass

    class NoConfig(ShardedJob):
        def execute(self, ctx):
            pass
    """
)

JOBS_FILE = textwrap.dedent(
    """
    jobs:
      - name: from-file
        job_class: sample_jobs:FromFile
        interval: 3600
        sharding_total_count: 3
    """
)


def test_run_and_remote_shutdown(registry_url: str, ops: Operations, tmp_path: Path) -> None:
    (tmp_path / "sample_jobs.py").write_text(JOBS_MODULE)
    (tmp_path / "jobs.yaml").write_text(JOBS_FILE)
    env = {**os.environ, "SHARDKEEPER_REGISTRY": registry_url}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardkeeper.cli",
            "run",
            "sample_jobs:WithConfig",
            "sample_jobs:FromFile",
            "--config",
            "jobs.yaml",
            "--grace",
            "1",
            "--label",
            "role=test",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        views = wait_until(
            lambda: [v for v in ops.instances() if len(v.jobs) == 2],
            timeout=30,
            message="the `run` instance did not register both jobs",
        )
        [view] = views
        assert view.jobs == ["from-file", "with-config"] and view.labels == {"role": "test"}
        assert view.pid == proc.pid
        totals = {j.name: j.sharding_total_count for j in ops.jobs()}
        assert totals == {"from-file": 3, "with-config": 2}
        out = ok(cli("shutdown", view.instance_id, "--wait", "20", registry=registry_url))
        assert out.strip() == f"{view.instance_id} stopped"
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        proc.stderr.close()
    assert "Traceback" not in stderr
    assert ops.instances() == []


def test_run_usage_errors(registry_url: str, tmp_path: Path) -> None:
    (tmp_path / "sample_jobs.py").write_text(JOBS_MODULE)
    line = one_error_line(cli("run", "no_such_module:Job", registry=registry_url, cwd=tmp_path), 2)
    assert "no_such_module" in line
    line = one_error_line(
        cli("run", "sample_jobs:NoConfig", registry=registry_url, cwd=tmp_path), 2
    )
    assert "no configuration" in line and "sample_jobs:NoConfig" in line
    assert cli("run", registry=registry_url, cwd=tmp_path).returncode == 2


def test_registry_up_status_down(tmp_path: Path) -> None:
    directory = tmp_path / "reg"
    try:
        up = cli("registry", "up", "--backend", "etcd", "--dir", str(directory))
        url = ok(up).strip()
        assert url.startswith("etcd://127.0.0.1:") and "started" in up.stderr
        status = as_json(cli("registry", "status", "--dir", str(directory), "--json"))
        assert status["running"] and status["healthy"] and status["backend"] == "etcd"
        assert status["url"] == url and len(status["members"]) == 1
        assert "registry: healthy" in ok(cli("registry", "status", "--dir", str(directory)))
        assert ok(cli("jobs", registry=url)).strip() == "no jobs registered"
    finally:
        down = cli("registry", "down", "--dir", str(directory))
    assert ok(down).startswith("stopped pids")
    result = cli("registry", "status", "--dir", str(directory), "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout) == {"running": False, "dir": str(directory), "healthy": False}
    assert ok(cli("registry", "down", "--dir", str(directory))).strip() == "nothing was running"
    one_error_line(cli("registry", "up", "--nodes", "2", "--dir", str(directory)), 2)


def test_wrong_credentials(tmp_path: Path) -> None:
    with EtcdCluster(size=1, base_dir=tmp_path, auth=True) as server:
        good = server.url("creds", connection_timeout=3)
        assert as_json(cli("jobs", "--json", registry=good)) == {"jobs": []}
        bad = good.replace(f":{server.password}@", ":wrong-password@")
        assert bad != good
        line = one_error_line(cli("jobs", registry=bad), 1)
        assert "wrong-password" not in line  # the password is never printed
        assert "auth" in line.lower() or "credential" in line.lower() or "password" in line


BAD_MODULES = {
    "syntax_error": "def broken(:\n    pass\n",
    "not_a_config": textwrap.dedent(
        """
        from shardkeeper.job import ShardedJob

        class Job(ShardedJob):
            config = {"name": "x", "interval": 5}

            def execute(self, ctx):
                pass
        """
    ),
    "tiny_interval": textwrap.dedent(
        """
        from shardkeeper.config import JobConfig
        from shardkeeper.job import ShardedJob

        class Job(ShardedJob):
            config = JobConfig.parse(name="x", interval=1e-6, sharding_total_count=1)

            def execute(self, ctx):
                pass
        """
    ),
    "raises": "raise RuntimeError('boom at import')\n",
}


@pytest.mark.parametrize(
    ("module", "fragments"),
    [
        ("syntax_error", ["'syntax_error'", "syntax error", "syntax_error.py, line 1"]),
        ("not_a_config", ["not_a_config:Job", "config is a dict", "JobConfig"]),
        ("tiny_interval", ["interval 1e-06 is too short", "at least 0.1 seconds"]),
        ("raises", ["'raises'", "RuntimeError: boom at import"]),
    ],
)
def test_run_bad_job_modules(tmp_path: Path, module: str, fragments: list[str]) -> None:
    """A job module that cannot be loaded is one error line and exit 2, not a traceback
    (before anything connects: the registry here does not exist)."""
    (tmp_path / f"{module}.py").write_text(BAD_MODULES[module])
    url = f"zk://127.0.0.1:{free_port()}/ns?connection_timeout=1"
    line = one_error_line(cli("run", f"{module}:Job", registry=url, cwd=tmp_path), 2)
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("zk://127.0.0.1:2181/ns?connection_timeout=1e12", "connection_timeout='1e12' is too long"),
        ("etcd://127.0.0.1:2379/ns?connection_timeout=1e12", "at most 3600 seconds"),
        ("zk://.../ns", "invalid host '...'"),
        ("etcd://...:2379/ns", "invalid host '...'"),
    ],
)
def test_bad_timeouts_and_hosts_are_one_line(url: str, fragment: str) -> None:
    """Values that used to end in a traceback (or a start that never gave up) are
    refused as an invalid registry URL, exit 2."""
    line = one_error_line(cli("status", registry=url), 2)
    assert "invalid registry URL" in line and fragment in line


def test_config_set_refuses_bad_schedules_and_names(
    registry_url: str, start: Start, ops: Operations
) -> None:
    """Through `config set`: too short an interval, a cron that never fires, each named."""
    start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    line = one_error_line(
        cli("config", "set", JOB, "cron=null", "interval=1e-9", registry=registry_url), 2
    )
    assert "interval 1e-09 is too short" in line
    line = one_error_line(cli("config", "set", JOB, "cron=0 0 30 2 *", registry=registry_url), 2)
    assert "'0 0 30 2 *'" in line and "can never fire" in line
    assert ops.get_config(JOB).cron == NEVER


CORRUPT_CONFIG = b'{"name":"tiny","cron":"0 0 1 1 *","sharding_total_count":"lots"}'


def test_corrupt_config_is_shown_and_repaired(
    registry_url: str, store: CoordinationStore, ops: Operations, tmp_path: Path
) -> None:
    """A corrupt stored config: `config get` shows the raw text and why (exit 1);
    `enable`/`disable` work; `config set` repairs it from its readable fields;
    `config replace --file` replaces a document that is not even JSON."""
    config_path = f"/jobs/{JOB}/config"
    store.put(config_path, CORRUPT_CONFIG)
    result = cli("config", "get", JOB, registry=registry_url)
    line = one_error_line(result, 1)
    assert result.stdout.strip() == CORRUPT_CONFIG.decode()
    assert "is invalid" in line and "sharding_total_count='lots'" in line
    assert "config replace" in line
    data = json.loads(cli("config", "get", JOB, "--json", registry=registry_url).stdout)
    assert data["raw"] == CORRUPT_CONFIG.decode() and "lots" in data["config_error"]

    ok(cli("disable", JOB, registry=registry_url))
    ok(cli("enable", JOB, registry=registry_url))

    out = ok(cli("config", "set", JOB, "sharding_total_count=5", registry=registry_url))
    assert "invalid stored config was replaced" in out
    assert ops.get_config(JOB).sharding_total_count == 5
    assert ops.get_config(JOB).cron == NEVER
    human = ok(cli("config", "get", JOB, registry=registry_url))
    assert "written by operator shardkeeper-ops@" in human and "revision" in human

    store.put(config_path, b"\x00 not json")
    (tmp_path / "jobs.yaml").write_text(
        f"jobs:\n  - name: {JOB}\n    interval: 60\n    sharding_total_count: 2\n"
        "  - name: other\n    interval: 60\n    sharding_total_count: 1\n"
    )
    out = ok(
        cli("config", "replace", JOB, "--file", str(tmp_path / "jobs.yaml"), registry=registry_url)
    )
    assert "invalid stored config was replaced" in out
    assert ops.get_config(JOB).interval == 60 and ops.get_config(JOB).sharding_total_count == 2
    line = one_error_line(
        cli(
            "config",
            "replace",
            "nope",
            "--file",
            str(tmp_path / "jobs.yaml"),
            registry=registry_url,
        ),
        2,
    )
    assert "has no job named 'nope'" in line
    # a valid replace shows what changed
    (tmp_path / "jobs.yaml").write_text(
        f"jobs:\n  - name: {JOB}\n    interval: 30\n    sharding_total_count: 2\n"
    )
    out = ok(
        cli("config", "replace", JOB, "-f", str(tmp_path / "jobs.yaml"), registry=registry_url)
    )
    assert "interval 60.0 -> 30.0" in out


def test_version_prints_the_package_version_without_a_registry() -> None:
    from shardkeeper import __version__

    out = ok(cli("--version"))
    assert out.strip() == f"shardkeeper {__version__}"


def test_trigger_with_parameters(registry_url: str, start: Start, ops: Operations) -> None:
    rt, job = start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    out = ok(cli("trigger", JOB, "--param", "region=eu", "--param", "n=2", registry=registry_url))
    assert out.strip() == f"triggered {JOB} on {rt.instance_id} with region=eu, n=2"
    wait_until(lambda: job.count() == 4, message="the triggered items did not run")
    line = one_error_line(cli("trigger", JOB, "--param", "novalue", registry=registry_url), 2)
    assert "'novalue' is not KEY=VALUE" in line
    line = one_error_line(cli("trigger", JOB, "--param", "bad key=1", registry=registry_url), 2)
    assert "'bad key'" in line


DIFF_MODULE = f'''
from shardkeeper import JobConfig, ShardedJob

class Same(ShardedJob):
    config = JobConfig.parse(name="{JOB}", cron="{NEVER}", sharding_total_count=4,
                             sharding_item_parameters="0=a")
    def execute(self, ctx):
        pass

class Changed(ShardedJob):
    config = JobConfig.parse(name="{JOB}", cron="{NEVER}", sharding_total_count=8,
                             description="new")
    def execute(self, ctx):
        pass
'''


def test_config_diff_against_a_job_class(
    registry_url: str, start: Start, ops: Operations, tmp_path: Path
) -> None:
    start()
    wait_until(lambda: ops.job(JOB).leader, message="no leader")
    (tmp_path / "diff_jobs.py").write_text(DIFF_MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    same = cli("config", "diff", JOB, "diff_jobs:Same", registry=registry_url, env=env)
    assert "the stored config matches diff_jobs:Same" in ok(same)
    changed = cli(
        "config", "diff", JOB, "diff_jobs:Changed", "--json", registry=registry_url, env=env
    )
    assert changed.returncode == 1, changed.stderr
    differences = json.loads(changed.stdout)["differences"]
    assert differences["sharding_total_count"] == {"stored": 4, "code": 8}
    assert differences["description"] == {"stored": "", "code": "new"}
    assert "sharding_item_parameters" in differences
    line = one_error_line(
        cli("config", "diff", "other", "diff_jobs:Same", registry=registry_url, env=env), 2
    )
    assert "configures job 'tiny', not 'other'" in line


def test_run_takes_its_options_from_a_runtime_config_and_the_environment(
    registry_url: str, ops: Operations, tmp_path: Path
) -> None:
    """Registry, jobs, job file and labels from the runtime config; a label from the
    environment on top; the command line is not needed at all."""
    (tmp_path / "sample_jobs.py").write_text(JOBS_MODULE)
    (tmp_path / "jobs.yaml").write_text(JOBS_FILE)
    (tmp_path / "runtime.yaml").write_text(
        textwrap.dedent(
            f"""
            registry: "{registry_url}"
            jobs: [sample_jobs:WithConfig, sample_jobs:FromFile]
            job_file: jobs.yaml
            grace: 1
            labels: {{zone: eu-1, role: batch}}
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "SHARDKEEPER_REGISTRY"}
    env |= {"SHARDKEEPER_RUNTIME_CONFIG": "runtime.yaml", "SHARDKEEPER_LABELS": "role=web"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardkeeper.cli", "run"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        [view] = wait_until(
            lambda: [v for v in ops.instances() if len(v.jobs) == 2],
            timeout=30,
            message="the instance did not register both jobs",
        )
        assert view.labels == {"zone": "eu-1", "role": "web"}  # the environment wins
        ok(cli("shutdown", view.instance_id, "--wait", "20", registry=registry_url))
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("workers: 3\n", "unknown setting 'workers'"),
        ("worker_threads: many\n", "worker_threads='many' is not an integer"),
        ("jobs: []\n", "no job to run"),
    ],
)
def test_run_refuses_a_bad_runtime_config(tmp_path: Path, content: str, fragment: str) -> None:
    (tmp_path / "runtime.yaml").write_text(content)
    result = cli("run", "--runtime-config", str(tmp_path / "runtime.yaml"), cwd=tmp_path)
    assert fragment in one_error_line(result, 2)
