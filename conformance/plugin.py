"""pytest plugin of the conformance suite (registered through the ``pytest11`` entry point).

It chooses the implementation under test (``--canary-impl`` / ``CANARY_IMPL``, default
``canary``) and the device (``--canary-device`` / ``CANARY_DEVICE``, default ``cuda`` when
available, else ``cpu``), picks the Hypothesis profile, prints what was chosen in the report
header, and hands the module and device to the tests as the ``impl`` and ``device`` fixtures.
The suite reaches the implementation only through these names, never its internals.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import types

import pytest

from . import profiles
from .report import Recorder

CORE_NAMES = ("RealKvSource", "RealKvHashMode", "CanaryLaunchTag", "fingerprint")
WRITE_VERIFY_NAMES = (
    "VerifyOrWriteContext",
    "VerifyPlan",
    "WritePlan",
    "launch_canary_write_kernel",
    "launch_canary_verify_kernel",
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
        "--canary-report",
        default=None,
        metavar="PATH",
        help="write a JSON conformance report to PATH",
    )


def _load(module_name: str) -> types.ModuleType:
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise pytest.UsageError(
            f"--canary-impl {module_name!r}: cannot import it ({error})"
        ) from error
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
    return module


def _device(config: pytest.Config):
    import torch

    name = config.getoption("--canary-device") or os.environ.get("CANARY_DEVICE")
    if not name:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
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
    return device


def _selection(config: pytest.Config) -> Selection | None:
    return getattr(config, "_canary_selection", None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "write_verify: needs the write/verify group of the API")
    config.addinivalue_line("markers", "gpu: needs a GPU device (skipped on the CPU leg)")
    module_name = config.getoption("--canary-impl") or os.environ.get("CANARY_IMPL") or "canary"
    device = _device(config)
    module = _load(module_name)
    profile = config.getoption("--hypothesis-profile", default=None) or os.environ.get(
        "HYPOTHESIS_PROFILE"
    )
    if not profile:
        profile = "ci" if os.environ.get("CI") else "dev"
    profiles.ON_CPU = device.type == "cpu"
    loaded = profiles.select(profile, on_cpu=profiles.ON_CPU)
    selection = Selection(
        module=module,
        module_name=module_name,
        device=device,
        profile=loaded,
        write_verify=all(hasattr(module, name) for name in WRITE_VERIFY_NAMES),
    )
    config._canary_selection = selection
    config.pluginmanager.register(
        Recorder(
            config, config.getoption("--canary-report"), lambda: describe_environment(selection)
        ),
        "canary-report",
    )


def _version(module: types.ModuleType) -> str:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        return importlib.metadata.version(module.__name__.split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def describe_environment(selection: Selection) -> dict:
    """The facts the report header and the JSON report print about this run."""
    import numpy
    import torch

    facts = {
        "implementation": selection.module_name,
        "implementation_file": getattr(selection.module, "__file__", None),
        "implementation_version": _version(selection.module),
        "write_verify": selection.write_verify,
        "device": str(selection.device),
        "gpu": None,
        "hypothesis_profile": selection.profile,
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


def pytest_report_header(config: pytest.Config) -> list[str]:
    selection = _selection(config)
    if selection is None:
        return []
    facts = describe_environment(selection)
    lines = [
        f"canary implementation: {facts['implementation']} {facts['implementation_version']} "
        f"({facts['implementation_file']})",
        f"canary device: {facts['device']}"
        + (f" ({facts['gpu']}, sm {facts['gpu_capability']})" if facts["gpu"] else ""),
        f"canary versions: torch {facts['torch']}, triton {facts['triton']}, numpy "
        f"{facts['numpy']}, hypothesis {facts['hypothesis']}, python {facts['python']}",
        f"canary hypothesis profile: {facts['hypothesis_profile']}",
    ]
    if not selection.write_verify:
        lines.append("canary write/verify group: absent from the module; those tests are skipped")
    env = facts["environment"]
    lines.append(
        "canary environment: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none set)")
    )
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selection = _selection(config)
    if selection is None:
        return
    if not selection.write_verify:
        skip = pytest.mark.skip(
            reason=f"{selection.module_name} does not provide the write/verify group "
            f"({', '.join(WRITE_VERIFY_NAMES)})"
        )
        for item in items:
            if "write_verify" in item.keywords:
                item.add_marker(skip)
    if selection.device.type != "cuda":
        skip_gpu = pytest.mark.skip(reason=f"needs a GPU; this run's device is {selection.device}")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> types.ModuleType:
    """The implementation under test."""
    return _selection(pytestconfig).module


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config):
    """The torch device the suite puts tensors on."""
    return _selection(pytestconfig).device


@pytest.fixture(scope="session")
def impl_name(pytestconfig: pytest.Config) -> str:
    return _selection(pytestconfig).module_name
