"""Self-tests of the strength gate (strength.gate) and of the known-bad catalogue.

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

import hypothesis.errors
import pytest

from tests import forked

if sys.version_info < (3, 11):  # the builtin arrived in 3.11
    from exceptiongroup import ExceptionGroup

from conformance.plugin import CORE_NAMES
from strength import gate, gate_record, known_bad

KNOWN_BAD = gate.REPO_ROOT / "strength" / "known_bad"


@pytest.fixture(scope="module")
def catalogue():
    mutants, correct = gate.load_targets()
    return mutants, correct


def fake_runner(outcomes: dict[str, str]):
    """A runner that reports ``outcomes[module]`` for each target, without running anything."""

    def run(target: gate.Target) -> gate.Result:
        outcome = outcomes[target.module]
        first = "conformance/test_x.py::test_y" if outcome == gate.KILLED else None
        code = {"passes": 0, "killed": 1, "misplaced": 1}.get(outcome, 4)
        return gate.Result(target, outcome, 0.5, code, first, detail=f"{outcome} detail")

    return run


# --- classification of one suite run -------------------------------------------------------

KILL_TARGET = gate.Target(
    "strength.known_bad.x", "hashing", "killed", "bug", ("test_f.py::test_hash*",)
)
CORRECT_TARGET = gate.Target("canary", gate.CORRECT_AREA, "passes")


def failure(nodeid: str, kind: str = "assertion", when: str = "call") -> dict:
    types = {"assertion": ["builtins.AssertionError"], "crash": ["builtins.TypeError"]}
    return {
        "nodeid": nodeid,
        "when": when,
        "kind": kind,
        "types": types.get(kind, ["x.Y"]),
        "message": "m",
    }


def record(*failures: dict, collection_errors=()) -> dict:
    return {
        "exit_status": 1 if failures else 0,
        "failures": list(failures),
        "collection_errors": list(collection_errors),
    }


HASH_FAILS = failure("conformance/test_f.py::test_hash_equal[case 1]")
OTHER_FAILS = failure("conformance/test_g.py::test_other")


@pytest.mark.parametrize(
    ("returncode", "run", "target", "outcome", "first"),
    [
        (0, record(), KILL_TARGET, "passes", None),
        (1, record(OTHER_FAILS, HASH_FAILS), KILL_TARGET, "killed", HASH_FAILS["nodeid"]),
        (1, record(OTHER_FAILS), KILL_TARGET, "misplaced", OTHER_FAILS["nodeid"]),
        (1, record(failure("conformance/test_g.py::t", "refusal"), HASH_FAILS), KILL_TARGET,
         "killed", HASH_FAILS["nodeid"]),
        (1, record(failure("conformance/test_f.py::test_hash", "refusal")), KILL_TARGET,
         "killed", "conformance/test_f.py::test_hash"),
        (1, record(failure("conformance/test_f.py::test_hash", "crash")), KILL_TARGET, "error",
         "conformance/test_f.py::test_hash"),
        (1, record(HASH_FAILS, failure("conformance/test_g.py::t", "crash")), KILL_TARGET,
         "error", "conformance/test_g.py::t"),
        (1, record(failure("conformance/test_f.py::test_hash", "health-check")), KILL_TARGET,
         "error", "conformance/test_f.py::test_hash"),
        (1, record(failure("conformance/test_f.py::test_hash", "flaky")), KILL_TARGET, "error",
         "conformance/test_f.py::test_hash"),
        (1, record(), KILL_TARGET, "error", None),
        (2, record(collection_errors=[{"nodeid": "conformance/test_f.py", "message": "x"}]),
         KILL_TARGET, "error", None),
        (4, None, KILL_TARGET, "error", None),
        (None, None, KILL_TARGET, "error", None),
        (1, record(OTHER_FAILS), CORRECT_TARGET, "killed", OTHER_FAILS["nodeid"]),
        (1, record(failure("conformance/test_g.py::t", "crash")), CORRECT_TARGET, "error",
         "conformance/test_g.py::t"),
    ],
    ids=["pass", "listed kill", "only unlisted", "refusal elsewhere", "refusal in listed test", "crash in listed test", "kill and a crash",
         "health check", "flaky", "exit 1, nothing recorded", "collection error",
         "usage error, no record", "timeout", "correct one fails", "correct one crashes"],
)  # fmt: skip
def test_classify(returncode, run, target, outcome, first):
    """Each recorded run gets the outcome the kill rule gives it (what counts as a kill: see
    strength/gate.py)."""
    got = gate.classify(returncode, run, target)
    assert got[:2] == (outcome, first)
    if outcome == "error" and run and run["failures"]:
        assert first in got[2]  # the error names the test that crashed


def test_listed_matches_test_functions_with_every_parametrization():
    """A pattern names a suite module and test function (globs allowed), parameters included."""
    patterns = ("test_f.py::test_hash*", "test_g.py::test_exact")
    assert gate.listed("conformance/test_f.py::test_hash_equal[a-b[c]]", patterns)
    assert gate.listed("conformance/test_g.py::test_exact[x]", patterns)
    assert not gate.listed("conformance/test_g.py::test_exact_not", patterns)
    assert not gate.listed("conformance/test_h.py::test_hash_equal", patterns)


# --- the gate's verdict --------------------------------------------------------------------

TARGETS = [
    gate.Target("strength.known_bad.a", "hashing", "killed", "bug a"),
    gate.Target("strength.known_bad.b", "validation", "killed", "bug b"),
    gate.Target("good", gate.CORRECT_AREA, "passes"),
]


def test_gate_ok_when_every_outcome_is_expected(capsys, tmp_path):
    """Exit 0 when every mutant is killed and every correct module passes; table, summary, JSON."""
    outcomes = {
        "strength.known_bad.a": "killed",
        "strength.known_bad.b": "killed",
        "good": "passes",
    }
    report = tmp_path / "gate.json"
    status = gate.main(
        ["--jobs", "2", "--json", str(report)], targets=TARGETS, runner=fake_runner(outcomes)
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "strength.known_bad.a" in out and "conformance/test_x.py::test_y" in out
    assert "kill rate 2/2 (100.0%)" in out and "mean 0.5 s per mutant" in out
    assert "gate OK" in out
    facts = json.loads(report.read_text())
    assert facts["summary"]["ok"] is True
    assert [r["outcome"] for r in facts["results"]] == ["killed", "killed", "passes"]


@pytest.mark.parametrize(
    "outcomes",
    [
        {
            "strength.known_bad.a": "killed",
            "strength.known_bad.b": "passes",
            "good": "passes",
        },  # a survivor
        {
            "strength.known_bad.a": "killed",
            "strength.known_bad.b": "error",
            "good": "passes",
        },  # a crash
        {
            "strength.known_bad.a": "killed",
            "strength.known_bad.b": "killed",
            "good": "killed",
        },  # a false alarm
        {
            "strength.known_bad.a": "killed",
            "strength.known_bad.b": "killed",
            "good": "error",
        },  # correct one broken
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
        return fake_runner({"strength.known_bad.a": "killed"})(target)

    assert gate.main(["--only", ".a"], targets=TARGETS, runner=runner) == 0
    assert seen == ["strength.known_bad.a"]
    with pytest.raises(SystemExit) as caught:
        gate.main(["--only", "no such module"], targets=TARGETS, runner=runner)
    assert caught.value.code == 2


def test_leave_out_drops_exactly_the_named_modules_and_refuses_an_unknown_one(capsys):
    seen = []

    def runner(target):
        seen.append(target.module)
        return fake_runner({t.module: t.expected for t in TARGETS})(target)

    names = [t.module for t in TARGETS]
    gate.main(["--leave-out", names[0]], targets=TARGETS, runner=runner)
    assert sorted(seen) == sorted(names[1:])
    with pytest.raises(SystemExit) as caught:
        gate.main(["--leave-out", names[0][:-1]], targets=TARGETS, runner=runner)
    assert caught.value.code == 2
    assert "--leave-out names no module of the gate" in capsys.readouterr().err


def test_bounds_mutants_run_on_the_cpu_only(capsys, monkeypatch):
    """The mutants that read outside their buffers run where the watch masks those reads (the
    CPU) and nowhere else; the gate says it left them out."""
    monkeypatch.delenv("CANARY_DEVICE", raising=False)
    bounds_target = gate.Target(
        "strength.known_bad.b", gate.CPU_ONLY_AREA, "killed", "bug", ("t::f",)
    )
    targets = [bounds_target, CORRECT_TARGET]
    outcomes = {"strength.known_bad.b": "killed", "canary": "passes"}
    for device, expected in (("cpu", ["strength.known_bad.b", "canary"]), ("cuda:1", ["canary"])):
        seen = []

        def runner(target, seen=seen):
            seen.append(target.module)
            return fake_runner(outcomes)(target)

        assert gate.main(["--device", device], targets=targets, runner=runner) == 0
        assert sorted(seen) == sorted(expected)
    assert "left out on this device: the 1 bounds mutant(s)" in capsys.readouterr().err
    monkeypatch.setenv("CANARY_DEVICE", "cuda")
    assert not gate.runs_on_cpu(None)
    assert gate.runs_on_cpu("cpu")
    import strength.known_bad

    assert gate.CPU_ONLY_AREA in strength.known_bad.AREAS


def test_results_keep_catalogue_order_whatever_finishes_first():
    """Results come back in the order of the targets, not of completion."""
    import time

    def runner(target):
        time.sleep(0.05 if target.module == "strength.known_bad.a" else 0)
        return fake_runner(
            {"strength.known_bad.a": "killed", "strength.known_bad.b": "killed", "good": "passes"}
        )(target)

    results = gate.run_all(TARGETS, runner, jobs=3)
    assert [r.target.module for r in results] == [t.module for t in TARGETS]


def test_the_correct_implementations_start_first():
    """They run the whole suite, the longest runs: started last, they would leave a core idle
    while they finish."""
    started = []

    def runner(target):
        started.append(target.module)
        return fake_runner(
            {"strength.known_bad.a": "killed", "strength.known_bad.b": "killed", "good": "passes"}
        )(target)

    results = gate.run_all(TARGETS, runner, jobs=1)
    assert started == ["good", "strength.known_bad.a", "strength.known_bad.b"]
    assert [r.target.module for r in results] == [t.module for t in TARGETS]


# --- the subprocess runs -------------------------------------------------------------------


def test_command_and_environment():
    """Each run is the suite (quickest modules first) on one module, every test (no -x), no cache,
    the mutation profile, failures recorded; CI=true and the repo importable."""
    command = gate.pytest_command("strength.known_bad.x", "cuda:1", record="/r.json")
    assert command[:3] == [sys.executable, "-m", "pytest"]
    assert "-x" not in command and "--exitfirst" not in command
    assert "no:cacheprovider" in command
    assert command[command.index("--hypothesis-profile") + 1] == "mutation"
    assert "strength.gate_record" in command
    assert command[command.index("--gate-record") + 1] == "/r.json"
    modules = [part for part in command if part.startswith("conformance/")]
    on_disk = sorted(
        f"conformance/{p.name}" for p in (gate.REPO_ROOT / "conformance").glob("test_*.py")
    )
    assert sorted(modules) == on_disk, "every suite module runs, each once"
    assert modules[0] == "conformance/test_spec_vectors.py"
    properties = gate.suite_paths(properties_only=True)
    left_out = {f"conformance/{name}" for name in gate.VECTOR_MODULES}
    assert set(modules) - left_out == set(properties)
    assert command[command.index("--canary-impl") + 1] == "strength.known_bad.x"
    assert command[command.index("--canary-device") + 1] == "cuda:1"
    assert "--canary-device" not in gate.pytest_command("canary")
    env = gate.child_environment()
    assert env["CI"] == "true"
    assert str(gate.REPO_ROOT) in env["PYTHONPATH"].split(os.pathsep)


#: canary, each entry point wrapped to note its name in the file $TOUR_CALLS when it is called
TRACED = """
import os
import canary
from canary import *  # noqa: F403
from canary import __all__  # noqa: F401

