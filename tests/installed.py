"""The suite as a user installs it, proved from outside the repository.

    python -m tests.installed [--workdir DIR] [--torch SPEC] [--sglang SPEC]   # all of it
    python -m tests.installed outside --workdir DIR [--torch SPEC] [--sglang SPEC]  # 1-4, 6
    python -m tests.installed compare --workdir DIR --inside DIR                    # 5

1. Builds the wheel (``pip wheel --no-deps``) from a copy of the project's files, so nothing
   of an earlier build in the checkout can slip into it.
2. Makes a fresh virtual environment and installs into it torch (``--torch``, the local CPU
   build the scripts use) and the wheel with the dependencies it declares, nothing else; then
   SGLang (``--sglang``) without its dependencies, for the SGLang run.
3. Checks the declared dependencies: every module that the installed packages import is in
   Python's standard library, is one of the wheel's own packages, or comes from a
   distribution the wheel requires.
4. From an empty folder, runs the suite's command ``kv-canary-conformance``, each run with
   ``--canary-report``: the whole suite against a ``.py`` file implementation written into
   that folder (canary_torch's API under the file's name, the quickest whole run; with
   ``--file-run vectors``, as ``scripts/tests.sh`` runs it, its stored vectors only, and
   canary_torch's whole run is the nightly gate's). On
   ``canary`` and on the SGLang adapter (with the installed package's expectations file for
   the installed release), whose whole runs the gate and the SGLang leg make inside the
   repository already, it runs the whole suite with every test but the stored vectors
   deselected (``-k``: the CONTRACT §2 vectors and ``golden/*.json`` but the engine-scale
   ones), which launch every kernel family of the installed copy and read its data files.
5. Compares each run's test counts (pytest's last line, as the JSON report's ``tests``; for a
   run of the stored vectors, the tests it collected, deselected ones included) with the same
   suite inside the repository.
   ``compare --inside DIR`` takes those from the runs
   ``scripts/tests.sh`` makes anyway: ``DIR/gate.json`` (the known-bad gate, whose
   correct-implementation run of ``canary`` is the whole suite, which every implementation
   passes alike: the file's counts are compared with it) and
   ``DIR/sglang.json`` (the SGLang leg's report); the whole check without a command makes
   those runs itself.
6. Shows that it can fail: with ``hypothesis`` uninstalled from the fresh environment, the
   dependency check must name it and the command must fail to start.

``scripts/tests.sh`` runs ``outside`` in the background from its start (with the machine's
Python, where it has pip, beside the install of the project's environment: it imports nothing
of that environment) and ``compare`` once its own runs are done. Exit status 0 when every step holds; the first
broken step stops the check with status 1 and says why.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The file implementation written into the empty folder: canary_torch under another name.
FILE_IMPL_NAME = "kv_file_impl.py"
FILE_IMPL = '''"""A KV canary given to the suite as a file: canary_torch's API under this file's name."""

from canary_torch import *  # noqa: F403
from canary_torch import __all__  # noqa: F401
'''


class CheckFailed(Exception):
    """A step of the check did not hold; the message says which and why."""


@dataclass(frozen=True)
class Run:
    """One run of the suite from the empty folder, and where its inside counts come from."""

    name: str
    args: tuple[str, ...]  # the command's arguments besides --canary-report
    shown: str  # the implementation's name in the report header
    inside_impl: str  # the implementation the same suite ran on inside the repository
    #: "whole": its counts are compared with the inside run's; "vectors": the whole suite with
    #: all but the stored vectors deselected, which must pass (or fail as the expectations
    #: file says), and whose count of collected tests is compared
    mode: str = "whole"


#: What the installed copy runs of the whole suite where the whole suite runs inside the
#: repository already: the stored vectors (seconds under the interpreter), which launch the
#: fingerprint, write, verify, plan and scatter kernels of the installed package; every other
#: test is collected and deselected, so the run counts the whole suite's tests too.
VECTOR_MODULES = ("test_spec_vectors.py", "test_golden.py", "test_golden_plan.py")
VECTORS = ("-k", " or ".join(VECTOR_MODULES))


def say(text: str) -> None:
    print(f"[installed] {text}", flush=True)


def run(command, *, cwd=None, env=None, log: Path | None = None, timeout=1800):
    """``command``; its output goes to ``log`` (if given) and is returned."""
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if log is not None:
        log.write_text(done.stdout)
    return done


def require(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode != 0:
        tail = "\n".join(done.stdout.rstrip().splitlines()[-25:])
        raise CheckFailed(f"{what} failed (exit {done.returncode}):\n{tail}")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points into the repository or its
    virtual environment, so that the installed copy is all a run can import."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")
        and not key.startswith(("CANARY_", "HYPOTHESIS_"))
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


# --- 1. the wheel ---------------------------------------------------------------------------


def project_files(root: Path) -> list[str]:
    """The files of the project: tracked and untracked ones that git does not ignore."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root)
    require(listed, "git ls-files")
    return [name for name in listed.stdout.split("\0") if name and (root / name).is_file()]


