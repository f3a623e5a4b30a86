"""No run is green unless a test ran: pytest's modes that run no test body (``--setup-only``,
``--setup-plan``) end with a verdict that says nothing was checked and a status that is no
pass, and ``--collect-only`` says that it only collected; the JSON report says the same."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conformance import report

from .runs import BROKEN_FINGERPRINT, suite, verdict

#: the quick module: 8 tests, every one of which fails on BROKEN_FINGERPRINT or passes
QUICK = "conformance.test_spec_vectors"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("nothing-ran")
    (folder / "broken.py").write_text(BROKEN_FINGERPRINT)
    return folder


def table_outcomes(out: str) -> set[str]:
    """The outcomes the summary table gives its properties."""
    table = out.split("KV-canary conformance", 1)[1]
    return set(re.findall(r"^test_\w+ +(passed|failed|not run|skipped) ", table, re.M))


@pytest.mark.parametrize("mode", ["--setup-only", "--setup-plan"])
def test_a_mode_that_runs_no_test_body_is_no_pass(folder, mode):
    """With an implementation whose every fingerprint raises, ``--setup-only`` and
    ``--setup-plan`` run no test: the verdict says nothing was checked, the status is 6, no
    property is shown as passed, and the JSON report says so."""
    done = suite(QUICK, "--canary-impl", "./broken.py", mode, "--canary-report", "r.json",
                 cwd=folder)  # fmt: skip
    assert done.returncode == report.NO_TEST_RAN, done.stdout[-3000:] + done.stderr[-2000:]
    line = verdict(done)
    assert line.startswith("verdict: NO TEST RAN: ") and mode in line, line
    assert "nothing was checked" in line, line
    assert table_outcomes(done.stdout) == {"not run"}, done.stdout[-3000:]
    assert not re.search(r"^\d+ passed properties", done.stdout, re.M), done.stdout[-2000:]
    document = json.loads((folder / "r.json").read_text())
    assert document["exit_status"] == report.NO_TEST_RAN
    assert document["verdict"] == line.removeprefix("verdict: ")
    assert document["summary"]["passed"] == 0 and document["summary"]["not run"] == 3


def test_collect_only_exits_0_and_says_it_only_collected(folder):
    """``--collect-only`` is no run of the tests: exit 0, with a verdict line that says it only
    collected (and how many), in the terminal and in the JSON report."""
    done = suite(QUICK, "--canary-impl", "./broken.py", "--collect-only", "-q",
                 "--canary-report", "r.json", cwd=folder)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    line = verdict(done)
    assert line == "verdict: COLLECTED ONLY: 8 tests collected, none run (exit status 0)", line
    document = json.loads((folder / "r.json").read_text())
    assert (document["exit_status"], document["verdict"]) == (0, line.removeprefix("verdict: "))


def test_a_run_that_ran_reports_as_before(folder):
    """The same selection run: the failures fail it, and the table shows them."""
    done = suite(QUICK, "--canary-impl", "./broken.py", cwd=folder)
    assert done.returncode == 1, done.stdout[-3000:]
    assert verdict(done) == "verdict: FAILED (exit status 1)"
    assert table_outcomes(done.stdout) == {"passed", "failed"}
