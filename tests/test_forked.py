"""A forked run of the suite's command (``tests/forked.py``) is what a fresh Python's would be:
the same exit status, the same output, its own folder, environment and path, and the caller's
time limit."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import forked
from tests.suite.runs import ROOT, clean_env

#: seconds, as the run's summary and its table of properties print them
CLOCK = re.compile(r"\b\d+\.\d+s?\b|\b\d+ s\b")

#: a module run with ``-m``: what it sees of its process
PROBE = """import json, os, sys
print(json.dumps({"cwd": os.getcwd(), "path0": sys.path[0], "argv": sys.argv[1:],
                  "seen": os.environ.get("KV_CANARY_PROBE"), "left": "KV_CANARY_LEFT" in os.environ,
                  "extra": sys.path[1]}))
print("to stderr", file=sys.stderr)
raise SystemExit(int(sys.argv[1]))
"""


def both(command, **keywords):
    """``command`` forked and fresh: ``(returncode, stdout, stderr)`` of each, seconds masked."""
    assert forked.forkable(command, keywords)
    runs = forked.run(command, **keywords), subprocess.run(command, **keywords)
    return [(r.returncode, CLOCK.sub("T", r.stdout), CLOCK.sub("T", r.stderr)) for r in runs]


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["--canary-level", "bogus"], 4),
        (["conformance.test_spec_vectors", "--canary-device", "cpu", "-p", "no:cacheprovider"], 0),
        (["conformance.test_spec_vectors", "--canary-impl", "strength.known_bad.hash_golden_gamma",
          "--canary-device", "cpu", "-p", "no:cacheprovider", "--hypothesis-profile", "ci"], 1),
    ],
    ids=["a usage error", "a passing run", "a failing run"],
)  # fmt: skip
def test_a_forked_command_prints_and_exits_as_a_fresh_one(tmp_path, args, status):
    forked_run, fresh = both(
        [sys.executable, "-m", "conformance", *args],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert forked_run == fresh
    assert fresh[0] == status, fresh


def test_a_forked_run_has_its_folder_environment_path_and_arguments(tmp_path, monkeypatch):
    """Exactly the given environment (a variable of the caller's left out is gone), the folder
    first on ``sys.path`` then ``PYTHONPATH``, ``SystemExit``'s code as its status."""
    (tmp_path / "probe_module.py").write_text(PROBE)
    monkeypatch.setenv("KV_CANARY_LEFT", "1")
    env = {k: v for k, v in os.environ.items() if k != "KV_CANARY_LEFT"}
    env.update(KV_CANARY_PROBE="seen", PYTHONPATH=str(ROOT))
    forked.MODULES += ("probe_module",)  # type: ignore[assignment]
    try:
        command = [sys.executable, "-m", "probe_module", "3", "x y"]
        keywords = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        forked_run, fresh = both(command, **keywords)
    finally:
        forked.MODULES = forked.MODULES[:-1]
    assert forked_run == fresh
    status, out, err = forked_run
    assert status == 3 and err == "to stderr\n", forked_run
    assert f'"cwd": "{tmp_path}", "path0": "{tmp_path}"' in out, out
    assert '"argv": ["3", "x y"], "seen": "seen", "left": false' in out, out
    assert f'"extra": "{ROOT}"' in out, out


def test_a_forked_script_has_its_folder_first_and_its_arguments(tmp_path):
    """``python SCRIPT ARGS``: the script's own folder first on ``sys.path`` (not the working
    folder), ``sys.argv[0]`` the script, its exit status."""
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "probe_script.py"
    script.write_text(PROBE.replace('"extra": sys.path[1]', '"extra": sys.argv[0]'))
    command = [sys.executable, str(script), "5", "x"]
    keywords = dict(cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
    forked_run, fresh = both(command, **keywords)
    assert forked_run == fresh
    status, out, _ = forked_run
    assert status == 5 and f'"path0": "{tmp_path / "bin"}"' in out, forked_run
    assert f'"extra": "{script}"' in out, out


def test_a_forked_run_past_its_time_limit_is_killed(tmp_path):
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(60)\n")
    forked.MODULES += ("slow_module",)  # type: ignore[assignment]
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            forked.run([sys.executable, "-m", "slow_module"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=2)  # fmt: skip
    finally:
        forked.MODULES = forked.MODULES[:-1]


@pytest.mark.parametrize(
    ("command", "keywords"),
    [
        ([sys.executable, "-c", "pass"], {"capture_output": True}),
        ([sys.executable, "missing_script.py"], {"capture_output": True}),
        ([sys.executable, "-W", "ignore", "-m", "pytest"], {"capture_output": True}),
        ([sys.executable, "-m", "pytest"], {"capture_output": True, "input": "x"}),
        ([sys.executable, "-m", "pytest"], {}),
        ([sys.executable, "-m", "pytest"], {"capture_output": True, "env": {"PYTHONHASHSEED": "0"}}),
        (["python3", "-m", "pytest"], {"capture_output": True}),
    ],
    ids=["-c", "no such script", "an interpreter flag", "input", "output not captured", "a start-up variable",
         "another interpreter"],
)  # fmt: skip
def test_what_a_fork_cannot_be_runs_fresh(command, keywords):
    assert not forked.forkable(command, keywords)
    assert forked.forkable([sys.executable, "-m", "pytest"], {"capture_output": True, "env": {}})
