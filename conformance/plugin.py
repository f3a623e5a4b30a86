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

import importlib
import importlib.metadata
import os
import platform
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from . import levels, profiles
from .report import Recorder, in_suite

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


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or Path(spec).is_dir()


def import_target(spec: str) -> tuple[str, str | None]:
    """What ``--canary-impl spec`` imports: (dotted module name, folder to put on sys.path).

    ``spec`` is a dotted name (``my_engine.kv_canary``: imported as is, the folder is None), a
    ``.py`` file (``path/to/mykv.py``: module ``mykv`` from ``path/to``) or a package directory
    (``path/to/mykv``, holding ``__init__.py``: package ``mykv`` from ``path/to``).
    """
    if not _looks_like_path(spec):
        return spec, None
    path = Path(spec).expanduser().resolve()
    if path.is_file() and path.suffix == ".py":
        return path.stem, str(path.parent)
    if path.is_dir() and (path / "__init__.py").is_file():
        return path.name, str(path.parent)
    if path.is_dir():
        raise pytest.UsageError(
            f"--canary-impl {spec!r}: a directory must be a package (hold an __init__.py)"
        )
    raise pytest.UsageError(
        f"--canary-impl {spec!r}: no such .py file or package directory; give a dotted module "
        "name (importable from sys.path), a path to a .py file or a path to a package directory"
    )


def _load(spec: str) -> tuple[types.ModuleType, str, str | None]:
    """Import the implementation named by ``spec``: (module, its dotted name, its folder)."""
    module_name, folder = import_target(spec)
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
            f"--canary-impl {spec!r}: cannot import {module_name!r} ({error}){hint}"
        ) from error
    if folder is not None:
        found = Path(getattr(module, "__file__", "") or "").resolve()
        wanted = Path(spec).expanduser().resolve()
        if found != wanted and found.parent != wanted:
            raise pytest.UsageError(
                f"--canary-impl {spec!r}: the name {module_name!r} is already taken by "
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

    name = device_name(config.getoption("--canary-device"))
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise pytest.UsageError(f"--canary-device {name!r}: {error}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(f"--canary-device {name!r}: torch sees no CUDA/ROCm device")
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


def _selection(config: pytest.Config) -> Selection | None:
    return getattr(config, "_canary_selection", None)


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
    spec = config.getoption("--canary-impl") or os.environ.get("CANARY_IMPL") or "canary"
    device = _device(config)
    module, module_name, folder = _load(spec)
    from . import support

    support.IMPL_FOLDER = folder
    profile = config.getoption("--hypothesis-profile", default=None) or os.environ.get(
        "HYPOTHESIS_PROFILE"
    )
    if not profile:
        profile = "ci" if os.environ.get("CI") else "dev"
    profiles.ON_CPU = device.type == "cpu"
    no_shrink = bool(config.getoption("canary_no_shrink", default=False))
    loaded = profiles.select(profile, on_cpu=profiles.ON_CPU, shrink=not no_shrink)
    selection = Selection(
        level=_level(config),
        module=module,
        module_name=module_name,
        module_folder=folder,
        impl_arg=spec,
        device=device,
        profile=loaded,
        shrink_seconds=0 if no_shrink else profiles.shrink_seconds(loaded),
        write_verify=all(hasattr(module, name) for name in WRITE_VERIFY_NAMES),
        plan=all(hasattr(module, name) for name in PLAN_NAMES + WRITE_VERIFY_NAMES),
    )
    config._canary_selection = selection
    config.pluginmanager.register(
        Recorder(
            config,
            config.getoption("--canary-report"),
            lambda: describe_environment(selection),
            rerun_options=rerun_options_of(selection),
        ),
        "canary-report",
    )


def _level(config: pytest.Config) -> str:
    """The conformance level of this run: ``--canary-level``, else ``$CANARY_LEVEL``, else full."""
    given = config.getoption("--canary-level", default=None)
    if given:
        return given
    level = os.environ.get("CANARY_LEVEL") or levels.FULL
    if level not in levels.LEVELS_ORDER:
        raise pytest.UsageError(
            f"CANARY_LEVEL={level!r}: the levels are {', '.join(levels.LEVELS_ORDER)}"
        )
    return level


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
    """The options that rerun one test of this run on the same implementation and device."""
    import shlex

    options = (
        f"--canary-impl {shlex.quote(selection.impl_arg)} "
        f"--canary-device {shlex.quote(str(selection.device))} "
        f"--hypothesis-profile {selection.profile.removesuffix('-no-shrink').removesuffix('-cpu')}"
    )
    if selection.shrink_seconds == 0:
        options += " --canary-no-shrink"
    if selection.level != levels.FULL:
        options += f" --canary-level {selection.level}"
    return options


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
        "memory_bounds": memory_bounds(selection.device),
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


def memory_bounds(device: torch.device) -> str:
    """Whether this run checks that launches stay inside their buffers, and how."""
    if device.type != "cpu":
        return "not checked: launches are compiled (run the suite under compute-sanitizer)"
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
    if not selection.write_verify:
        lines.append("canary write/verify group: absent from the module; those tests are skipped")
    if not selection.plan:
        lines.append("canary plan group: absent from the module; those tests are skipped")
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
    "test_plans.py",
    "test_plan_refusals.py",
    "test_fingerprint.py",
    "test_write_verify.py",
    "test_scatter.py",
    "test_plan_kernels.py",
)


def _module_rank(item: pytest.Item) -> int:
    if not in_suite(item):
        return -1  # not ours: keep its place before the conformance modules
    name = item.path.name
    return MODULE_ORDER.index(name) if name in MODULE_ORDER else len(MODULE_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selection = _selection(config)
    if selection is None:
        return
    items.sort(key=_module_rank)  # stable: tests keep their order inside a module
    _select_level(config, selection, items)
    if not selection.write_verify:
        skip = pytest.mark.skip(
            reason=f"{selection.module_name} does not provide the write/verify group "
            f"({', '.join(WRITE_VERIFY_NAMES)})"
        )
        for item in items:
            if "write_verify" in item.keywords:
                item.add_marker(skip)
    if not selection.plan:
        lacks = PLAN_NAMES if selection.write_verify else PLAN_NAMES + WRITE_VERIFY_NAMES
        skip_plan = pytest.mark.skip(
            reason=f"{selection.module_name} does not provide the plan group ({', '.join(lacks)})"
        )
        for item in items:
            if "plan" in item.keywords:
                item.add_marker(skip_plan)
    if selection.device.type != "cuda":
        skip_gpu = pytest.mark.skip(reason=f"needs a GPU; this run's device is {selection.device}")
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
