"""A run says what it did not check: the constants it reads are held to the contract's values,
a run that checked nothing or skipped a contract group is no pass (exit statuses 6 and 7), the
README's command is the suite's own command, and the smaller things a user reads are true."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conformance import cli, plugin, report
from tests import forked

ROOT = Path(__file__).resolve().parents[2]
COMMAND = Path(sys.executable).parent / "kv-canary-conformance"

#: canary_torch without the plan group: an engine whose canary has the write/verify group only
WRITE_VERIFY_ONLY = '''"""canary_torch's names, without the plan group."""
import canary_torch as _c

RealKvSource, RealKvHashMode, CanaryLaunchTag = _c.RealKvSource, _c.RealKvHashMode, _c.CanaryLaunchTag
fingerprint, VerifyOrWriteContext = _c.fingerprint, _c.VerifyOrWriteContext
VerifyPlan, WritePlan = _c.VerifyPlan, _c.WritePlan
launch_canary_write_kernel = _c.launch_canary_write_kernel
launch_canary_verify_kernel = _c.launch_canary_verify_kernel
'''

#: canary_torch whose third fingerprint call is interrupted, as by Ctrl-C
INTERRUPTED_THIRD_CALL = '''"""canary_torch, with Ctrl-C pressed during its third fingerprint."""
from canary_torch import *  # noqa: F403
import canary_torch as _c

_calls = []


def fingerprint(*args, **kwargs):
    _calls.append(1)
    if len(_calls) == 3:
        raise KeyboardInterrupt
    return _c.fingerprint(*args, **kwargs)
