"""The error messages a newcomer meets in the first hour (review newcomer-2, N14,
N18-N21, N26, N27): each run through the real CLI, against a real store where one is
needed, and each saying the cause, the place and what to do.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until

CLI_TIMEOUT = 60


@pytest.fixture
def backend() -> str:
    """etcd for the tests that need a real store (it starts in half a second)."""
    return "etcd"


def cli(
    *args: str, registry: str | None = None, env: dict[str, str] | None = None, cwd: Any = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m shardkeeper.cli ARGS`` (the registry in the environment)."""
    full_env = {**os.environ, "COLUMNS": "250", **(env or {})}
    full_env.pop("SHARDKEEPER_REGISTRY", None)
    full_env.pop("SHARDKEEPER_HISTORY_URL", None)
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


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with ``code`` and exactly one ``error:`` line, no traceback."""
    assert result.returncode == code, f"rc={result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nowhere() -> str:
    """A registry URL nothing listens on: a command that reaches its store fails."""
    return f"zk://127.0.0.1:{free_port()}/ns?connection_timeout=1"


# ---- N18: an exception while importing a job module shows its file and line -----------

DEEP = {
    "deep_job.py": textwrap.dedent(
        """
        import deep_helper
        from shardkeeper.job import ShardedJob

        class Job(ShardedJob):
            def execute(self, ctx):
                pass
        """
    ),
    "deep_helper.py": textwrap.dedent(
        """
        settings = None


        def database():
            return settings.database


        DB = database()
        """
    ),
    "env_job.py": textwrap.dedent(
        """
        import os

        URL = os.environ["SK_TEST_NO_SUCH_VARIABLE"]
        """
    ),
    "missing_dep_job.py": "import sk_no_such_dependency\n",
}


@pytest.mark.parametrize(
    ("module", "fragments"),
    [
        (
            "deep_job",
            [
                "importing module 'deep_job' failed",
                "AttributeError: 'NoneType' object has no attribute 'database'",
                "deep_helper.py, line 6, in database",
            ],
        ),
        (
            "env_job",
            ["KeyError: 'SK_TEST_NO_SUCH_VARIABLE'", "env_job.py, line 4"],
        ),
        (
            "missing_dep_job",
            ["No module named 'sk_no_such_dependency'", "missing_dep_job.py, line 1"],
        ),
    ],
    ids=["helper-module", "stdlib-raises", "missing-dependency"],
)
def test_an_import_error_names_the_file_and_line_in_user_code(
    tmp_path: Path, module: str, fragments: list[str]
) -> None:
    """The innermost frame in the user's code (the helper module's line, not os.py's
    nor importlib's), at the default log level; before: no file, no line."""
    for name, text in DEEP.items():
        (tmp_path / name).write_text(text)
    line = one_error_line(cli("run", f"{module}:Job", registry=nowhere(), cwd=tmp_path), 2)
    for fragment in fragments:
        assert fragment in line, line
    assert str(tmp_path) in line  # the full path: open it in an editor
    assert "os.py" not in line and "importlib" not in line


