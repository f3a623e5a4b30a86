"""The GitHub Actions workflows (``.github/workflows/``) against what they must run.

- ``gpu.yml`` has one job per GPU type of ``tools/gpu_types.py``, on that type's runner labels,
  and each job runs the type's tox leg and the GPU check, uploads the report and the benchmark
  JSON and compares the benchmarks with the baseline stored for its type;
  ``.github/actionlint.yaml`` declares exactly those runner labels.
- ``nightly.yml`` runs the gate on the whole suite, the detection table's every trial, every
  mutation session of ``strength/mutation/`` and every SGLang release of
  ``conformance/upstream.py``.
- ``ci.yml`` runs the README's test command.

Each disagreement is one line of a failure, with what the workflow should say. That the
workflows are valid and safe is for actionlint and zizmor (the lint step of
``scripts/tests.sh``).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from conformance.upstream import DEFAULT_RELEASE, KERNEL_PATH_RELEASES, RELEASES
from tools.gpu_types import GPU_TYPES

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
#: runner labels GitHub gives every self-hosted runner; actionlint knows them
BUILTIN_LABELS = {"self-hosted", "linux", "x64"}


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def steps_text(job: dict) -> str:
    """Every step's ``uses`` and ``run`` text of ``job``, one after the other."""
    return "\n".join(
        f"{step.get('uses', '')}\n{step.get('run', '')}\n{step.get('with', '')}"
        for step in job["steps"]
    )


def gpu_disagreements(gpu_workflow: dict) -> list[str]:
    """How ``gpu.yml`` (parsed) and the GPU-type table disagree; empty when they agree."""
    job = gpu_workflow["jobs"]["gpu"]
    problems = []
    if job.get("runs-on") != "${{ matrix.runner }}":
        problems.append(f"runs-on is {job.get('runs-on')!r}, not '${{{{ matrix.runner }}}}'")
    entries = job.get("strategy", {}).get("matrix", {}).get("include", [])
    got = {entry.get("leg"): tuple(entry.get("runner", ())) for entry in entries}
    want = {gpu.leg: gpu.runner_labels for gpu in GPU_TYPES}
    if len(entries) != len(got):
        problems.append("a leg has more than one job")
    for leg in want.keys() - got.keys():
        problems.append(
            f"no job for GPU type {leg}: add `- leg: {leg}` with "
            f"`runner: [{', '.join(want[leg])}]` to the matrix"
        )
    for leg in got.keys() - want.keys():
        problems.append(f"a job for {leg}, which is no GPU type of tools/gpu_types.py")
    for leg in want.keys() & got.keys():
        if got[leg] != want[leg]:
            problems.append(f"{leg} runs on {list(got[leg])}, the table says {list(want[leg])}")
    text = steps_text(job)
    for what, pattern in (
        ("the tox leg", r'tox" -e "\$LEG"'),
        ("the GPU check", r"tools/gpu_check\.sh"),
        ("the stored baseline, per leg", r"actions/cache/restore@[\s\S]*benchmarks-\$\{\{ matrix\.leg \}\}"),
        ("the benchmark comparison", r"--benchmark-compare-fail=median:"),
        ("the upload", r"actions/upload-artifact@[\s\S]*conformance-report\.json[\s\S]*benchmarks\.json"),
    ):  # fmt: skip
        if not re.search(pattern, text):
            problems.append(f"the job does not run {what}")
    if job.get("env", {}).get("LEG") != "${{ matrix.leg }}":
        problems.append("LEG is not the matrix's leg")
    return problems


def test_gpu_jobs_are_the_gpu_types():
    """gpu.yml has one job per GPU type, on the table's runner labels, running its tox leg, the GPU check, the upload and the benchmark comparison."""
    assert gpu_disagreements(workflow("gpu.yml")) == []


def mismatched(change) -> list[str]:
    changed = copy.deepcopy(workflow("gpu.yml"))
    change(changed["jobs"]["gpu"])
    return gpu_disagreements(changed)


