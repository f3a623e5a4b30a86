"""What the suite needs of the Python it runs in, checked before anything of it imports them.

``pytest conformance`` run by a Python without the project's environment (the ``python3`` or
the ``pytest`` on a user's PATH, which has no torch) stops with one line that names what is
missing and the command that sets the environment up: in a checkout, ``bash
scripts/conformance.sh``, which makes ``.venv/`` with torch on its first run and runs the
suite in it; in an installed copy, pip. This module imports nothing but the standard library
and pytest, so that ``conformance/conftest.py`` can stand in for the plugin where the plugin
itself cannot be imported (no Hypothesis).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
import sys
from pathlib import Path

import pytest

#: What the suite itself imports when it runs, in the order it is checked (an implementation
#: brings its own: canary Triton, say, which its import names if it is missing).
NEEDED = ("numpy", "hypothesis", "torch")
ROOT = Path(__file__).resolve().parent.parent

#: The suite's options and Hypothesis' that take a value, and those that take none: what the
#: stand-in registers, so that a run given them gets the one line rather than a usage error
#: about an option it does not know.
WITH_VALUE = ("--canary-impl", "--canary-device", "--canary-level", "--canary-expect",
              "--canary-allow-missing", "--canary-report")  # fmt: skip
FLAGS = ("--canary-no-shrink", "--canary-first-failure", "--canary-suite-only")
HYPOTHESIS_WITH_VALUE = ("--hypothesis-profile", "--hypothesis-seed", "--hypothesis-verbosity")
HYPOTHESIS_FLAGS = ("--hypothesis-show-statistics", "--hypothesis-explain")


def missing(names: tuple[str, ...] = NEEDED) -> list[str]:
    """The modules of ``names`` this Python cannot import."""
    lacking: list[str] = []
    for name in names:
        if lacking:  # torch imported without numpy warns: once one is missing, look only
            if importlib.util.find_spec(name) is None:
                lacking.append(name)
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            lacking.append(name)
    return lacking


def setup_command(root: Path = ROOT, *, cwd: Path | None = None, lacking=()) -> str:
    """The command that gives the suite what it needs: the checkout's script (relative to the
    checkout's folders), else pip installing ``lacking`` here."""
    script = root / "scripts" / "conformance.sh"
    if script.is_file():
        cwd = (cwd or Path.cwd()).resolve()
        inside = cwd.is_relative_to(root.resolve())
        return f"bash {shlex.quote(os.path.relpath(script, cwd) if inside else str(script))}"
    return f"{shlex.quote(sys.executable)} -m pip install {' '.join(lacking) or 'torch'}"


def problem(lacking: list[str]) -> str:
    """The one line a run without ``lacking`` stops with."""
    command = setup_command(lacking=lacking)
    does = (
        "makes the project's environment (.venv/, torch included) on its first run and runs "
        "the suite in it, with the same arguments"
        if command.startswith("bash ")
        else "installs it into this Python"
    )
    return (
        f"kv-canary: this Python ({sys.executable}) has no {', '.join(lacking)}, which the "
        f"suite needs: {command} {does}"
    )


def check() -> None:
    """A usage error, in one line, when this Python lacks what the suite needs."""
    lacking = missing()
    if lacking:
        raise pytest.UsageError(problem(lacking))


def stand_in(error: ImportError):
    """The hooks ``conformance/conftest.py`` registers where the plugin cannot be imported:
    the suite's options (so that they parse), and a stop before the run with the one line."""
    lacking = [error.name] if error.name in NEEDED else missing()

    def pytest_addoption(parser: pytest.Parser, pluginmanager) -> None:
        group = parser.getgroup("canary", "KV-canary conformance")
        options = [(name, True) for name in WITH_VALUE] + [(name, False) for name in FLAGS]
        if not pluginmanager.has_plugin("hypothesispytest"):
            options += [(name, True) for name in HYPOTHESIS_WITH_VALUE]
            options += [(name, False) for name in HYPOTHESIS_FLAGS]
        for name, takes_value in options:
            action = "append" if takes_value else "store_true"
            group.addoption(name, action=action, dest=name.lstrip("-").replace("-", "_"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_cmdline_main(config: pytest.Config) -> None:
        raise pytest.UsageError(problem(lacking or [str(error.name or error)]))

    return pytest_addoption, pytest_cmdline_main
