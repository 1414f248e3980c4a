"""Every shell and Python block of README.md and docs/*.md runs, or says why not.

A fenced block whose language is a shell (``sh``, ``bash``, ``shell``, ``console``)
or Python is one of:

* **run** by a test: :data:`RUN` names it (by its file and first line) and the test
  that executes it as written, against real servers: the README tour and
  getting-started's sections 4-5 with ``shardkeeper registry up``, the ``shardkeeper``
  command and two instances; the Python blocks in a subprocess on the session's
  ZooKeeper, with the names the page leaves to the reader (``sync_partition``,
  ``serve_forever``, a ``ledger``...) given as stubs first;
* **an excerpt** (:data:`EXCERPTS`): an abridged copy of a file that its own tests
  run; every code line of the block must be in that file;
* **illustrative**: an HTML comment ``<!-- illustrative: REASON -->`` right before
  the fence says why it cannot run here (a package index, a PostgreSQL host, root...).

:func:`test_every_block_is_run_or_says_why_not` holds the three lists to the docs:
a new block, or a block whose first line changed, fails it until it is placed.
Long-running commands (``shardkeeper run``) are started with a deadline and stopped
once the line or state the doc promises is seen.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import keyword
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from shardkeeper.errors import JobLookupError
from shardkeeper.ops import Operations
from shardkeeper.testing.faults import wait_until

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
SHELL = frozenset({"sh", "bash", "shell", "console"})
PYTHON = frozenset({"python", "py"})
ILLUSTRATIVE = re.compile(r"^<!--\s*illustrative:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
#: the bin directory of this interpreter: `shardkeeper` as the docs type it
BIN = str(Path(sys.executable).parent)
#: a command of a doc block, or a wait on what it prints
COMMAND_TIMEOUT = 60


@dataclass(frozen=True)
class Block:
    """One fenced code block of a doc page."""

    doc: str  # "README.md", "docs/cli.md"
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    illustrative: str | None  # the reason of a <!-- illustrative: ... --> before it

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0]

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line} ({self.first_line!r})"


def blocks(doc: str) -> list[Block]:
    """The fenced blocks of ``doc`` (relative to the repository root)."""
    lines = (ROOT / doc).read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = match.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        reason = ILLUSTRATIVE.match(before)
        found.append(
            Block(doc, start + 1, lang.lower(), "\n".join(body) + "\n", reason and reason.group(1))
        )
        i += 1
    return found


def runnable_blocks() -> list[Block]:
    """The shell and Python blocks of every doc page."""
    return [b for doc in DOC_FILES for b in blocks(doc) if b.lang in SHELL | PYTHON]


def block(doc: str, start: str) -> Block:
    """The one shell or Python block of ``doc`` whose text starts with ``start``."""
    found = [b for b in blocks(doc) if b.lang in SHELL | PYTHON and b.text.startswith(start)]
    assert len(found) == 1, f"{doc}: {len(found)} blocks start with {start!r}, expected 1"
    return found[0]


# -- what runs each block ------------------------------------------------------------

HERE = "tests/examples/test_doc_blocks.py"
TOUR = "tests/examples/test_readme_tour.py::test_readme_tour_from_a_clone_as_a_user_without_java"
STARTED = f"{HERE}::test_getting_started_tour"
ALONE = f"{HERE}::test_python_block"
PLUGIN = f"{HERE}::test_testing_doc_in_a_users_project"

#: (doc, the start of the block: enough to name one) -> the test that runs it
RUN: dict[tuple[str, str], str] = {
    # the README's install from a clone and its tour, in order
    (
        "README.md",
        "git clone https://github.com/shardkeeper/shardkeeper.git && cd shardkeeper\npython3",
    ): TOUR,
    ("README.md", "export SHARDKEEPER_REGISTRY=$(shardkeeper registry up"): TOUR,
    ("README.md", '"""The tour\'s job'): TOUR,
    ("README.md", "# terminal 1 (set up above)"): TOUR,
    ("README.md", "shardkeeper status"): TOUR,
    ("README.md", "shardkeeper trigger city-report"): TOUR,
    ("README.md", "from shardkeeper import Runtime"): TOUR,
    ("README.md", "shardkeeper registry down"): TOUR,
    # getting started, sections 3 to 5
    ("docs/getting-started.md", "from shardkeeper import JobConfig, Runtime, ShardedJob"): (
        "tests/examples/test_docs_behaviour.py::test_getting_started_snippet_runs_beside_the_cli"
    ),
    ("docs/getting-started.md", ". .venv/bin/activate"): STARTED,
    ("docs/getting-started.md", "python examples/simple_job.py"): STARTED,
    ("docs/getting-started.md", "shardkeeper run examples.simple_job:CityReport"): STARTED,
    ("docs/getting-started.md", "$ shardkeeper status"): STARTED,
    # Python blocks run on their own, with stubs: see PROGRAMS
    ("docs/concepts.md", "from shardkeeper import JobConfig, ShardedJob"): ALONE,
    ("docs/concepts.md", 'JobConfig(name="migrate-2026"'): ALONE,
    ("docs/configuration.md", "from shardkeeper.config import JobConfig, load_job_configs"): ALONE,
    ("docs/configuration.md", "JobConfig.parse("): ALONE,
    ("docs/failover.md", "from shardkeeper import ShardedJob, ShardingContext"): ALONE,
    ("docs/monitoring.md", "from shardkeeper import JobListener"): ALONE,
    ("docs/monitoring.md", "import logging"): ALONE,
    ("docs/security.md", "from shardkeeper import RegistrySettings, Runtime"): ALONE,
    (
        "docs/testing.md",
        "from shardkeeper import JobConfig, Runtime\nfrom shardkeeper.testing",
    ): ALONE,
    # the pytest plugin in a user's project: conftest.py, the test, both stores
    ("docs/testing.md", 'pytest_plugins = ["shardkeeper.testing.pytest_plugin"]'): PLUGIN,
    ("docs/testing.md", "from shardkeeper import JobConfig, Runtime\n\n\ndef test_"): PLUGIN,
    ("docs/testing.md", "import pytest"): PLUGIN,
    # openssl as written, then servers that accept the certificates
    ("docs/security.md", "# 1. a CA"): (
        "tests/registry/test_tls.py::"
        "test_the_openssl_recipe_of_the_docs_makes_certificates_both_stores_accept"
    ),
}

