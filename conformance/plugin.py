"""pytest plugin of the conformance suite, loaded by ``conformance/conftest.py`` for runs of the
suite only (elsewhere: ``pytest -p conformance.plugin``).

It chooses the implementation under test (``--canary-impl`` / ``CANARY_IMPL``, default
``canary``: a dotted module name, a ``.py`` file or a package directory) and the device
(``--canary-device`` / ``CANARY_DEVICE``, default ``cuda`` when available, else ``cpu``;
``cuda`` without an index means the current CUDA device), picks the Hypothesis profile,
prints what was chosen in the report header, and hands the module and device to the tests
as the ``impl`` and ``device`` fixtures. The suite reaches the implementation only through
these names, never its internals.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import platform
import re
import sys
import traceback
import types
from argparse import SUPPRESS
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import levels, prerequisites, profiles
from .report import Recorder, SkipGroup, check_writable, cut, in_suite
from .run_settings import check_given_once, level_given, named, profile_given, setting

if TYPE_CHECKING:
    import torch

pytest_plugins = ["conformance.expectations"]  # --canary-expect, CANARY_CAPABILITIES

CORE_NAMES = ("RealKvSource", "RealKvHashMode", "CanaryLaunchTag", "fingerprint")
WRITE_VERIFY_NAMES = (
    "VerifyOrWriteContext",
    "VerifyPlan",
    "WritePlan",
    "launch_canary_write_kernel",
    "launch_canary_verify_kernel",
)
#: The plan group (CONTRACT §14): the plan kernel and the expected-token scatter, which fill the
#: write/verify group's plans and so come with it.
PLAN_NAMES = (
    "launch_canary_plan_kernels",
    "launch_scatter_req_token_ids_kernel",
    "REQ_POOL_IDX_PADDING",
)
ENV_PREFIXES = ("CANARY_", "TRITON_", "HYPOTHESIS_")
#: The contract groups an implementation may lack (CONTRACT §14), by the marker of their tests:
#: what a run reports it did not check, and what ``--canary-allow-missing`` names.
GROUPS = {
    "write_verify": ("the write/verify group", WRITE_VERIFY_NAMES, ("§5", "§6", "§7", "§8", "§11")),
    "plan": ("the plan group", PLAN_NAMES, ("§12", "§13", "§14", "§15")),
}


class Selection(types.SimpleNamespace):
    """What this run tests: the module, its name, the device, and what the module lacks."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("canary", "KV-canary conformance")
    group.addoption(
        "--canary-impl",
        default=None,
        help="module under test (default: $CANARY_IMPL or 'canary')",
    )
    group.addoption(
        "--canary-device",
        default=None,
        help="device for tensors (default: $CANARY_DEVICE, else cuda if available, else cpu)",
    )
    group.addoption(
        "--canary-level",
        default=None,
        choices=levels.LEVELS_ORDER,
        help="core: what SGLang's kv_canary promises; full: also the contract's own additions "
        "(default: $CANARY_LEVEL or full; see conformance/levels.py)",
    )
    group.addoption(
        "--canary-report",
        default=None,
        metavar="PATH",
        help="write a JSON conformance report to PATH",
    )
    group.addoption(
        "--canary-no-shrink",
        "--canary-first-failure",
        action="store_true",
        default=False,
        dest="canary_no_shrink",
        help="report each property's first failing example as found, without shrinking it",
    )
    group.addoption(
        "--canary-allow-missing",
        action="append",
        default=None,
        metavar="GROUP",
        help="a contract group (write_verify, plan) the implementation may lack: its tests are "
        "skipped and the run can still pass (default: $CANARY_ALLOW_MISSING, comma-separated, "
        "or none: a run that skips a group exits 7)",
    )
    # given by the suite's command (conformance/cli.py): a test outside the suite is refused
    group.addoption("--canary-suite-only", action="store_true", default=False, help=SUPPRESS)


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or Path(spec).is_dir()


