"""How the suite behaves when something is wrong: the implementation named as a path, the
device normalised, failures announced at once and rendered field by field, the shrink budget,
and reproduction snippets that fail the way the test failed when pasted."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import Phase, find, settings
from hypothesis.internal.conjecture import engine

import strategies as st_kv
from conformance import plugin, profiles, support
from conformance.assertions import (
    fail_bits_name,
    launch_tag_name,
    record_differences,
    ring_row_differences,
)
from reference import CanaryLaunchTag, FailReason, RealKvHashMode
from tests import forked

ROOT = Path(__file__).resolve().parents[2]
NAMES = "from canary import RealKvSource, RealKvHashMode, CanaryLaunchTag, fingerprint\n"


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter at the repository root (as a pasted snippet runs)."""
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def run_suite(*args: str, quiet: bool = True, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    if quiet:
        command.append("-q")
    return forked.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


# --- --canary-impl: a dotted name, a .py file, a package directory ------------------------


def test_import_target_forms(tmp_path):
    """A dotted name is imported as is; a .py file or a package directory from its folder."""
    (tmp_path / "mykv.py").write_text(NAMES)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text(NAMES)
    (tmp_path / "not_a_package").mkdir()
    assert plugin.import_target("my_engine.kv_canary") == ("my_engine.kv_canary", None)
    assert plugin.import_target(str(tmp_path / "mykv.py")) == ("mykv", str(tmp_path))
    assert plugin.import_target(str(tmp_path / "mypkg")) == ("mypkg", str(tmp_path))
    with pytest.raises(pytest.UsageError, match="no such .py file or package directory"):
        plugin.import_target(str(tmp_path / "missing.py"))
    with pytest.raises(pytest.UsageError, match="must be a package"):
        plugin.import_target(str(tmp_path / "not_a_package"))


def test_a_path_whose_name_is_taken_is_refused(tmp_path, monkeypatch):
    """A file called canary.py cannot be imported as canary once the project's canary is (that
    name is taken): a usage error."""
    importlib.import_module("canary")  # whatever ran before: the name is taken from here on
    (tmp_path / "canary.py").write_text(NAMES)
    monkeypatch.setattr(sys, "path", list(sys.path))  # _load puts the folder on sys.path
    with pytest.raises(pytest.UsageError, match="already taken"):
        plugin._load(str(tmp_path / "canary.py"))


@pytest.mark.parametrize("form", ["file", "package"])
def test_canary_impl_accepts_a_path(tmp_path, form):
    """--canary-impl path/to/mykv.py and path/to/mykv run the suite on that module."""
    if form == "file":
        target = tmp_path / "mykv_file.py"
        target.write_text(NAMES)
    else:
        target = tmp_path / "mykv_pkg"
        target.mkdir()
        (target / "__init__.py").write_text(NAMES)
    done = run_suite("conformance/test_spec_vectors.py", "--canary-impl", str(target),
                     "--canary-allow-missing", "write_verify,plan", quiet=False)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"canary implementation: {target.stem}, no __version__" in out
    # the 5 CONTRACT §2 vectors and the 2 CONTRACT §1 enums; the plan constant's test skipped
    assert "7 passed, 1 skipped" in out


def test_an_unimportable_name_says_how_to_give_a_path():
    """A dotted name that cannot be imported is a usage error that mentions paths and PYTHONPATH."""
    done = run_suite("conformance/test_spec_vectors.py", "--canary-impl", "no_such_kv_module")
    out = done.stdout + done.stderr
    assert done.returncode == 4, out  # pytest's usage error
    assert "cannot import 'no_such_kv_module'" in out and "PYTHONPATH" in out


# --- the device --------------------------------------------------------------------------


def test_cuda_without_an_index_is_the_current_device(monkeypatch):
    """'cuda' becomes cuda:<current index>, in the helper and in the plugin's choice of device."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert support.normalize_device("cuda") == torch.device("cuda", 3)
    assert support.normalize_device(torch.device("cuda")) == torch.device("cuda", 3)
    assert support.normalize_device("cuda:1") == torch.device("cuda", 1)
    assert support.normalize_device("cpu") == torch.device("cpu")
    assert support.same_device("cuda", "cuda:3")
    assert not support.same_device("cuda", "cuda:0")
    assert not support.same_device("cpu", "cuda:3")

    class Config:
        def getoption(self, name, default=None):
            return "cuda" if name == "--canary-device" else default

    assert plugin._device(Config()) == torch.device("cuda", 3)


# --- the header --------------------------------------------------------------------------


def test_a_module_without_version_says_so():
    """No module is shown as 'unknown': the header says 'no __version__', and names the package's."""
    import canary

    assert plugin._version(canary) == canary.__version__
    assert plugin._version(types.ModuleType("canary.without_version")) == (
        f"no __version__ (package canary {canary.__version__})"
    )
    assert plugin._version(types.ModuleType("lonely_kv")) == "no __version__"


# --- Hypothesis profiles -----------------------------------------------------------------


@pytest.fixture
def restore_profile():
    previous = settings._current_profile
    previous_budget = engine.MAX_SHRINKING_SECONDS
    yield
    settings.load_profile(previous)
    engine.MAX_SHRINKING_SECONDS = previous_budget


def test_shrinking_is_bounded_in_every_profile(restore_profile):
    """Every profile bounds shrinking per property (nightly longest, the CPU half), none explains."""
    budgets = {}
    for name in ("dev", "ci", "nightly"):
        for on_cpu in (False, True):
            loaded = profiles.select(name, on_cpu=on_cpu)
            budgets[loaded] = engine.MAX_SHRINKING_SECONDS
            assert Phase.shrink in settings.default.phases
            assert (Phase.explain in settings.default.phases) == (name == "nightly")
    assert budgets == {
        "dev": 20,
        "dev-cpu": 10,
        "ci": 20,
        "ci-cpu": 10,
        "nightly": 120,
        "nightly-cpu": 60,
    }


def test_no_shrink_leaves_shrinking_out(restore_profile):
    """--canary-no-shrink loads a profile without the shrink and explain phases."""
    loaded = profiles.select("nightly", on_cpu=True, shrink=False)
    assert loaded == "nightly-cpu-no-shrink"
    assert Phase.shrink not in settings.default.phases
    assert Phase.explain not in settings.default.phases
    assert Phase.generate in settings.default.phases


# --- rendering ---------------------------------------------------------------------------


def test_ring_rows_differ_field_by_field():
    """A differing ring row names the column that differs, not the whole row in hex."""
    kind, bits = CanaryLaunchTag.HEAD_V_FULL, FailReason.VERIFY_REAL_KV_HASH_MISMATCH
    want = [[kind, 10, 5, 7, -1, -2414019407054260458, -2414019407054260458, bits]]
    got = [[kind, 10, 5, 7, 0, -2414019407054260458, -2414019407054260458, bits]]
    assert ring_row_differences(got, want) == [
        "ring row 0 (slot 10): expected_token got 0, want -1"
    ]
    assert ring_row_differences(want, want) == []
    missing = ring_row_differences([], want)
    assert missing[0] == "ring row missing (the reference stores it):"
    assert "kernel_kind=HEAD_V_FULL" in missing[1] and "fail_reason_bits=REAL_KV" in "".join(
        missing
    )
    assert all(len(line) < 100 for line in missing)


def test_records_differ_field_by_field():
    """A differing record names each differing field, hashes in hex, in lines under 100 columns."""
    want = np.zeros((4, 4), dtype=np.int64)
    got = want.copy()
    got[2] = [1, 2, -5, 77]
    lines = record_differences(got, want)
    text = "\n".join(lines)
    assert lines[0].startswith("slot 2: token got 1, want 0, position got 2, want 0")
    assert "prev_hash got 0xfffffffffffffffb, want 0x0000000000000000" in text
    assert "real_kv_hash got 0x000000000000004d" in text
    assert all(len(line) < 100 for line in lines)


def test_enums_print_by_name():
    """Launch tags, violation bits and modes print by name."""
    # plain ints, deliberately: the names are for the int64 values a ring row or a world holds
    assert launch_tag_name(1) == "HEAD_V_FULL"
    assert launch_tag_name(99) == "99"
    assert fail_bits_name(5) == "CHAIN|REAL_KV"
    assert fail_bits_name(0) == "0"
    assert support.mode_name(2) == "ALL"


# --- a failure is announced while the run goes on ----------------------------------------


def test_a_failure_is_announced_before_the_end():
    """A failing property prints a one-paragraph summary at once, before pytest's failure section."""
    done = run_suite(
        "conformance/test_spec_vectors.py",
        "--canary-impl",
        "strength.known_bad.hash_big_endian_words",
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    announced = out.find("kv-canary: FAILED conformance/test_spec_vectors.py::")
    assert 0 <= announced < out.find("= FAILURES ="), out
    assert (
        "rerun alone: " in out[announced:] and "--canary-impl strength.known_bad" in out[announced:]
    )


def test_the_summary_also_goes_to_the_github_step_summary(tmp_path):
    """With GITHUB_STEP_SUMMARY set, the summary table is appended to that file as Markdown
    (failures in bold, the counts of pytest's last line), and the JSON report counts the tests
    as that line does."""
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    report = tmp_path / "report.json"
    done = run_suite(
        "conformance/test_spec_vectors.py",
        "--canary-impl",
        "strength.known_bad.hash_big_endian_words",
        "--canary-report",
        str(report),
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    last = re.findall(r"^=* ?(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", done.stdout, re.M)[-1]
    counts = {outcome: int(n) for n, outcome in re.findall(r"(\d+) (\w+)", last)}
    assert json.loads(report.read_text())["tests"] == counts
    text = summary.read_text()
    assert text.startswith("earlier step\n## KV-canary conformance: ")
    assert "strength.known_bad.hash_big_endian_words on cpu" in text
    assert f"({last}; exit status 1)" in text
    assert "| property | outcome | cases | examples | seconds |" in text
    assert re.search(r"^\| `test_spec_fingerprint_vectors` \| \*\*failed\*\* \| 5 \|", text, re.M)
    assert re.search(r"^\| `test_enums_are_the_contracts` \| passed \| 2 \|", text, re.M)
    # without the variable, nothing is written anywhere
    assert "GITHUB_STEP_SUMMARY" in done.stdout
    quiet = run_suite(
        "conformance/test_spec_vectors.py",
        env={k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"},
    )
    assert quiet.returncode == 0 and "GITHUB_STEP_SUMMARY" not in quiet.stdout


# --- snippets reproduce the verdict ------------------------------------------------------

LAYOUT = st_kv.layout(rows=2, page_size=2, num_bytes_per_token=128, read_bytes=64, seed=11)


def fingerprint_snippet(impl_name: str) -> str:
    return support.fingerprint_repro(
        impl_name, "cpu", (LAYOUT,), [0, 1, 2, 3], RealKvHashMode.PARTIAL
    )


def write_verify_snippet(impl_name: str) -> str:
    """The story of a write and a verify whose token check is off, told for ``impl_name``."""
    import canary
    from conformance.write_verify_support import run_verify, run_write, story

    world = st_kv.CanaryWorld(  # plain ints: the snippet pastes the world's repr
        sources=(),
        mode=int(RealKvHashMode.NONE),
        num_slots=8,
        slot_stride_bytes=32,
        ring_capacity=4,
        ring_start=0,
        kernel_kind=int(CanaryLaunchTag.HEAD_V_FULL),
        chain_assert=0,
        seed=1,
    )
    made = st_kv.materialize_world(world, "cpu")
    write = st_kv.WriteBatch(
        requests=(st_kv.WriteRequest(-1, (1, 2, 3), (11, 12, 13), (0, 1, 2)),),
        num_valid=1,
        padding=(),
        input_assert=False,
        expected_tokens=(),
        expected_positions=(),
    )
    verify = st_kv.VerifyBatch(
        slots=(1, 2, 3),
        expected_tokens=(99, 99, 99),
        expected_positions=(0, 1, 2),
        prev_slots=(-1, 1, 2),
        num_valid=3,
        enable=1,
        check_token=False,
    )
    run_write(canary, made, write, "cpu")  # canary tells the story; the snippet names impl_name
    run_verify(canary, made, verify, "cpu")
    return story(types.SimpleNamespace(__name__=impl_name), "cpu", made)


def source_snippet(impl_name: str) -> str:
    case = find(st_kv.invalid_source_cases(rule=10), lambda case: True)
    return support.source_case_repro(impl_name, "cpu", case)


SNIPPETS = {
    "fingerprint": (fingerprint_snippet, "strength.known_bad.hash_partial_reads_8_bytes"),
    "write/verify": (write_verify_snippet, "strength.known_bad.chain_token_checked_without_flag"),
    "RealKvSource": (source_snippet, "strength.known_bad.val_alignment_unchecked"),
}


@pytest.mark.parametrize("kind", SNIPPETS)
def test_snippet_fails_on_a_known_bad_module(kind):
    """A generated snippet, run against a known-bad module, raises the AssertionError the test raised."""
    make, known_bad = SNIPPETS[kind]
    done = run_python(make(known_bad))
    assert done.returncode != 0, done.stdout + done.stderr
    assert "AssertionError" in done.stderr, done.stderr
    if kind == "write/verify":
        assert "ring row missing" in done.stderr or "ring row extra" in done.stderr, done.stderr
        assert "violation_write_index got 3, want 0" in done.stderr, done.stderr


def test_snippets_pass_on_canary():
    """The same snippets run clean against canary: they compare, not merely fail."""
    code = "\n".join(f"exec({textwrap.dedent(make('canary'))!r})" for make, _ in SNIPPETS.values())
    done = run_python(code)
    assert done.returncode == 0, done.stdout + done.stderr


def test_announcement_headline():
    """The announced lines are the failure's message: pytest's E lines, a plain message up to its
    configuration, or one line per failure of a Hypothesis exception group."""
    from conformance.report import headline

    assert headline("E   AssertionError: x\nE   assert 1 == 2\nother") == [
        "AssertionError: x",
        "assert 1 == 2",
    ]
    plain = (
        "after verify:\n  ring row 0 (slot 2): expected_token got 0, want -1\n[world]\nReproduce"
    )
    assert headline(plain) == [
        "after verify:",
        "  ring row 0 (slot 2): expected_token got 0, want -1",
    ]
    group = """  + Exception Group Traceback (most recent call last):
  |   File "x.py", line 3, in test_x
  | BaseExceptionGroup: Hypothesis found 2 distinct failures. (2 sub-exceptions)
  +-+---------------- 1 ----------------
    | ValueError: kv-canary: wrong
    | Failed: first message
    +---------------- 2 ----------------
    | Failed: second message
"""
    assert headline(group) == [
        "Hypothesis found 2 distinct failures. (2 sub-exceptions)",
        "- first message",
        "- second message",
    ]


# --- every input is checked before the first test ------------------------------------------


def usage_error(*args: str, env=None, cwd=ROOT) -> str:
    """Run the quick module with ``args``; assert a usage error before any test; its stderr."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "conformance.plugin"]
    command += ["--pyargs", "conformance.test_spec_vectors", *args]
    done = forked.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CANARY_DEVICE": "cpu", "PYTHONPATH": str(ROOT), **(env or {})},
    )
    out = done.stdout + done.stderr
    assert done.returncode == 4, out
    assert "passed" not in done.stdout and "INTERNALERROR" not in out, out
    assert "Traceback" not in out, out
    return done.stderr


@pytest.mark.parametrize("where", ["missing/report.json", "/proc/x", "."])
def test_a_report_that_cannot_be_written_stops_the_run_first(tmp_path, where):
    """--canary-report into a missing folder, where no file can be made, or at a directory is a
    usage error naming the flag, before any test runs (not a traceback after all of them)."""
    error = usage_error("--canary-report", where, cwd=tmp_path)
    assert f"ERROR: --canary-report {where!r}: " in error


@pytest.mark.parametrize("where", ["missing/summary.md", "."])
def test_a_step_summary_that_cannot_be_written_stops_the_run_first(tmp_path, where):
    """GITHUB_STEP_SUMMARY naming a file that cannot be written is a usage error naming it."""
    error = usage_error(env={"GITHUB_STEP_SUMMARY": where}, cwd=tmp_path)
    assert f"ERROR: GITHUB_STEP_SUMMARY={where!r}: " in error


@pytest.mark.parametrize(
    ("source", "raised"),
    [
        ("def broken(:\n", "SyntaxError"),
        ("from canary import *\nraise RuntimeError('no GPU driver here')\n", "RuntimeError"),
    ],
)
def test_an_implementation_that_fails_to_import_is_a_usage_error(tmp_path, source, raised):
    """An implementation file with a syntax error, or one that raises on import, is a usage
    error with the error it raised, in one line (no INTERNALERROR, no traceback)."""
    (tmp_path / "mykv_broken.py").write_text(source)
    error = usage_error("--canary-impl", str(tmp_path / "mykv_broken.py"))
    lines = [line for line in error.splitlines() if line.strip()]
    assert len(lines) == 1, error
    assert lines[0].startswith("ERROR: --canary-impl ") and f"raised {raised}: " in lines[0]


def test_a_name_that_is_no_module_name_is_a_usage_error():
    """--canary-impl .canary (a relative name) is a usage error, not a TypeError."""
    error = usage_error("--canary-impl", ".canary")
    assert "ERROR: --canary-impl '.canary': not a dotted module name" in error


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--hypothesis-profile", "nope"], {}, "--hypothesis-profile 'nope'"),
        (["--hypothesis-profile", "ci-cpu"], {}, "--hypothesis-profile 'ci-cpu'"),
        ([], {"HYPOTHESIS_PROFILE": "nope"}, "HYPOTHESIS_PROFILE='nope'"),
    ],
)
def test_an_unknown_profile_is_a_usage_error(args, env, named):
    """An unknown profile, also a name the header prints (ci-cpu), is a usage error naming it."""
    error = usage_error(*args, env=env)
    assert f"ERROR: {named}: " in error


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--canary-device", "meta"], {}, "--canary-device 'meta'"),
        (["--canary-device", "xla"], {}, "--canary-device 'xla'"),
        (["--canary-device", "mps"], {}, "--canary-device 'mps'"),
        ([], {"CANARY_DEVICE": "meta"}, "CANARY_DEVICE='meta'"),
        ([], {"CANARY_DEVICE": "nonsense"}, "CANARY_DEVICE='nonsense'"),
    ],
)
def test_a_device_that_cannot_run_the_suite_is_refused(args, env, named):
    """A device torch cannot hold the suite's tensors on (meta, xla, mps without one) is a usage
    error naming the flag or the variable, not a run in which every test fails."""
    error = usage_error(*args, env=env)
    assert f"ERROR: {named}: " in error


def test_an_expectations_file_from_the_variable_is_named_so(tmp_path):
    """An error about CANARY_EXPECT's file names the variable, not the flag."""
    error = usage_error(env={"CANARY_EXPECT": str(tmp_path / "missing.txt")})
    assert f"ERROR: CANARY_EXPECT={str(tmp_path / 'missing.txt')!r}: " in error


FAKE_VERSIONS = """
import numpy, triton
triton.__version__ = "3.6.0"
numpy.__version__ = "2.4.1"
"""


def test_triton_before_3_7_with_numpy_2_4_stops_on_the_cpu(tmp_path):
    """Triton 3.6 with numpy 2.4 cannot interpret a launch: on the CPU the run stops with one
    line naming the combination and what to install, before any test, instead of failing every
    test as if the implementation were wrong (the versions are faked by a plugin loaded first)."""
    (tmp_path / "fake_versions.py").write_text(FAKE_VERSIONS)
    error = usage_error("-p", "fake_versions", env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    lines = [line for line in error.splitlines() if line.strip()]
    assert len(lines) == 1, error
    assert "triton 3.6.0 with numpy 2.4.1" in lines[0]
    assert "numpy<2.4" in lines[0] and "triton>=3.7" in lines[0]
    assert plugin.interpreter_problem("3.7.1", "2.4.1") is None
    assert plugin.interpreter_problem("3.6.0", "2.3.5") is None
    assert plugin.interpreter_problem(None, "2.4.1") is None


def test_a_file_the_readme_says_is_refused_is_refused(tmp_path):
    """The README's example of a refused implementation file is refused, in a fresh run as the
    suite's own (a file called canary.py is not: nothing of the suite imports canary)."""
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"a file called `(\w+)\.py`", readme)
    assert example, "README: no example of a refused file"
    (tmp_path / f"{example[1]}.py").write_text(NAMES)
    error = usage_error("--canary-impl", str(tmp_path / f"{example[1]}.py"))
    assert "already taken" in error


# --- the rerun line runs as printed -------------------------------------------------------


def announced_rerun(out: str) -> list[str]:
    line = re.search(r"^    rerun alone: (.*)$", out, re.M)
    assert line, out
    return shlex.split(line[1])


def test_outside_the_checkout_ids_and_rerun_lines_are_the_suites(tmp_path):
    """From another folder the failures keep their module in their ids, and the printed rerun
    line, run as printed in that folder, runs that one test."""
    done = forked.run(
        [sys.executable, "-m", "conformance", "conformance.test_spec_vectors"]
        + ["--canary-impl", "strength.known_bad.hash_big_endian_words", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CANARY_DEVICE": "cpu", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "kv-canary: FAILED conformance/test_spec_vectors.py::test_spec_fingerprint_vectors[" in (
        done.stdout
    )
    assert "FAILED conformance/test_spec_vectors.py::test_spec_fingerprint_vectors[" in done.stdout
    assert "FAILED ::" not in done.stdout
    rerun = forked.run(
        [*announced_rerun(done.stdout), "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert re.search(r"^=* ?1 failed in ", rerun.stdout, re.M), rerun.stdout


def test_the_rerun_line_keeps_the_profile_and_the_expectations(tmp_path):
    """With an expectations file the run is derandomized: the rerun line names the file (which
    derandomizes the rerun alike), and the profile the run was given."""
    expect = tmp_path / "expect.txt"
    expect.write_text(
        "conformance/test_spec_vectors.py::test_spec_fingerprint_vectors[one source, 16 bytes, "
        "PARTIAL]  # [1] one of the five\n"
    )
    done = run_suite(
        "conformance/test_spec_vectors.py",
        "--canary-impl",
        "strength.known_bad.hash_big_endian_words",
        "--hypothesis-profile",
        "dev",
        "--canary-expect",
        str(expect),
        quiet=False,
        # without CI: where it is set, Hypothesis derandomizes every profile itself
        env={k: v for k, v in os.environ.items() if k != "CI"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "canary hypothesis profile: dev-cpu-derandomized" in done.stdout
    rerun = announced_rerun(done.stdout)
    assert rerun[rerun.index("--canary-expect") + 1] == str(expect)
    assert rerun[rerun.index("--hypothesis-profile") + 1] == "dev"
