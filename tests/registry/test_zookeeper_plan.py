"""The pure ZooKeeper planner (registry/zookeeper/plan.py), table-tested with no server.

Each row: a commit's operations and what the pre-reads found, and the multi the planner
builds (as ``kind op-path``: the multi operation's type and absolute path, then why it
is there) or the failed path it reports without sending anything."""

from __future__ import annotations

from typing import Any

import pytest
from kazoo.protocol import serialization as zkproto
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE

from shardkeeper.registry.base import Check, CommitResult, Create, Delete, Op, Put
from shardkeeper.registry.zookeeper.plan import PlanContext, Planned, build_multi, reads_needed

CTX = PlanContext("/ns", OPEN_ACL_UNSAFE, session=0x51)


def stat(*, version: int = 3, czxid: int = 10, owner: int = 0) -> ZnodeStat:
    """A znode stat with the fields the planner reads."""
    return ZnodeStat(czxid, czxid + 1, 0, 0, version, 0, 0, owner, 1, 0, czxid)


def shown(planned: CommitResult | Planned) -> list[str] | str:
    """The multi as ``type path (kind)`` lines, or ``failed <path>``."""
    if isinstance(planned, CommitResult):
        return f"failed {planned.failed_path}"
    names = {
        zkproto.Create: "create",
        zkproto.Delete: "delete",
        zkproto.SetData: "set",
        zkproto.CheckVersion: "check",
    }
    out = []
    for op, (kind, _user, _path) in zip(planned.ops, planned.origins, strict=True):
        version = getattr(op, "version", None)
        tail = "" if version is None else f"@{version}"
        out.append(f"{names[type(op)]} {op.path}{tail} ({kind})")
    return out


ROWS: list[tuple[str, list[Op], dict[str, Any], list[str], list[str] | str]] = [
    (
        "a version check is native, no read",
        [Check("/a", version=4), Put("/b", b"1", existing=True)],
        {},
        [],
        ["check /ns/a@4 (user)", "set /ns/b@-1 (existing)"],
    ),
    (
        "a bare existence check is check -1 and lets a delete skip its read",
        [Check("/a/x", exists=True), Delete("/a")],
        {},
        [],
        ["check /ns/a/x@-1 (user)", "delete /ns/a@-1 (user)"],
    ),
    (
        "an absence check is a guard create and delete",
        [Check("/free", exists=False), Create("/c", b"v")],
        {},
        [],
        [
            "create /ns/free (guard)",
            "delete /ns/free@-1 (guard)",
            "create /ns/c (user)",
        ],
    ),
    (
        "a value check holding becomes a version check of what was read",
        [Check("/v", value=b"x")],
        {"/v": (b"x", stat(version=7))},
        ["/v"],
        ["check /ns/v@7 (derived)"],
    ),
    (
        "a value check already false fails without a multi",
        [Check("/v", value=b"x"), Put("/w", b"1")],
        {"/v": (b"y", stat()), "/w": None},
        ["/v", "/w"],
        "failed /v",
    ),
    (
        "a created-revision check of a missing node fails",
        [Check("/m", created_revision=10)],
        {"/m": None},
        ["/m"],
        "failed /m",
    ),
    (
        "a Put of a present node of the right kind sets it at its version",
        [Put("/p", b"2")],
        {"/p": (b"1", stat(version=5))},
        ["/p"],
        ["set /ns/p@5 (derived)"],
    ),
    (
        "a Put of a missing node creates it",
        [Put("/p", b"2")],
        {"/p": None},
        ["/p"],
        ["create /ns/p (create)"],
    ),
    (
        "an ephemeral Put of a persistent node replaces it",
        [Put("/e", b"2", ephemeral=True)],
        {"/e": (b"1", stat(version=2, owner=0))},
        ["/e"],
        ["delete /ns/e@2 (derived)", "create /ns/e (derived)"],
    ),
    (
        "an ephemeral Put of our own node sets it",
        [Put("/e", b"2", ephemeral=True)],
        {"/e": (b"1", stat(version=2, owner=0x51))},
        ["/e"],
        ["set /ns/e@2 (derived)"],
    ),
    (
        "a Delete of a missing node is an absence guard",
        [Delete("/gone")],
        {"/gone": None},
        ["/gone"],
        ["create /ns/gone (guard)", "delete /ns/gone@-1 (guard)"],
    ),
]


@pytest.mark.parametrize(
    ("ops", "seen", "reads", "multi"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_the_planner_table(
    ops: list[Op], seen: dict[str, Any], reads: list[str], multi: list[str] | str
) -> None:
    """The pre-reads asked for and the multi built, row by row."""
    assert reads_needed(ops) == reads
    assert shown(build_multi(ops, CTX, seen)) == multi


def test_missing_parents_are_created_top_down_before_the_node() -> None:
    """Parents the commit must make come first, top-down, each once."""
    ops: list[Op] = [Create("/a/b/c", b"1"), Create("/a/b/d", b"2")]
    planned = build_multi(ops, CTX, {}, parents={"/a", "/a/b"})
    assert shown(planned) == [
        "create /ns/a (parent)",
        "create /ns/a/b (parent)",
        "create /ns/a/b/c (user)",
        "create /ns/a/b/d (user)",
    ]


def test_an_absence_check_of_a_parent_the_multi_creates_is_folded_into_that_create() -> None:
    """The parent create fails on an existing node by itself: no guard pair."""
    ops: list[Op] = [Check("/jobs/j", exists=False), Create("/jobs/j/config", b"c")]
    planned = build_multi(ops, CTX, {}, parents={"/jobs/j"})
    assert shown(planned) == ["create /ns/jobs/j (parent)", "create /ns/jobs/j/config (user)"]


def test_a_guard_below_an_ephemeral_ancestor_is_its_existence() -> None:
    """``guards`` names another guard: an existence check of an ephemeral ancestor."""
    ops: list[Op] = [Check("/e/x", exists=False)]
    planned = build_multi(ops, CTX, {}, guards={"/e/x": ("exists", "/e")})
    assert shown(planned) == ["check /ns/e@-1 (guard)"]


def test_our_own_ephemeral_of_known_incarnation_needs_no_read() -> None:
    """A created-revision check listed in ``mine`` is an existence check, unread."""
    ops: list[Op] = [Check("/me", created_revision=10), Put("/x", b"", existing=True)]
    assert reads_needed(ops, mine=frozenset({"/me"})) == []
    planned = build_multi(ops, CTX, {}, mine=frozenset({"/me"}))
    assert shown(planned) == ["check /ns/me@-1 (owned)", "set /ns/x@-1 (existing)"]


def test_a_put_below_a_path_checked_absent_is_a_create_with_no_read() -> None:
    """A registration's membership node: below an absent path it cannot exist yet."""
    ops: list[Op] = [Check("/jobs/j", exists=False), Put("/jobs/j/instances/i", b"")]
    below = frozenset({"/jobs/j/instances/i"})
    assert reads_needed(ops, below_absent=below) == []
    planned = build_multi(
        ops, CTX, {}, parents={"/jobs/j", "/jobs/j/instances"}, below_absent=below
    )
    assert shown(planned) == [
        "create /ns/jobs/j (parent)",
        "create /ns/jobs/j/instances (parent)",
        "create /ns/jobs/j/instances/i (create)",
    ]


def test_the_root_maps_onto_the_namespace_node() -> None:
    """``/`` is the namespace node itself in a multi (absolute paths)."""
    assert CTX.full("/") == "/ns" and CTX.full("/a") == "/ns/a"
    assert CTX.wanted_owner(True) == 0x51 and CTX.wanted_owner(False) == 0