def test_debug_level_shows_the_whole_traceback(tmp_path: Path) -> None:
    for name, text in DEEP.items():
        (tmp_path / name).write_text(text)
    result = cli("run", "deep_job:Job", "--log-level", "debug", registry=nowhere(), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


# ---- N19: a job class without execute() is refused at start -------------------------

NO_EXECUTE = textwrap.dedent(
    """
    from shardkeeper.config import JobConfig
    from shardkeeper.job import DataflowJob, ShardedJob

    class NoExec(ShardedJob):
        config = JobConfig.parse(name="noexec", interval=5, sharding_total_count=2)

        def exceute(self, ctx):  # misspelt
            pass

    class HalfFlow(DataflowJob):
        config = JobConfig.parse(name="halfflow", interval=5, sharding_total_count=2)

        def fetch_data(self, ctx):
            return []

    def make():
        class Local(ShardedJob):
            config = JobConfig.parse(name="local", interval=5, sharding_total_count=2)

            def execute(self, ctx):
                pass

        return Local

    Local = make()
    """
)


@pytest.mark.parametrize(
    ("cls", "fragments"),
    [
        ("NoExec", ["'broken_jobs:NoExec' does not define execute(self, ctx)", "every item"]),
        ("HalfFlow", ["'broken_jobs:HalfFlow' does not define process_data(self, ctx, data)"]),
        (
            "Local",
            [
                "'broken_jobs:make.<locals>.Local' is defined inside the function 'make'",
                "no other instance can import it",
                "top level of module 'broken_jobs'",
            ],
        ),
    ],
)
def test_a_job_class_that_cannot_work_is_refused_before_it_connects(
    tmp_path: Path, cls: str, fragments: list[str]
) -> None:
    """Exit 2 and one line before anything connects (the registry does not exist);
    before: NoExec and HalfFlow started and failed every item at every fire, and
    Local was stored under a path every other instance refused."""
    (tmp_path / "broken_jobs.py").write_text(NO_EXECUTE)
    line = one_error_line(cli("run", f"broken_jobs:{cls}", registry=nowhere(), cwd=tmp_path), 2)
    for fragment in fragments:
        assert fragment in line, line


# ---- N20: a misspelt job name in a job file is an error ------------------------------

CITY = textwrap.dedent(
    """
    from shardkeeper.config import JobConfig
    from shardkeeper.job import ShardedJob

    class CityReport(ShardedJob):
        config = JobConfig.parse(name="city-report", interval=5, sharding_total_count=4)

        def execute(self, ctx):
            pass
    """
)


def test_a_misspelt_job_name_in_the_job_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "city.py").write_text(CITY)
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - name: city-reprot\n    interval: 5\n    sharding_total_count: 4\n"
    )
    result = cli("run", "city:CityReport", "-c", "jobs.yaml", registry=nowhere(), cwd=tmp_path)
    line = one_error_line(result, 2)
    assert "job 'city-reprot' matches no job class of this run" in line
    assert "did you mean 'city-report'?" in line
    assert "'city-report'" in line and "'CityReport'" in line  # the valid names
    assert "job_class" in line  # how to keep a job of another process in the file


def test_a_shared_file_keeps_the_jobs_of_other_processes_by_their_job_class(
    tmp_path: Path,
) -> None:
    """A file job naming another process's class is not an error: it is logged."""
    (tmp_path / "city.py").write_text(CITY)
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n"
        "  - name: city-report\n    interval: 5\n    sharding_total_count: 4\n"
        "  - name: other\n    job_class: elsewhere:Other\n    interval: 5\n"
        "    sharding_total_count: 1\n"
    )
    url = nowhere()
    result = cli("run", "city:CityReport", "-c", "jobs.yaml", registry=url, cwd=tmp_path)
    # it went past the job file: it failed on the store, exit 1
    assert result.returncode == 1, result.stderr
    assert "not run by this instance" in result.stderr and "other" in result.stderr
    assert "connection refused" in result.stderr