def import_target(spec: str, source: str = "--canary-impl") -> tuple[str, str | None]:
    """What ``--canary-impl spec`` imports: (dotted module name, folder to put on sys.path).

    ``spec`` is a dotted name (``my_engine.kv_canary``: imported as is, the folder is None), a
    ``.py`` file (``path/to/mykv.py``: module ``mykv`` from ``path/to``) or a package directory
    (``path/to/mykv``, holding ``__init__.py``: package ``mykv`` from ``path/to``). ``source``
    is where ``spec`` came from (the flag or ``CANARY_IMPL``), for the errors.
    """
    where = named(source, spec)
    if not _looks_like_path(spec):
        if not all(part.isidentifier() for part in spec.split(".")):
            raise pytest.UsageError(
                f"{where}: not a dotted module name (my_engine.kv_canary), a .py file or a "
                "package directory"
            )
        return spec, None
    path = Path(spec).expanduser().resolve()
    if path.is_file() and path.suffix == ".py":
        return path.stem, str(path.parent)
    if path.is_dir() and (path / "__init__.py").is_file():
        return path.name, str(path.parent)
    if path.is_dir():
        raise pytest.UsageError(f"{where}: a directory must be a package (hold an __init__.py)")
    raise pytest.UsageError(
        f"{where}: no such .py file or package directory; give a dotted module "
        "name (importable from sys.path), a path to a .py file or a path to a package directory"
    )


def one_line(error: BaseException, limit: int = 300) -> str:
    """``Type: message`` of an error in one line, with where it was raised (``file:line``); a
    message past ``limit`` characters is cut, with a mark (torch's can run to kilobytes)."""
    text = cut(" ".join(str(error).split()), limit)
    if isinstance(error, SyntaxError):  # its message already names the file and the line
        return f"{type(error).__name__}: {text}"
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {text}{where}"


def _load(spec: str, source: str = "--canary-impl") -> tuple[types.ModuleType, str, str | None]:
    """Import the implementation named by ``spec``: (module, its dotted name, its folder)."""
    where = named(source, spec)
    module_name, folder = import_target(spec, source)
    if folder is not None and folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        hint = (
            ""
            if folder
            else "; a module outside the current directory and sys.path is given as a path "
            "(path/to/mykv.py, path/to/mykv) or found through PYTHONPATH"
        )
        raise pytest.UsageError(
            f"{where}: cannot import {module_name!r} ({' '.join(str(error).split())}){hint}"
        ) from error
    except Exception as error:  # a syntax error, or whatever the module raises when imported
        raise pytest.UsageError(
            f"{where}: importing {module_name!r} raised {one_line(error)}"
        ) from error
    if folder is not None:
        found = Path(getattr(module, "__file__", "") or "").resolve()
        wanted = Path(spec).expanduser().resolve()
        if found != wanted and found.parent != wanted:
            raise pytest.UsageError(
                f"{where}: the name {module_name!r} is already taken by "
                f"{found}; rename the file or package"
            )
    _check_names(module, spec)
    return module, module_name, folder


def _check_names(module: types.ModuleType, module_name: str) -> None:
    missing = [name for name in CORE_NAMES if not hasattr(module, name)]
    if missing:
        raise pytest.UsageError(
            f"--canary-impl {module_name!r} does not provide {', '.join(missing)}; "
            f"a canary implementation provides at least {', '.join(CORE_NAMES)}"
        )
    partial = [name for name in WRITE_VERIFY_NAMES if not hasattr(module, name)]
    if partial and len(partial) != len(WRITE_VERIFY_NAMES):
        raise pytest.UsageError(
            f"--canary-impl {module_name!r} provides part of the write/verify group but not "
            f"{', '.join(partial)}; provide all of {', '.join(WRITE_VERIFY_NAMES)} or none"
        )
    partial = [name for name in PLAN_NAMES if not hasattr(module, name)]
    if partial and len(partial) != len(PLAN_NAMES):
        raise pytest.UsageError(
            f"--canary-impl {module_name!r} provides part of the plan group but not "
            f"{', '.join(partial)}; provide all of {', '.join(PLAN_NAMES)} or none"
        )


