"""Where ``registry up`` (and the test servers) find etcd, ZooKeeper and java, and what
they say when none is installed (issue 37, newcomer review N3, N22): an environment
variable, the PATH (Homebrew, a tarball), then Debian's paths; a missing program is
named with the line that installs it, never a raw errno or a Java class error. And the
local registry's state is per user, not per working directory.

No server is started here: fake installations in a temporary directory."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardkeeper import localregistry
from shardkeeper.cli import main
from shardkeeper.testing.servers import locate
from shardkeeper.testing.servers.locate import (
    ServerNotFoundError,
    find_etcd,
    find_etcdctl,
    find_java,
    find_zookeeper,
)


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Each test leaves os.environ as it found it. A variable left behind (a fake
    install's SHARDKEEPER_ZOOKEEPER_HOME) is inherited by every later test of the same
    worker and by the servers they start: ZooKeeper then exits with ClassNotFoundException.
    Set up before ``monkeypatch`` (autouse), so checked after it has undone its changes."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = {
        k: (before.get(k), after.get(k))
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k) and k != "PYTEST_CURRENT_TEST"  # pytest's own
    }
    assert not changed, f"the test left os.environ changed (name: (before, after)): {changed}"


def _program(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _jar(path: Path, *classes: str) -> Path:
    """A jar (a zip) holding empty entries for ``classes`` (dotted names)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for name in classes:
            archive.writestr(name.replace(".", "/") + ".class", b"")
    return path


def _tarball(home: Path, version: str = "3.8.4", *, server: bool = True) -> Path:
    """An unpacked ZooKeeper release: bin/zkServer.sh, lib/*.jar, conf/ (``server``:
    its zookeeper jar holds the server class, else only a client class)."""
    _program(home / "bin" / "zkServer.sh")
    (home / "lib").mkdir(parents=True)
    main_class = locate.SERVER_CLASS if server else "org.apache.zookeeper.ZooKeeper"
    _jar(home / "lib" / f"zookeeper-{version}.jar", main_class)
    _jar(home / "lib" / f"zookeeper-jute-{version}.jar", "org.apache.jute.Record")
    (home / "conf").mkdir()
    return home


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with none of the programs: an empty PATH, no Debian paths, none of
    the variables set. Returns an empty directory for the test's own installs."""
    for name in (
        "SHARDKEEPER_ETCD",
        "SHARDKEEPER_ETCDCTL",
        "SHARDKEEPER_ZOOKEEPER_JAR",
        "SHARDKEEPER_ZOOKEEPER_HOME",
        "ZOOKEEPER_HOME",
        "JAVA_HOME",
    ):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(locate, "DEBIAN_ETCD", str(tmp_path / "no" / "etcd"))
    monkeypatch.setattr(locate, "DEBIAN_ETCDCTL", str(tmp_path / "no" / "etcdctl"))
    monkeypatch.setattr(locate, "DEBIAN_ZOOKEEPER_JAR", str(tmp_path / "no" / "zookeeper.jar"))
    home = tmp_path / "installs"
    home.mkdir()
    return home


def test_etcd_missing_says_how_to_install_it(bare: Path) -> None:
    with pytest.raises(ServerNotFoundError) as err:
        find_etcd()
    text = str(err.value)
    assert "etcd not found" in text
    assert "sudo apt-get install etcd-server etcd-client" in text
    assert "brew install etcd" in text
    assert "SHARDKEEPER_ETCD=/path/to/etcd" in text and "release tarball" in text