# ---- N21: refused and unknown hosts at once; a black hole waits and says so ----------


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A local port whose connections are never answered: its accept queue is full,
    so the kernel drops every further SYN (what a firewall's DROP rule does)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    fill = socket.create_connection(("127.0.0.1", port), timeout=2)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        with pytest.raises(TimeoutError):
            probe.connect(("127.0.0.1", port))
    finally:
        probe.close()
    yield port
    fill.close()
    server.close()


@pytest.mark.parametrize("scheme", ["zk", "etcd"])
def test_refused_and_unknown_hosts_are_reported_at_once(scheme: str) -> None:
    name = "ZooKeeper" if scheme == "zk" else "etcd"
    port = free_port()
    began = time.monotonic()
    line = one_error_line(
        cli("jobs", registry=f"{scheme}://127.0.0.1:{port}/ns?connection_timeout=20"), 1
    )
    # well inside the 20 s timeout: the start of a Python process and a refused connect
    assert time.monotonic() - began < 10, line
    assert f"cannot reach {name} at 127.0.0.1:{port}: 127.0.0.1:{port}: connection refused" in line
    assert "is the server running" in line and "within the connection timeout" not in line

    try:
        socket.getaddrinfo("nosuchhost.invalid", 2379)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:  # no DNS answer at all: not certain, waits
            pytest.skip(f"this resolver does not say 'unknown' for a .invalid name: {exc}")
    began = time.monotonic()
    line = one_error_line(
        cli("jobs", registry=f"{scheme}://nosuchhost.invalid:2379/ns?connection_timeout=20"), 1
    )
    assert time.monotonic() - began < 10, line
    assert "nosuchhost.invalid:2379: unknown host 'nosuchhost.invalid'" in line
    assert "check the host name in the registry URL" in line


@pytest.mark.parametrize("scheme", ["zk", "etcd"])
def test_a_black_hole_waits_the_timeout_and_says_nothing_answered(
    scheme: str, black_hole: int
) -> None:
    name = "ZooKeeper" if scheme == "zk" else "etcd"
    began = time.monotonic()
    url = f"{scheme}://127.0.0.1:{black_hole}/ns?connection_timeout=2"
    line = one_error_line(cli("jobs", registry=url), 1)
    assert time.monotonic() - began >= 2.0
    assert f"cannot reach {name} at 127.0.0.1:{black_hole} within the connection timeout" in line
    assert f"no answer from 127.0.0.1:{black_hole}: packets to it are dropped" in line


# ---- N14: history from a database that does not exist --------------------------------


def test_history_of_a_database_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here" / "history.db"
    for extra in ([], ["--json"]):
        result = cli(
            "history",
            "city-report",
            "--history-url",
            f"sqlite:///{missing}",
            *extra,
            registry="zk://127.0.0.1:2181/ns",
        )
        line = one_error_line(result, 1)
        assert f"no history database at {missing}: nothing was ever recorded there" in line
        assert "--history-url" in line
        assert result.stdout == ""
    assert not missing.parent.exists()  # reading created nothing


# ---- N26: a missing extra exits 2 everywhere -----------------------------------------


@pytest.mark.parametrize(
    ("hidden", "argv", "extra"),
    [
        (["prometheus_client"], ["run", "x:Y", "--metrics-port", "0"], "metrics"),
        (["fastapi", "uvicorn"], ["serve"], "console"),
        (["sqlalchemy"], ["history", "x", "--all-scopes"], "history"),
        (["sqlalchemy"], ["audit", "--history-url", "default"], "history"),
        (["etcd3"], ["jobs", "--registry", "etcd://127.0.0.1:2379/ns"], "etcd"),
    ],
    ids=["metrics", "console", "history", "audit", "etcd"],
)
def test_a_missing_extra_is_exit_2_everywhere(
    tmp_path: Path, hidden: list[str], argv: list[str], extra: str
) -> None:
    (tmp_path / "x.py").write_text(
        "from shardkeeper.config import JobConfig\nfrom shardkeeper.job import ShardedJob\n"
        "class Y(ShardedJob):\n"
        "    config = JobConfig.parse(name='y', interval=5, sharding_total_count=1)\n"
        "    def execute(self, ctx):\n        pass\n"
    )
    hide = "; ".join(f"sys.modules[{m!r}] = None" for m in hidden)
    code = f"import sys; {hide}\nfrom shardkeeper.cli import main; sys.exit(main({argv!r}))"
    env = {**os.environ, "SHARDKEEPER_REGISTRY": nowhere()}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    line = one_error_line(result, 2)
    assert f"pip install 'shardkeeper[{extra}]'" in line


# ---- N27: no APScheduler noise in run's output --------------------------------------


def test_run_prints_no_apscheduler_info_lines(
    registry_url: str, store: CoordinationStore, tmp_path: Path
) -> None:
    (tmp_path / "city.py").write_text(CITY)
    env = {**os.environ, "SHARDKEEPER_REGISTRY": registry_url}
    env.pop("SHARDKEEPER_HISTORY_URL", None)
    err = tmp_path / "stderr"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shardkeeper.cli", "run", "city:CityReport", "--grace", "1"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    ops = Operations(store)
    try:
        wait_until(
            lambda: [v for v in ops.instances() if v.pid == proc.pid],
            timeout=30,
            message="the `run` instance did not register",
        )
        wait_until(lambda: "started with 1 jobs" in err.read_text(), timeout=30)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = err.read_text()
    assert "INFO shardkeeper" in text  # the default level is INFO: our lines show
    assert "apscheduler" not in text, text  # "Adding job tentatively", "Scheduler started"