def _noted(name, call):
    def noting(*args, **kwargs):
        result = call(*args, **kwargs)
        with open(os.environ["TOUR_CALLS"], "a") as out:  # a call that ran to its end
            out.write(name + "\\n")
        return result
    return noting

for _name in ("fingerprint", "launch_canary_write_kernel", "launch_canary_verify_kernel",
              "launch_canary_plan_kernels", "launch_scatter_req_token_ids_kernel"):
    globals()[_name] = _noted(_name, getattr(canary, _name))
for _cls in (VerifyPlan, WritePlan):  # noqa: F405
    _cls.allocate = staticmethod(_noted(f"{_cls.__name__}.allocate", _cls.allocate))
_init = RealKvSource.__post_init__  # noqa: F405
RealKvSource.__post_init__ = _noted("RealKvSource", _init)  # noqa: F405
"""


def test_the_tour_calls_every_entry_point(tmp_path):
    """Every entry point of the API runs to its end at least once in the tour, so a mutant
    that crashes in any of them fails its run as a crash."""
    (tmp_path / "traced_canary.py").write_text(TRACED)
    calls = tmp_path / "calls.txt"
    done = forked.run(
        [sys.executable, "-m", "pytest", *(f"conformance/{t}" for t in gate.TOUR), "-q"]
        + ["-p", "no:cacheprovider", "--canary-impl", str(tmp_path / "traced_canary.py")],
        cwd=gate.REPO_ROOT,
        env={**gate.child_environment(), "TOUR_CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(calls.read_text().split()) == {
        "RealKvSource",
        "fingerprint",
        "VerifyPlan.allocate",
        "WritePlan.allocate",
        "launch_canary_write_kernel",
        "launch_canary_verify_kernel",
        "launch_canary_plan_kernels",
        "launch_scatter_req_token_ids_kernel",
    }


def test_a_mutant_runs_the_tour_and_its_listed_tests():
    """A mutant runs the tour (tests that call every entry point) and the tests its entry
    lists (each with every parametrization, a pattern matching several tests naming each),
    quickest module first; canary and canary_torch, or --whole-suite, run every module, and a
    correct variant the tour and its listed tests."""
    target = gate.Target(
        "strength.known_bad.x",
        "chain",
        "killed",
        "b",
        ("test_write_verify.py::test_write_*", "test_golden.py::test_write_verify_vector"),
    )
    selection = gate.target_selection(target)
    assert all("::" in part for part in selection)
    tour = [f"conformance/{test}" for test in gate.TOUR]
    assert [part for part in selection if part in tour] == sorted(
        tour, key=lambda t: gate.suite_paths().index(t.split("::")[0])
    )
    assert [part for part in selection if part not in tour] == [
        "conformance/test_golden.py::test_write_verify_vector",
        "conformance/test_write_verify.py::test_write_equals_reference",
        "conformance/test_write_verify.py::test_write_then_verify_is_clean",
    ]
    assert not any(part.startswith("conformance/test_fingerprint.py") for part in selection)
    whole = gate.suite_paths()
    assert gate.target_selection(target, whole_suite=True) == whole
    assert gate.target_selection(gate.Target("canary", gate.CORRECT_AREA, "passes")) == whole
    variant = gate.Target("v", gate.CORRECT_AREA, "passes", runs_in=target.dies_in)
    assert gate.target_selection(variant) == selection
    assert gate.target_selection(variant, whole_suite=True) == whole
    vectors_out = gate.target_selection(target, properties_only=True)
    assert not any(part.removeprefix("conformance/") in gate.VECTOR_MODULES for part in vectors_out)
    command = gate.pytest_command("strength.known_bad.x", selection=selection)
    assert command[3 : 3 + len(selection)] == selection


def test_suite_tests_are_the_test_functions_in_file_order(tmp_path, monkeypatch):
    """What a listed pattern can name: module-level ``test_`` functions, in file order."""
    (tmp_path / "test_m.py").write_text(
        "def test_b():\n    pass\n\ndef helper():\n    pass\n\n"
        "class TestC:\n    def test_d(self):\n        pass\n\nasync def test_e():\n    pass\n\n"
        "def test_a():\n    pass\n"
    )
    monkeypatch.setattr(gate, "SUITE_DIR", tmp_path)
    assert gate.suite_tests("test_m.py") == ["test_b", "test_a"]


def _fake_suite(monkeypatch, code: str) -> None:
    """The suite replaced by ``code``, run with the record's path as its argument."""

    def command(module, device=None, *, record=None, **_):
        return [sys.executable, "-c", code, str(record)]

    monkeypatch.setattr(gate, "pytest_command", command)


