"""The deployment recipes (examples/recipes, deploy/kubernetes) run for real.

Each web or Django recipe is started as its real server process (uvicorn, gunicorn,
``manage.py run_jobs``) against a real store; the test waits, with deadlines, for
its instances to register and run the recipe job's items, then sends SIGTERM and
checks that the process exits 0 and its instances left the registry. The
Kubernetes manifests are validated offline against the Kubernetes schemas and
checked for the fields a graceful rollout needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

from shardkeeper.ops import Operations
from shardkeeper.registry import CoordinationStore
from shardkeeper.testing.faults import wait_until
from shardkeeper.testing.servers import free_ports

ROOT = Path(__file__).resolve().parents[2]
JOB = "recipe-heartbeat"
ITEMS = 4
RAN = re.compile(rf"{JOB} item=(\d+) instance=(\S+)")


@contextlib.contextmanager
def process(cmd: list[str], output: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd`` in the repository root (its own process group, output to a
    file); the whole group is killed if still running at the end."""
    with output.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "SHARDKEEPER_GRACE": "5", **env},
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        # the group: gunicorn's workers too, even if the master is gone
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def instances(store: CoordinationStore) -> dict[str, list[int]]:
    """Live instances of the recipe job and the items each is assigned."""
    ops = Operations(store)
    if JOB not in {job.name for job in ops.jobs()}:
        return {}
    return {view.instance_id: view.items.get(JOB, []) for view in ops.instances(JOB)}


def ran(output: Path, since: int = 0) -> dict[str, set[int]]:
    """The items each instance printed that it ran (after the first ``since``
    characters of the output)."""
    result: dict[str, set[int]] = {}
    for item, instance in RAN.findall(output.read_text()[since:]):
        result.setdefault(instance, set()).add(int(item))
    return result


def alive(proc: subprocess.Popen[bytes], output: Path) -> None:
    """Fail at once (with the output) if the process died."""
    assert proc.poll() is None, f"exited {proc.returncode}; output:\n{output.read_text()}"


def stop_gracefully(
    proc: subprocess.Popen[bytes],
    output: Path,
    store: CoordinationStore,
    *,
    exit_codes: tuple[int, ...] = (0,),
    timeout: float = 30,
) -> None:
    """SIGTERM; the process must exit in time with one of ``exit_codes`` and its
    instances must have left the registry."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within {timeout} s of SIGTERM; output:\n{output.read_text()}")
    assert code in exit_codes, output.read_text()
    assert instances(store) == {}, output.read_text()


def get_json(url: str) -> tuple[int, Any]:
    """GET ``url``: (status, decoded JSON body)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def answers(url: str) -> bool:
    """True once ``url`` answers 200 (False while nothing listens yet)."""
    try:
        return get_json(url)[0] == 200
    except OSError:
        return False


# -- FastAPI ------------------------------------------------------------------------


def test_fastapi_lifespan(registry_url: str, store: CoordinationStore, tmp_path: Path) -> None:
    port = free_ports(1)[0]
    output = tmp_path / "uvicorn.txt"
    cmd = [sys.executable, "-m", "uvicorn", "examples.recipes.fastapi_app:app"]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    with process(cmd, output, SHARDKEEPER_REGISTRY=registry_url) as proc:
        base = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            alive(proc, output)
            return answers(base + "/healthz")

        wait_until(serving, timeout=30, message=lambda: f"/healthz; output:\n{output.read_text()}")
        live = wait_until(
            lambda: instances(store),
            timeout=20,
            message=lambda: f"the app's instance registered; output:\n{output.read_text()}",
        )
        [instance] = live
        wait_until(
            lambda: ran(output).get(instance) == set(range(ITEMS)),
            timeout=20,
            message=lambda: f"all {ITEMS} items run; output:\n{output.read_text()}",
        )
        code, body = get_json(base + "/jobs")
        assert code == 200
        assert body == {"instance": instance, "running": True, "items": list(range(ITEMS))}
        # uvicorn re-raises the signal it caught once shutdown is complete: -SIGTERM
        stop_gracefully(proc, output, store, exit_codes=(0, -signal.SIGTERM))
    assert "Application shutdown complete" in output.read_text()


# -- gunicorn -----------------------------------------------------------------------