#: What a copy of a tree that is not a git checkout leaves out: environments, caches, builds.
NOT_PROJECT = (
    ".git",
    ".venv",
    ".tox",
    ".hypothesis",
    ".benchmarks",
    "__pycache__",
    "build",
    "dist",
    "*.egg-info",
    ".*_cache",
)


def build_wheel(root: Path, workdir: Path) -> Path:
    """The project's wheel, built from a copy of its files (no stale ``build/`` inside)."""
    source = workdir / "source"
    if (root / ".git").exists():
        for name in project_files(root):
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, target)
    else:  # an unpacked source tree
        shutil.copytree(root, source, ignore=shutil.ignore_patterns(*NOT_PROJECT))
    dist = workdir / "dist"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", dist, source],
        log=workdir / "wheel.log",
    )
    require(built, "pip wheel")
    (wheel,) = dist.glob("*.whl")
    return wheel


# --- 2. the fresh environment ---------------------------------------------------------------


def make_venv(workdir: Path, wheel: Path, torch_spec: str, sglang_spec: str) -> Path:
    """A new virtual environment with torch, the wheel and its declared dependencies, and
    SGLang without its own; its Python."""
    venv = workdir / "venv"
    require(run([sys.executable, "-m", "venv", venv]), "python -m venv")
    python = venv / "bin" / "python"
    # --no-compile: a handful of processes import from this environment, and compiling only
    # what they import costs less than compiling every file of torch and Triton up front
    pip = [python, "-m", "pip", "install", "--quiet", "--no-compile"]
    # torch pinned in the same resolution as the wheel's own `torch>=` requirement, so that the
    # local CPU build is taken and no CUDA build is pulled
    env = clean_env()
    require(run([*pip, torch_spec, wheel], env=env, log=workdir / "pip.log"), "pip install")
    require(run([*pip, "--no-deps", sglang_spec], env=env), f"pip install {sglang_spec}")
    return python


# --- 3. declared dependencies ---------------------------------------------------------------


def requirement_name(requirement: str) -> str | None:
    """The normalised distribution name of a ``Requires-Dist`` line; None for an extra's."""
    if "extra ==" in requirement.replace('"', "").replace("'", ""):
        return None
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return normalise(match.group(1)) if match else None


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules(files: list[Path]) -> dict[str, set[str]]:
    """Top-level module -> the files that import it, for every absolute import in ``files``
    (module level or inside functions)."""
    found: dict[str, set[str]] = {}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(path.name)
    return found


