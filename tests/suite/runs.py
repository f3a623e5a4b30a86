"""Runs of the suite's command for the self-tests that read what a user reads: the command
from a folder of the test's own, on the CPU, with no variable of this shell leaking in; the
verdict line; and implementations with one known defect."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from tests import forked

ROOT = Path(__file__).resolve().parents[2]

#: canary_torch whose fingerprint raises: one cause behind every failure that calls it
BROKEN_FINGERPRINT = '''"""canary_torch whose fingerprint raises."""
from canary_torch import *  # noqa: F403


def fingerprint(*args, **kwargs):
    raise RuntimeError("fingerprint is not wired up yet")
'''


def clean_env(**extra: str) -> dict[str, str]:
    """This process' environment without the suite's variables, with the repository importable
    (as an installed copy would be), and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANARY_", "HYPOTHESIS_"))}
    env.pop("CI", None)  # the default profile is then dev, as on a user's machine
    env.pop("KV_CANARY_PROG", None)
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def suite(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m conformance ARGS`` from ``cwd`` on the CPU."""
    return forked.run(
        [sys.executable, "-m", "conformance", "--canary-device", "cpu", "-p", "no:cacheprovider",
         *args],
        cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def pasted(lines: str, *, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``lines`` pasted into a shell in ``cwd`` (the same environment as the run's)."""
    return subprocess.run(
        ["bash", "-c", lines], cwd=cwd, env=env or clean_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def verdict(done: subprocess.CompletedProcess) -> str:
    """The run's verdict line (the last one, should there be several)."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("verdict: ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    return lines[-1]


def command_word(line: str) -> str:
    """The program a printed command line runs."""
    return shlex.split(line)[0]
