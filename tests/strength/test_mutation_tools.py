"""The mutation-testing tools: a config for every module, and a fork server that sees each
mutant (docs/STRENGTH.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORKSERVER = ROOT / "strength" / "mutation" / "forkserver.py"


def configs() -> dict[str, dict]:
    """Each session's one-line keys (the configs keep them on one line; tomllib needs 3.11)."""
    out = {}
    for path in sorted((ROOT / "strength" / "mutation").glob("*.toml")):
        text = path.read_text()
        out[path.stem] = {
            key: re.search(rf'^{key} = "(.*)"$', text, re.M).group(1)
            for key in ("module-path", "test-command")
        }
    return out


def test_every_module_has_a_session():
    """Each module with code of canary/, canary_torch/ (its ``__init__`` is the backend) and
    reference/, and the two library modules of tools/, is some session's module (the GPU-host
    scripts of tools/ run on a GPU alone)."""
    modules = {
        str(path.relative_to(ROOT))
        for package in ("canary", "canary_torch", "reference")
        for path in (ROOT / package).glob("*.py")
        if path.name != "__init__.py" or package == "canary_torch"
    } | {"tools/compile_check.py", "tools/gpu_types.py"}
    covered = {config["module-path"] for config in configs().values()}
    assert modules - covered == set()
    assert covered - modules == set(), "a session names a module that does not exist"


@pytest.mark.parametrize("name", sorted(configs()))
def test_each_session_runs_pytest_quietly_and_stops_at_the_first_failure(name):
    """run.sh rewrites `python -m pytest ` to the fork server; -x makes a kill cheap."""
    command = configs()[name]["test-command"]
    assert command.startswith("python -m pytest "), command
    assert re.search(r"(^| )-x( |$)", command), command
    for path in re.findall(r"(?:conformance|tests)/[\w/]+\.py", command):
        assert (ROOT / path).exists(), path


def test_the_fork_server_sees_each_mutant(tmp_path):
    """Two versions of one module, the same size and written within a second: each run of
    the client imports the one on disk and exits with pytest's status."""
    (tmp_path / "target.py").write_text("VALUE = 1\n")
    (tmp_path / "test_target.py").write_text(
        "import target\n\ndef test_value():\n    assert target.VALUE == 1\n"
    )
    socket = tmp_path / "server.sock"
    server = subprocess.Popen(
        [sys.executable, str(FORKSERVER), "serve", "--socket", str(socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not socket.exists():
            assert server.poll() is None, server.stdout.read().decode()
            assert time.monotonic() < deadline, "the fork server did not start"
            time.sleep(0.1)

        def run() -> int:
            return subprocess.run(
                [
                    sys.executable,
                    str(FORKSERVER),
                    "run",
                    "--socket",
                    str(socket),
                    "--",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "test_target.py",
                ],
                cwd=tmp_path,
                capture_output=True,
                timeout=120,
            ).returncode

        assert run() == 0
        (tmp_path / "target.py").write_text("VALUE = 2\n")  # a mutant of the same size
        assert run() == 1
        (tmp_path / "target.py").write_text("VALUE = 1\n")
        assert run() == 0
        assert not list(tmp_path.glob("**/*.pyc")), "children must write no bytecode"
    finally:
        server.terminate()
        server.wait(timeout=30)
        if os.path.exists(socket):
            os.unlink(socket)


def test_a_replay_can_add_tests_to_a_sessions_selection():
    """``replay_survivors.py --also`` puts the given tests before the session's own options."""
    sys.path.insert(0, str(ROOT / "strength" / "mutation"))
    try:
        import replay_survivors
    finally:
        sys.path.remove(str(ROOT / "strength" / "mutation"))
    command = "python -m pytest conformance/test_golden.py -x -q"
    assert replay_survivors.with_tests(command, []) == command
    assert replay_survivors.with_tests(command, ["a.py", "b.py"]) == (
        "python -m pytest a.py b.py conformance/test_golden.py -x -q"
    )
    with pytest.raises(ValueError, match="not a pytest command"):
        replay_survivors.with_tests("pytest -x", ["a.py"])