def undeclared_imports(
    imports: dict[str, set[str]],
    own: set[str],
    provider: dict[str, set[str]],
    required: set[str],
) -> dict[str, str]:
    """Each imported module that is not the standard library's, not one of ``own`` packages
    and not provided (``provider``: module -> distributions) by a ``required`` distribution,
    with what is wrong with it."""
    wrong = {}
    for module, files in sorted(imports.items()):
        if module in sys.stdlib_module_names or module in own or module == "__future__":
            continue
        givers = {normalise(d) for d in provider.get(module, ())}
        if not givers & required:
            by = f"installed by {', '.join(sorted(givers))}" if givers else "not installed"
            wrong[module] = f"imported by {', '.join(sorted(files))}; {by}, not declared"
    return wrong


def check_dependencies(python: Path, wheel: Path) -> dict[str, str]:
    """:func:`undeclared_imports` of the wheel as installed in ``python``'s environment."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    required = {
        name
        for line in lines
        if line.startswith("Requires-Dist:")
        for name in [requirement_name(line.split(":", 1)[1])]
        if name
    }
    own = {n.split("/")[0] for n in names if n.endswith(".py") and "/" in n}
    site = Path(
        run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    files = [p for package in sorted(own) for p in (site / package).rglob("*.py")]
    script = "import importlib.metadata as m, json; print(json.dumps(m.packages_distributions()))"
    provider = json.loads(run([python, "-c", script], env=clean_env()).stdout)
    return undeclared_imports(imported_modules(files), own, provider, required)


# --- 4. the runs from the empty folder ------------------------------------------------------


def expectations_path(python: Path, folder: Path) -> str:
    """The installed package's expectations file of the installed SGLang release."""
    done = run([python, "-m", "conformance.upstream", "expectations"], cwd=folder, env=clean_env())
    require(done, "python -m conformance.upstream expectations")
    return done.stdout.strip().splitlines()[-1]


def outside_runs(python: Path, folder: Path, file_run: str = "whole") -> list[Run]:
    """The runs from the empty folder; ``file_run``: the file implementation's run, the whole
    suite or its stored vectors."""
    common = ("--canary-device", "cpu", "--hypothesis-profile", "ci", "-p", "no:cacheprovider")
    expect = expectations_path(python, folder)
    sglang = "conformance.adapters.sglang"
    canary = ("--canary-impl", "canary", *common)
    sglang_args = ("--canary-impl", sglang, "--canary-expect", expect, *common)
    file_args = ("--canary-impl", f"./{FILE_IMPL_NAME}", *common)
    return [
        Run(
            f"the file {FILE_IMPL_NAME}" + (", its stored vectors" if file_run == "vectors" else ""),
            (*file_args, *VECTORS) if file_run == "vectors" else file_args,
            Path(FILE_IMPL_NAME).stem,
            "canary",  # the same whole suite, passed alike by every correct implementation
            file_run,
        ),
        Run("canary, its stored vectors", (*canary, *VECTORS), "canary", "canary", "vectors"),
        Run("SGLang's kv_canary, its stored vectors", (*sglang_args, *VECTORS), sglang, sglang,
            "vectors"),
    ]  # fmt: skip


def run_outside(python: Path, folder: Path, workdir: Path, one: Run) -> tuple[Run, dict, float]:
    """``one`` from ``folder`` with the installed command; (run, its report, seconds)."""
    slug = re.sub(r"\W+", "-", one.inside_impl)
    report = workdir / f"outside-{slug}.json"
    command = python.parent / "kv-canary-conformance"
    start = time.monotonic()
    done = run(
        [command, *one.args, "--canary-report", report],
        cwd=folder,
        env=clean_env(CI="true"),
        log=workdir / f"outside-{slug}.log",
    )
    seconds = time.monotonic() - start
    require(done, f"kv-canary-conformance on {one.name} from an empty folder")
    if f"canary implementation: {one.shown}," not in done.stdout:
        raise CheckFailed(f"the run on {one.name} does not name {one.shown} in its header")
    return one, json.loads(report.read_text()), seconds