_WRITE_RECORD = (
    "import json, sys; json.dump({{'failures': {failures}, 'collection_errors': []}}, "
    "open(sys.argv[1], 'w')); print('1 failed'); raise SystemExit({code})"
)


def test_run_target_classifies_a_real_subprocess(monkeypatch):
    """run_target runs the command, reads its exit status and record, and times it."""
    kill = {
        "nodeid": "conformance/test_f.py::test_hash[1]",
        "when": "call",
        "kind": "assertion",
        "types": ["builtins.AssertionError"],
        "message": "boom",
    }
    _fake_suite(monkeypatch, _WRITE_RECORD.format(failures=[kill], code=1))
    result = gate.run_target(KILL_TARGET, device=None, timeout_s=60)
    assert (result.outcome, result.returncode) == ("killed", 1)
    assert result.first_failure == "conformance/test_f.py::test_hash[1]"
    assert "boom" in result.detail and result.failures == (kill,)
    assert result.seconds > 0

    crash = {**kill, "kind": "crash", "types": ["builtins.NameError"]}
    _fake_suite(monkeypatch, _WRITE_RECORD.format(failures=[crash], code=1))
    result = gate.run_target(KILL_TARGET, device=None, timeout_s=60)
    assert result.outcome == "error" and "NameError" in result.detail

    _fake_suite(monkeypatch, "import sys; print('usage'); sys.exit(4)")
    result = gate.run_target(KILL_TARGET, device=None, timeout_s=60)
    assert (result.outcome, result.returncode) == ("error", 4)
    assert "usage" in result.tail