def device_name(given: str | None) -> str:
    """The device a run uses, by name: ``given`` (``--canary-device``), else
    ``$CANARY_DEVICE``, else ``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    return (
        given or os.environ.get("CANARY_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    )


def _device(config: pytest.Config):
    import torch

    from .support import normalize_device

    given, source = setting(config, "--canary-device", "CANARY_DEVICE")
    name = device_name(given)
    where = named(source, name) if given else f"the default device {name!r}"
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise pytest.UsageError(f"{where}: {error}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"{where}: torch sees no CUDA/ROCm device")
    # One GPU per pytest-xdist worker (gw<i> takes cuda:<i % count>) unless an index was
    # given. Triton launches on the current device, so the worker's GPU is made current.
    worker = getattr(config, "workerinput", {}).get("workerid", "")  # "gw0", "gw1", ...
    if (
        device.type == "cuda"
        and device.index is None
        and worker[:2] == "gw"
        and worker[2:].isdigit()
    ):
        device = torch.device("cuda", int(worker[2:]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    # "cuda" becomes "cuda:<current index>": results live on an indexed device, and
    # torch.device("cuda") != torch.device("cuda:0").
    return normalize_device(device)


def _device_where(config: pytest.Config) -> str:
    given, source = setting(config, "--canary-device", "CANARY_DEVICE")
    return named(source, given) if given else f"the default device {device_name(None)!r}"


def check_device(device, where: str) -> None:
    """That the suite's tensors can live on ``device``: a tensor put there reads back. Else a
    usage error (``meta`` holds no data; ``xla`` or ``mps`` without one cannot hold any), rather
    than a run in which every test fails as if the implementation were wrong."""
    import torch

    if device.type == "meta":
        raise pytest.UsageError(f"{where}: a meta tensor holds no data; the suite compares data")
    try:
        readable = torch.arange(4, device=device).cpu().tolist() == [0, 1, 2, 3]
    except Exception as error:
        raise pytest.UsageError(
            f"{where}: torch cannot hold a tensor there ({one_line(error)})"
        ) from error
    if not readable:
        raise pytest.UsageError(f"{where}: a tensor put there does not read back")


def _release(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def interpreter_problem(triton_version: str | None, numpy_version: str) -> str | None:
    """Why Triton's interpreter cannot run with these versions, or None. Triton before 3.7 with
    numpy 2.4 or later fails every interpreted launch (``InterpreterError: TypeError('only
    0-dimensional arrays can be converted to Python scalars')``): measured with Triton 3.6 and
    numpy 2.4; Triton 3.6 with numpy 2.3.5 and Triton 3.7.1 with numpy 2.4 pass."""
    if triton_version is None:
        return None
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (
            f"triton {triton_version} with numpy {numpy_version} cannot run Triton's "
            "interpreter, which runs the launches on CPU tensors (every interpreted launch "
            "fails, as if the implementation were wrong): install numpy<2.4, or triton>=3.7 "
            "with the torch it goes with"
        )
    return None


def check_environment(device) -> None:
    """On the CPU, with an implementation that brought in Triton, that Triton's interpreter can
    run: a broken environment stops the run before its first test, in one line."""
    triton = sys.modules.get("triton")
    if device.type != "cpu" or triton is None:
        return
    import numpy

    problem = interpreter_problem(getattr(triton, "__version__", None), numpy.__version__)
    if problem:
        raise pytest.UsageError(problem)


def _selection(config: pytest.Config) -> Selection | None:
    return getattr(config, "_canary_selection", None)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """What the suite needs of this Python, then the profile, are checked before anything
    imports them (Hypothesis' own plugin loads the profile: a traceback otherwise)."""
    prerequisites.check()
    check_given_once(list(config.invocation_params.args))
    profile_given(config)
    config._canary_benchmarks_was_there = BENCHMARK_STORAGE.exists()  # before it is made


# Last: Hypothesis' own plugin loads ``--hypothesis-profile NAME`` as given in its
# pytest_configure; ours must run after it to load NAME's per-device variant (``ci-cpu``).
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "write_verify: needs the write/verify group of the API")
    config.addinivalue_line(
        "markers", "plan: needs the plan group of the API (and the write/verify group)"
    )
    config.addinivalue_line("markers", "gpu: needs a GPU device (skipped on the CPU leg)")
    # the suite's own verdicts, wherever it runs (an installed copy reads no pyproject.toml): a
    # RuntimeWarning (numpy's overflow of an int8 size, say) fails the test that caused it, and
    # so does a warning of Hypothesis about the suite's own strategies
    for warning in ("RuntimeWarning", "hypothesis.errors.HypothesisWarning"):
        config.addinivalue_line("filterwarnings", f"error::{warning}")
    # every input is checked here, before the first test: what a run cannot use is a usage
    # error that names the flag or variable it came from
    given, source = setting(config, "--canary-impl", "CANARY_IMPL")
    spec = given or "canary"
    profile = profile_given(config)
    level = level_given(config)
    report, _ = setting(config, "--canary-report", None)
    if not hasattr(config, "workerinput"):  # the controller writes the reports
        if report is not None:
            check_writable(report, named("--canary-report", report))
        step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if step_summary:
            check_writable(step_summary, named("GITHUB_STEP_SUMMARY", step_summary))
    device = _device(config)
    check_device(device, _device_where(config))
    module, module_name, folder = _load(spec, source if given else "--canary-impl")
    # whether the implementation's own import brought in Triton (before the suite's modules
    # that import it): its launches on CPU tensors are then interpreted, and watched
    uses_triton = "triton" in sys.modules
    check_environment(device)
    allowed = _allowed_missing(config)
    from . import support

    support.IMPL_FOLDER = folder
    profiles.ON_CPU = device.type == "cpu"
    no_shrink = bool(config.getoption("canary_no_shrink", default=False))
    loaded = profiles.select(profile, on_cpu=profiles.ON_CPU, shrink=not no_shrink)
    selection = Selection(
        level=level,
        module=module,
        module_name=module_name,
        module_folder=folder,
        impl_arg=spec,
        device=device,
        profile=loaded,
        profile_arg=profile,
        expect_arg=None,  # set by conformance.expectations
        seed=config.getoption("--hypothesis-seed", default=None),
        shrink_seconds=0 if no_shrink else profiles.shrink_seconds(loaded),
        write_verify=all(hasattr(module, name) for name in WRITE_VERIFY_NAMES),
        plan=all(hasattr(module, name) for name in PLAN_NAMES + WRITE_VERIFY_NAMES),
        uses_triton=uses_triton,
        allow_missing=allowed,
    )
    config._canary_selection = selection
    config.pluginmanager.register(
        Recorder(
            config,
            report,
            lambda: describe_environment(selection),
            rerun_options=lambda: rerun_options_of(selection),
            skip_groups=lambda: skip_groups(selection),
        ),
        "canary-report",
    )


def _allowed_missing(config: pytest.Config) -> frozenset[str]:
    """The groups ``--canary-allow-missing`` (or ``$CANARY_ALLOW_MISSING``) names."""
    given = config.getoption("--canary-allow-missing", default=None)
    source = "--canary-allow-missing"
    if given is None and os.environ.get("CANARY_ALLOW_MISSING") is not None:
        given, source = [os.environ["CANARY_ALLOW_MISSING"]], "CANARY_ALLOW_MISSING"
    names = [name.strip() for value in given or () for name in value.split(",")]
    wrong = [name for name in names if name not in GROUPS]
    if wrong or (given is not None and not names):
        raise pytest.UsageError(
            f"{named(source, ','.join(given or []))}: the groups are {', '.join(GROUPS)}"
        )
    return frozenset(names)


def skip_groups(selection: Selection) -> dict[str, SkipGroup]:
    """The reasons the suite skips tests for in this run, and what each stands for."""
    out = {}
    for group, reason in group_skip_reasons(selection).items():
        what, _, sections = GROUPS[group]
        out[reason] = SkipGroup(what, group, group in selection.allow_missing, sections)
    out[gpu_skip_reason(selection)] = SkipGroup("the tests that need a GPU", None, True)
    return out


def group_skip_reasons(selection: Selection) -> dict[str, str]:
    """{group the module lacks: the reason its tests are skipped for}."""
    reasons = {}
    if not selection.write_verify:
        reasons["write_verify"] = (
            f"{selection.module_name} does not provide the write/verify group "
            f"({', '.join(WRITE_VERIFY_NAMES)})"
        )
    if not selection.plan:
        lacks = PLAN_NAMES if selection.write_verify else PLAN_NAMES + WRITE_VERIFY_NAMES
        reasons["plan"] = (
            f"{selection.module_name} does not provide the plan group ({', '.join(lacks)})"
        )
    return reasons


def gpu_skip_reason(selection: Selection) -> str:
    return f"needs a GPU; this run's device is {selection.device}"


#: pytest-benchmark's storage folder, made in the current folder by every run it is loaded in.
BENCHMARK_STORAGE = Path(".benchmarks")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The suite runs no benchmark: an empty ``.benchmarks`` that was not there before the run
    goes again, so that a run leaves nothing behind but what it was asked for."""
    if getattr(config, "_canary_benchmarks_was_there", True):
        return
    with contextlib.suppress(OSError):  # not empty, or gone already
        BENCHMARK_STORAGE.rmdir()


LEVEL_WORDS = {
    levels.CORE: "what SGLang's kv_canary promises; the contract's additions are not run",
    levels.FULL: "the whole contract, its own additions included",
}


def item_level(item: pytest.Item) -> str:
    """The declared level (conformance/levels.py) of one of the suite's tests."""
    function = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    callspec = getattr(item, "callspec", None)
    return levels.declared_level(f"{item.path.name}::{function}", callspec.id if callspec else None)


def rerun_options_of(selection: Selection) -> str:
    """The options that rerun one test of this run as it ran: on the same implementation and
    device, with the profile it was given, and the expectations file, seed, level and shrinking
    that shaped its examples (a variable of the shell the rerun runs in changes none of them)."""
    import shlex

    options = [
        f"--canary-impl {shlex.quote(selection.impl_arg)}",
        f"--canary-device {shlex.quote(str(selection.device))}",
        f"--hypothesis-profile {shlex.quote(selection.profile_arg)}",
    ]
    if selection.expect_arg:
        options.append(f"--canary-expect {shlex.quote(selection.expect_arg)}")
    if selection.seed is not None:
        options.append(f"--hypothesis-seed {shlex.quote(str(selection.seed))}")
    if selection.shrink_seconds == 0:
        options.append("--canary-no-shrink")
    for group in sorted(selection.allow_missing):
        options.append(f"--canary-allow-missing {group}")
    if selection.level != levels.FULL or os.environ.get("CANARY_LEVEL"):
        options.append(f"--canary-level {selection.level}")
    return " ".join(options)


def _version(module: types.ModuleType) -> str:
    """The module's ``__version__``, else its distribution's version, else says there is none."""
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    top = module.__name__.split(".")[0]
    package_version = getattr(sys.modules.get(top), "__version__", None)
    if top != module.__name__ and package_version:
        return f"no __version__ (package {top} {package_version})"
    try:
        return f"no __version__ (distribution {importlib.metadata.version(top)})"
    except importlib.metadata.PackageNotFoundError:
        return "no __version__"


def describe_environment(selection: Selection) -> dict:
    """The facts the report header and the JSON report print about this run."""
    import numpy
    import torch

    facts = {
        "implementation": selection.module_name,
        "implementation_file": getattr(selection.module, "__file__", None),
        "implementation_version": _version(selection.module),
        "write_verify": selection.write_verify,
        "plan": selection.plan,
        "level": selection.level,
        "device": str(selection.device),
        "gpu": None,
        "hypothesis_profile": selection.profile,
        "memory_bounds": memory_bounds(selection.device, uses_triton=selection.uses_triton),
        "allow_missing": sorted(selection.allow_missing),
        "shrink_seconds": selection.shrink_seconds,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "hypothesis": importlib.metadata.version("hypothesis"),
        "environment": {
            key: value for key, value in sorted(os.environ.items()) if key.startswith(ENV_PREFIXES)
        },
    }
    try:
        facts["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        facts["triton"] = None
    if selection.device.type == "cuda":
        index = selection.device.index or 0
        facts["gpu"] = torch.cuda.get_device_name(index)
        facts["gpu_capability"] = ".".join(map(str, torch.cuda.get_device_capability(index)))
    if "CI" in os.environ:
        facts["environment"]["CI"] = os.environ["CI"]
    return facts


def memory_bounds(device: torch.device, *, uses_triton: bool = True) -> str:
    """Whether this run checks that launches stay inside their buffers, and how."""
    if device.type != "cpu":
        return "not checked: launches are compiled (run the suite under compute-sanitizer)"
    if not uses_triton:
        return (
            "not watched: the implementation imports no Triton, so none of its launches is "
            "interpreted (the watch sees interpreted launches only)"
        )
    from . import bounds

    reason = bounds.unavailable_reason()
    if reason is not None:
        return f"not checked: {reason}"
    return "checked: every access of an interpreted launch"


def pytest_report_header(config: pytest.Config) -> list[str]:
    selection = _selection(config)
    if selection is None:
        return []
    facts = describe_environment(selection)
    lines = [
        f"canary implementation: {facts['implementation']}, "
        f"{facts['implementation_version']}, file {facts['implementation_file']}",
        f"canary level: {facts['level']} ({LEVEL_WORDS[facts['level']]})",
        f"canary device: {facts['device']}"
        + (f" ({facts['gpu']}, sm {facts['gpu_capability']})" if facts["gpu"] else ""),
        f"canary versions: torch {facts['torch']}, triton {facts['triton']}, numpy "
        f"{facts['numpy']}, hypothesis {facts['hypothesis']}, python {facts['python']}",
        f"canary hypothesis profile: {facts['hypothesis_profile']} ("
        + (
            f"shrinking bounded to {facts['shrink_seconds']} s per property"
            if facts["shrink_seconds"]
            else "no shrinking: first failing examples as found"
        )
        + ")",
    ]
    lines.append(f"canary memory bounds: {facts['memory_bounds']}")
    for group in group_skip_reasons(selection):
        allowed = group in selection.allow_missing
        lines.append(
            f"canary {GROUPS[group][0].removeprefix('the ')}: absent from the module; its tests "
            + (
                "are skipped (allowed: --canary-allow-missing)"
                if allowed
                else f"are skipped, and the run cannot pass (exit 7) without "
                f"--canary-allow-missing {group}"
            )
        )
    env = facts["environment"]
    lines.append(
        "canary environment: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none set)")
    )
    return lines


#: Conformance modules in the order they run: the quick, exact checks first (stored vectors,
#: construction rules, launch refusals take seconds), so that a broken implementation shows
#: its first failure early; the Hypothesis properties of fingerprint and write/verify follow.
MODULE_ORDER = (
    "test_spec_vectors.py",
    "test_source_validation.py",
    "test_golden.py",
    "test_launch_refusals.py",
    "test_argument_kinds.py",
    "test_buffers.py",
    "test_plan_refusals.py",
    "test_golden_plan.py",
    "test_fingerprint.py",
    "test_write_verify.py",
    "test_scatter.py",
    "test_plan.py",
    "test_engine.py",
)


def _module_rank(item: pytest.Item) -> int:
    if not in_suite(item):
        return -1  # not ours: keep its place before the conformance modules
    name = item.path.name
    return MODULE_ORDER.index(name) if name in MODULE_ORDER else len(MODULE_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("canary_suite_only", default=False):
        outside = [item.nodeid for item in items if not in_suite(item)]
        if outside:  # the suite's command runs the suite: never another test, never green
            raise pytest.UsageError(
                f"{len(outside)} collected tests are not the suite's ({', '.join(outside[:3])}"
                f"{', ...' if len(outside) > 3 else ''}); the command runs the suite's tests only"
            )
    selection = _selection(config)
    if selection is None:
        return
    items.sort(key=_module_rank)  # stable: tests keep their order inside a module
    _select_level(config, selection, items)
    for group, reason in group_skip_reasons(selection).items():
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if group in item.keywords:
                item.add_marker(skip)
    if selection.device.type != "cuda":
        skip_gpu = pytest.mark.skip(reason=gpu_skip_reason(selection))
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


def _select_level(config: pytest.Config, selection: Selection, items: list[pytest.Item]) -> None:
    """Every test of the suite declares its level; a core run deselects the full ones."""
    undeclared, left_out = [], []
    for item in items:
        if not in_suite(item):
            continue
        try:
            level = item_level(item)
        except levels.UndeclaredLevel as error:
            undeclared.append(str(error))
            continue
        item.user_properties.append(("canary_level", level))
        if not levels.runs_at(selection.level, level):
            left_out.append(item)
    if undeclared:
        raise pytest.UsageError("\n".join(sorted(set(undeclared))))
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        dropped = set(left_out)
        items[:] = [item for item in items if item not in dropped]
    config._canary_level_left_out = [item.nodeid for item in left_out]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, config: pytest.Config):
    """The causes of the failures, each once, before pytest's paragraph of every failure."""
    recorder = config.pluginmanager.get_plugin("canary-report")
    if recorder is not None:
        recorder.write_causes(terminalreporter)
    yield


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> types.ModuleType:
    """The implementation under test; on the CPU its launchers are watched for accesses
    outside their buffers (``conformance.bounds``)."""
    selection = _selection(pytestconfig)
    if selection.device.type == "cpu":
        from . import bounds

        return bounds.checked_module(selection.module)
    return selection.module


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config):
    """The torch device the suite puts tensors on."""
    return _selection(pytestconfig).device


@pytest.fixture(scope="session")
def rerun_options(pytestconfig: pytest.Config) -> str:
    """The pytest options that rerun a test on this run's implementation, device and profile."""
    return rerun_options_of(_selection(pytestconfig))


@pytest.fixture(scope="session")
def impl_name(pytestconfig: pytest.Config) -> str:
    return _selection(pytestconfig).module_name