def test_gunicorn_one_instance_per_worker(
    registry_url: str, store: CoordinationStore, tmp_path: Path
) -> None:
    port = free_ports(1)[0]
    output = tmp_path / "gunicorn.txt"
    # --preload: the app is imported in the master before the fork; the runtimes
    # still start in the workers (post_worker_init), which is what this checks
    cmd = [sys.executable, "-m", "gunicorn", "-c", "examples/recipes/gunicorn_conf.py"]
    cmd += ["--workers", "2", "--bind", f"127.0.0.1:{port}", "--preload"]
    cmd += ["examples.recipes.gunicorn_app:app"]
    with process(cmd, output, SHARDKEEPER_REGISTRY=registry_url) as proc:

        def two_instances_split() -> dict[str, list[int]] | None:
            # the first worker may own every item for a moment: the job reshards
            # once the second has registered (at the next trigger)
            alive(proc, output)
            live = instances(store)
            owned = sorted(i for items in live.values() for i in items)
            halves = all(len(items) == ITEMS // 2 for items in live.values())
            return live if len(live) == 2 and halves and owned == list(range(ITEMS)) else None

        live = wait_until(
            two_instances_split,
            timeout=40,
            message=lambda: f"2 instances, {ITEMS // 2} items each; output:\n{output.read_text()}",
        )
        assert live is not None
        split_at = len(output.read_text())  # only runs after the split count

        def both_ran() -> bool:
            alive(proc, output)
            seen = ran(output, since=split_at)
            return all(seen.get(inst, set()) >= set(items) for inst, items in live.items())

        wait_until(
            both_ran,
            timeout=20,
            message=lambda: f"each worker ran its items {live}; output:\n{output.read_text()}",
        )
        # the workers answer HTTP, each with its own instance
        seen: set[str] = set()
        for _ in range(20):
            code, body = get_json(f"http://127.0.0.1:{port}/")
            assert code == 200 and body["running"] is True
            seen.add(body["instance"])
        assert seen <= set(live)
        stop_gracefully(proc, output, store)
    text = output.read_text()
    assert all(f"instance {inst} stopped" in text for inst in live), text


# -- Django -------------------------------------------------------------------------


def test_django_run_jobs_command(
    registry_url: str, store: CoordinationStore, tmp_path: Path
) -> None:
    output = tmp_path / "django.txt"
    cmd = [sys.executable, "-m", "examples.recipes.django_site.manage", "run_jobs", "--grace", "3"]
    with process(cmd, output, SHARDKEEPER_REGISTRY=registry_url) as proc:

        def registered() -> dict[str, list[int]]:
            alive(proc, output)
            return instances(store)

        live = wait_until(
            registered,
            timeout=30,
            message=lambda: f"the command's instance registered; output:\n{output.read_text()}",
        )
        [instance] = live
        wait_until(
            lambda: ran(output).get(instance) == set(range(ITEMS)),
            timeout=20,
            message=lambda: f"all {ITEMS} items run; output:\n{output.read_text()}",
        )
        stop_gracefully(proc, output, store)
    text = output.read_text()
    assert f"shardkeeper instance {instance}: running" in text and "stopped" in text, text


def test_django_run_jobs_rejects_a_bad_job(tmp_path: Path) -> None:
    settings = tmp_path / "bad_settings.py"
    settings.write_text(
        "from examples.recipes.django_site.settings import *  # noqa: F403\n"
        "SHARDKEEPER = {'JOBS': ['examples.recipes.jobs:build_runtime']}\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "examples.recipes.django_site.manage", "run_jobs"],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
            "DJANGO_SETTINGS_MODULE": "bad_settings",
            "SHARDKEEPER_REGISTRY": "zk://127.0.0.1:1/never-used",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "'examples.recipes.jobs:build_runtime' is <function build_runtime" in result.stderr
    assert "not a ShardedJob subclass" in result.stderr


# -- Kubernetes ---------------------------------------------------------------------

KUBE = ROOT / "deploy" / "kubernetes"


def manifests() -> dict[str, dict[str, Any]]:
    """Every document of deploy/kubernetes, by kind."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[doc["kind"]] = doc
    return docs


def test_kubernetes_manifests_match_the_schemas() -> None:
    docs = manifests()
    assert set(docs) == {"Deployment", "Secret"}
    for doc in docs.values():
        # strict: an unknown or misspelt field fails too
        kv.validate(doc, kv.latest_version(), strict=True)
    broken = json.loads(json.dumps(docs["Deployment"]))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["prot"] = 1
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)


def _option(command: list[str], name: str) -> str:
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def test_kubernetes_deployment_stops_gracefully_and_probes_the_metrics_port() -> None:
    docs = manifests()
    deployment = docs["Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    command = container["command"] + container.get("args", [])
    assert command[:2] == ["shardkeeper", "run"]
    assert _option(command, "--metrics-host") == "0.0.0.0"
    port = int(_option(command, "--metrics-port"))
    grace = float(_option(command, "--grace"))
    jobs = [arg for arg in command[2:] if ":" in arg and not arg.startswith("-")]
    assert jobs, f"no MODULE:CLASS job in {command}"
    assert container["image"] and not container["image"].endswith(":latest")
    assert {"containerPort": port, "name": "metrics"} in [
        {k: p[k] for k in ("containerPort", "name")} for p in container["ports"]
    ]
    # probes: /healthz live, /readyz ready, on the metrics port (by name or number)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] in (port, "metrics")
    # the registry URL from a Secret, the one in this directory
    [env] = [e for e in container["env"] if e["name"] == "SHARDKEEPER_REGISTRY"]
    ref = env["valueFrom"]["secretKeyRef"]
    secret = docs["Secret"]
    assert ref["name"] == secret["metadata"]["name"]
    assert ref["key"] in secret["stringData"]
    # preStop sleep, then SIGTERM and --grace: all inside the termination grace period
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 1
    assert pod["terminationGracePeriodSeconds"] > pre_stop + grace
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


# -- docs/deployment.md -------------------------------------------------------------

DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"


def test_deployment_doc_links_and_runtime_config(tmp_path: Path) -> None:
    from shardkeeper.cli.settings import load_run_settings

    text = DEPLOYMENT_DOC.read_text()
    links = re.findall(r"\]\((\.\./[^)#]+)\)", text)
    assert links, "the page links the recipe files"
    for link in links:
        assert (DEPLOYMENT_DOC.parent / link).resolve().exists(), link
    # the runtime config file the page shows is one `shardkeeper run` accepts
    [block] = re.findall(r"```yaml\n(# /etc/shop/shardkeeper.yaml[^\n]*\n.*?)```", text, re.S)
    path = tmp_path / "shardkeeper.yaml"
    path.write_text(block)
    loaded = load_run_settings(path)
    assert loaded.grace == 30 and loaded.metrics_port == 9108
    assert loaded.metrics_host == "0.0.0.0"


def test_deployment_doc_matches_the_manifest() -> None:
    text = DEPLOYMENT_DOC.read_text()
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    grace = _option(container["command"], "--grace")
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    period = pod["terminationGracePeriodSeconds"]
    assert f"terminationGracePeriodSeconds: {period}" in text
    assert f"# > preStop {pre_stop} s + --grace {grace} s" in text
    assert f'--grace, "{grace}"' in text
