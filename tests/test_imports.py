"""The project's import graph: no module imports itself back, and the description layers of
``strategies`` stay torch-free.

The graph is read from the source with ``ast``, so it holds imports made inside functions
(deferred ones) as well as module-level ones: a circle that only closes at call time is still
a circle. An edge goes to the module an import names (``from strategies.layouts import X``:
``strategies.layouts``; ``from conformance import profiles``: ``conformance.profiles``), not
to the packages above it that Python runs first, which every package's own ``__init__``
would otherwise close into a circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.house import PACKAGES

ROOT = Path(__file__).resolve().parents[1]


#: Modules that describe without making anything real: importing one must not import torch.
#: (The ``strategies`` package re-exports :mod:`strategies.materialize`, which does.)
#: Each with what it must also do without torch: draw a default strategy (``dtypes=None`` once
#: imported torch to list the dtypes), except for invalid arguments, whose expected error is
#: the reference's verdict on an object made with torch.
TORCH_FREE = {
    "strategies.layouts": "find(module.fingerprint_cases(), bool)",
    "strategies.chains": "find(module.canary_worlds(), bool)",
    "strategies.verify": "find(module.verify_batches(()), bool)",
    "strategies.invalid": "module.invalid_source_cases()",
    "strategies.sizes": "find(module.sizes(2**20, block=16), bool)",
}


def module_files() -> dict[str, Path]:
    """Every project module by dotted name (a package by its own name, for ``__init__.py``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name ``from <node.module> import ...`` refers to inside ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, source: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """The project modules (of ``known``) that ``module``, whose text is ``source``, imports
    anywhere: at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve(module, is_package, node)
            # ``from pkg import sub`` names the submodule when there is one
            names = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in known else origin
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            # ``import a.b.c`` of a project module; a name from outside the project is dropped
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    known = set(files)
    return {
        module: imports_of(module, path.read_text(), known, is_package=path.name == "__init__.py")
        for module, path in files.items()
    }


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), each as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle(graph, set(group)) for group in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest closed path through the group's first module, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start} in {sorted(group)}")


def test_the_graph_sees_every_package_and_deferred_imports():
    """The graph holds each package, and an import inside a function counts as an edge."""
    graph = import_graph()
    assert set(PACKAGES) <= set(graph)
    assert "strategies.layouts" in graph["strategies.chains"]
    tree = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(tree) == [["a", "b", "c", "a"]]
    deferred = "def f():\n    from strategies.materialize import materialize\n"
    assert imports_of("probe", deferred, set(graph)) == {"strategies.materialize"}
    relative = "from . import layouts\nfrom .chains import Chain\nimport numpy\n"
    assert imports_of("strategies.invalid", relative, set(graph)) == {
        "strategies.layouts",
        "strategies.chains",
    }


def test_no_import_circle_among_the_project_modules():
    """No project module imports itself back, at module level or inside a function."""
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def imports_torch(module: str, then: str = "None") -> bool:
    """Whether importing ``module`` of the ``strategies`` package, and evaluating ``then``
    (``module`` and Hypothesis' ``find`` in scope), loads torch in a fresh interpreter. The
    package's ``__init__`` (which re-exports everything, materialisation included) is
    bypassed, so only what the module itself imports counts."""
    code = (
        "import importlib, sys, types\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "package = types.ModuleType('strategies')\n"
        f"package.__path__ = [{str(ROOT / 'strategies')!r}]\n"
        "sys.modules['strategies'] = package\n"
        f"module = importlib.import_module({module!r})\n"
        "from hypothesis import find\n"
        f"{then}\n"
        "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"importing {module} failed:\n{result.stderr}"
    return result.stdout.split() == ["True"]


@pytest.mark.parametrize("module", sorted(TORCH_FREE))
def test_description_modules_do_not_import_torch(module):
    """The strategies that describe (layouts, worlds and batches, invalid arguments) import
    no torch, nor do their default strategies when built or drawn: only
    :mod:`strategies.materialize` makes descriptions real."""
    then = TORCH_FREE[module]
    assert not imports_torch(module, then), f"importing {module} and {then} loads torch"


def test_the_torch_probe_sees_torch():
    """The probe above is not blind: materialisation imports torch, and it says so."""
    assert imports_torch("strategies.materialize")


@pytest.mark.parametrize("module", ["engine_model", "engine_model.faults"])
def test_the_engine_model_imports_neither_torch_nor_the_strategies(module):
    """The engine model is an oracle beside :mod:`reference`: importing it loads no torch, and
    nothing of :mod:`strategies` (whose package re-exports the torch-bound materialisation)."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'strategies'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"importing {module} failed:\n{result.stderr}"
    assert result.stdout.split() == ["[]"], f"importing {module} loads {result.stdout.strip()}"
