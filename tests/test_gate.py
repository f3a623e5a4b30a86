"""Self-tests of the strength gate (conformance.gate) and of the known-bad catalogue.

Nothing here runs the suite on the catalogue: outcomes come from fake runners and tiny fake
commands. Catalogue modules are imported only in a child process, since each one patches
canary for the whole process that imports it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conformance import gate
from conformance.plugin import CORE_NAMES

KNOWN_BAD = gate.REPO_ROOT / "known_bad"


@pytest.fixture(scope="module")
def catalogue():
    mutants, correct = gate.load_targets()
    return mutants, correct


def fake_runner(outcomes: dict[str, str]):
    """A runner that reports ``outcomes[module]`` for each target, without running anything."""

    def run(target: gate.Target) -> gate.Result:
        outcome = outcomes[target.module]
        first = "conformance/test_x.py::test_y" if outcome == gate.KILLED else None
        return gate.Result(target, outcome, 0.5, {"passes": 0, "killed": 1}.get(outcome, 4), first)

    return run


# --- classification of one suite run -------------------------------------------------------

FAILED_OUTPUT = """\
..F
=========================== short test summary info ============================
FAILED conformance/test_fingerprint.py::test_addresses[rows 2^31 apart] - AssertionError: x - y
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
1 failed, 2 passed in 3.21s
"""


@pytest.mark.parametrize(
    ("returncode", "output", "outcome", "first"),
    [
        (0, "....\n4 passed in 1.00s\n", "passes", None),
        (1, FAILED_OUTPUT, "killed", "conformance/test_fingerprint.py::test_addresses[rows 2^31 apart]"),
        (1, "F\n1 failed in 0.50s\n", "killed", None),
        (1, "==== 1 failed, 3 passed in 0.50s ====\n", "killed", None),
        (1, "E\nERROR conformance/test_f.py - ValueError: bad\n1 error in 0.11s\n", "error", None),
        (4, "ERROR: --canary-impl 'nope': cannot import it\n", "error", None),
        (5, "no tests ran in 0.01s\n", "error", None),
        (-11, "Fatal Python error: Segmentation fault\n", "error", None),
        (None, "", "error", None),
        (2, "!!! Interrupted: 1 error during collection !!!\n", "error", None),
    ],
    ids=["pass", "failed line", "count only", "framed count", "errors only", "usage error",
         "no tests", "signal", "timeout", "interrupted"],
)  # fmt: skip
def test_classify(returncode, output, outcome, first):
    """A run passes on exit 0, is killed on exit 1 with failed tests, and is an error otherwise."""
    assert gate.classify(returncode, output) == (outcome, first)


def test_failed_tests_keeps_ids_with_spaces_and_dashes():
    """Node ids are read whole from FAILED lines, up to the ' - ' before the message."""
    output = FAILED_OUTPUT + "FAILED conformance/t.py::test_z[a-b]\n"
    assert gate.failed_tests(output) == [
        "conformance/test_fingerprint.py::test_addresses[rows 2^31 apart]",
        "conformance/t.py::test_z[a-b]",
    ]


# --- the gate's verdict --------------------------------------------------------------------

TARGETS = [
    gate.Target("known_bad.a", "hashing", "killed", "bug a"),
    gate.Target("known_bad.b", "validation", "killed", "bug b"),
    gate.Target("good", gate.CORRECT_AREA, "passes"),
]


def test_gate_ok_when_every_outcome_is_expected(capsys, tmp_path):
    """Exit 0 when every mutant is killed and every correct module passes; table, summary, JSON."""
    outcomes = {"known_bad.a": "killed", "known_bad.b": "killed", "good": "passes"}
    report = tmp_path / "gate.json"
    status = gate.main(
        ["--jobs", "2", "--json", str(report)], targets=TARGETS, runner=fake_runner(outcomes)
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "known_bad.a" in out and "conformance/test_x.py::test_y" in out
    assert "kill rate 2/2 (100.0%)" in out and "mean 0.5 s per mutant" in out
    assert "gate OK" in out
    facts = json.loads(report.read_text())
    assert facts["summary"]["ok"] is True
    assert [r["outcome"] for r in facts["results"]] == ["killed", "killed", "passes"]


@pytest.mark.parametrize(
    "outcomes",
    [
        {"known_bad.a": "killed", "known_bad.b": "passes", "good": "passes"},  # a survivor
        {"known_bad.a": "killed", "known_bad.b": "error", "good": "passes"},  # a crash
        {"known_bad.a": "killed", "known_bad.b": "killed", "good": "killed"},  # a false alarm
        {"known_bad.a": "killed", "known_bad.b": "killed", "good": "error"},  # correct one broken
    ],
    ids=["survivor", "error is no kill", "correct killed", "correct errors"],
)
def test_gate_fails_on_any_unexpected_outcome(capsys, outcomes):
    """Exit 1 when any outcome differs from its expectation, naming the module in the summary."""
    assert gate.main([], targets=TARGETS, runner=fake_runner(outcomes)) == 1
    out = capsys.readouterr().out
    (odd,) = [m for m, o in outcomes.items() if o != {"good": "passes"}.get(m, "killed")]
    assert f"gate FAILED: {odd}" in out


def test_flipping_one_real_expectation_fails_the_gate(catalogue, capsys):
    """With the real catalogue and a suite that kills every mutant, flipping one entry to 'passes' fails the gate."""
    mutants, correct = catalogue
    perfect = {t.module: t.expected for t in [*mutants, *correct]}
    assert gate.main([], targets=[*mutants, *correct], runner=fake_runner(perfect)) == 0
    flipped = [dataclasses.replace(mutants[0], expected="passes"), *mutants[1:], *correct]
    capsys.readouterr()
    assert gate.main([], targets=flipped, runner=fake_runner(perfect)) == 1
    assert f"gate FAILED: {mutants[0].module}" in capsys.readouterr().out


def test_only_filters_and_refuses_an_empty_selection(capsys):
    """--only keeps the modules whose name contains it; a selection of nothing is a usage error."""
    seen = []

    def runner(target):
        seen.append(target.module)
        return fake_runner({"known_bad.a": "killed"})(target)

    assert gate.main(["--only", ".a"], targets=TARGETS, runner=runner) == 0
    assert seen == ["known_bad.a"]
    with pytest.raises(SystemExit) as caught:
        gate.main(["--only", "no such module"], targets=TARGETS, runner=runner)
    assert caught.value.code == 2


def test_results_keep_catalogue_order_whatever_finishes_first():
    """Results come back in the order of the targets, not of completion."""
    import time

    def runner(target):
        time.sleep(0.05 if target.module == "known_bad.a" else 0)
        return fake_runner({"known_bad.a": "killed", "known_bad.b": "killed", "good": "passes"})(
            target
        )

    results = gate.run_all(TARGETS, runner, jobs=3)
    assert [r.target.module for r in results] == [t.module for t in TARGETS]


# --- the subprocess runs -------------------------------------------------------------------


def test_command_and_environment():
    """Each run is the whole suite (quick modules first) on one module, -x, no cache, with
    CI=true and the repo importable."""
    command = gate.pytest_command("known_bad.x", "cuda:1")
    assert command[:3] == [sys.executable, "-m", "pytest"]
    for part in ("-q", "-x", "no:cacheprovider"):
        assert part in command
    modules = [part for part in command if part.startswith("conformance/")]
    on_disk = sorted(
        f"conformance/{p.name}" for p in (gate.REPO_ROOT / "conformance").glob("test_*.py")
    )
    assert sorted(modules) == on_disk, "every suite module runs, each once"
    assert modules[0] == "conformance/test_spec_vectors.py"
    properties = gate.pytest_command("known_bad.x", properties_only=True)
    left_out = {f"conformance/{name}" for name in gate.VECTOR_MODULES}
    assert set(modules) - left_out == {p for p in properties if p.startswith("conformance/")}
    assert command[command.index("--canary-impl") + 1] == "known_bad.x"
    assert command[command.index("--canary-device") + 1] == "cuda:1"
    assert "--canary-device" not in gate.pytest_command("canary")
    env = gate.child_environment()
    assert env["CI"] == "true"
    assert str(gate.REPO_ROOT) in env["PYTHONPATH"].split(os.pathsep)


def _fake_suite(monkeypatch, code: str) -> None:
    monkeypatch.setattr(
        gate, "pytest_command", lambda module, device=None, **_: [sys.executable, "-c", code]
    )


def test_run_target_classifies_a_real_subprocess(monkeypatch):
    """run_target runs the command, reads its exit status and output, and times it."""
    _fake_suite(
        monkeypatch,
        "print('FAILED conformance/t.py::test_k - boom'); print('1 failed in 0.1s'); raise SystemExit(1)",
    )
    result = gate.run_target(TARGETS[0], device=None, timeout_s=60)
    assert (result.outcome, result.returncode) == ("killed", 1)
    assert result.first_failure == "conformance/t.py::test_k"
    assert result.failure_line == "FAILED conformance/t.py::test_k - boom"
    assert result.seconds > 0

    _fake_suite(monkeypatch, "import sys; print('usage'); sys.exit(4)")
    result = gate.run_target(TARGETS[0], device=None, timeout_s=60)
    assert (result.outcome, result.returncode) == ("error", 4)
    assert "usage" in result.tail


def test_run_target_times_out_as_an_error(monkeypatch):
    """A run that outlives the timeout is stopped and counted as an error, never as a kill."""
    _fake_suite(monkeypatch, "import time; print('FAILED a::b', flush=True); time.sleep(30)")
    result = gate.run_target(TARGETS[0], device=None, timeout_s=0.5)
    assert result.outcome == "error" and result.returncode is None
    assert "timed out" in result.tail


# --- the catalogue -------------------------------------------------------------------------


def test_catalogue_entries_are_well_formed(catalogue):
    """Entries name distinct known_bad modules, a known area, and expect a kill; CORRECT expects passes."""
    import known_bad

    mutants, correct = catalogue
    assert len(mutants) >= 14
    modules = [t.module for t in mutants]
    assert len(set(modules)) == len(modules)
    for target in mutants:
        assert target.module.startswith("known_bad.")
        assert target.area in known_bad.AREAS
        assert target.expected in known_bad.OUTCOMES
        assert target.bug and "\n" not in target.bug
    assert [t.module for t in correct] == list(known_bad.CORRECT)
    assert all(t.expected == "passes" for t in correct)


def test_every_mutant_file_is_catalogued_and_documented(catalogue):
    """Each known_bad/<name>.py is in the catalogue (and back), with a docstring naming a SPEC rule."""
    mutants, _ = catalogue
    files = {p.stem for p in KNOWN_BAD.glob("*.py") if not p.name.startswith("_")}
    assert files == {t.module.split(".", 1)[1] for t in mutants}
    for stem in files:
        doc = ast.get_docstring(ast.parse((KNOWN_BAD / f"{stem}.py").read_text()))
        assert doc and "SPEC" in doc, f"known_bad/{stem}.py needs a docstring naming its SPEC rule"


_IMPORT_EACH = textwrap.dedent(
    """
    import importlib, os, sys, traceback
    import canary  # the slow imports once, before forking

    core = sys.argv[1].split(",")
    bad = []
    for name in sys.argv[2:]:
        pid = os.fork()
        if pid == 0:  # one child per module: each patches canary for its whole process
            code = 0
            try:
                module = importlib.import_module(name)
                missing = [n for n in core if not hasattr(module, n)]
                if missing:
                    print(f"{name} does not provide {missing}")
                    code = 3
            except BaseException:
                traceback.print_exc()
                code = 2
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status:
            bad.append(name)
    print("modules that failed:", bad)
    sys.exit(1 if bad else 0)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="imports each module in a forked child")
