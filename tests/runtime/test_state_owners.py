"""Each field of JobState has one owning module (``jobstate.OWNERS``), and the code
of ``shardkeeper.runtime`` writes each field only there: an AST scan of every
module for assignments to ``<state>.<field>``, item assignments into it and calls
of mutating methods on it. Also: no class in the runtime is a mixin left with
``NotImplementedError`` stubs, and the phase is changed only by Phase.transition."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import shardkeeper.runtime
from shardkeeper.runtime.job.jobstate import OWNERS, JobState

RUNTIME = Path(shardkeeper.runtime.__file__).parent
#: methods that change a set, dict or list in place
MUTATORS = {
    "add",
    "append",
    "clear",
    "difference_update",
    "discard",
    "extend",
    "intersection_update",
    "pop",
    "popitem",
    "remove",
    "setdefault",
    "symmetric_difference_update",
    "update",
}
#: the names that hold a JobState in the runtime's code
RECEIVERS = {"state", "st", "_state"}


def _fields() -> set[str]:
    names = {f.name for f in dataclasses.fields(JobState)}
    return names | {"strategy", "on_error"}  # set in __post_init__ and set_config


def _is_state(node: ast.expr, module: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id in RECEIVERS or (module == "jobstate" and node.id == "self")
    return isinstance(node, ast.Attribute) and node.attr in RECEIVERS


def _written(node: ast.expr, module: str, fields: set[str]) -> str | None:
    """The JobState field ``node`` writes into (``st.x``, ``st.x[k]``), if any."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr in fields and _is_state(node.value, module):
        return node.attr
    return None


def writers() -> dict[str, set[str]]:
    """field -> the runtime modules that write it."""
    fields = _fields()
    found: dict[str, set[str]] = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        module = path.stem
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    targets += target.elts if isinstance(target, ast.Tuple) else [target]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATORS
            ):
                targets = [node.func.value]
            for target in targets:
                name = _written(target, module, fields)
                if name is not None:
                    found.setdefault(name, set()).add(module)
    return found


def test_every_field_has_one_owner_written_down() -> None:
    """OWNERS names exactly the fields of JobState."""
    assert set(OWNERS) == _fields()


def test_only_the_owner_writes_each_field() -> None:
    """The scan finds each field written by its owner alone (and finds the writes:
    a scan that saw nothing would pass vacuously)."""
    found = writers()
    strays = {name: sorted(modules) for name, modules in found.items() if modules != {OWNERS[name]}}
    assert not strays, f"fields written outside their owner (field: writers): {strays}"
    # the scan does see writes of each kind, in several owners
    assert found["stats"] == {"jobstate"} and found["queue_hint"] == {"runner"}
    assert found["disabled_items"] == {"settings"} and found["starting"] == {"fires"}


def test_the_scan_catches_a_write_outside_the_owner() -> None:
    """A stray write, of each kind, is found (the check can fail)."""
    fields = _fields()
    for code in (
        "st.queue_hint = set()",
        "self._state.queue_hint.add(1)",
        "runner.state.stats['x'] = 1",
        "st.misfire_at, other = None, 1",
    ):
        [stmt] = ast.parse(code).body
        node = stmt.value if isinstance(stmt, ast.Expr) else stmt
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Attribute)
            target: ast.expr = node.func.value
        else:
            assert isinstance(node, ast.Assign)
            first = node.targets[0]
            target = first.elts[0] if isinstance(first, ast.Tuple) else first
        assert _written(target, "trigger", fields) is not None, code


def test_the_phase_is_changed_by_transition_alone() -> None:
    """``Phase._phase`` is assigned only in Phase.__init__ and Phase.transition."""
    tree = ast.parse((RUNTIME / "job" / "phase.py").read_text())
    assigning: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == "_phase" for t in node.targets
                ):
                    assigning.add(fn.name)
    assert assigning == {"__init__", "transition"}
    for path in RUNTIME.rglob("*.py"):
        if path.name != "phase.py":
            assert "._phase" not in path.read_text(), path.name


def test_no_mixin_and_no_stub_is_left_in_the_runtime() -> None:
    """No ``NotImplementedError`` stub (the mark of a mixin that borrows its host's
    methods), and JobRunner derives from nothing but object."""
    for path in sorted(RUNTIME.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                assert not (isinstance(exc, ast.Name) and exc.id == "NotImplementedError"), (
                    f"{path.name}:{node.lineno}: a NotImplementedError stub"
                )
    from shardkeeper.runtime.runner.runner import JobRunner

    assert JobRunner.__bases__ == (object,)
