"""The etcd planner as pure functions, tabled without a server (``registry/etcd/planner.py``,
``conditions.py``, ``nesting.py``): operations in, compares / writes / failure reads
out (plain records, ``records.py``), and a failed transaction's reads in, a verdict
out. The part that sends (``Commits``) is driven by a scripted ``Txns``; the records'
messages (``messages.py``) are checked field by field; the real server is in
``test_etcd_backend.py`` and the contract suite."""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("etcd3")

from shardkeeper.errors import ConfigError, StoreError
from shardkeeper.registry.base import Check, Create, Delete, Op, Put
from shardkeeper.registry.etcd import messages
from shardkeeper.registry.etcd.conditions import Verdict, compare_holds
from shardkeeper.registry.etcd.keys import Keyspace
from shardkeeper.registry.etcd.nesting import (
    Planned,
    group_bytes,
    judge_group,
    plan_group,
)
from shardkeeper.registry.etcd.planner import (
    Commits,
    PlanContext,
    absence_chunks,
    absence_refuted,
    build,
    fold,
    judge,
    shape,
    writes,
)
from shardkeeper.registry.etcd.records import (
    Compare,
    DeleteRange,
    PutKey,
    Range,
    Request,
    Result,
    Target,
    Txn,
)

KEYS = Keyspace.of("ns")
LEASE = 0x51


def lease_for(ephemeral: bool) -> int:
    return LEASE if ephemeral else 0


CTX = PlanContext(KEYS, lease_for)


def shown_compare(cmp: Compare) -> str:
    """``version(/ns/a)==0``; a range as ``[start,end)``."""
    where = cmp.key.decode()
    if cmp.range_end:
        where = f"[{where},{cmp.range_end.decode()})"
    return f"{cmp.target.value}({where}){cmp.result.value}{cmp.wanted!s}"


def shown_write(op: Request) -> str:
    if isinstance(op, PutKey):
        return f"put {op.key.decode()}={op.value!r} lease={op.lease:x}"
    assert isinstance(op, DeleteRange), op
    return f"delete {op.key.decode()}"


def shown_read(req: Request) -> str:
    assert isinstance(req, Range), req
    where: str = req.key.decode()
    if req.range_end:
        where = f"[{where},{req.range_end.decode()})"
    return where + (f" limit={req.limit}" if req.limit else "")


def kv(key: str, *, lease: int = 0, version: int = 1, mod: int = 5, create: int = 5) -> Any:
    return types.SimpleNamespace(
        key=key.encode(),
        value=b"",
        lease=lease,
        version=version,
        mod_revision=mod,
        create_revision=create,
    )


def plan(ops: Sequence[Op], limit: int = 128) -> tuple[list[str], list[str], list[str]]:
    """(compares, writes, failure reads) of the first transaction of ``ops``."""
    folded = fold(ops, KEYS)
    guarded: dict[str, None] = {}
    success = writes("t", folded.final, guarded, CTX)
    conds = list(folded.conditions.values())
    shape(conds, limit)
    attempt = build(conds, guarded, limit, KEYS)
    return (
        [shown_compare(c) for c in attempt.compares],
        [shown_write(w) for w in success],
        [shown_read(p) for p in attempt.probes],
    )


# ---- operations in, one transaction out ------------------------------------------------

TABLE: list[tuple[str, list[Op], list[str], list[str], list[str]]] = [
    (
        "a put guards its ancestors' leases",
        [Put("/a/b", b"v")],
        ["lease(/ns/a)==0"],
        ["put /ns/a/b=b'v' lease=0"],
        ["/ns/a"],
    ),
    (
        "an ephemeral put is attached to the session's lease",
        [Put("/e", b"", ephemeral=True)],
        [],
        ["put /ns/e=b'' lease=51"],
        [],
    ),
    (
        "a create is an exact absence: no own key and nothing below",
        [Create("/a", b"x")],
        ["version(/ns/a)==0", "version([/ns/a/,/ns/a0))==0"],
        ["put /ns/a=b'x' lease=0"],
        ["/ns/a", "[/ns/a/,/ns/a0) limit=1"],
    ),
    (
        "a check of existence is sent in the own-key form, the other form read spare",
        [Check("/a", exists=True)],
        ["version(/ns/a)>0"],
        [],
        ["/ns/a", "[/ns/a/,/ns/a0) limit=1"],
    ),
    (
        "a version check compares the mod revision; a delete guards nothing",
        [Check("/a", version=7), Delete("/a")],
        ["mod(/ns/a)==7"],
        ["delete /ns/a"],
        ["/ns/a"],
    ),
    (
        "a version <= 0 never passes",
        [Check("/a", version=0)],
        ["version(/ns/a)<0"],
        [],
        ["/ns/a"],
    ),
    (
        "a create and an absence check of one path are one condition; a parent guarded",
        [Check("/j/a", exists=False), Create("/j/a")],
        ["version(/ns/j/a)==0", "version([/ns/j/a/,/ns/j/a0))==0", "lease(/ns/j)==0"],
        ["put /ns/j/a=b'' lease=0"],
        ["/ns/j/a", "[/ns/j/a/,/ns/j/a0) limit=1", "/ns/j"],
    ),
    (
        "delete then create of one path folds into one put with no compare",
        [Delete("/a"), Create("/a", b"n")],
        [],
        ["put /ns/a=b'n' lease=0"],
        [],
    ),
    (
        "the root's key ends with '/' and has no ancestor to guard",
        [Put("/", b"r")],
        [],
        ["put /ns/=b'r' lease=0"],
        [],
    ),
]