def test_run_target_times_out_as_an_error(monkeypatch):
    """A run that outlives the timeout is stopped and counted as an error, never as a kill."""
    _fake_suite(monkeypatch, "import time; print('FAILED a::b', flush=True); time.sleep(30)")
    result = gate.run_target(KILL_TARGET, device=None, timeout_s=0.5)
    assert result.outcome == "error" and result.returncode is None
    assert "timed out" in result.tail


# --- the record of failure kinds ------------------------------------------------------------


def _raised(make):
    try:
        make()
    except BaseException as error:  # noqa: BLE001 - pytest.fail raises a BaseException
        return error
    raise AssertionError("nothing raised")


def _fail():
    pytest.fail("a property failed", pytrace=False)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda: _raised(lambda: (_ for _ in ()).throw(AssertionError("x"))), "assertion"),
        (lambda: _raised(_fail), "assertion"),
        (lambda: ExceptionGroup("two bugs", [AssertionError("a"), AssertionError("b")]),
         "assertion"),
        (lambda: TypeError("unsupported operand"), "crash"),
        (lambda: NameError("name 'x' is not defined"), "crash"),
        (lambda: IndexError("list index out of range"), "crash"),
        (lambda: IndexError("kv-canary: slot 9 is out of range"), "refusal"),
        (lambda: TypeError("kv-canary: RealKvSource.page_size must be an int"), "refusal"),
        (lambda: KeyError("kv-canary: not a contract error type"), "crash"),
        (lambda: ExceptionGroup("two", [AssertionError("a"), ValueError("kv-canary: b")]),
         "refusal"),
        (lambda: ExceptionGroup("two bugs", [AssertionError("a"), TypeError("b")]), "crash"),
        (lambda: hypothesis.errors.FailedHealthCheck("filter_too_much"), "health-check"),
        (lambda: hypothesis.errors.Unsatisfiable("no example"), "health-check"),
        (lambda: hypothesis.errors.FlakyFailure("flaky", [AssertionError("once")]), "flaky"),
        (lambda: hypothesis.errors.Flaky("inconsistent"), "flaky"),
    ],
    ids=["AssertionError", "pytest.fail", "group of assertions", "TypeError", "NameError",
         "IndexError", "kv-canary IndexError", "kv-canary TypeError", "kv-canary KeyError",
         "assertion and refusal", "group with a crash", "FailedHealthCheck", "Unsatisfiable", "FlakyFailure",
         "Flaky"],
)  # fmt: skip
def test_failure_kind(make, kind):
    """Each exception gets its failure kind (what counts as a kill: see strength/gate.py)."""
    assert gate_record.failure_kind(make()) == kind


