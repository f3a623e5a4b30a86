"""The suite's command (conformance/cli.py): ``python -m conformance`` / ``kv-canary-conformance``
runs the suite from any folder with the plugin loaded, gives the counts, summary and exit
status of ``pytest conformance``, and its --help lists every option of the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import cli
from tests import forked

ROOT = Path(__file__).resolve().parents[2]


def run(args, cwd, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "CANARY_DEVICE": "cpu", "PYTHONPATH": str(ROOT), **(env or {})}
    return forked.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def counts(output: str) -> str:
    return re.findall(r"^=* ?(\d+ passed.*?) in [\d.]+s", output, re.M)[-1]


def test_help_lists_every_option_of_the_suite_with_its_variable():
    plugin = (ROOT / "conformance" / "plugin.py").read_text()
    plugin += (ROOT / "conformance" / "expectations.py").read_text()
    internal = {"--canary-first-failure", "--canary-suite-only"}  # an alias; the command's own
    registered = set(re.findall(r'"(--canary-[a-z-]+)"', plugin)) - internal
    listed = {option.split()[0] for option, _, _ in cli.OPTIONS}
    assert registered <= listed, registered - listed
    text = cli.usage()
    for option, env, _ in cli.OPTIONS:
        assert option in text and (not env or f"[{env}]" in text)


@pytest.mark.parametrize(
    ("args", "selected"),
    [
        ([], False),
        (["--canary-impl", "canary", "-q"], False),
        (["-k", "plans", "--canary-level=core"], False),
        (["conformance.test_buffers"], True),
        (["--canary-device", "cpu", "conformance.test_buffers"], True),
    ],
)
def test_a_selection_is_told_from_option_values(args, selected):
    assert cli.has_selection(args) is selected
    assert cli.pytest_args(args)[-1] == ("conformance" if not selected else args[-1])


def test_from_an_empty_folder_it_runs_the_suite_as_pytest_does(tmp_path):
    """Same counts and summary as ``pytest conformance/test_buffers.py`` in the repository."""
    inside = run(["-m", "pytest", "conformance/test_buffers.py", "-p", "no:cacheprovider"], ROOT)
    outside = run(
        ["-m", "conformance", "--canary-impl", "canary", "conformance.test_buffers"], tmp_path
    )
    assert inside.returncode == outside.returncode == 0, outside.stdout + outside.stderr
    assert counts(outside.stdout) == counts(inside.stdout)
    assert "canary implementation: canary" in outside.stdout
    assert "properties at level full" in outside.stdout


def test_a_failing_implementation_fails_the_command(tmp_path):
    done = run(
        ["-m", "conformance", "conformance.test_buffers", "-q", "-p", "no:cacheprovider"]
        + ["--canary-impl", "strength.known_bad.val_numpy_int_mode_refused"],
        tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"^test_allocate_takes_a_numpy_integer_capacity +failed", done.stdout, re.M)


# --- what the command runs: pytest's own options pass through, only the suite is selected ---

USER_TEST = "def test_user():\n    assert True\n"


@pytest.mark.parametrize(
    "args",
    [
        ["-r", "fE"],
        ["--junit-xml", "report.xml"],
        ["--hypothesis-verbosity", "verbose"],
        ["-W", "default", "--tb", "short", "--maxfail", "3"],
        ["--canary-report", "out.json", "-p", "no:cacheprovider"],
    ],
)
def test_option_values_are_not_selections(args):
    """The value of an option that takes one is no test selection: pytest's own parser says
    which arguments are values, for every option of pytest and its plugins."""
    assert cli.pytest_args(args)[-1] == "conformance"


def test_from_a_folder_with_its_own_tests_the_suite_runs(tmp_path):
    """From a folder holding a test_*.py, ``-r fE`` and ``--junit-xml PATH`` still run the
    suite's tests (here those -k selects), never the folder's."""
    (tmp_path / "test_user.py").write_text(USER_TEST)
    done = run(
        ["-m", "conformance", "-r", "fE", "--junit-xml", "junit.xml"]
        + ["-k", "test_enums_are_the_contracts", "-p", "no:cacheprovider"],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_user" not in done.stdout
    assert counts(done.stdout).startswith("2 passed")
    assert "test_enums_are_the_contracts" in (tmp_path / "junit.xml").read_text()


@pytest.mark.parametrize("selection", ["test_user.py", ".", "test_user.py::test_user", "json"])
def test_a_selection_outside_the_suite_is_refused(tmp_path, selection):
    """A test selection that is not one of the suite's tests is a usage error, before any test
    runs: the command runs the suite, nothing else."""
    (tmp_path / "test_user.py").write_text(USER_TEST)
    done = run(["-m", "conformance", selection, "-p", "no:cacheprovider"], tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"{selection!r} is not a test of the suite" in done.stderr
    assert "collected" not in done.stdout


def test_the_suites_ids_select_from_any_folder(tmp_path):
    """``conformance/test_x.py::test_y``, the id the reports print, selects the installed suite's
    test from any folder, as ``conformance.test_x::test_y`` does."""
    done = run(
        ["-m", "conformance", "conformance/test_spec_vectors.py::test_enums_are_the_contracts"]
        + ["-p", "no:cacheprovider"],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert counts(done.stdout).startswith("2 passed")


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--canary-impl", ""], {}, "--canary-impl"),
        ([], {"CANARY_IMPL": ""}, "CANARY_IMPL"),
        (["--canary-device", ""], {}, "--canary-device"),
        ([], {"CANARY_DEVICE": ""}, "CANARY_DEVICE"),
        ([], {"CANARY_LEVEL": ""}, "CANARY_LEVEL"),
        (["--canary-report", ""], {}, "--canary-report"),
        (["--canary-expect", ""], {}, "--canary-expect"),
        ([], {"CANARY_EXPECT": ""}, "CANARY_EXPECT"),
    ],
)
def test_an_empty_value_is_a_usage_error(tmp_path, args, env, named):
    """An empty implementation, device, level, report or expectations file (what an unset shell
    variable gives) is a usage error naming the flag or variable, never the default."""
    done = run(
        ["-m", "conformance", "conformance.test_spec_vectors", "-p", "no:cacheprovider", *args],
        tmp_path,
        env=env,
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"ERROR: {named} is empty" in done.stderr
    assert "passed" not in done.stdout


def test_version_is_the_suites(tmp_path):
    """``--version`` names the suite and its version (and the pytest and Hypothesis it runs on)."""
    done = run(["-m", "conformance", "--version"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kv-canary-conformance ")
    assert "pytest " in done.stdout and "hypothesis " in done.stdout


def test_help_into_a_closed_pipe_is_quiet(tmp_path):
    """``kv-canary-conformance -h | head``: a reader that stops early gets no traceback."""
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails with EPIPE
    try:
        done = forked.run(
            [sys.executable, "-m", "conformance", "-h"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_usage_errors_name_the_command(tmp_path):
    """A misused option is reported under the command's name, not as ``pytest.main()``."""
    done = run(["-m", "conformance", "--maxfail"], tmp_path)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "pytest.main()" not in done.stderr
    assert "python -m conformance: error: argument --maxfail" in done.stderr


