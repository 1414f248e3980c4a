"""README's Install and 5-minute tour, as a newcomer runs them (issue 37): from a clone,
as a user who is not root, with no Java on the PATH and etcd found only on the PATH (a
copy outside Debian's paths), up to a failover that the tour's job prints.

Every command is the README's block, run as written (the clone's URL swapped for a
local repository of this work tree). In between, the test does what the prose asks: it
kills one instance with SIGKILL while its items run, and waits (bounded) for the
survivor to print ``is_failover=True`` for the fire the dead instance was running and
``covers=`` the fire that came before the death was noticed.

The dependencies are the ones this test runs with (a ``.pth`` file in the new
environment points at them) so that ``pip install '.[cli,etcd]'`` installs the clone
itself without downloading them; pip's build isolation still fetches setuptools, as
the wheel test does.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers.locate import ServerNotFoundError, find_etcd
from tests.examples.test_doc_blocks import COMMAND_TIMEOUT, ROOT, block

pytestmark = [pytest.mark.external_service, pytest.mark.slow, pytest.mark.timeout(480)]

#: the account the tour runs as when the test runs as root
TOUR_USER = "shardkeeper-tour"
#: appended to a block that sets SHARDKEEPER_REGISTRY: prints it on a line of its own
ECHO_URL = 'printf "\\nURL=%s\\n" "$SHARDKEEPER_REGISTRY"\n'
CLONE_URL = "https://github.com/shardkeeper/shardkeeper.git"
INSTALL = "git clone https://github.com/shardkeeper/shardkeeper.git && cd shardkeeper\npython3"
UP = "export SHARDKEEPER_REGISTRY=$(shardkeeper registry up"
JOB = '"""The tour\'s job'
TERMINALS = "# terminal 1 (set up above)"
#: programs the tour must not find: Java (the tour needs none) and Debian's etcd
HIDDEN = re.compile(r"^(java|javac|jshell|keytool|jrunscript|etcd|etcdctl|etcdutl)$")
#: pip's install of the clone: its build backend may be fetched, nothing else
INSTALL_TIMEOUT = 240

#: a line of the tour's job: instance, item, city, fire, is_failover, covers, phase
RUN_LINE = re.compile(
    r"^(?P<instance>\S+@\S+) item (?P<item>\d) (?P<city>[a-z]+) fired (?P<fire>\d\d:\d\d:\d\d) "
    r"is_failover=(?P<failover>True|False) covers=(?P<covers>\S+) (?P<phase>started|done)$",
    re.M,
)


