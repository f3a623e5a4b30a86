"""The engine model's layout: the package exports the names its importers take, a fault class
reaches an engine only through its public names and its hooks, and no module or function
outgrows the project's limits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import engine_model
from engine_model import faults
from engine_model.hooks import EngineHooks

PACKAGE = Path(engine_model.__file__).resolve().parent
MODULES = sorted(PACKAGE.rglob("*.py"))
FAULT_MODULES = sorted((PACKAGE / "faults").glob("*.py"))
#: The project's limits: lines of a module, and of a function.
MODULE_LINES, FUNCTION_LINES = 800, 80


def test_the_package_exports_what_its_importers_take():
    """``from engine_model import X`` serves every name the suite, the tools and the tests
    import, and ``engine_model.faults`` the names of the one module it was."""
    names = {"Engine", "EngineConfig", "Forward", "GroupLaunch", "Move", "MoveGroup", "Sweep"}
    names |= {"SweepGroup", "KV_BYTES", "FULL", "SWA", "GROUPS", "STAGES", "ORACLE_MODES"}
    names |= {"PREFILL_ENGINE", "pick_from"}
    assert names <= set(engine_model.__all__)
    assert all(hasattr(engine_model, name) for name in engine_model.__all__)
    assert set(faults.__all__) == {
        "FAULTS", "FAULT_KINDS", "KV_BYTE_FAULTS", "KV_FAULTS", "MOVE_FAULTS", "READ_BYTES",
        "REQ_TO_TOKEN", "UNSEEABLE", "tags", "Due", "Fault", "FaultClass", "make",
    }  # fmt: skip
    assert all(hasattr(faults, name) for name in faults.__all__)


def engine_uses(path: Path) -> list[str]:
    """Where a module reads a private name of an engine (``engine._x``) or sets an attribute
    of one (``engine.x = ...``), as ``line: text``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets = [t for target in targets for t in getattr(target, "elts", [target])]
        for target in targets:
            if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "engine":
                found.append(f"{node.lineno}: sets {ast.unparse(target)}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and ast.unparse(node.value) in ("engine", "engine.peer")
        ):
            found.append(f"{node.lineno}: reads {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", FAULT_MODULES, ids=lambda p: p.name)
def test_a_fault_class_uses_only_the_engines_public_names(path):
    """A fault class calls an engine's public methods and arms its hooks
    (:class:`engine_model.hooks.EngineHooks`): no private method, no attribute of its own."""
    assert engine_uses(path) == [], path.name


def test_the_check_of_engine_uses_sees_both(tmp_path):
    """The check above is not blind: a private call and a loose attribute are named, an armed
    hook is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("engine._truncate(entry, 1)\nengine.store_fault = None\nengine.hooks.x = 1\n")
    assert sorted(engine_uses(probe)) == ["1: reads engine._truncate", "2: sets engine.store_fault"]


def test_every_hook_is_documented():
    """Each field of the hooks says what it is (a ``#:`` comment above it)."""
    source = (PACKAGE / "hooks.py").read_text().splitlines()
    for name in EngineHooks.__dataclass_fields__:
        line = next(i for i, text in enumerate(source) if text.startswith(f"    {name}:"))
        assert source[line - 1].strip().startswith("#:"), name


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_or_function_outgrows_the_limits(path):
    """A module of the engine model has at most 800 lines, a function at most 80."""
    text = path.read_text()
    assert len(text.splitlines()) <= MODULE_LINES
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > FUNCTION_LINES
    ]
    assert long == []