#: (doc, the start of the block) -> the file the block is abridged from: the file runs
#: in its own tests (tests/examples/test_recipes.py), the block must not name anything
#: the file does not
EXCERPTS: dict[tuple[str, str], str] = {
    ("docs/deployment.md", "@contextlib.asynccontextmanager"): "examples/recipes/fastapi_app.py",
    ("docs/deployment.md", "# gunicorn_conf.py"): "examples/recipes/gunicorn_conf.py",
    ("docs/deployment.md", "# settings.py"): "examples/recipes/django_site/settings.py",
    ("docs/deployment.md", "# jobs_app/management/commands/run_jobs.py"): (
        "examples/recipes/django_site/jobs_app/management/commands/run_jobs.py"
    ),
}


# -- the meta-test ----------------------------------------------------------------------


def _placed(b: Block) -> list[str]:
    """The tests (or excerpt sources) that name block ``b``."""
    named = {**RUN, **EXCERPTS}
    return [v for (doc, start), v in named.items() if doc == b.doc and b.text.startswith(start)]


def test_every_block_is_run_or_says_why_not() -> None:
    """Each shell and Python block is run by a named test, checked as an excerpt, or
    marked illustrative with a reason; no entry of RUN or EXCERPTS is stale."""
    unplaced, both = [], []
    for b in runnable_blocks():
        placed = _placed(b)
        if b.illustrative is None and not placed:
            unplaced.append(b.where)
        if b.illustrative is not None and placed:
            both.append(b.where)
    assert not unplaced, (
        "run these blocks in a test, or mark them <!-- illustrative: why -->:\n"
        + "\n".join(unplaced)
    )
    assert not both, "marked illustrative but also run (drop the marker):\n" + "\n".join(both)
    for doc, start in (*RUN, *EXCERPTS):
        block(doc, start)  # exactly one block starts so
    for node in set(RUN.values()):
        path, name = node.split("::")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(module, name, None)), f"{node} does not exist"
    for source in EXCERPTS.values():
        assert (ROOT / source).is_file(), source


def test_an_unmarked_block_fails_the_meta_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The meta-test's parser sees a marker only right before a fence."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "text\n\n<!-- illustrative: needs a PostgreSQL server -->\n\n```sh\npsql\n```\n\n"
        "<!-- illustrative: not this one -->\nprose\n```python\nprint(1)\n```\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    first, second = blocks("docs/page.md")
    assert (first.lang, first.illustrative, first.text) == (
        "sh",
        "needs a PostgreSQL server",
        "psql\n",
    )
    assert (second.lang, second.illustrative, second.line) == ("python", None, 11)


def _names(code: str) -> set[str]:
    """The identifiers of Python ``code``: not its comments, strings or keywords."""
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    return {
        tok.string
        for tok in tokens
        if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)
    }