'''


def suite(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """The suite's command run from ``cwd`` on the CPU (no variable of this shell leaks in)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CANARY_", "HYPOTHESIS_"))}
    return forked.run(
        [sys.executable, "-m", "conformance", "--canary-device", "cpu", "-p", "no:cacheprovider",
         *args],
        cwd=cwd, env={**clean, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def verdict(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stdout.splitlines() if line.startswith("verdict: ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    return lines[-1]


# --- 1. the constants an implementation provides -------------------------------------------


@pytest.mark.parametrize("value", [1, -1, None, False, 0.0, "0"])
def test_a_wrong_padding_constant_fails_its_property(value):
    """REQ_POOL_IDX_PADDING is held to CONTRACT §14's int 0, by value and by type."""
    from conformance.test_spec_vectors import test_plan_constant_is_the_contracts as prop

    prop(types.SimpleNamespace(REQ_POOL_IDX_PADDING=0))
    with pytest.raises(AssertionError, match="CONTRACT §14 gives the int 0"):
        prop(types.SimpleNamespace(REQ_POOL_IDX_PADDING=value))


# --- 2. a run that checked nothing, or skipped a group, is no pass -------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("impls")
    (folder / "wv_only.py").write_text(WRITE_VERIFY_ONLY)
    (folder / "interrupted.py").write_text(INTERRUPTED_THIRD_CALL)
    return folder


def test_every_selected_test_skipped_exits_6(folder):
    """A selection of the plan group only, on an implementation without it, ran nothing."""
    done = suite("--canary-impl", "./wv_only.py", "-m", "plan", cwd=folder)
    assert done.returncode == report.NO_TEST_RAN == 6, done.stdout[-2000:]
    assert verdict(done).startswith("verdict: NO TEST RAN: every one of the ")
    assert re.search(r"^  the plan group \(CONTRACT §12, §13, §14, §15\): \d+ tests: wv_only "
                     r"does not provide the plan group", done.stdout, re.M), done.stdout[-2000:]  # fmt: skip


def test_a_group_skipped_without_leave_exits_7_and_is_named(folder):
    """Tests ran and passed, but the plan group was skipped: incomplete, until allowed."""
    selection = ("conformance.test_spec_vectors", "--canary-impl", "./wv_only.py")
    done = suite(*selection, "--canary-report", "r.json", cwd=folder)
    assert done.returncode == report.INCOMPLETE == 7, done.stdout[-2000:]
    assert "--canary-allow-missing plan" in verdict(done)
    assert "canary plan group: absent from the module" in done.stdout
    document = json.loads((folder / "r.json").read_text())
    assert document["exit_status"] == 7 and document["verdict"].startswith("INCOMPLETE")
    [entry] = document["not_run"]
    assert (entry["group"], entry["tests"], entry["waived"]) == ("plan", 1, False)
    assert entry["sections"] == ["§12", "§13", "§14", "§15"]

    allowed = suite(*selection, "--canary-allow-missing", "plan", "--canary-report", "r.json",
                    cwd=folder)  # fmt: skip
    assert allowed.returncode == 0, allowed.stdout[-2000:]
    assert "(allowed: --canary-allow-missing)" in allowed.stdout
    document = json.loads((folder / "r.json").read_text())
    assert document["environment"]["allow_missing"] == ["plan"]
    assert [entry["waived"] for entry in document["not_run"]] == [True]

    by_variable = suite(*selection, cwd=folder, env={"CANARY_ALLOW_MISSING": "plan"})
    assert by_variable.returncode == 0, by_variable.stdout[-2000:]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--canary-allow-missing", "plans"], None, "--canary-allow-missing 'plans'"),
        ([], {"CANARY_ALLOW_MISSING": "core"}, "CANARY_ALLOW_MISSING='core'"),
    ],
)
def test_an_unknown_group_is_a_usage_error(folder, args, env, named):
    done = suite("conformance.test_spec_vectors", *args, cwd=folder, env=env)
    assert done.returncode == 4
    assert f"{named}: the groups are write_verify, plan" in done.stderr


def test_the_adapter_example_covers_every_group():
    """The README's worked adapter provides every name the suite reads (nothing is skipped),
    and its translation of fingerprint's mode keeps the contract's refusals (CONTRACT §11)."""
    done = suite("conformance.test_spec_vectors", "conformance.test_argument_kinds",
                 "--canary-impl", "examples.adapter_example", cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    assert "not checked by this run" not in done.stdout and "skipped" not in done.stdout


def test_every_suite_module_names_its_sections():
    """Each module of the suite has its CONTRACT sections, for what a skip leaves unchecked."""
    modules = {path.name for path in (ROOT / "conformance").glob("test_*.py")}
    assert modules == set(report.MODULE_SECTIONS)
    contract = (ROOT / "docs" / "CONTRACT.md").read_text()
    for sections in [*report.MODULE_SECTIONS.values(), *(g[2] for g in plugin.GROUPS.values())]:
        for section in sections:
            assert f"\n## {section.lstrip('§')}. " in contract, section


def test_contract_14_names_what_a_missing_plan_group_skips():
    """CONTRACT §14 names the sections whose tests a missing plan group skips, as the run does."""
    text = (ROOT / "docs" / "CONTRACT.md").read_text()
    section = text.split("## 14. ", 1)[1].split("\n## ", 1)[0]
    skipped = re.search(r"Without it, the tests of ([^.]*) are skipped", section)
    assert skipped, section
    assert re.findall(r"§\d+", skipped[1]) == list(plugin.GROUPS["plan"][2])


# --- 3. the README's command is the suite's command ----------------------------------------


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["conformance/test_scatter.py", "--co", "-q"], 0),
        (["conformance.test_scatter", "--co", "-q"], 0),
        (["--co", "tests/reference"], 4),
        (["-k", "no_test_has_this_name", "-q"], 5),
    ],
    ids=["a path", "a module", "a folder outside the suite", "nothing selected"],
)
def test_the_readme_command_runs_as_the_console_script(args, status):
    """scripts/conformance.sh and kv-canary-conformance: same selection, output and status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANARY_", "HYPOTHESIS_"))}
    env["CANARY_DEVICE"] = "cpu"
    common = ["-p", "no:cacheprovider", *args]

    def run(command):
        done = subprocess.run([*command, *common], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        clock = re.compile(r" in [\d.]+s\b")
        return done.returncode, clock.sub("", done.stdout), clock.sub("", done.stderr)

    script = run(["bash", str(ROOT / "scripts" / "conformance.sh")])
    console = run([str(COMMAND)])
    assert script == console
    assert script[0] == status, script


def test_the_install_says_what_it_does(tmp_path):
    """The first run's install announces each step as it starts (it takes minutes)."""
    fake = tmp_path / "python3"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        "# stands in for python: makes a venv of itself; has no torch; every install succeeds\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python";'
        " exit 0; fi\n"
        'if [ "$1" = -c ]; then exit 1; fi\n'
        'echo "$*" >> "$FAKE_CALLS"\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "CANARY_VENV": str(tmp_path / "venv"),
           "FAKE_CALLS": str(tmp_path / "calls.log")}  # fmt: skip
    done = subprocess.run(["bash", "-c", f"source {ROOT / 'scripts' / '_env.sh'}"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    steps = re.findall(r"^kv-canary setup \(\d+ s\): (.*)$", done.stderr, re.M)
    assert [s.split(" ", 1)[0] for s in steps] == ["making", "installing", "2/4", "3/4", "4/4",
                                                   "installed"], steps  # fmt: skip
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 4 and "torch==" in calls[1], calls


# --- 5. the smaller things -----------------------------------------------------------------


def test_an_interrupted_run_says_so(folder):
    """Ctrl-C: exit 2, and the footer says the run was interrupted, not just what passed."""
    done = suite("conformance.test_spec_vectors", "--canary-impl", "./interrupted.py",
                 cwd=folder)  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:]
    assert re.search(r"^interrupted: .* ran before it", done.stdout, re.M), done.stdout[-2000:]
    assert verdict(done) == "verdict: INTERRUPTED (exit status 2)"


def test_a_long_failure_line_is_cut_with_a_mark():
    """The paragraph announcing a failure cuts a long line visibly, not silently."""
    written: list[str] = []
    terminal = types.SimpleNamespace(
        write_line=lambda line, **_: written.append(line), _width_of_current_line=0
    )
    config = types.SimpleNamespace(
        pluginmanager=types.SimpleNamespace(get_plugin=lambda name: terminal)
    )
    recorder = report.Recorder(config, None, dict)
    recorder.announce(
        types.SimpleNamespace(
            when="call",
            nodeid="conformance/test_x.py::test_y",
            canary_id="conformance/test_x.py::test_y",
            duration=0.5,
            longreprtext="E   requires TypeError with " + "a long message " * 20,
        )
    )
    [line] = [line for line in written if "requires TypeError" in line]
    assert line.endswith(" [..]") and len(line) <= 4 + 120
    assert report.cut("short") == "short"


def test_a_run_leaves_no_benchmark_folder(tmp_path):
    """The suite runs no benchmark: no empty .benchmarks is left in the current folder."""
    done = suite("conformance.test_spec_vectors::test_enums_are_the_contracts", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert not (tmp_path / ".benchmarks").exists()
    (tmp_path / ".benchmarks").mkdir()  # one that was there before stays
    suite("conformance.test_spec_vectors::test_enums_are_the_contracts", cwd=tmp_path)
    assert (tmp_path / ".benchmarks").is_dir()


def test_the_header_says_nothing_is_interpreted_without_triton(tmp_path):
    """canary_torch launches nothing through Triton: the header does not claim a watch."""
    done = suite("--canary-impl", "canary_torch", "conformance.test_spec_vectors", "--co",
                 cwd=tmp_path)  # fmt: skip
    assert "canary memory bounds: not watched: the implementation imports no Triton" in done.stdout
    interpreted = suite("--canary-impl", "canary", "conformance.test_spec_vectors", "--co",
                        cwd=tmp_path)  # fmt: skip
    assert "canary memory bounds: checked: every access of an interpreted launch" in (
        interpreted.stdout
    )


def test_help_lists_every_exit_status():
    text = cli.usage()
    for code, word, meaning in report.EXIT_STATUSES:
        assert f"  {code}  {word}: {meaning}" in text
    assert [code for code, _, _ in report.EXIT_STATUSES] == list(range(8))


def test_the_readme_shows_the_help_as_it_is():
    """The README's copy of --help is the command's --help."""
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("$ kv-canary-conformance --help\n", 1)[1].split("```", 1)[0]
    assert shown.rstrip("\n") == cli.usage()


def test_a_device_error_is_one_short_line():
    """A device torch cannot hold a tensor on: torch's kilobytes of message are cut."""
    with pytest.raises(pytest.UsageError) as raised:
        plugin.check_device(torch.device("mps"), "--canary-device 'mps'")
    message = str(raised.value)
    assert message.startswith("--canary-device 'mps': torch cannot hold a tensor there (")
    assert len(message) < 450 and "\n" not in message


@pytest.mark.parametrize(
    ("option", "variable", "words"),
    [
        ("--canary-impl", "CANARY_IMPL", "CANARY_IMPL is empty (set, but to nothing); give a "
         "value, or unset it for the default"),
    ],
)  # fmt: skip
def test_an_empty_variable_says_to_unset_it(monkeypatch, option, variable, words):
    monkeypatch.setenv(variable, "")
    config = types.SimpleNamespace(getoption=lambda name, default=None: None)
    with pytest.raises(pytest.UsageError) as raised:
        plugin.setting(config, option, variable)
    assert str(raised.value) == words


def test_the_readme_names_the_markers_and_the_suites_readme():
    readme = (ROOT / "README.md").read_text()
    assert "(conformance/README.md)" in readme
    for marker in ("`write_verify`", "`plan`", "`gpu`", "--canary-allow-missing"):
        assert marker in readme, marker


def test_the_suites_readme_table_gives_each_modules_sections():
    """conformance/README.md's module table and report.MODULE_SECTIONS name the same sections."""
    table = (ROOT / "conformance" / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(test_\w+\.py)` \| ([^|]+) \|", table, re.M))
    assert {module: tuple(re.findall(r"§\d+", text)) for module, text in rows.items()} == (
        report.MODULE_SECTIONS
    )