def test_etcd_from_the_path_a_variable_or_debian(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy on the PATH (a tarball, Homebrew) wins over Debian's path;
    SHARDKEEPER_ETCD (the binary or its directory) wins over the PATH."""
    debian = _program(Path(locate.DEBIAN_ETCD))
    assert find_etcd() == str(debian)
    on_path = _program(bare / "etcd-v3.5.17-linux-amd64" / "etcd")
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{os.environ['PATH']}")
    assert find_etcd() == str(on_path)
    chosen = _program(bare / "mine" / "etcd")
    monkeypatch.setenv("SHARDKEEPER_ETCD", str(chosen))
    assert find_etcd() == str(chosen)
    monkeypatch.setenv("SHARDKEEPER_ETCD", str(chosen.parent))
    assert find_etcd() == str(chosen)
    # etcdctl: the one beside the etcd found (a tarball ships both)
    ctl = _program(chosen.with_name("etcdctl"))
    assert find_etcdctl() == str(ctl)


def test_a_bad_etcd_variable_names_its_value(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDKEEPER_ETCD", str(bare / "nowhere" / "etcd"))
    with pytest.raises(ServerNotFoundError, match=r"SHARDKEEPER_ETCD=.*nowhere/etcd"):
        find_etcd()


def test_zookeeper_missing_says_how_to_install_it(bare: Path) -> None:
    with pytest.raises(ServerNotFoundError) as err:
        find_zookeeper()
    text = str(err.value)
    assert "ZooKeeper not found" in text
    assert "sudo apt-get install zookeeper default-jre-headless" in text
    assert "brew install zookeeper" in text
    assert "SHARDKEEPER_ZOOKEEPER_HOME" in text and "--backend etcd" in text


def test_zookeeper_from_a_tarball_on_the_path_or_a_variable(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tarball's bin/ on the PATH, or its directory in SHARDKEEPER_ZOOKEEPER_HOME:
    the class path is its lib/*.jar and conf/ (logback.xml)."""
    home = _tarball(bare / "apache-zookeeper-3.8.4-bin")
    monkeypatch.setenv("PATH", f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
    found = find_zookeeper()
    assert found.classpath == (str(home / "lib" / "*"), str(home / "conf"))
    assert "zkServer.sh on the PATH" in found.source
    other = _tarball(bare / "other")
    monkeypatch.setenv("SHARDKEEPER_ZOOKEEPER_HOME", str(other))
    assert find_zookeeper().classpath[0] == str(other / "lib" / "*")
    monkeypatch.setenv("SHARDKEEPER_ZOOKEEPER_HOME", str(bare))
    with pytest.raises(ServerNotFoundError, match="holds no lib/zookeeper-"):
        find_zookeeper()


def test_a_release_without_the_server_class_is_not_used(
    bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lib/ whose zookeeper-*.jar files lack QuorumPeerMain (stubs, a client-only
    copy) would die with a Java ClassNotFoundException: named by a variable it is an
    error saying so; on the PATH it is skipped for the next candidate (Debian's), or
    named in the not-found message."""
    stub = _tarball(bare / "stub", server=False)
    monkeypatch.setenv("SHARDKEEPER_ZOOKEEPER_HOME", str(stub))
    with pytest.raises(ServerNotFoundError) as err:
        find_zookeeper()
    assert f"SHARDKEEPER_ZOOKEEPER_HOME={str(stub)!r}" in str(err.value)
    assert "QuorumPeerMain" in str(err.value) and "zookeeper-3.8.4.jar" in str(err.value)
    monkeypatch.delenv("SHARDKEEPER_ZOOKEEPER_HOME")
    monkeypatch.setenv("PATH", f"{stub / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(ServerNotFoundError) as err:
        find_zookeeper()
    assert "ZooKeeper not found" in str(err.value)
    assert f"skipped: zkServer.sh on the PATH ({stub / 'bin' / 'zkServer.sh'})" in str(err.value)
    debian = Path(locate.DEBIAN_ZOOKEEPER_JAR)
    debian.parent.mkdir(parents=True)
    debian.write_bytes(b"PK")
    assert find_zookeeper().source == str(debian)


def test_zookeeper_from_homebrew(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Homebrew: bin/zkServer is a symlink into the Cellar, whose libexec holds the
    release (lib/*.jar)."""
    cellar = bare / "Cellar" / "zookeeper" / "3.9.3"
    _program(cellar / "bin" / "zkServer")
    _tarball(cellar / "libexec", "3.9.3")
    prefix_bin = bare / "homebrew" / "bin"
    prefix_bin.mkdir(parents=True)
    (prefix_bin / "zkServer").symlink_to(cellar / "bin" / "zkServer")
    monkeypatch.setenv("PATH", str(prefix_bin))
    assert find_zookeeper().classpath[0] == str(cellar / "libexec" / "lib" / "*")


def test_zookeeper_from_debian_or_a_jar(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's jar with the slf4j jars beside it (and Netty's for TLS)."""
    share = Path(locate.DEBIAN_ZOOKEEPER_JAR).parent
    share.mkdir(parents=True)
    for name in ("zookeeper.jar", "slf4j-api.jar", "slf4j-simple.jar", "netty-codec.jar"):
        (share / name).write_bytes(b"PK")
    found = find_zookeeper()
    assert found.classpath == tuple(
        str(share / n) for n in ("zookeeper.jar", "slf4j-api.jar", "slf4j-simple.jar")
    )
    assert found.netty == (str(share / "netty-codec.jar"),)
    monkeypatch.setenv("SHARDKEEPER_ZOOKEEPER_JAR", str(bare / "missing.jar"))
    with pytest.raises(ServerNotFoundError, match=r"SHARDKEEPER_ZOOKEEPER_JAR=.*missing\.jar"):
        find_zookeeper()


def test_java_from_java_home_or_the_path(bare: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ServerNotFoundError) as err:
        find_java()
    assert "sudo apt-get install default-jre-headless" in str(err.value)
    assert "brew install openjdk" in str(err.value) and "--backend etcd" in str(err.value)
    on_path = _program(bare / "bin" / "java")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_java() == str(on_path)
    jdk = _program(bare / "jdk-21" / "bin" / "java")
    monkeypatch.setenv("JAVA_HOME", str(jdk.parent.parent))
    assert find_java() == str(jdk)
    monkeypatch.setenv("JAVA_HOME", str(bare / "jdk-21" / "bin"))
    with pytest.raises(ServerNotFoundError, match=r"JAVA_HOME=.* holds no bin/java"):
        find_java()


def test_registry_up_without_etcd_prints_the_install_lines(
    bare: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`registry up` exits 1 with the install lines, each on its own line, starts
    nothing and writes no state; the same for ZooKeeper without Java."""
    directory = tmp_path / "reg"
    assert main(["registry", "up", "--backend", "etcd", "--dir", str(directory)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: etcd not found"), err
    assert "\n  Debian/Ubuntu:    sudo apt-get install etcd-server etcd-client\n" in err
    assert "\n  macOS (Homebrew): brew install etcd\n" in err
    assert "Errno" not in err and "Traceback" not in err
    assert localregistry.load_state(directory) is None

    _tarball(bare / "zk")
    monkeypatch.setenv("SHARDKEEPER_ZOOKEEPER_HOME", str(bare / "zk"))
    assert main(["registry", "up", "--backend", "zookeeper", "--dir", str(directory)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ZooKeeper needs Java"), err
    assert "sudo apt-get install default-jre-headless" in err
    assert "ClassNotFoundException" not in err


def test_the_registry_state_is_per_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not per working directory: SHARDKEEPER_LOCAL_REGISTRY_DIR, else
    $XDG_STATE_HOME/shardkeeper/registry, else ~/.local/state/shardkeeper/registry."""
    monkeypatch.delenv(localregistry.DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert localregistry.default_dir() == tmp_path / "home/.local/state/shardkeeper/registry"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")  # the XDG spec: ignored
    assert localregistry.default_dir() == tmp_path / "home/.local/state/shardkeeper/registry"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert localregistry.default_dir() == tmp_path / "state/shardkeeper/registry"
    monkeypatch.setenv(localregistry.DIR_ENV, str(tmp_path / "mine"))
    assert localregistry.default_dir() == tmp_path / "mine"
    # the same state whichever directory a terminal is in
    directory = localregistry.default_dir()
    directory.mkdir(parents=True)
    (directory / localregistry.STATE_FILE).write_text('{"url": "etcd://127.0.0.1:1/x"}')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert localregistry.load_state() == {"url": "etcd://127.0.0.1:1/x"}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardkeeper.cli", "registry", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _program_of(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


@pytest.mark.external_service  # starts real servers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["etcd", "zookeeper"])
def test_registry_up_runs_a_store_found_outside_debians_paths(backend: str, tmp_path: Path) -> None:
    """With an empty PATH: etcd as a copy named by SHARDKEEPER_ETCD; ZooKeeper as a
    release-style directory (lib/zookeeper-*.jar) named by SHARDKEEPER_ZOOKEEPER_HOME,
    run by the java of JAVA_HOME. The server processes are those programs."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SHARDKEEPER_", "JAVA_HOME", "ZOOKEEPER_HOME", "XDG_"))
    }
    env["PATH"] = str(empty)
    if backend == "etcd":
        try:
            etcd = find_etcd()
        except ServerNotFoundError as exc:
            pytest.skip(str(exc))
        copy = tmp_path / "etcd-release" / "etcd"
        copy.parent.mkdir()
        shutil.copy2(etcd, copy)
        env["SHARDKEEPER_ETCD"] = str(copy.parent)
        expected = [str(copy)]
    else:
        java, jar = shutil.which("java"), Path(locate.DEBIAN_ZOOKEEPER_JAR)
        slf4j = jar.with_name("slf4j-simple.jar")
        if java is None or not jar.is_file() or not slf4j.is_file():
            pytest.skip("needs Debian's zookeeper package and a java to build a release layout")
        home = tmp_path / "apache-zookeeper-3.8-bin"
        (home / "lib").mkdir(parents=True)
        # Debian's jar names its dependencies by absolute paths: it works from lib/
        (home / "lib" / "zookeeper-3.8.0.jar").symlink_to(jar.resolve())
        (home / "lib" / "slf4j-simple.jar").symlink_to(slf4j.resolve())
        java_home = Path(java).resolve().parent.parent
        env["SHARDKEEPER_ZOOKEEPER_HOME"] = str(home)
        env["JAVA_HOME"] = str(java_home)
        expected = [str(java_home / "bin" / "java"), str(home / "lib" / "*")]
    directory = tmp_path / "reg"
    up = _cli(env, "up", "--backend", backend, "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr
        state = localregistry.load_state(directory)
        assert state is not None and up.stdout.strip() == state["url"]
        command = _program_of(state["pids"][0])
        assert command[0] == expected[0], command
        assert all(any(e in part for part in command) for e in expected[1:]), command
        status = _cli(env, "status", "--dir", str(directory))
        assert status.returncode == 0 and "healthy" in status.stdout, status
    finally:
        down = _cli(env, "down", "--dir", str(directory))
    assert down.returncode == 0 and down.stdout.startswith("stopped pids"), down