def test_every_module_imports_and_provides_the_core_names(catalogue, tmp_path):
    """Every catalogue and correct module imports (its patches apply) and provides the core API names."""
    mutants, correct = catalogue
    modules = [t.module for t in [*mutants, *correct]]
    # Forked children end with os._exit, so no exit handler removes their patched kernel
    # files: they go to this test's own temporary directory.
    env = {**gate.child_environment(), "TMPDIR": str(tmp_path)}
    completed = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, ",".join(CORE_NAMES), *modules],
        cwd=gate.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


# --- the patching helpers ------------------------------------------------------------------


def test_apply_replaces_every_occurrence_and_refuses_a_missing_text():
    """A replacement changes every occurrence of its text; a text that does not occur raises."""
    from known_bad._mutate import apply

    assert apply("a + a - b", (("a", "c"), ("b", "d")), what="t") == "c + c - d"
    with pytest.raises(LookupError, match="no longer occurs"):
        apply("a + b", (("z", "y"),), what="t")


def test_patch_function_rewrites_in_the_original_globals(tmp_path, monkeypatch):
    """A patched function runs with its module's globals and replaces the module attribute."""
    import importlib

    from known_bad._mutate import patch_function

    (tmp_path / "gate_probe_module.py").write_text(
        "SCALE = 3\n\n\ndef times(x):\n    return x * SCALE\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.import_module("gate_probe_module")
    try:
        patch_function(probe, "times", ("x * SCALE", "x * SCALE + 1"))
        assert probe.times(2) == 7
        probe.SCALE = 10  # the module's globals, not a copy of them
        assert probe.times(2) == 21
    finally:
        sys.modules.pop("gate_probe_module", None)