def collected_of(tests: dict) -> int:
    """The tests a run collected, from its counts (the deselected ones left out)."""
    return sum(n for outcome, n in tests.items() if outcome != "deselected")


# --- 5. the counts inside the repository ----------------------------------------------------


def inside_counts_from(folder: Path) -> dict[str, dict]:
    """Implementation -> its test counts inside the repository, from the reports of
    ``scripts/tests.sh``: the gate's JSON and the SGLang leg's report."""
    counts = {}
    gate = json.loads((folder / "gate.json").read_text())
    for result in gate["results"]:
        if result["target"]["area"] == "correct":
            counts[result["target"]["module"]] = result["tests"]
    counts["conformance.adapters.sglang"] = json.loads((folder / "sglang.json").read_text())[
        "tests"
    ]
    return counts


def inside_counts_by_running(workdir: Path) -> dict[str, dict]:
    """The same counts, from runs of the suite inside the repository made now."""

    def one(impl: str) -> tuple[str, dict]:
        report = workdir / f"inside-{impl}.json"
        if impl == "conformance.adapters.sglang":
            command = [sys.executable, "-m", "conformance.upstream", "run"]
        else:
            command = [sys.executable, "-m", "pytest", "conformance", "--canary-impl", impl]
            command += ["--canary-device", "cpu", "--hypothesis-profile", "ci"]
        command += ["-q", "-p", "no:cacheprovider", "--canary-report", report]
        require(run(command, cwd=ROOT, env={**os.environ, "CI": "true"}), f"the suite on {impl}")
        return impl, json.loads(report.read_text())["tests"]

    impls = ("canary", "conformance.adapters.sglang")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, impls))


def count_line(tests: dict) -> str:
    return ", ".join(f"{n} {outcome}" for outcome, n in tests.items()) or "no tests"


# --- 6. a run-time dependency taken away ----------------------------------------------------


def check_a_missing_dependency_fails(python: Path, wheel: Path, folder: Path) -> None:
    """With hypothesis uninstalled, the dependency check names it and the command fails."""
    gone = run([python, "-m", "pip", "uninstall", "--yes", "--quiet", "hypothesis"])
    require(gone, "pip uninstall hypothesis")
    wrong = check_dependencies(python, wheel)
    if "hypothesis" not in wrong:
        raise CheckFailed("with hypothesis uninstalled, the dependency check did not name it")
    done = run(
        [python.parent / "kv-canary-conformance", "--collect-only", "-q"],
        cwd=folder,
        env=clean_env(CI="true"),
    )
    if done.returncode == 0 or "No module named 'hypothesis'" not in done.stdout:
        raise CheckFailed(
            f"with hypothesis uninstalled, the command gave exit {done.returncode}:\n"
            + done.stdout[-2000:]
        )


# --- the check ------------------------------------------------------------------------------


def outside(args: argparse.Namespace, workdir: Path) -> None:
    """Steps 1-4 and 6; the runs' reports and ``runs.json`` (what ran) stay in ``workdir``."""
    start = time.monotonic()
    wheel = build_wheel(ROOT, workdir)
    say(f"built {wheel.name} ({wheel.stat().st_size // 1024} KiB)")
    python = make_venv(workdir, wheel, args.torch, args.sglang)
    say(f"fresh environment: {args.torch}, the wheel and its dependencies, {args.sglang} "
        f"(--no-deps), in {time.monotonic() - start:.0f} s")  # fmt: skip
    wrong = check_dependencies(python, wheel)
    if wrong:
        lines = "\n".join(f"  {module}: {why}" for module, why in wrong.items())
        raise CheckFailed(f"the installed packages import undeclared dependencies:\n{lines}")
    say("every module the installed packages import is declared or the standard library's")

    folder = workdir / "empty"
    folder.mkdir()
    (folder / FILE_IMPL_NAME).write_text(FILE_IMPL)
    runs = outside_runs(python, folder, args.file_run)
    # two at a time: the longest run first, beside the short ones
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda one: run_outside(python, folder, workdir, one), runs))
    made = []
    for one, report, seconds in done:
        say(f"  {one.name}: {count_line(report['tests'])} in {seconds:.0f} s")
        if one.mode == "vectors":  # no inside run of its own: each passed, or failed as listed
            ran = {k: n for k, n in report["tests"].items() if k != "deselected"}
            if not ran or set(ran) - {"passed", "xfailed"}:
                raise CheckFailed(f"{one.name}: {count_line(report['tests'])}")
            made.append({"name": one.name, "inside_impl": one.inside_impl,
                         "collected": sum(report["tests"].values())})  # fmt: skip
            continue
        made.append({"name": one.name, "inside_impl": one.inside_impl, "tests": report["tests"]})
    (workdir / "runs.json").write_text(json.dumps(made, indent=1))

    check_a_missing_dependency_fails(python, wheel, folder)
    say("with hypothesis uninstalled, the dependency check names it and the command fails")
    say(f"outside the repository: passed in {time.monotonic() - start:.0f} s")