@pytest.mark.parametrize(
    ("ops", "compares", "success", "failure"),
    [case[1:] for case in TABLE],
    ids=[case[0] for case in TABLE],
)
def test_the_planner_table(
    ops: list[Op], compares: list[str], success: list[str], failure: list[str]
) -> None:
    assert plan(ops) == (compares, success, failure)


def test_a_create_after_a_write_of_the_same_path_dooms_the_commit() -> None:
    assert fold([Put("/a", b""), Create("/a")], KEYS).doomed == "/a"
    assert fold([Delete("/a"), Create("/a")], KEYS).doomed is None


def test_an_ephemeral_root_and_children_of_an_ephemeral_write_are_refused() -> None:
    with pytest.raises(ConfigError, match="cannot be ephemeral"):
        fold([Put("/", b"", ephemeral=True)], KEYS)
    folded = fold([Put("/e", b"", ephemeral=True), Put("/e/c", b"")], KEYS)
    with pytest.raises(StoreError, match="ephemeral node cannot have children"):
        writes("t", folded.final, {}, CTX)


def test_absences_past_the_limit_take_the_compact_form_after_a_pre_read() -> None:
    """Three creates at a limit of 4: the slack (4 - 3) leaves the first exact, the
    last two compact (one create-revision compare over [K, K0) each)."""
    folded = fold([Create("/a"), Create("/b"), Create("/c")], KEYS)
    conds = list(folded.conditions.values())
    shape(conds, 4)
    assert [c.compact for c in conds] == [False, True, True]
    chunks = absence_chunks([c for c in conds if c.compact], 4)
    assert [[shown_read(r) for r in reads] for _, reads in chunks] == [
        ["/ns/b", "[/ns/b/,/ns/b0) limit=1", "/ns/c", "[/ns/c/,/ns/c0) limit=1"]
    ]
    chunk = chunks[0][0]
    assert absence_refuted(chunk, 40, [[], [], [], []]) is None
    assert [c.since for c in chunk] == [40, 40]
    assert shown_compare(chunk[0].compares()[0]) == "create([/ns/b,/ns/b0))<41"
    assert absence_refuted(chunk, 41, [[], [], [kv("/ns/c/x")], []]) == "/c"


# ---- a failed transaction's reads in, a verdict out ---------------------------------------

VERDICTS: list[tuple[str, list[Op], list[list[Any]], Verdict, str | None]] = [
    (
        "a create whose key exists is false",
        [Create("/a")],
        [[kv("/ns/a")], [], []],
        Verdict.FALSE,
        "/a",
    ),
    (
        "a create below which a key exists is false (a pure parent)",
        [Create("/a")],
        [[], [kv("/ns/a/b")], []],
        Verdict.FALSE,
        "/a",
    ),
    (
        "an existence check of a pure parent holds in the other form: sent again",
        [Check("/a", exists=True)],
        [[], [kv("/ns/a/b")]],
        Verdict.RETRY,
        "/a",
    ),
    (
        "an existence check with neither form is false at once",
        [Check("/a", exists=True)],
        [[], []],
        Verdict.FALSE,
        "/a",
    ),
    (
        "a version check read with another mod revision is false",
        [Check("/a", version=7)],
        [[kv("/ns/a", mod=8)]],
        Verdict.FALSE,
        "/a",
    ),
    (
        "every condition held: the failure was elsewhere",
        [Check("/a", version=7)],
        [[kv("/ns/a", mod=7)]],
        Verdict.HOLDS,
        None,
    ),
]