RECORDED_TESTS = """
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_assertion():
    assert 1 == 2

def test_fail():
    pytest.fail("property failed")

def test_crash():
    return None + 1

def test_refusal():
    raise ValueError("kv-canary: RealKvSource.read_bytes must be a positive multiple of 16")

def test_setup_error(broken):
    pass

@settings(max_examples=5, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers().filter(lambda n: False))
def test_health_check(n):
    pass

calls = []

@settings(max_examples=5, database=None, derandomize=True)
@given(st.integers())
def test_flaky(n):
    calls.append(n)
    assert len(calls) > 1

def test_passes():
    pass
"""


def test_recorder_writes_each_failing_test_with_its_kind(tmp_path):
    """A real pytest run with the recorder: every failing test, each with the right kind."""
    (tmp_path / "test_recorded.py").write_text(RECORDED_TESTS)
    out = tmp_path / "record.json"
    completed = forked.run(
        [sys.executable, "-m", "pytest", "test_recorded.py", "-q", "-p", "no:cacheprovider",
         "-p", "conformance.plugin", "-p", "strength.gate_record", "--gate-record", str(out),
         "--canary-device", "cpu"],
        cwd=tmp_path, env=gate.child_environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 1, completed.stdout + completed.stderr
    kinds = {f["nodeid"].split("::")[1]: f["kind"] for f in json.loads(out.read_text())["failures"]}
    assert kinds == {
        "test_assertion": "assertion",
        "test_fail": "assertion",
        "test_crash": "crash",
        "test_refusal": "refusal",
        "test_setup_error": "crash",
        "test_health_check": "health-check",
        "test_flaky": "flaky",
    }


def test_the_recorder_stops_at_the_first_failed_property_of_a_listed_test(tmp_path):
    """--gate-stop-at-kill: the run ends as failed (exit 1) after the first failed property of a
    listed test; what failed before it is recorded, nothing after it runs."""
    (tmp_path / "test_recorded.py").write_text(RECORDED_TESTS)
    out = tmp_path / "record.json"
    completed = forked.run(
        [sys.executable, "-m", "pytest", "test_recorded.py", "-q", "-p", "no:cacheprovider",
         "-p", "conformance.plugin", "-p", "strength.gate_record", "--gate-record", str(out),
         "--canary-device", "cpu", "--gate-stop-at-kill", "test_recorded.py::test_f*",
         "--gate-stop-at-kill", "test_recorded.py::test_crash"],
        cwd=tmp_path, env=gate.child_environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 1, completed.stdout + completed.stderr
    record = json.loads(out.read_text())
    assert [f["nodeid"].split("::")[1] for f in record["failures"]] == [
        "test_assertion",
        "test_fail",
    ]
    assert record["tests"] == {"failed": 2}
    command = gate.pytest_command("m", record="/r.json", stop_at=("a.py::t", "b.py::u*"))
    at = command.index("--gate-stop-at-kill")
    assert command[at : at + 4] == [
        "--gate-stop-at-kill",
        "a.py::t",
        "--gate-stop-at-kill",
        "b.py::u*",
    ]
    assert "--gate-stop-at-kill" not in gate.pytest_command("m", record="/r.json")


def test_a_crash_only_mutant_is_an_error_and_a_real_bug_a_kill(monkeypatch):
    """The suite fails on both: a module whose patch broke it (NameError) is an error, a real
    hashing bug is a kill, though both fail the same listed tests."""
    monkeypatch.setattr(gate, "TOUR", ())
    listed = ("test_spec_vectors.py::test_spec_fingerprint_vectors",)
    crash = gate.Target("strength.known_bad.probe_crash_only", "hashing", "killed", "probe", listed)
    bug = gate.Target("strength.known_bad.hash_golden_gamma", "hashing", "killed", "gamma", listed)
    results = {t.module: gate.run_target(t, device="cpu", timeout_s=600) for t in (crash, bug)}
    crashed, killed = results[crash.module], results[bug.module]
    assert crashed.outcome == "error", crashed
    assert crashed.failures and {f["kind"] for f in crashed.failures} == {"crash"}
    assert "NameError" in crashed.detail
    assert killed.outcome == "killed", killed
    assert {f["kind"] for f in killed.failures} == {"assertion"}
    assert gate.listed(killed.first_failure, listed)


# --- the catalogue -------------------------------------------------------------------------


def suite_tests() -> set[str]:
    """``<module>::<test function>`` of every test function of the suite."""
    return {
        f"{path.name}::{name}"
        for path in gate.SUITE_DIR.glob("test_*.py")
        for name in gate.suite_tests(path.name)
    }


def test_every_entry_lists_existing_tests(catalogue):
    """Each entry lists where it must die, and every pattern names at least one suite test (a
    renamed test cannot leave an entry that nothing can kill)."""
    mutants, _ = catalogue
    tests = suite_tests()
    for target in mutants:
        assert target.dies_in, f"{target.module} lists no test that must kill it"
        for pattern in target.dies_in:
            assert any(gate.listed(f"conformance/{t}", (pattern,)) for t in tests), (
                f"{target.module}: {pattern!r} names no test of the suite"
            )


def test_catalogue_entries_are_well_formed(catalogue):
    """Entries name distinct known_bad modules, a known area, and expect a kill; CORRECT expects passes."""
    import strength.known_bad

    mutants, correct = catalogue
    assert len(mutants) >= 14
    modules = [t.module for t in mutants]
    assert len(set(modules)) == len(modules)
    for target in mutants:
        assert target.module.startswith("strength.known_bad.")
        assert target.area in strength.known_bad.AREAS
        assert target.expected in strength.known_bad.OUTCOMES
        assert target.bug and "\n" not in target.bug
    assert [t.module for t in correct] == list(strength.known_bad.CORRECT)
    assert all(t.expected == "passes" for t in correct)


def test_every_mutant_file_is_catalogued_and_documented(catalogue):
    """Each strength/known_bad/<name>.py is in the catalogue (and back), with a docstring citing the contract."""
    mutants, _ = catalogue
    # probe_*: the gate's self-test modules; compile_*: mutants only the compile check kills;
    # correct_*: changes the contract allows, in CORRECT
    files = {
        p.stem
        for p in KNOWN_BAD.glob("*.py")
        if not p.name.startswith(("_", "probe_", "compile_", "correct_"))
    }
    assert files == {t.module.rsplit(".", 1)[1] for t in mutants}
    for stem in files:
        doc = ast.get_docstring(ast.parse((KNOWN_BAD / f"{stem}.py").read_text()))
        assert doc and "CONTRACT §" in doc, (
            f"strength/known_bad/{stem}.py needs a docstring citing its CONTRACT § rule"
        )


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
    from strength.known_bad._mutate import apply

    assert apply("a + a - b", (("a", "c"), ("b", "d")), what="t") == "c + c - d"
    with pytest.raises(LookupError, match="no longer occurs"):
        apply("a + b", (("z", "y"),), what="t")


def test_patch_function_rewrites_in_the_original_globals(tmp_path, monkeypatch):
    """A patched function runs with its module's globals and replaces the module attribute."""
    import importlib

    from strength.known_bad._mutate import patch_function

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


def test_each_correct_variant_runs_where_its_difference_shows():
    """``CORRECT_RUNS_IN`` names correct variants of the catalogue (never canary or
    canary_torch, which always run the whole suite), each pattern naming suite tests; the gate
    runs a variant on them and the tour, and on the whole suite with ``--whole-suite``."""
    _, correct = gate.load_targets()
    assert set(known_bad.CORRECT_RUNS_IN) <= set(known_bad.CORRECT) - {"canary", "canary_torch"}
    tests = [
        f"{path}::{name}"
        for path in gate.suite_paths()
        for name in gate.suite_tests(path.removeprefix("conformance/"))
    ]
    for target in correct:
        assert target.runs_in == known_bad.CORRECT_RUNS_IN.get(target.module, ())
        for pattern in target.runs_in:
            assert any(gate.listed(test, (pattern,)) for test in tests), pattern