def test_a_gpu_job_that_disagrees_with_the_table_is_named():
    """Each way the workflow can drift from the table is reported, naming the leg."""
    include = lambda job: job["strategy"]["matrix"]["include"]  # noqa: E731
    missing = mismatched(lambda job: include(job).pop())
    assert missing == [
        "no job for GPU type rocm-mi355: add `- leg: rocm-mi355` with "
        "`runner: [self-hosted, linux, x64, gpu-mi355]` to the matrix"
    ]
    relabelled = mismatched(lambda job: include(job)[2].update(runner=["self-hosted", "h200"]))
    assert relabelled == [
        "cuda-h200 runs on ['self-hosted', 'h200'], the table says "
        "['self-hosted', 'linux', 'x64', 'gpu-h200']"
    ]
    extra = mismatched(lambda job: include(job).append({"leg": "cuda-h20", "runner": ["x"]}))
    assert extra == ["a job for cuda-h20, which is no GPU type of tools/gpu_types.py"]
    fixed = mismatched(lambda job: job.update({"runs-on": "gpu-h200"}))
    assert fixed == ["runs-on is 'gpu-h200', not '${{ matrix.runner }}'"]
    no_compare = mismatched(lambda job: job["steps"].pop(-3))
    assert no_compare == ["the job does not run the benchmark comparison"]


def test_actionlint_knows_exactly_the_gpu_runner_labels():
    """.github/actionlint.yaml declares the table's own runner labels, and no others."""
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    want = {label for gpu in GPU_TYPES for label in gpu.runner_labels} - BUILTIN_LABELS
    assert set(config["self-hosted-runner"]["labels"]) == want


def test_nightly_runs_every_mutation_session_and_every_release():
    """nightly.yml has one mutation job per session config and one upstream job per SGLang release."""
    jobs = workflow("nightly.yml")["jobs"]
    sessions = sorted(p.stem for p in (ROOT / "strength" / "mutation").glob("*.toml"))
    assert jobs["mutation"]["strategy"]["matrix"]["session"] == sessions
    assert re.search(r'tox -e mutation -- "\$SESSION"', steps_text(jobs["mutation"]))
    releases = [str(r) for r in jobs["upstream"]["strategy"]["matrix"]["release"]]
    assert releases == [release.version for release in RELEASES]
    assert re.search(r'tox -e "sglang-\$RELEASE"', steps_text(jobs["upstream"]))
    kernels = [str(r) for r in jobs["upstream-kernels"]["strategy"]["matrix"]["release"]]
    assert kernels == list(KERNEL_PATH_RELEASES)
    assert re.search(r'tox -e "sglang-kernels-\$RELEASE"', steps_text(jobs["upstream-kernels"]))
    assert "schedule" in workflow("nightly.yml")[True]  # YAML 1.1 reads the key `on` as True


def test_the_scripts_install_the_default_sglang_release():
    """scripts/_env.sh installs the SGLang release conformance/upstream.py names the default
    (the newest, scripts/_specs.sh), unless CANARY_SGLANG names another: the shell's copy of
    the Python one."""
    assert "_specs.sh" in (ROOT / "scripts" / "_env.sh").read_text()
    text = (ROOT / "scripts" / "_specs.sh").read_text()
    found = re.search(r'sglang_spec="\$\{CANARY_SGLANG:-sglang==([^}"]+)\}"', text)
    assert found, "scripts/_specs.sh: no default SGLang release (sglang_spec)"
    assert found[1] == DEFAULT_RELEASE, (
        f"scripts/_specs.sh installs sglang=={found[1]} by default, conformance/upstream.py "
        f"names {DEFAULT_RELEASE}"
    )


def test_nightly_runs_the_gate_on_the_whole_suite():
    """.ci/run gives each mutant its tour and listed tests; nightly sweeps the whole suite."""
    text = steps_text(workflow("nightly.yml")["jobs"]["gate"])
    assert re.search(r"tox -e gate -- --whole-suite", text)


def test_nightly_runs_every_trial_of_the_detection_table():
    """.ci/run trusts the detection table's stamp; nightly runs every trial again."""
    assert re.search(
        r"tox -e detection\b", steps_text(workflow("nightly.yml")["jobs"]["detection"])
    )
    tox = (ROOT / "tox.ini").read_text()
    section = tox[tox.index("[testenv:detection]") :].split("\n[", 1)[0]
    assert "CANARY_DETECTION_FULL = 1" in section
    assert "tests/tools/test_detection_table.py" in section


def test_ci_runs_the_readme_test_command():
    """ci.yml runs the README's test command, the one .ci/run runs."""
    command = "bash scripts/tests.sh"
    assert re.search(rf"^{re.escape(command)} ", (ROOT / "README.md").read_text(), re.M)
    assert command in (ROOT / ".ci" / "run").read_text().replace("exec ", "")
    runs = [step.get("run", "") for step in workflow("ci.yml")["jobs"]["tests"]["steps"]]
    assert command in runs