@pytest.mark.parametrize(
    ("ops", "reads", "verdict", "path"),
    [case[1:] for case in VERDICTS],
    ids=[case[0] for case in VERDICTS],
)
def test_the_verdict_table(
    ops: list[Op], reads: list[list[Any]], verdict: Verdict, path: str | None
) -> None:
    folded = fold(ops, KEYS)
    guarded: dict[str, None] = {}
    writes("t", folded.final, guarded, CTX)
    conds = list(folded.conditions.values())
    shape(conds, 128)
    attempt = build(conds, guarded, 128, KEYS)
    assert judge("t", attempt, conds, folded.final, reads) == (verdict, path)


def test_a_guarded_ancestor_found_ephemeral_names_the_child_written() -> None:
    folded = fold([Put("/e/c", b"")], KEYS)
    guarded: dict[str, None] = {}
    writes("t", folded.final, guarded, CTX)
    attempt = build([], guarded, 128, KEYS)
    assert attempt.guards == ["/e"]
    with pytest.raises(StoreError, match=r"cannot write '/e/c': '/e' is an ephemeral node"):
        judge("t", attempt, [], folded.final, [[kv("/ns/e", lease=LEASE)]])


# ---- groups: nested transactions -------------------------------------------------------


def test_a_group_is_a_nested_transaction_with_its_own_compares() -> None:
    guards: dict[str, None] = {}
    planned = plan_group([Create("/j/running/1", b"m"), Put("/j/r/1", b"r")], guards, CTX)
    assert isinstance(planned, Planned)
    request = planned.request
    assert [shown_compare(c) for c in request.compare] == [
        "version(/ns/j/running/1)==0",
        "version([/ns/j/running/1/,/ns/j/running/10))==0",
    ]
    assert [shown_write(w) for w in request.success] == [
        "put /ns/j/running/1=b'm' lease=0",
        "put /ns/j/r/1=b'r' lease=0",
    ]
    # the ancestors are guarded by the outer transaction, once for every group
    assert list(guards) == ["/j/running", "/j", "/j/r"]
    assert planned.keys == {b"/ns/j/running/1", b"/ns/j/r/1"}
    assert messages.request_op(request).ByteSize() <= group_bytes(
        [Create("/j/running/1", b"m"), Put("/j/r/1", b"r")], len(KEYS.root)
    )


def test_a_doomed_group_is_its_path_and_a_refused_one_names_its_condition() -> None:
    assert plan_group([Put("/a", b""), Create("/a")], {}, CTX) == "/a"
    planned = plan_group([Check("/x", exists=True), Delete("/x")], {}, CTX)
    assert isinstance(planned, Planned)

    def reply(*reads: list[Any]) -> Any:
        return types.SimpleNamespace(
            responses=[
                types.SimpleNamespace(response_range=types.SimpleNamespace(kvs=r)) for r in reads
            ]
        )

    assert judge_group(planned, reply([], [])) == "/x"
    # a pure parent: every condition held in some form (committed again alone)
    planned = plan_group([Check("/x", exists=True), Delete("/x")], {}, CTX)
    assert isinstance(planned, Planned)
    assert judge_group(planned, reply([], [kv("/ns/x/y")])) is None


# ---- the records as etcd3's generated messages (messages.py) -----------------------------

#: each target's operand field in etcd's Compare (its ``target_union``)
OPERAND_FIELD = {
    Target.VERSION: "version",
    Target.CREATE: "create_revision",
    Target.MOD: "mod_revision",
    Target.VALUE: "value",
    Target.LEASE: "lease",
}


@pytest.mark.parametrize("target", list(Target), ids=[t.value for t in Target])
def test_a_compare_sets_the_operand_field_of_its_target_zero_included(target: Target) -> None:
    wanted: int | bytes = b"v" if target is Target.VALUE else 0
    message = messages.compare(Compare(b"/ns/a", target, Result.EQUAL, wanted, range_end=b"/ns0"))
    assert message.WhichOneof("target_union") == OPERAND_FIELD[target]
    assert getattr(message, OPERAND_FIELD[target]) == wanted
    assert message.target == getattr(type(message), target.name)
    assert (message.key, message.range_end, message.result) == (
        b"/ns/a",
        b"/ns0",
        type(message).EQUAL,
    )


