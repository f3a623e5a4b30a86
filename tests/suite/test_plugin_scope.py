"""The suite's plugin is active for runs of ``conformance/`` only, never for other runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Collects the given paths in-process, then prints which of the suite's modules got imported
# and which Hypothesis profile is loaded.
PROBE = """
import sys, pytest
from hypothesis import settings
code = pytest.main(["-q", "--co", "-p", "no:cacheprovider", *sys.argv[1:]])
names = ("canary", "conformance.plugin", "conformance.profiles")
print("IMPORTED", sorted(n for n in names if n in sys.modules))
print("PROFILE", settings._current_profile)
print("EXIT", int(code))
"""


def probe(*paths: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = dict(
        line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ")[0].isupper()
    )
    assert lines.get("EXIT") == "0", done.stdout + done.stderr
    return lines


def test_project_tests_run_without_the_plugin():
    """Collecting tests/ imports neither the plugin nor an implementation, nor loads a profile."""
    seen = probe("tests/reference/test_hashing.py")
    assert seen["IMPORTED"] == "[]"
    assert seen["PROFILE"] not in {"dev", "ci-cpu", "dev-cpu", "mutation-cpu"}


def test_the_suite_loads_the_plugin():
    """Collecting conformance/ loads the plugin, the implementation and the suite's profile."""
    seen = probe("conformance/test_spec_vectors.py", "--canary-device", "cpu")
    assert seen["IMPORTED"] == "['canary', 'conformance.plugin', 'conformance.profiles']"
    assert seen["PROFILE"] == ("ci-cpu" if os.environ.get("CI") else "dev-cpu")  # as in CI or not


def test_a_named_profile_gets_its_cpu_variant():
    """``--hypothesis-profile ci`` on the CPU runs ``ci-cpu`` (half the examples), not ``ci``:
    the suite's plugin configures after Hypothesis' own, which loads the name as given."""
    seen = probe(
        "conformance/test_spec_vectors.py", "--canary-device", "cpu", "--hypothesis-profile", "ci"
    )
    assert seen["PROFILE"] == "ci-cpu"
