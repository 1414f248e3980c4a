"""The benchmark harness must keep working: its smallest case, once, on etcd.

Runs the coordination-cost benchmark with 1 and 10 items (two triggers each) and
renders the report, then checks that the numbers are well formed. No timing is
asserted: absolute times depend on the machine.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shardkeeper.bench import coordination_cost, report
from shardkeeper.bench.common import BenchContext, Servers
from shardkeeper.testing.servers import EtcdCluster


@pytest.fixture
def ctx(etcd_server: EtcdCluster, tmp_path: Path) -> BenchContext:
    servers = Servers(tmp_path / "unused")
    # reuse the session's etcd instead of starting another one
    servers.clusters["etcd"] = etcd_server
    return BenchContext(quick=True, servers=servers, workdir=tmp_path, log=lambda _m: None)


def test_coordination_cost_smallest_case(ctx: BenchContext, tmp_path: Path) -> None:
    result = coordination_cost.run(ctx, "etcd", sizes=(1, 10), triggers=2)
    cases = result["cases"]
    assert [(c["items"], c["monitor"]) for c in cases] == [
        (1, True),
        (10, True),
        (1, False),
        (10, False),
    ]
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
        # every trigger costs at least one request, and every item ran
        assert case["total_per_trigger"]["min"] >= 1
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
