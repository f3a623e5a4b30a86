"""Conformance levels (conformance/levels.py): every test of the suite declares its level in the
table, no entry is stale, a core run leaves the full tests out and says so, and a test the
table does not name stops the run."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import levels
from tests import forked

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "conformance"


def pytest_run(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    """``pytest ARGS`` in a fresh process on CPU tensors, with ``env`` set."""
    return forked.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CANARY_DEVICE": "cpu", **env},
    )


def collect(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return pytest_run("--collect-only", "-q", *args, cwd=cwd)


@pytest.fixture(scope="module")
def collected() -> list[str]:
    done = collect("conformance")
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if "::" in line]


def suite_functions() -> set[str]:
    found = set()
    for path in SUITE.glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.add(f"{path.name}::{node.name}")
    return found


def test_every_test_function_declares_a_level_and_no_entry_is_stale():
    assert set(levels.LEVELS) == suite_functions()
    for name, declared in levels.LEVELS.items():
        assert declared in levels.LEVELS_ORDER or isinstance(declared, tuple), name


def test_every_case_pattern_names_a_case(collected):
    """Each full-level case pattern matches a collected case of a test that declares it (the
    launch checks' patterns are shared by two tests, one of which runs a subset)."""
    unmatched: dict[str, bool] = {}
    for name, declared in levels.LEVELS.items():
        if isinstance(declared, str):
            continue
        cases = [levels.split_nodeid(n)[1] for n in collected if levels.split_nodeid(n)[0] == name]
        for pattern in declared:
            hit = any(case and levels._pattern(pattern).fullmatch(case) for case in cases)
            unmatched[pattern] = unmatched.get(pattern, True) and not hit
    assert not [p for p, missing in unmatched.items() if missing]


def test_level_of_cases():
    assert levels.level_of("conformance/test_golden.py::test_write_verify_vector[wv-x]") == "core"
    rule = "conformance/test_source_validation.py::test_each_rule_raises_its_error"
    assert levels.level_of(f"{rule}[8]") == "full"
    assert levels.level_of(f"{rule}[9]") == "core"
    launch = "conformance/test_launch_refusals.py::test_bad_launch_raises_before_any_work"
    assert levels.level_of(f"{launch}[write: ring [4, 7]]") == "full"
    assert levels.level_of(f"{launch}[write: canary_buf strided]") == "core"
    empty = "conformance/test_launch_refusals.py::test_empty_plans_are_still_validated"
    assert levels.level_of(f"{empty}[verify: slot stride 24 bytes]") == "full"
    assert levels.level_of(f"{launch}[verify: slot stride 24 bytes]") == "core"
    with pytest.raises(levels.UndeclaredLevel, match="test_new"):
        levels.level_of("conformance/test_golden.py::test_new")


def test_a_core_run_leaves_the_full_tests_out(collected):
    done = collect("conformance", "--canary-level", "core")
    assert done.returncode == 0, done.stdout + done.stderr
    core = [line for line in done.stdout.splitlines() if "::" in line]
    assert core and len(core) < len(collected)
    assert set(core) == {n for n in collected if levels.level_of(n) == "core"}
    assert "deselected" in done.stdout


def test_the_level_comes_from_the_environment_and_is_checked():
    env_core = pytest_run("conformance/test_buffers.py", CANARY_LEVEL="core")
    assert env_core.returncode == 0, env_core.stdout + env_core.stderr
    assert "canary level: core" in env_core.stdout
    assert "at level core" in env_core.stdout
    bad = pytest_run("conformance/test_buffers.py", "--co", "-q", CANARY_LEVEL="most")
    assert bad.returncode == 4 and "CANARY_LEVEL='most'" in bad.stdout + bad.stderr


def test_an_undeclared_test_stops_the_run(tmp_path):
    """A suite module with a test the table does not name is a usage error, not a silent core."""
    copy = tmp_path / "repo"
    shutil.copytree(SUITE, copy / "conformance", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "conformance" / "test_extra.py").write_text("def test_unlisted():\n    assert 1\n")
    done = collect("conformance/test_extra.py", cwd=copy)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "test_extra.py::test_unlisted declares no conformance level" in done.stdout + done.stderr
