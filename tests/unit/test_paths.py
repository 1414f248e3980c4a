"""Every registry path is built in coordination/paths.py: check each literal."""

from __future__ import annotations

from pathlib import Path

from shardkeeper.coordination.paths import (
    JobPaths,
    instance_path,
    parse_job_path,
    shutdown_path,
)
from shardkeeper.registry.base import check_path


def test_every_path_literal() -> None:
    """The documented tree, path by path (docs/registry-layout.md)."""
    p = JobPaths("order-sync")
    expected = {
        instance_path("h@1@a"): "/instances/h@1@a",
        shutdown_path("h@1@a"): "/control/shutdown/h@1@a",
        p.root: "/jobs/order-sync",
        p.config: "/jobs/order-sync/config",
        p.instances: "/jobs/order-sync/instances",
        p.instance("h@1@a"): "/jobs/order-sync/instances/h@1@a",
        p.leader: "/jobs/order-sync/leader",
        p.sharding: "/jobs/order-sync/sharding",
        p.necessary: "/jobs/order-sync/necessary",
        p.running_root: "/jobs/order-sync/running",
        p.running(7): "/jobs/order-sync/running/7",
        p.failover_queue: "/jobs/order-sync/failover/queue",
        p.failover_item(7): "/jobs/order-sync/failover/queue/7",
        p.misfire_root: "/jobs/order-sync/misfire",
        p.misfire(7): "/jobs/order-sync/misfire/7",
        p.disabled_job: "/jobs/order-sync/disabled/job",
        p.disabled_items: "/jobs/order-sync/disabled/items",
        p.disabled_item(7): "/jobs/order-sync/disabled/items/7",
        p.disabled_instances: "/jobs/order-sync/disabled/instances",
        p.disabled_instance("h@1@a"): "/jobs/order-sync/disabled/instances/h@1@a",
        p.trigger_root: "/jobs/order-sync/trigger",
        p.trigger("h@1@a"): "/jobs/order-sync/trigger/h@1@a",
        p.fired_root: "/jobs/order-sync/fired",
        p.fired("h@1@a"): "/jobs/order-sync/fired/h@1@a",
        p.once_root: "/jobs/order-sync/once",
        p.once("123-before"): "/jobs/order-sync/once/123-before",
        p.results_root: "/jobs/order-sync/results",
        p.result(7): "/jobs/order-sync/results/7",
        p.done: "/jobs/order-sync/done",
    }
    for built, literal in expected.items():
        assert built == literal
        assert check_path(built) == built  # valid on both backends


def test_done_node_parses() -> None:
    """The one-off done marker is a node of the layout (not Unknown), and not high churn."""
    from shardkeeper.coordination.paths import JobNode, is_high_churn, parse

    p = JobPaths("order-sync")
    assert parse(p.done) == JobNode("order-sync", "done")
    assert not is_high_churn(p.done)
    layout = (Path(__file__).resolve().parents[2] / "docs" / "registry-layout.md").read_text()
    assert "| `/jobs/{job}/done` | P |" in layout


def test_parse_job_path() -> None:
    """Job paths split into job name and the rest; other paths are not job paths."""
    assert parse_job_path("/jobs/a/running/3") == ("a", ["running", "3"])
    assert parse_job_path("/jobs/a") == ("a", [])
    assert parse_job_path("/instances/x") is None
    assert parse_job_path("/jobsx/a") is None


def test_high_churn_subtrees() -> None:
    """Exactly /jobs/{job}/running, misfire and once are left out of the namespace watch."""
    from shardkeeper.coordination.paths import is_high_churn

    p = JobPaths("j")
    assert is_high_churn(p.running_root)
    assert is_high_churn(p.misfire_root)
    assert is_high_churn(p.once_root)
    assert is_high_churn(p.fired_root)
    for path in (p.running(3), p.sharding, p.necessary, p.failover_queue, p.instances, "/jobs"):
        assert not is_high_churn(path)
    assert not is_high_churn("/instances/running")
