"""Outside the project's environment (a Python without torch, say: the ``python3`` or the
``pytest`` on a user's PATH), ``pytest conformance`` stops with one line that names what is
missing and the command that sets the environment up, not with an INTERNALERROR traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import prerequisites

from .runs import ROOT, clean_env


def without(module: str, tmp_path: Path) -> str:
    """A PYTHONPATH on which ``import module`` fails as if it were not installed."""
    fake = tmp_path / "fake" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n"
    )
    return f"{fake.parent}{os.pathsep}{ROOT}"


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("torch", [str(ROOT / "conformance")]),
        ("torch", [str(ROOT / "conformance"), "--canary-impl", "canary_torch", "-x"]),
        ("torch", ["-p", "conformance.plugin", "--pyargs", "conformance.test_spec_vectors"]),
        ("numpy", [str(ROOT / "conformance" / "test_spec_vectors.py")]),
        ("hypothesis", [str(ROOT / "conformance"), "-p", "no:hypothesispytest"]),
        ("hypothesis", [str(ROOT / "conformance"), "--canary-impl", "canary_torch",
                        "--hypothesis-profile", "ci", "-p", "no:hypothesispytest"]),
    ],
    ids=["torch", "torch, with the suite's options", "torch, the plugin by name", "numpy",
         "hypothesis", "hypothesis, with the suite's options"],
)  # fmt: skip
def test_pytest_without_a_dependency_says_so_in_one_line(tmp_path, module, args):
    """``pytest conformance`` from a folder of its own, in a Python that lacks ``module``: one
    line, exit 4 (nothing ran), naming the module and the command that sets the project up."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=tmp_path, env=clean_env(PYTHONPATH=without(module, tmp_path)),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr
    lines = [line for line in out.splitlines() if line.strip()]
    assert done.returncode == 4, out
    assert len(lines) == 1, out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert lines[0].startswith(f"ERROR: kv-canary: this Python ({sys.executable}) has no {module}")
    assert "bash " + str(ROOT / "scripts" / "conformance.sh") in lines[0], lines[0]


def test_the_setup_command_is_the_checkouts_or_pip():
    """A checkout names its script (relative to the current folder where it is below it); an
    installed copy, which has no scripts, names pip."""
    assert prerequisites.setup_command(ROOT, cwd=ROOT) == "bash scripts/conformance.sh"
    assert prerequisites.setup_command(ROOT, cwd=Path("/")) == (
        f"bash {ROOT / 'scripts' / 'conformance.sh'}"
    )
    assert prerequisites.setup_command(Path("/nowhere"), cwd=ROOT).startswith(
        f"{sys.executable} -m pip install "
    )


def test_the_adapter_example_names_a_command_that_sets_the_environment_up():
    """The worked adapter's docstring runs the suite through the project's command, which
    makes its environment, not through whatever ``pytest`` is on the PATH."""
    text = (ROOT / "examples" / "adapter_example.py").read_text()
    doc = text.split('"""', 2)[1]
    assert "bash scripts/conformance.sh --canary-impl examples.adapter_example" in doc
    assert "\n    pytest conformance" not in doc