@pytest.mark.parametrize("key", sorted(EXCERPTS), ids=lambda k: f"{k[0]}:{k[1][:24]}")
def test_an_excerpt_names_only_what_its_file_has(key: tuple[str, str]) -> None:
    """An abridged block calls, assigns and imports only names its source file has:
    a renamed hook, setting or call in the recipe fails here."""
    b = block(*key)
    source = (ROOT / EXCERPTS[key]).read_text()
    missing = _names(b.text) - _names(source) - set(dir(builtins))
    assert not missing, f"{b.where} names {sorted(missing)}, which {EXCERPTS[key]} does not"


def test_the_excerpt_check_sees_a_rename() -> None:
    """Names in comments and strings do not count; a call the file lacks does."""
    assert _names("x = run(1)  # start_runtime()\ny = 'stop_runtime'\n") == {"x", "run", "y"}


# -- running blocks ---------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    # a terminal as wide as the docs' samples: without one Rich wraps at 80 columns,
    # and where a cell wraps depends on the pids' length (an instance id cut in two)
    env["COLUMNS"] = "200"
    env.pop("SHARDKEEPER_REGISTRY", None)
    env.update(extra)
    return env


def _bash(script: str, cwd: Path, env: dict[str, str], *, stdout_only: bool = False) -> str:
    """Run ``script`` as the doc shows it (``set -e``: a failing line fails it)."""
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"rc {proc.returncode} of:\n{script}\n{out}"
    return proc.stdout if stdout_only else out