def compare(workdir: Path, inside: dict[str, dict], source: str) -> None:
    """Step 5: the counts of the runs in ``workdir/runs.json`` against ``inside``."""
    say(f"test counts, outside (from an empty folder) and inside the repository ({source}):")
    mismatched = []
    for one in json.loads((workdir / "runs.json").read_text()):
        want = inside[one["inside_impl"]]
        if "collected" in one:
            same = one["collected"] == collected_of(want)
            say(f"  {one['name']}: {one['collected']} tests; inside: {count_line(want)}: "
                f"{'same' if same else 'DIFFERENT'}")  # fmt: skip
        else:
            same = one["tests"] == want
            say(f"  {one['name']}: {count_line(one['tests'])}; inside: {count_line(want)}: "
                f"{'same' if same else 'DIFFERENT'}")  # fmt: skip
        if not same:
            mismatched.append(one["name"])
    if mismatched:
        raise CheckFailed("outside the repository the counts differ: " + ", ".join(mismatched))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.installed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("step", nargs="?", choices=("outside", "compare"), help="one half only")
    parser.add_argument("--workdir", metavar="DIR", help="kept after the check (default: a temporary folder)")  # fmt: skip
    parser.add_argument("--inside", metavar="DIR", help="compare: the reports of the runs inside (see 5.)")  # fmt: skip
    parser.add_argument("--torch", default="torch==2.13.0", help="torch to install first (default %(default)s)")  # fmt: skip
    parser.add_argument("--file-run", choices=("whole", "vectors"), default="whole", help="the file implementation's run: the whole suite (default) or its stored vectors (scripts/tests.sh: canary_torch's whole run is the nightly gate's)")  # fmt: skip
    parser.add_argument("--sglang", help="SGLang release for the SGLang run (default: the newest, conformance.upstream.DEFAULT_RELEASE)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.sglang is None:  # imported here: ``outside`` runs before the project's environment
        from conformance.upstream import DEFAULT_RELEASE

        args.sglang = f"sglang=={DEFAULT_RELEASE}"
    if args.step and not args.workdir:
        parser.error(f"{args.step} needs --workdir")
    if args.step == "compare" and not args.inside:
        parser.error("compare needs --inside")
    if args.workdir:
        workdir = Path(args.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        cleanup = None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="kv-canary-installed-")
        workdir = Path(cleanup.name)
    try:
        if args.step != "compare":
            outside(args, workdir)
        if args.step == "compare":
            compare(workdir, inside_counts_from(Path(args.inside)), f"the reports in {args.inside}")
        elif args.step is None:
            compare(workdir, inside_counts_by_running(workdir), "runs made now")
    except CheckFailed as failed:
        print(f"[installed] FAILED: {failed}", file=sys.stderr, flush=True)
        return 1
    finally:
        if cleanup is not None:
            cleanup.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