@pytest.mark.parametrize("name", ["ci.yml", "gpu.yml", "nightly.yml"])
def test_workflows_pin_every_action_to_a_commit(name):
    """Every action a workflow uses is pinned to a full commit hash, with its tag in a comment."""
    text = (WORKFLOWS / name).read_text()
    uses = re.findall(r"uses: (\S+)(.*)", text)
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", action), action
        assert re.fullmatch(r" # v\d+(\.\d+)*", comment), (action, comment)


def current_triage() -> list[str]:
    """The sessions whose triage file is stamped with their module as it is (``module_sha256``,
    strength/mutation/replay_survivors.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "replay_survivors", ROOT / "strength" / "mutation" / "replay_survivors.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return sorted(
        path.stem
        for path in (ROOT / "strength" / "mutation" / "survivors").glob("*.json")
        if tool.is_current(tool.load_triage(path), ROOT)
    )


def test_a_mutation_job_gates_exactly_when_its_triage_is_current():
    """A mutation job fails when its survivors disagree with their triage. A session whose
    triage is stamped with its module as it is gates; the others (stale or missing triage) are
    informational (continue-on-error), with the reason in the workflow naming each session
    without a triage file. The list is the stamped sessions exactly: a module edited after its
    triage fails here, until its session is run and stamped again or it leaves the list. The
    other nightly jobs gate."""
    text = (WORKFLOWS / "nightly.yml").read_text()
    jobs = workflow("nightly.yml")["jobs"]
    flag = jobs["mutation"].get("continue-on-error")
    found = re.fullmatch(
        r"\$\{\{ !contains\(fromJSON\('(\[.*\])'\), matrix\.session\) \}\}", str(flag)
    )
    assert found, f"nightly.yml: mutation's continue-on-error is {flag!r}"
    gating = yaml.safe_load(found.group(1))
    assert gating == current_triage(), (
        "nightly.yml: the gating sessions are not the ones whose triage is current "
        f"(stamped with their module as it is): {current_triage()}"
    )
    assert all(
        "continue-on-error" not in jobs[name] for name in ("gate", "upstream", "upstream-kernels")
    )
    survivors = ROOT / "strength" / "mutation" / "survivors"
    untriaged = [
        p.stem
        for p in sorted((ROOT / "strength" / "mutation").glob("*.toml"))
        if not (survivors / f"{p.stem}.json").exists()
    ]
    reason = text[: text.index("    continue-on-error: ")].rsplit("mutation:", 1)[1]
    assert "informational" in reason.lower() and "stale" in reason.lower()
    for session in untriaged:
        assert session in reason, f"nightly.yml: the reason does not name {session}"


def declared_minimums() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("dependencies = [") : text.index("]", text.index("dependencies = ["))]
    return dict(re.findall(r'"([a-z]+)>=([\d.]+)"', block))


def test_the_oldest_leg_pins_the_declared_minimums():
    """tox -e oldest pins Triton, numpy, Hypothesis, pytest and msgspec at the minimums pyproject.toml
    declares, and the README names the same range."""
    tox = (ROOT / "tox.ini").read_text()
    leg = tox[tox.index("[testenv:oldest]") :].split("\n[", 1)[0]
    pins = dict(re.findall(r"^\s+([a-z]+)==([\d.]+)$", leg, re.M))
    minimums = declared_minimums()
    for name in ("triton", "numpy", "hypothesis", "pytest", "msgspec"):
        assert pins.get(name, "").startswith(minimums[name]), (name, pins.get(name), minimums)
    readme = (ROOT / "README.md").read_text()
    for name, version in pins.items():
        assert f"{version}" in readme, f"README: the oldest leg's {name} {version} is not named"


def test_the_oldest_leg_compiles_for_every_target():
    """tox -e oldest compiles every kernel variant for every GPU target with the oldest Triton,
    which GPU hosts run, before it runs the suite."""
    tox = (ROOT / "tox.ini").read_text()
    leg = tox[tox.index("[testenv:oldest]") :].split("\n[", 1)[0]
    assert "-m tools.compile_check --all" in leg
    assert "triton==3.6.0" in leg


def test_ci_runs_the_oldest_leg():
    """ci.yml runs tox -e oldest, on the oldest Python the project declares."""
    job = workflow("ci.yml")["jobs"]["oldest"]
    assert re.search(r"tox -e oldest", steps_text(job))
    declared = re.search(r'requires-python = ">=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    versions = [
        step["with"]["python-version"]
        for step in job["steps"]
        if "with" in step and "python-version" in step["with"]
    ]
    assert versions == [declared[1]]