def test_a_transaction_becomes_its_messages_field_for_field() -> None:
    """Each branch operation goes into the RequestOp field of its kind, nested
    transactions included; defaults stay unset (the bytes the parts used to build)."""
    inner = Txn((Compare(b"/ns/i", Target.MOD, Result.LESS, 4),), (DeleteRange(b"/ns/i"),))
    txn = Txn(
        (Compare(b"/ns/a", Target.VERSION, Result.GREATER, 0),),
        (PutKey(b"/ns/a", b"v", LEASE, prev_kv=True), DeleteRange(b"/ns/b/", b"/ns/b0"), inner),
        (Range(b"/ns/a", keys_only=True), Range(b"/ns/", b"/ns0", limit=1, min_create_revision=9)),
    )
    message = messages.txn_request(txn)
    assert [op.WhichOneof("request") for op in message.success] == [
        "request_put",
        "request_delete_range",
        "request_txn",
    ]
    put = message.success[0].request_put
    assert (put.key, put.value, put.lease, put.prev_kv) == (b"/ns/a", b"v", LEASE, True)
    assert message.success[1].request_delete_range.range_end == b"/ns/b0"
    nested = message.success[2].request_txn
    assert nested.compare[0].mod_revision == 4 and not nested.failure
    reads = [op.request_range for op in message.failure]
    assert [(r.key, r.range_end, r.keys_only, r.limit, r.min_create_revision) for r in reads] == [
        (b"/ns/a", b"", True, 0, 0),
        (b"/ns/", b"/ns0", False, 1, 9),
    ]
    # a default is the field left unset: the bytes of the message built with the rest
    assert (
        reads[0].SerializeToString()
        == type(reads[0])(key=b"/ns/a", keys_only=True).SerializeToString()
    )
    assert messages.kv_request(txn)[0] == "Txn"
    assert messages.kv_request(Range(b"/ns/a"))[0] == "Range"


def test_compare_holds_evaluates_a_compare_as_the_server_does() -> None:
    node = kv("/ns/a", lease=LEASE, version=2, mod=7, create=5)
    assert compare_holds(Compare(b"/ns/a", Target.MOD, Result.EQUAL, 7), node)
    assert compare_holds(Compare(b"/ns/a", Target.LEASE, Result.NOT_EQUAL, 0), node)
    assert not compare_holds(Compare(b"/ns/a", Target.CREATE, Result.LESS, 5), node)
    assert compare_holds(Compare(b"/ns/a", Target.VERSION, Result.EQUAL, 0), None)
    assert not compare_holds(Compare(b"/ns/a", Target.VALUE, Result.EQUAL, b""), None)
    assert compare_holds(Compare(b"/ns/a", Target.VALUE, Result.EQUAL, b""), node)


# ---- the part that sends, on a scripted transport ----------------------------------------


class ScriptedTxns:
    """Answers each transaction with the next scripted (succeeded, reads, revision)."""

    def __init__(self, *answers: tuple[bool, list[list[Any]], int]) -> None:
        self.answers = list(answers)
        self.sent: list[dict[str, Any]] = []

    def txn(
        self,
        what: str,
        *,
        compare: Sequence[Any] = (),
        success: Sequence[Any] = (),
        failure: Sequence[Any] = (),
    ) -> Any:
        self.sent.append({"what": what, "compare": list(compare), "failure": list(failure)})
        ok, reads, revision = self.answers.pop(0)
        return types.SimpleNamespace(
            succeeded=ok,
            header=types.SimpleNamespace(revision=revision),
            responses=[
                types.SimpleNamespace(response_range=types.SimpleNamespace(kvs=r)) for r in reads
            ],
        )


def test_commits_resend_a_pure_parent_check_in_the_other_form() -> None:
    """An existence check of a pure parent fails in the own-key form, its spare read
    finds keys below: it is sent again over the subtree, where it holds."""
    txns = ScriptedTxns((False, [[], [kv("/ns/p/c")]], 0), (True, [], 12))
    ops: list[Op] = [Check("/p", exists=True)]
    resp, failed = Commits(txns, CTX).write("t", ops, 2)
    assert (resp.succeeded, failed) == (True, None)
    assert [[shown_compare(c) for c in s["compare"]] for s in txns.sent] == [
        ["version(/ns/p)>0"],
        ["version([/ns/p/,/ns/p0))>0"],
    ]


def test_commits_report_the_condition_found_false_and_send_nothing_when_doomed() -> None:
    txns = ScriptedTxns((False, [[kv("/ns/a")], [], []], 0))
    resp, failed = Commits(txns, CTX).write("t", [Create("/a")], 128)
    assert (resp.succeeded, failed) == (False, "/a")
    empty = ScriptedTxns()
    assert Commits(empty, CTX).write("t", [Put("/a", b""), Create("/a")], 128) == (None, "/a")
    assert empty.sent == []


def test_commits_pre_read_compact_absences_and_stop_at_one_found() -> None:
    txns = ScriptedTxns((True, [[], [], [kv("/ns/c")], []], 30))
    resp, failed = Commits(txns, CTX).write("t", [Create("/a"), Create("/b"), Create("/c")], 4)
    assert (resp, failed) == (None, "/c")
    assert [s["what"] for s in txns.sent] == ["t: read before the commit"]