def test_the_console_script_imports_from_the_current_folder(tmp_path):
    """The console script finds an implementation in the current folder by its module name, as
    ``python -m conformance`` does (a console script's sys.path has its own folder first, not
    the current one)."""
    (tmp_path / "mykv_here.py").write_text(
        "from canary import RealKvSource, RealKvHashMode, CanaryLaunchTag, fingerprint\n"
    )
    as_script = (
        "import sys; sys.path.remove(''); from conformance.cli import main; sys.exit(main())"
    )
    done = run(
        ["-c", as_script, "--canary-impl", "mykv_here", "conformance.test_spec_vectors"]
        + ["-p", "no:cacheprovider", "--canary-allow-missing", "write_verify,plan"],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "canary implementation: mykv_here" in done.stdout


def test_readme_lists_every_option_with_its_variable():
    """The README's option table has a row for each option of --help, with its variable."""
    readme = (ROOT / "README.md").read_text()
    cell = r"(?:\\\||[^|])*"  # a table cell, escaped pipes (core\|full) included
    rows = dict(re.findall(rf"^\| `(--[a-z-]+){cell}\| *`?([A-Z_]*)`? *\|", readme, re.M))
    for option, env, _ in cli.OPTIONS:
        name = option.split()[0]
        assert name in rows, f"README: no row for {name}"
        assert rows[name] == env, f"README: {name} names {rows[name]!r}, --help {env!r}"


def test_without_hypothesis_the_command_names_it(tmp_path):
    """With a dependency of the suite missing, the command fails and says which, as pytest
    does (tests/installed.py checks this on a real install without Hypothesis)."""
    fake = tmp_path / "fake" / "hypothesis"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'hypothesis'\")\n"
    )
    done = run(
        ["-m", "conformance", "--collect-only", "-q", "-p", "no:hypothesispytest"],
        tmp_path,
        env={"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{ROOT}"},
    )
    out = done.stdout + done.stderr  # tests/installed.py reads them together
    assert done.returncode != 0, out
    assert "No module named 'hypothesis'" in out and "Traceback" not in out, out
