"""The jitter bench and its trace: a short traced run on etcd, and the pure parts.

No timing is asserted (absolute times depend on the machine): only that every fire
is counted, that each traced fire's moments come in the order of its path, and that
the server's disk histograms were read.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench.common import BenchContext, Servers
from bench.jitter import measure, paired
from bench.jitter_trace import _over

from bench import jitter
from shardkeeper.testing.servers import EtcdCluster

pytestmark = pytest.mark.xdist_group("cpu-heavy")

#: the store methods a start commit may go through (etcd packs it in groups)
COMMITS = ("commit", "commit_groups")


@pytest.fixture
def ctx(etcd_server: EtcdCluster, tmp_path: Path) -> BenchContext:
    servers = Servers(tmp_path / "unused")
    servers.clusters["etcd"] = etcd_server  # the session's etcd
    return BenchContext(quick=True, servers=servers, workdir=tmp_path, log=lambda _m: None)


@pytest.mark.timeout(90)
def test_traced_run_on_etcd(ctx: BenchContext) -> None:
    result = measure(ctx, "etcd", 10, trace=True)
    # one fire may fall on either side of the window's edges
    assert 9 <= result["shardkeeper"]["n"] <= 11, result["shardkeeper"]
    assert 9 <= result["apscheduler"]["n"] <= 11, result["apscheduler"]
    assert result["fires"] == 10 and len(result["load_before"]) == 3
    trace = result["trace"]
    # the start commits of the fires were made by the trigger flow, and timed
    commits = {k: v for k, v in trace["requests"].items() if k.split(" ")[0] in COMMITS}
    assert any("trigger" in k for k in commits), trace["requests"]
    wal = trace["server_disk"]["etcd_disk_wal_fsync_duration_seconds"]
    assert wal["count"] >= 10 and wal["sum_s"] > 0, wal


@pytest.mark.timeout(90)
def test_every_fire_is_explained_in_path_order(
    ctx: BenchContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every fire counts as late: all are explained
    monkeypatch.setattr(jitter, "TRACE_LATE_MS", -math.inf)
    result = measure(ctx, "etcd", 8, trace=True)
    rows = result["trace"]["rows"]
    assert len(rows) >= 7
    for row in rows:
        moments = [row["queued_ms"], row["steps_ms"][0], row["launched_ms"], row["late_ms"]]
        assert None not in moments, row
        assert moments == sorted(moments), row
        assert row["cause"] != "not traced"
        assert any(c["method"] in COMMITS and "trigger" in c["origin"] for c in row["calls"]), row


def test_paired_tells_shared_lateness_from_our_own() -> None:
    warm = 100.0
    sk = [(100.0, 0.030), (100.2, 0.030), (100.4, 0.001), (99.8, 0.5)]
    plain = [(100.0, 0.020), (100.2, 0.001), (100.4, 0.001), (99.8, 0.5)]
    out = paired(sk, plain, warm)
    # 99.8 is before the warm-up's end: left out
    assert out["over_25ms"] == {"n": 2, "apscheduler_late_too": 1}
    assert out["over_100ms"] == {"n": 0, "apscheduler_late_too": 0}


def test_over_counts_observations_above_a_bound() -> None:
    buckets = {0.001: 5.0, 0.002: 7.0, 0.004: 9.0, 0.008: 10.0, math.inf: 12.0, -1.0: 0.3}
    assert _over(buckets, 0.002) == 5.0
    assert _over(buckets, 0.003) == 3.0  # by the next bound up (4 ms)
    # past every finite bound: those above the largest (at most this many)
    assert _over(buckets, 0.016) == 2.0
