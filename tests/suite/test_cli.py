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

ROOT = Path(__file__).resolve().parents[2]


def run(args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "CANARY_DEVICE": "cpu", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def counts(output: str) -> str:
    return re.findall(r"^=* ?(\d+ passed.*?) in [\d.]+s", output, re.M)[-1]


def test_help_lists_every_option_of_the_suite_with_its_variable():
    plugin = (ROOT / "conformance" / "plugin.py").read_text()
    plugin += (ROOT / "conformance" / "expectations.py").read_text()
    registered = set(re.findall(r'"(--canary-[a-z-]+)"', plugin)) - {"--canary-first-failure"}
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
        (["conformance.test_plans"], True),
        (["--canary-device", "cpu", "conformance.test_plans"], True),
    ],
)
def test_a_selection_is_told_from_option_values(args, selected):
    assert cli.has_selection(args) is selected
    assert cli.pytest_args(args)[-1] == ("conformance" if not selected else args[-1])


def test_from_an_empty_folder_it_runs_the_suite_as_pytest_does(tmp_path):
    """Same counts and summary as ``pytest conformance/test_plans.py`` in the repository."""
    inside = run(["-m", "pytest", "conformance/test_plans.py", "-p", "no:cacheprovider"], ROOT)
    outside = run(
        ["-m", "conformance", "--canary-impl", "canary", "conformance.test_plans"], tmp_path
    )
    assert inside.returncode == outside.returncode == 0, outside.stdout + outside.stderr
    assert counts(outside.stdout) == counts(inside.stdout)
    assert "canary implementation: canary" in outside.stdout
    assert "properties at level full" in outside.stdout


def test_a_failing_implementation_fails_the_command(tmp_path):
    done = run(
        ["-m", "conformance", "conformance.test_plans", "-q", "-p", "no:cacheprovider"]
        + ["--canary-impl", "strength.known_bad.val_numpy_int_mode_refused"],
        tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"^test_allocate_takes_a_numpy_integer_capacity +failed", done.stdout, re.M)