@dataclass(frozen=True)
class Tourist:
    """Who runs the tour, where, with which environment."""

    prefix: tuple[str, ...]  # the command that drops root (empty when not root)
    uid: int
    gid: int
    base: Path  # the work directory: home, tools, the origin repository, the clone
    env: dict[str, str]

    @property
    def clone(self) -> Path:
        return self.base / "shardkeeper"

    def run(
        self,
        script: str,
        cwd: Path,
        env: dict[str, str] | None = None,
        *,
        timeout: float = COMMAND_TIMEOUT,
    ) -> str:
        """``script`` in bash as this user (``set -e``: a failing line fails it), with
        ``env`` (default: the user's bare environment)."""
        proc = subprocess.run(
            [*self.prefix, "bash", "-e", "-o", "pipefail", "-c", script],
            cwd=cwd,
            env=self.env if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"rc {proc.returncode} of:\n{script}\n{out}"
        return out


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


def _account() -> tuple[tuple[str, ...], int, int]:
    """The command prefix, uid and gid of a user who is not root: this process's own
    when it is not root, else TOUR_USER (created with useradd if missing)."""
    if os.geteuid() != 0:
        return (), os.getuid(), os.getgid()
    if shutil.which("setpriv") is None or shutil.which("useradd") is None:
        pytest.skip("running as root without setpriv or useradd: cannot drop privileges")
    try:
        entry = pwd.getpwnam(TOUR_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", TOUR_USER],
            check=True,
            capture_output=True,
            timeout=30,
        )
        entry = pwd.getpwnam(TOUR_USER)
    prefix = (
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
        "--",
    )
    return prefix, entry.pw_uid, entry.pw_gid


def _as_user(prefix: tuple[str, ...], *command: str) -> bool:
    """Whether ``command`` succeeds as the tour's user."""
    done = subprocess.run(
        [*prefix, *command], capture_output=True, timeout=COMMAND_TIMEOUT, check=False
    )
    return done.returncode == 0


def _tools(base: Path, prefix: tuple[str, ...]) -> Path:
    """A directory standing for the PATH's programs less Java and etcd (symlinks), with
    ``python3`` a Python of this environment's minor version that the tour's user can
    run from there and make a venv with (this one may sit in root's home)."""
    tools = base / "tools"
    tools.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or folder.startswith(str(Path(sys.prefix))) or not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            if HIDDEN.match(entry.name) or (tools / entry.name).exists():
                continue
            (tools / entry.name).symlink_to(entry.path)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [
        f"/usr/bin/python{version}",
        str(Path(sys.base_prefix) / "bin" / f"python{version}"),
        *(
            str(Path(folder) / f"python{version}")
            for folder in os.environ.get("PATH", "").split(os.pathsep)
            if folder
        ),
    ]
    python3 = tools / "python3"
    for candidate in dict.fromkeys(candidates):
        if not os.path.isfile(candidate):
            continue
        python3.unlink(missing_ok=True)
        python3.symlink_to(candidate)
        check = ("env", f"PATH={tools}", "python3", "-c", "import venv, ensurepip")
        if _as_user(prefix, *check):
            return tools
    pytest.skip(f"no Python {version} with venv that the tour's user can run")


def _origin(base: Path) -> Path:
    """A git repository of this work tree (tracked files and new, not ignored, ones):
    what a clone of the pushed commit would hold."""
    origin = base / "origin" / "shardkeeper"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        source = ROOT / raw.decode()
        if not source.is_file():  # deleted in the work tree
            continue
        target = origin / raw.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    git = {
        **os.environ,
        "GIT_AUTHOR_NAME": "tour",
        "GIT_AUTHOR_EMAIL": "tour@example.invalid",
        "GIT_COMMITTER_NAME": "tour",
        "GIT_COMMITTER_EMAIL": "tour@example.invalid",
    }
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the work tree"]):
        subprocess.run(["git", *args], cwd=origin, env=git, check=True, timeout=60)
    return origin


@contextlib.contextmanager
def _tourist() -> Iterator[Tourist]:
    prefix, uid, gid = _account()
    try:
        etcd = find_etcd()
    except ServerNotFoundError as exc:
        pytest.skip(f"no etcd to copy: {exc}")
    base = Path(tempfile.mkdtemp(prefix="shardkeeper-tour-"))
    try:
        base.chmod(0o755)
        (base / "home").mkdir()
        etcd_bin = base / "etcd-v3-linux"  # an unpacked release, say
        etcd_bin.mkdir()
        shutil.copy2(etcd, etcd_bin / "etcd")
        path = f"{etcd_bin}{os.pathsep}{_tools(base, prefix)}"
        _origin(base)
        _chown_tree(base, uid, gid)
        env = {
            "HOME": str(base / "home"),
            "PATH": path,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            "COLUMNS": "200",
        }
        yield Tourist(prefix, uid, gid, base, env)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Terminal:
    """A terminal of the tour running ``shardkeeper run``, its output in a file."""

    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def runs(self) -> list[dict[str, str]]:
        return [m.groupdict() for m in RUN_LINE.finditer(self.output())]


@contextlib.contextmanager
def _terminal(tourist: Tourist, script: str, env: dict[str, str], log: Path) -> Iterator[Terminal]:
    """``script`` in its own process group; its last command replaces the shell
    (``exec``), so that the pid is the instance's, as `kill -9 PID` takes it."""
    lines = script.rstrip().split("\n")
    last = max(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    lines[last] = f"exec {lines[last]}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*tourist.prefix, "bash", "-e", "-c", "\n".join(lines) + "\n"],
            cwd=tourist.clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Terminal(proc, log)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _install(tourist: Tourist) -> None:
    """README's Install block as written, from a local origin; the environment it
    makes sees this test's dependencies (a .pth), so pip installs only the clone."""
    text = block("README.md", INSTALL).text
    assert CLONE_URL in text, text
    text = text.replace(CLONE_URL, str(tourist.base / "origin" / "shardkeeper"))
    deps = sysconfig.get_paths()["purelib"]
    lines = text.rstrip().split("\n")
    venv = next(i for i, line in enumerate(lines) if "-m venv .venv" in line)
    lines.insert(
        venv + 1,
        "python -c \"import site; open(site.getsitepackages()[0] + '/tour_deps.pth', 'w')"
        f'.write({deps!r})"',
    )
    tourist.run("\n".join(lines) + "\n", tourist.base, timeout=INSTALL_TIMEOUT)
    installed = tourist.run(
        '. .venv/bin/activate && python -c "import shardkeeper; print(shardkeeper.__file__)"',
        tourist.clone,
    )
    assert str(tourist.clone / ".venv") in installed, installed  # the clone's, not ours


def _mid_item(t: Terminal) -> set[tuple[str, str]]:
    """(item, fire) of the runs ``t`` has started and not finished."""
    started = {(r["item"], r["fire"]) for r in t.runs() if r["phase"] == "started"}
    done = {(r["item"], r["fire"]) for r in t.runs() if r["phase"] == "done"}
    return started - done


def test_readme_tour_from_a_clone_as_a_user_without_java(tmp_path: Path) -> None:
    """Install from a clone, `registry up` (etcd, found as a copy on the PATH), two
    instances sharing the four cities, the inspection commands, `kill -9` of one in
    the middle of its items: the survivor prints is_failover=True for that fire and
    covers= the fire that came before the death was noticed; then the operator
    commands, the embedded runtime and `registry down`."""
    with _tourist() as tourist:
        found = tourist.run("command -v java || echo no-java; command -v etcd", tourist.base)
        assert found.split() == ["no-java", str(tourist.base / "etcd-v3-linux" / "etcd")], found
        _install(tourist)
        venv = tourist.clone / ".venv" / "bin"
        env = {
            **tourist.env,
            "VIRTUAL_ENV": str(venv.parent),
            "PATH": f"{venv}:{tourist.env['PATH']}",
        }
        up = block("README.md", UP).text
        assert "--backend" not in up  # the default: etcd, which needs no Java
        stopped = False
        try:
            said = tourist.run(up + ECHO_URL, tourist.clone, env)
            url = re.findall(r"^URL=(\S+)$", said, re.M)[-1]
            assert url.startswith("etcd://127.0.0.1:") and ":2379/" not in url, said
            # the state is the user's, wherever the terminal is; the etcd is the copy
            state_file = tourist.base / "home/.local/state/shardkeeper/registry/state.json"
            state = json.loads(state_file.read_text())
            [pid] = state["pids"]
            exe = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            assert exe == str(tourist.base / "etcd-v3-linux" / "etcd"), exe
            assert os.stat(f"/proc/{pid}").st_uid == tourist.uid
            again = tourist.run(up + ECHO_URL, tourist.base / "home", env)
            assert re.findall(r"^URL=(\S+)$", again, re.M)[-1] == url, again

            job = block("README.md", JOB)
            assert job.text == (tourist.clone / "examples" / "city_report.py").read_text()
            _failover(tourist, env, url, tmp_path)

            down = block("README.md", "shardkeeper registry down").text
            assert "stopped" in tourist.run(down, tourist.clone, env)
            stopped = True
            status = tourist.run("shardkeeper registry status || true", tourist.clone, env)
            assert "no registry runs" in status, status
        finally:
            if not stopped:  # whatever failed above, leave no server behind
                with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                    tourist.run("shardkeeper registry down", tourist.clone, env)


def _failover(tourist: Tourist, env: dict[str, str], url: str, tmp_path: Path) -> None:
    terminals = block("README.md", TERMINALS).text.split("\n\n")
    assert len(terminals) == 2, terminals
    env_1 = {**env, "SHARDKEEPER_REGISTRY": url}  # terminal 1 is "set up above"
    env_2 = {**tourist.env}  # terminal 2 sets itself up: activate, registry up
    with (
        _terminal(tourist, terminals[0], env_1, tmp_path / "t1.log") as t1,
        _terminal(tourist, terminals[1], env_2, tmp_path / "t2.log") as t2,
    ):

        def logs() -> str:
            return f"terminal 1:\n{t1.output()}\nterminal 2:\n{t2.output()}"

        def shared() -> bool:
            runs = t1.runs() + t2.runs()
            by_fire: dict[str, set[tuple[str, str]]] = {}
            for r in runs:
                by_fire.setdefault(r["fire"], set()).add((r["instance"], r["item"]))
            return any(
                sorted(i for _, i in r) == ["0", "1", "2", "3"] and len({n for n, _ in r}) == 2
                for r in by_fire.values()
            )

        wait_until(shared, COMMAND_TIMEOUT, message=lambda: f"no fire shared by both; {logs()}")
        watch = tourist.run(block("README.md", "shardkeeper status").text, tourist.clone, env_1)
        assert "city-report" in watch and "2 live instance(s)" in watch, watch

        # kill -9 terminal 2's instance while its items run: just after a fire's items
        # started (seen within the poll interval), so they are sure to be mid-run
        before = {(r["item"], r["fire"]) for r in t2.runs()}
        wait_until(lambda: bool(_mid_item(t2) - before), COMMAND_TIMEOUT, message=logs)
        os.kill(t2.proc.pid, signal.SIGKILL)
        cut = _mid_item(t2)
        assert cut, logs()
        victim = {r["instance"] for r in t2.runs()}
        assert len(victim) == 1, logs()

        def failed_over() -> list[dict[str, str]]:
            return [
                r for r in t1.runs() if r["failover"] == "True" and (r["item"], r["fire"]) in cut
            ]

        def covered() -> list[dict[str, str]]:
            cut_items = {item for item, _ in cut}
            return [r for r in t1.runs() if r["covers"] != "-" and r["item"] in cut_items]

        wait_until(
            lambda: bool(failed_over()) and bool(covered()),
            COMMAND_TIMEOUT,
            message=lambda: f"killed mid {sorted(cut)}; no failover and covers seen; {logs()}",
        )
        # a covered fire ran nowhere: the dead instance never started it
        for r in covered():
            for fire in r["covers"].split(","):
                assert not [
                    x for x in t1.runs() + t2.runs() if x["fire"] == fire and x["item"] == r["item"]
                ], f"{fire} ran, yet is covered; {logs()}"

        steer = tourist.run(
            block("README.md", "shardkeeper trigger city-report").text, tourist.clone, env_1
        )
        assert re.search(r"^triggered city-report on ", steer, re.M), steer
        _embedded(tourist, env_1)
        os.killpg(t1.proc.pid, signal.SIGTERM)  # Ctrl-C: a graceful stop
        assert t1.proc.wait(COMMAND_TIMEOUT) == 0, t1.output()
        assert "Traceback" not in t1.output(), t1.output()


def _embedded(tourist: Tourist, env: dict[str, str]) -> None:
    """README's embedded runtime, with the service stubbed: until an item ran."""
    embedded = block("README.md", "from shardkeeper import Runtime").text
    stubs = (
        "import threading\n"
        "from examples.city_report import CityReport\n"
        "ran = threading.Event()\n"
        "def _recorded(self, ctx):\n"
        "    ran.set()\n"
        "CityReport.execute = _recorded\n"
        "def serve_forever():  # the service: here, until an item has run\n"
        "    assert ran.wait(30), 'no item ran in the embedded runtime'\n"
    )
    program = tourist.base / "home" / "embedded.py"
    program.write_text(stubs + embedded + 'print("EMBEDDED OK")\n')
    os.chown(program, tourist.uid, tourist.gid)
    out = tourist.run(f"PYTHONPATH=. python {program}", tourist.clone, env)
    assert "EMBEDDED OK" in out, out
