"""The parts of the installed-package check (``tests/installed.py``) that judge: the dependency
check, the file implementation, and the comparison of counts inside and outside. The check
itself runs in ``scripts/tests.sh`` (it builds a wheel and a fresh environment: minutes)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

import canary_torch
from tests import installed


def test_requirement_names_leave_out_the_extras():
    assert installed.requirement_name("torch>=2.4") == "torch"
    assert installed.requirement_name("Typing_Extensions (>=4); python_version < '3.11'") == (
        "typing-extensions"
    )
    assert installed.requirement_name('pytest-xdist>=3.5; extra == "test"') is None


def test_an_undeclared_import_is_named_with_its_importers():
    """A third-party import is declared, the standard library's, or the wheel's own; anything else is named."""
    imports = {
        "torch": {"launch.py"},
        "json": {"report.py"},
        "canary": {"plugin.py"},
        "hypothesis": {"profiles.py", "strategies.py"},
        "yaml": {"cli.py"},
        "_pytest": {"plugin.py"},
    }
    provider = {"torch": ["torch"], "hypothesis": ["hypothesis"], "_pytest": ["pytest"]}
    wrong = installed.undeclared_imports(imports, {"canary"}, provider, {"torch", "pytest"})
    assert wrong == {
        "hypothesis": "imported by profiles.py, strategies.py; installed by hypothesis, not declared",
        "yaml": "imported by cli.py; not installed, not declared",
    }
    assert installed.undeclared_imports(imports, {"canary"}, provider, set()).keys() == {
        "torch",
        "hypothesis",
        "yaml",
        "_pytest",
    }


def test_imports_are_found_inside_functions_too(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("import os\n\ndef f():\n    import numpy.linalg\n    from torch import nn\n")
    found = installed.imported_modules([module])
    assert found == {"os": {"late.py"}, "numpy": {"late.py"}, "torch": {"late.py"}}


def test_the_file_implementation_is_canary_torch_under_another_name(tmp_path):
    path = tmp_path / installed.FILE_IMPL_NAME
    path.write_text(installed.FILE_IMPL)
    spec = importlib.util.spec_from_file_location("kv_file_impl", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__all__ == canary_torch.__all__
    for name in canary_torch.__all__:
        assert getattr(module, name) is getattr(canary_torch, name)


def inside_reports(folder, canary_tests, sglang_tests):
    gate = {
        "results": [
            {"target": {"module": "canary", "area": "correct"}, "tests": canary_tests},
            {"target": {"module": "canary_torch", "area": "correct"}, "tests": canary_tests},
            {"target": {"module": "strength.known_bad.x", "area": "hashing"}, "tests": {}},
        ]
    }
    (folder / "gate.json").write_text(json.dumps(gate))
    (folder / "sglang.json").write_text(json.dumps({"tests": sglang_tests}))


def test_counts_are_compared_run_by_run(tmp_path, capsys):
    """The same counts pass; any difference fails the check, naming the run."""
    inside_reports(tmp_path, {"passed": 461}, {"passed": 232, "xfailed": 229})
    inside = installed.inside_counts_from(tmp_path)
    assert inside == {
        "canary": {"passed": 461},
        "canary_torch": {"passed": 461},
        "conformance.adapters.sglang": {"passed": 232, "xfailed": 229},
    }
    runs = [
        {"name": "canary", "inside_impl": "canary", "tests": {"passed": 461}},
        {"name": "a file", "inside_impl": "canary", "tests": {"passed": 461}},
        {
            "name": "SGLang",
            "inside_impl": "conformance.adapters.sglang",
            "tests": {"passed": 232, "xfailed": 229},
        },
    ]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    installed.compare(tmp_path, inside, "test")
    assert "SGLang: 232 passed, 229 xfailed; inside: 232 passed, 229 xfailed: same" in (
        capsys.readouterr().out
    )
    runs[2]["tests"] = {"failed": 2, "passed": 232, "xfailed": 227}
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    with pytest.raises(installed.CheckFailed, match="the counts differ: SGLang$"):
        installed.compare(tmp_path, inside, "test")


def test_canarys_collected_count_is_compared_with_its_whole_run_inside(tmp_path, capsys):
    """canary's outside run is its stored vectors, every other test deselected: the tests it
    collected must equal the tests of the gate's run inside (deselected ones left out), else
    the check fails naming it."""
    inside_reports(tmp_path, {"passed": 461, "skipped": 3}, {"passed": 2})
    inside = installed.inside_counts_from(tmp_path)
    runs = [{"name": "canary, its stored vectors", "inside_impl": "canary", "collected": 464}]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    installed.compare(tmp_path, inside, "test")
    assert "canary, its stored vectors: 464 tests; inside: 461 passed, 3 skipped: same" in (
        capsys.readouterr().out
    )
    runs[0]["collected"] = 463
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    with pytest.raises(
        installed.CheckFailed, match="the counts differ: canary, its stored vectors$"
    ):
        installed.compare(tmp_path, inside, "test")
    assert installed.collected_of({"passed": 2, "deselected": 5, "xfailed": 1}) == 3


def test_the_stored_vectors_selected_outside_are_the_gates_but_the_engine_scale_ones():
    """The ``-k`` of the outside runs names the modules of stored vectors, the engine-scale
    ones (minutes under the interpreter) left out."""
    from strength import gate

    assert installed.VECTORS == ("-k", " or ".join(installed.VECTOR_MODULES))
    assert set(installed.VECTOR_MODULES) == set(gate.VECTOR_MODULES) - {"test_golden_scale.py"}


def test_the_runs_see_nothing_of_the_repository(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("CANARY_IMPL", "canary")
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "dev")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    env = installed.clean_env(CI="true")
    assert not {"PYTHONPATH", "CANARY_IMPL", "HYPOTHESIS_PROFILE", "VIRTUAL_ENV"} & env.keys()
    assert env["CI"] == "true"
