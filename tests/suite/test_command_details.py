"""The smaller things a user of the suite's command reads: a misused option is one line that
names the command that was run; an implementation given where a test selection goes, or given
twice, is told how to give it; the README's markers and timings are true."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests import forked

from .runs import ROOT, clean_env, suite

SCRIPT = ROOT / "scripts" / "conformance.sh"


def errors(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--canary-level", "bogus"], "argument --canary-level: invalid choice: 'bogus'"),
        (["-k"], "argument -k: expected one argument"),
        (["--maxfail"], "argument --maxfail: expected one argument"),
    ],
)
@pytest.mark.parametrize(
    ("prog", "env"),
    [
        ("python -m conformance", {}),
        ("bash scripts/conformance.sh", {"KV_CANARY_PROG": "bash scripts/conformance.sh"}),
    ],
    ids=["module", "script"],
)
def test_a_misused_option_is_one_line_naming_the_command(tmp_path, args, words, prog, env):
    """pytest's parser says ``usage: ...`` on a line of its own and names the program as
    Python runs it: the command says it in one line, under the name it was run by."""
    done = forked.run(
        [sys.executable, "-m", "conformance", *args], cwd=tmp_path, env=clean_env(**env),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    [line] = errors(done)
    assert line.startswith(f"ERROR: {prog}: error: {words}"), line
    assert line.endswith(f" (see {prog} --help)"), line
    assert "passed" not in done.stdout


def test_the_script_names_itself(tmp_path):
    """Run as ``bash scripts/conformance.sh``, a usage error names that command."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "-k"], cwd=tmp_path, env=clean_env(), capture_output=True,
        text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr
    [line] = [line for line in errors(done) if line.startswith("ERROR: ")]
    assert line.startswith(f"ERROR: bash {SCRIPT}: error: argument -k: "), line
    assert "python -m conformance" not in done.stderr


@pytest.mark.parametrize("given", ["./mykv.py", "mykv.py", "./mykv_pkg"])
def test_an_implementation_given_as_a_selection_is_told_to_use_canary_impl(tmp_path, given):
    (tmp_path / "mykv.py").write_text("from canary_torch import *  # noqa: F403\n")
    (tmp_path / "mykv_pkg").mkdir()
    (tmp_path / "mykv_pkg" / "__init__.py").write_text("from canary_torch import *\n")
    done = suite(given, cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    [line] = errors(done)
    assert f"{given!r} is not a test of the suite" in line
    assert line.endswith(f"; to test the implementation {given}, give it as --canary-impl {given}")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--canary-impl", "canary", "--canary-impl", "canary_torch"], "--canary-impl"),
        (["--canary-impl=canary", "--canary-impl", "canary_torch"], "--canary-impl"),
        (["--canary-expect", "a.txt", "--canary-expect", "b.txt"], "--canary-expect"),
        (["--canary-level", "core", "--canary-level", "full"], "--canary-level"),
        (["--canary-report", "a.json", "--canary-report", "b.json"], "--canary-report"),
    ],
)
def test_an_option_given_twice_with_two_values_is_a_usage_error(tmp_path, args, named):
    """The last value does not silently win: the run stops, naming both."""
    done = suite("conformance.test_spec_vectors", *args, cwd=tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    first, second = [a.split("=", 1)[-1] for a in args if not a.startswith("--") or "=" in a]
    assert errors(done) == [
        f"ERROR: {named} is given twice, as {first!r} and as {second!r}; give it once"
    ], done.stderr


def test_the_same_value_twice_is_no_error(tmp_path):
    done = suite("conformance.test_spec_vectors::test_enums_are_the_contracts", "--canary-impl",
                 "canary", "--canary-impl", "canary", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr


def test_no_test_of_the_suite_needs_a_gpu_and_the_readmes_say_so(tmp_path):
    """``-m gpu`` selects none of the suite's tests, as both READMEs say: every test runs on
    any device (none skips without CUDA; the GPU tests are the benchmarks')."""
    done = suite("-m", "gpu", "--collect-only", "-q", cwd=tmp_path)
    assert done.returncode == 5, done.stdout[-2000:]
    for test_file in (ROOT / "conformance").glob("test_*.py"):
        text = test_file.read_text()
        assert "mark.gpu" not in text and "cuda.is_available" not in text, test_file.name
    for readme in (ROOT / "README.md", ROOT / "conformance" / "README.md"):
        text = " ".join(readme.read_text().lower().split())
        assert "no test of the suite needs a gpu" in text, readme
        assert "tests that need a GPU carry" not in text, readme


def test_the_readme_points_at_the_measured_times_instead_of_repeating_them():
    """Timings age with the tree: the README's "Run it" gives none, and points at the section
    of docs/PERFORMANCE.md that holds them."""
    readme = (ROOT / "README.md").read_text()
    run_it = readme.split("\n## Run it\n", 1)[1].split("\n## ", 1)[0]
    assert not re.search(r"\b\d+ s\b", run_it), run_it
    assert "(docs/PERFORMANCE.md#how-long-the-commands-take)" in run_it
    performance = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    assert "\n## How long the commands take\n" in performance
