"""The benchmark harness must keep working: its smallest cases, once.

Runs the coordination-cost benchmark with 1 and 10 items (two triggers each) and
renders the report; one kill of the busy-survivor failover case and a 3 s overload
run on etcd; the leader's reshard cost once on ZooKeeper. Checks that the numbers
are printed and well formed. No timing is asserted: absolute times depend on the
machine.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench.common import BenchContext, Servers

from bench import busy_failover, coordination_cost, overload, report, resharding
from shardkeeper.testing.servers import EtcdCluster, ZooKeeperCluster

# CPU-heavy: one xdist worker runs all of these, so they never compete with each other
pytestmark = pytest.mark.xdist_group("cpu-heavy")


@pytest.fixture
def ctx(etcd_server: EtcdCluster, tmp_path: Path) -> BenchContext:
    servers = Servers(tmp_path / "unused")
    # reuse the session's etcd instead of starting another one
    servers.clusters["etcd"] = etcd_server
    return BenchContext(quick=True, servers=servers, workdir=tmp_path, log=lambda _m: None)


def test_coordination_cost_smallest_case(ctx: BenchContext, tmp_path: Path) -> None:
    result = coordination_cost.run(ctx, "etcd", sizes=(1, 10), triggers=2, idle=0.5)
    cases = result["cases"]
    raised = {"max_txn_ops": 4096}
    assert [(c["items"], c["monitor"], c["url_options"]) for c in cases] == [
        (1, True, {}),
        (10, True, {}),
        (1, False, {}),
        (10, False, {}),
        (1, True, raised),
        (10, True, raised),
    ]
    assert cases[-1]["commit_limit"] == 4096
    for case in cases:
        assert len(case["raw_total"]) == 2
        for key in (
            "calls_per_trigger",
            "commits_per_trigger",
            "total_per_trigger",
            "watch_per_trigger",
            "flow_per_trigger",
        ):
            stats = case[key]
            assert stats["n"] == 2
            assert math.isfinite(stats["median"]) and stats["median"] >= 0
        # every trigger costs at least one request, and every item ran; its own
        # requests are those less the liveness probes that fell in its window
        assert case["total_per_trigger"]["min"] >= 1
        assert 1 <= case["own_per_trigger"]["min"] <= case["total_per_trigger"]["min"]
        assert case["background_per_s"] >= 0
        assert case["commits_per_trigger"]["min"] >= 1
        assert case["executed_per_trigger"] == [case["items"]] * 2
        assert case["marks_left_after_trigger"] == [0, 0]
        assert case["trigger_seconds"]["median"] > 0

    doc = {
        "coordination_cost": {
            "benchmark": "coordination_cost",
            "quick": True,
            "environment": {},
            "backends": {"etcd": result},
        }
    }
    md = tmp_path / "benchmarks.md"
    md.write_text(f"# Title\n\nprose before\n\n{report.BEGIN}\nold\n{report.END}\n\nprose after\n")
    report.write_docs(doc, md, tmp_path / "img")
    text = md.read_text()
    assert "prose before" in text and "prose after" in text and "\nold\n" not in text
    assert "| etcd | on | 10 |" in text


def test_busy_failover_one_kill(ctx: BenchContext) -> None:
    """One kill -9 of a busy instance: its items are taken elsewhere and counted."""
    (result,) = busy_failover.run(ctx, "etcd", rounds=1, slots=(2,))["cases"]
    assert result["kills"] == 1 and result["worker_threads"] == 2
    lat = result["latency"]
    # the killed instance ran items (2 of 6), and each was taken or counted as not
    assert lat["n"] + result["unclaimed"] >= 1
    assert lat["n"] == len(result["samples"]) == len(result["via_failover"])
    assert all(math.isfinite(s) and s > 0 for s in result["samples"])
    assert result["executions"] > 0
    assert 0 <= result["stale_failover_runs"] <= result["failover_runs"]


def test_stale_failover_runs_are_told_apart() -> None:
    recs = [
        {"item": 0, "fire": 10.0, "start": 10.0, "failover": False},
        {"item": 0, "fire": 11.0, "start": 11.0, "failover": False},
        # fire 10 re-run by failover after fire 11 had started: stale
        {"item": 0, "fire": 10.0, "start": 12.0, "failover": True},
        # fire 11 re-run by failover: no newer fire had started
        {"item": 0, "fire": 11.0, "start": 12.5, "failover": True},
        {"item": 1, "fire": 10.0, "start": 12.0, "failover": True},
    ]
    stale = busy_failover.stale_failover_runs(recs)
    assert [(r["item"], r["fire"]) for r in stale] == [(0, 10.0)]


def test_overload_tiny(ctx: BenchContext, tmp_path: Path) -> None:
    """A short overload run prints a bounded queue, fire ages and the reshard count."""
    result = overload.run(ctx, "etcd", duration=3.0, calibration=2.0)
    assert result["sustainable_fires_per_s"] > 0
    assert (
        result["offered_fires_per_s"]
        == pytest.approx(overload.FACTOR * result["sustainable_fires_per_s"], rel=0.01)
        or result["interval"] == 0.001
    )
    assert result["raw_commits_per_s"] > 0
    assert result["executions_per_s"] > 0 and result["triggers_per_s"] > 0
    assert result["samples"] > 0
    assert result["pending_fires"]["n"] > 0 and result["pending_fires"]["min"] >= 0
    assert result["fire_age"]["n"] > 0 and result["fire_age"]["min"] > 0
    assert result["reshards_initial"] >= 1  # the leader's first assignment at least
    assert result["reshards_during"] >= 0
    doc = {
        "overload": {
            "benchmark": "overload",
            "quick": True,
            "environment": {},
            "backends": {"etcd": result},
        }
    }
    text = report.tables(doc)
    assert "### Overload" in text and "| etcd |" in text


def test_leader_cost_once(zk_server: ZooKeeperCluster, tmp_path: Path) -> None:
    """The leader's reshard of 10,000 items over 100 instances on ZooKeeper, once:
    both paths commit, and the parts add up to what reshard() sends."""
    servers = Servers(tmp_path / "unused")
    servers.clusters["zookeeper"] = zk_server
    zctx = BenchContext(quick=True, servers=servers, workdir=tmp_path, log=lambda _m: None)
    big = resharding.leader_cost(zctx, "zookeeper", repeats=1)
    assert big["assignment_bytes"] > 0
    assert big["reshard_calls"]["commit"] == 1
    assert big["reshard_started_calls"]["commit"] == 1
    # the path that knows the fire started reads no member node; it reads the fired
    # marks once (one listing), since a new assignment must take effect after the
    # latest fire any instance started, however late this fire is decided
    assert big["reshard_started_calls"].get("get_tree", 0) <= 1
    assert big["reshard_started_round_trips"]["median"] < big["reshard_round_trips"]["median"]
    parts = {k: v["median"] for k, v in big["parts_round_trips"].items()}
    # 100 member nodes and 100 fired marks are each read in one multiRead request
    # after their listing (chunks of 512 nodes), not one request a node
    assert parts["listings"] >= 2
    assert 2 <= parts["members"] <= 3 and 2 <= parts["fired"] <= 3