@dataclass
class Background:
    """A long-running command of a doc block, with its output in a file."""

    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _exec_last(script: str) -> str:
    """The terminal's last command replaces its shell (``exec``), so that SIGTERM,
    as Ctrl-C, reaches the long-running program and its exit status is the test's."""
    lines = script.rstrip().split("\n")
    last = max(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    lines[last] = f"exec {lines[last]}"
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _background(script: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[Background]:
    """Start ``script`` (a terminal of the doc) in its own process group; on exit
    SIGKILL what is left of it (a test that stops it gracefully checks that first)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", _exec_last(script)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Background(proc, log)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _stop(*programs: Background) -> None:
    """SIGTERM (Ctrl-C's graceful stop) to each process group; each exits with 0."""
    for p in programs:
        os.killpg(p.proc.pid, signal.SIGTERM)
    for p in programs:
        assert p.proc.wait(COMMAND_TIMEOUT) == 0, p.output()
        assert "Traceback" not in p.output(), p.output()


@contextlib.contextmanager
def _local_registry(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """Whatever a block leaves running in ``cwd``'s registry/data is stopped at the end
    (the test itself runs the docs' `registry down` and checks it)."""
    try:
        yield
    finally:
        subprocess.run(
            ["shardkeeper", "registry", "down"],
            cwd=cwd,
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )


def _members(url: str, job: str) -> int:
    with Operations.connect(url) as ops:
        try:
            return len(ops.instances(job))
        except JobLookupError:  # not registered yet
            return 0


@pytest.mark.external_service  # starts its own servers (registry up, the plugin)
def test_getting_started_tour(tmp_path: Path) -> None:
    """getting-started.md sections 4 and 5 in a directory laid out like the checkout:
    `registry up --namespace examples`, one instance as a script and one through
    the CLI, each printing its cities as shown; then `status`, `shards` and
    `instances` print the columns and lines of the sample."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    # the registry's state is per user: this test's own user directory
    env = _env(XDG_STATE_HOME=str(tmp_path / "state"))
    doc = "docs/getting-started.md"
    with _local_registry(tmp_path, env):
        up = block(doc, ". .venv/bin/activate").text
        url = _bash(up + 'printf "\\nURL=%s\\n" "$SHARDKEEPER_REGISTRY"\n', tmp_path, env)
        url = re.findall(r"^URL=(\S+)$", url, re.M)[-1]
        assert url.endswith("/examples"), url
        terminal = up  # "In EVERY terminal you use below ... set up the same way"
        script = terminal + block(doc, "python examples/simple_job.py").text
        cli = terminal + block(doc, "shardkeeper run examples.simple_job:CityReport").text
        with (
            _background(script, tmp_path, env, tmp_path / "script.log") as one,
            _background(cli, tmp_path, env, tmp_path / "cli.log") as two,
        ):
            # vm@14411@7b1248: item 0/4 city=amsterdam fired=18:02:05 execution=city-report@...#0
            sample = re.compile(
                r"^\S+: item [0-3]/4 city=(amsterdam|berlin|cairo|delhi) "
                r"fired=\d\d:\d\d:\d\d execution=city-report@\d+#[0-3]$",
                re.M,
            )

            def both_ran() -> bool:
                return bool(sample.search(one.output()) and sample.search(two.output()))

            wait_until(
                lambda: _members(url, "city-report") == 2 and both_ran(),
                COMMAND_TIMEOUT,
                message=lambda: f"script:\n{one.output()}\ncli:\n{two.output()}",
            )
            transcript = block(doc, "$ shardkeeper status")
            _compare_transcript(transcript, tmp_path, {**env, "SHARDKEEPER_REGISTRY": url})
            _stop(one, two)
        _bash("shardkeeper registry down", tmp_path, env)


#: the header line of a table the CLI prints: upper-case columns two spaces apart
TABLE_HEADER = re.compile(r"^[A-Z]{3,}\s{2,}[A-Z]")


def _compare_transcript(b: Block, cwd: Path, env: dict[str, str]) -> None:
    """Each `$ command` of a console block, run: the same first line when it has no
    table, the same table columns and the same number of rows."""
    sections = re.split(r"^\$ (.+)$", b.text, flags=re.M)[1:]
    assert sections, b.where
    for command, shown in zip(sections[::2], sections[1::2], strict=True):
        got = _bash(command, cwd, env, stdout_only=True).strip().splitlines()
        want = [line for line in shown.strip().splitlines() if line.strip()]
        header, got_header = (
            next(i for i, line in enumerate(lines) if TABLE_HEADER.match(line))
            for lines in (want, got)
        )
        assert want[:header] == got[:got_header], f"{command}:\n{got}"
        assert re.split(r"\s{2,}", want[header]) == re.split(r"\s{2,}", got[got_header]), (
            f"{b.where}: `{command}` prints the columns\n{got[got_header]}\n"
            f"the doc shows\n{want[header]}"
        )
        assert len(want) - header == len(got) - got_header, f"{command}:\n" + "\n".join(got)


# -- Python blocks on their own -----------------------------------------------------------

#: a job class the block defines, run on the session's ZooKeeper: one trigger, every
#: item done (``expect`` is evaluated in the program's namespace afterwards)
RUN_THE_JOB = """
import os as _os
from shardkeeper import Runtime as _Runtime, ShardedJob as _ShardedJob
from shardkeeper.config import JobConfig as _JobConfig
from shardkeeper.ops import Operations as _Operations
from shardkeeper.testing.faults import wait_until as _wait_until

def _run_once(cls, config=None, expect=lambda: True):
    url = _os.environ["SHARDKEEPER_REGISTRY"]
    runtime = _Runtime(url, shutdown_grace=5)
    runtime.add_job(cls(), config)
    name = (config or cls.config).name
    with runtime, _Operations.connect(url) as ops:
        ops.trigger(name)
        _wait_until(expect, 30, message=f"{name} ran every item")
    print("RAN", name)
"""


@dataclass(frozen=True)
class Program:
    """How a Python block runs: names the doc leaves to the reader, then the block,
    then what must hold (it prints ``OK`` at the end)."""

    doc: str
    first_line: str
    before: str = ""
    after: str = ""
    files: tuple[tuple[str, str], ...] = ()  # (name in the cwd, source under ROOT)
    #: a directory the block names: the test's own directory stands in for it (the
    #: paths are replaced in the program), its files made first by this shell block
    directory: tuple[str, tuple[str, str]] | None = None


PROGRAMS = [
    Program(
        "docs/concepts.md",
        "from shardkeeper import JobConfig, ShardedJob",
        before=(
            "synced = []\n"
            "def sync_partition(item, parameter):\n"
            "    synced.append((item, parameter))\n"
        ),
        after=RUN_THE_JOB
        + "_run_once(OrderSync, expect=lambda: len(synced) == 8)\n"
        + "assert sorted(synced)[:3] == [(0, 'eu'), (1, 'us'), (2, '')], synced\n",
    ),
    Program(
        "docs/concepts.md",
        'JobConfig(name="migrate-2026"',
        before="from shardkeeper import JobConfig\n",
    ),
    Program(
        "docs/configuration.md",
        "from shardkeeper.config import JobConfig, load_job_configs",
        after="assert config.sharding_total_count == 3 and configs, configs\n",
        files=(("jobs.yaml", "examples/jobs.yaml"),),
    ),
    Program(
        "docs/configuration.md",
        "JobConfig.parse(",
        before="from shardkeeper import JobConfig\n",
    ),
    Program(
        "docs/failover.md",
        "from shardkeeper import ShardedJob, ShardingContext",
        before=(
            "import threading\n"
            "class Ledger:\n"
            "    def __init__(self):\n"
            "        self.commits, self.lock = {}, threading.Lock()\n"
            "    def done(self, key):\n"
            "        return key in self.commits\n"
            "    def commit(self, rows, key, partition, token):\n"
            "        with self.lock:\n"
            "            self.commits[key] = (rows, partition, token)\n"
            "ledger = Ledger()\n"
            "def build_export(region, until):\n"
            "    return [f'{region}@{until:%H:%M:%S}']\n"
        ),
        after=RUN_THE_JOB + "config = _JobConfig.parse(name='export-invoices', cron='0 0 1 1 *',\n"
        "    sharding_total_count=3, sharding_item_parameters='0=eu,1=us,2=apac')\n"
        "_run_once(ExportInvoices, config, expect=lambda: len(ledger.commits) == 3)\n"
        "assert {p for _, p, _ in ledger.commits.values()} == {0, 1, 2}, ledger.commits\n"
        "assert all(t > 0 for *_, t in ledger.commits.values()), ledger.commits\n",
    ),
    Program(
        "docs/monitoring.md",
        "from shardkeeper import JobListener",
        after=(
            "from shardkeeper.observe import SkipRecord\n"
            "SkipAlert().on_skipped(SkipRecord('orders', 1.5, 'vm@1@a', 'disabled', (0,)))\n"
        ),
    ),
    Program(
        "docs/monitoring.md",
        "import logging",
        after=(
            "logging.getLogger('user').info('outside an item')\nimport sys; sys.stderr.flush()\n"
        ),
    ),
    Program(
        "docs/security.md",
        "from shardkeeper import RegistrySettings, Runtime",
        after=(
            "assert settings.tls and settings.backend == 'etcd', settings\n"
            "assert settings.tls_key.endswith('client.key')\n"
            "assert 'client.key' not in repr(settings), settings  # the key's path is not shown\n"
        ),
        directory=("/etc/shardkeeper/", ("docs/security.md", "# 1. a CA")),
    ),
    Program(
        "docs/testing.md",
        "from shardkeeper import JobConfig, Runtime\nfrom shardkeeper.testing",
        after="test_every_item_runs()\n",
    ),
]


def _python(b: Block, cwd: Path, env: dict[str, str], before: str = "", after: str = "") -> str:
    """Run ``before`` + the block + ``after`` as one program in ``cwd``."""
    source = "\n".join([textwrap.dedent(before), b.text, textwrap.dedent(after), 'print("OK")\n'])
    (cwd / "doc_block.py").write_text(source)
    proc = subprocess.run(
        [sys.executable, "doc_block.py"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), (
        f"{b.where}:\n{source}\n{out}"
    )
    return out


@pytest.mark.parametrize("backend", ["zookeeper"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: f"{p.doc}:{p.first_line[:30]}")
def test_python_block(program: Program, registry_url: str, tmp_path: Path) -> None:
    """The block runs as a program (with its stubs) on the session's ZooKeeper."""
    b = block(program.doc, program.first_line)
    for name, source in program.files:
        shutil.copy(ROOT / source, tmp_path / name)
    if program.directory is not None:
        directory, maker = program.directory
        assert directory in b.text, b.where
        b = replace(b, text=b.text.replace(directory, f"{tmp_path}/"))
        _bash(block(*maker).text, tmp_path, _env())
    out = _python(
        b, tmp_path, _env(SHARDKEEPER_REGISTRY=registry_url), program.before, program.after
    )
    if program.first_line == "import logging":
        # the filter fills the fields outside an item, so the format never fails
        assert re.search(r"INFO \[None/None None token=None\] user: outside an item", out), out


def test_programs_cover_the_python_blocks_run_here() -> None:
    """Every RUN entry given to test_python_block has a Program, and no more."""
    mine = {k for k, v in RUN.items() if v == ALONE}
    assert mine == {(p.doc, p.first_line) for p in PROGRAMS}


@pytest.mark.external_service  # starts its own servers (registry up, the plugin)
def test_testing_doc_in_a_users_project(tmp_path: Path) -> None:
    """docs/testing.md as a user's project: conftest.py enables the plugin (and runs
    every test on both stores), the test file is the page's test; both pass."""
    doc = "docs/testing.md"
    plugin = block(doc, 'pytest_plugins = ["shardkeeper.testing.pytest_plugin"]').text
    both = block(doc, "import pytest").text
    test = block(doc, "from shardkeeper import JobConfig, Runtime\n\n\ndef test_").text
    (tmp_path / "conftest.py").write_text(plugin + "\n" + both)
    (tmp_path / "test_user.py").write_text(test)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "2 passed" in out, out
