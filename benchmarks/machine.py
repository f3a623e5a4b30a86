"""What machine a benchmark run measured, and where its results are kept.

Timings of different GPU types are never comparable, so every run is labelled with a
``gpu_type`` slug (``nvidia-h200``, ``amd-instinct-mi300x``, ``cpu``), stored under
``.benchmarks/<gpu_type>`` unless the user names a storage, and refused when compared
against a run of another type.

torch is imported only inside the functions that need it, so the pure helpers (slug,
storage choice, comparison check) are usable and testable without it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

CPU_GPU_TYPE = "cpu"
STORAGE_OPTION = "--benchmark-storage"
# pytest-benchmark's own default: a run that still has it was not given a storage.
DEFAULT_STORAGE = "file://./.benchmarks"
STORAGE_DIR = ".benchmarks"


def gpu_type_slug(device_name: str | None) -> str:
    """A file-name-safe label for a device name: ``"NVIDIA H200"`` -> ``"nvidia-h200"``.

    ``None`` or an empty name (no GPU) gives ``"cpu"``. Memory size and form factor stay in
    the slug (``nvidia-h100-80gb-hbm3`` vs ``nvidia-h100-pcie``): they change the bandwidth.
    """
    if not device_name or not device_name.strip():
        return CPU_GPU_TYPE
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.strip().lower()).strip("-")
    return slug or CPU_GPU_TYPE


def storage_given(args: Iterable[str]) -> bool:
    """Whether the command line (with its addopts) names a benchmark storage."""
    return any(arg == STORAGE_OPTION or arg.startswith(STORAGE_OPTION + "=") for arg in args)


def storage_uri(root: Path | str, gpu_type: str) -> str:
    """The per-GPU-type storage under ``root``: ``file://<root>/.benchmarks/<gpu_type>``."""
    return "file://" + str(Path(root).resolve() / STORAGE_DIR / gpu_type)


def choose_storage(current: str, args: Iterable[str], root: Path | str, gpu_type: str) -> str:
    """The storage a run uses: the user's if given, else the one of this GPU type."""
    if current != DEFAULT_STORAGE or storage_given(args):
        return current
    return storage_uri(root, gpu_type)


def command_line_args(config: pytest.Config) -> list[str]:
    """Everything that can carry ``--benchmark-storage``: arguments, ini addopts, PYTEST_ADDOPTS."""
    args = list(config.invocation_params.args)
    args += list(config.getini("addopts"))
    args += shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    return args


def check_comparable(machine_info: Mapping, compared_benchmark: Mapping, where: str = "") -> None:
    """Raise ``pytest.UsageError`` unless the compared run has this run's ``gpu_type``.

    A run saved without a ``gpu_type`` (by another conftest, or an older one) is refused too:
    what it measured cannot be told.
    """
    current = machine_info.get("gpu_type")
    saved = (compared_benchmark.get("machine_info") or {}).get("gpu_type")
    if saved == current and current is not None:
        return
    location = f" ({where})" if where else ""
    raise pytest.UsageError(
        f"--benchmark-compare: the compared run{location} was measured on gpu_type {saved!r}, "
        f"this run is on {current!r}. Timings of different GPU types are never compared; "
        f"compare against a run saved on the same GPU type (stored under "
        f"{STORAGE_DIR}/<gpu_type>), ideally in the same job."
    )


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(command: list[str]) -> str | None:
    """The standard output of ``command``, or ``None`` if it is absent or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def driver_version() -> str | None:
    """The GPU driver's version, from the vendor tool, else the CUDA driver API torch sees."""
    nvidia = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if nvidia and nvidia.strip():
        return nvidia.strip().splitlines()[0].strip()
    rocm = _run(["rocm-smi", "--showdriverversion"])
    found = re.search(r"Driver version:\s*(\S+)", rocm or "")
    if found:
        return found.group(1)
    import torch

    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is None or torch.version.cuda is None:
        return None
    try:
        version = int(get())
    except (RuntimeError, TypeError, ValueError):
        return None
    return f"CUDA driver API {version // 1000}.{version % 1000 // 10}"


def benchmark_device(config: pytest.Config | None = None):
    """The GPU the benchmarks run on, or ``None`` when the run has no GPU.

    The conformance suite's choice is honoured (``CANARY_DEVICE``, or ``--canary-device`` in a
    run that also loads the suite's plugin; a CPU device means no GPU benchmarks); otherwise
    the current CUDA/ROCm device, if any.
    It is read here rather than taken from the suite's plugin because the storage has to be
    chosen before that plugin has configured itself.
    """
    import torch

    name = config.getoption("--canary-device", default=None) if config is not None else None
    name = name or os.environ.get("CANARY_DEVICE")
    if name:
        try:
            device = torch.device(name)
        except RuntimeError as error:
            raise pytest.UsageError(f"--canary-device {name!r}: {error}") from error
        if device.type != "cuda":
            return None
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--canary-device {name!r}: torch sees no CUDA/ROCm device")
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.device("cuda", index)
    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


def gpu_facts(device) -> dict:
    """Name, compute capability, driver and runtime of ``device`` (a CUDA/ROCm device)."""
    import torch

    props = torch.cuda.get_device_properties(device)
    major, minor = torch.cuda.get_device_capability(device)
    facts = {
        "name": torch.cuda.get_device_name(device),
        "compute_capability": f"{major}.{minor}",
        "driver_version": driver_version(),
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "visible_devices": torch.cuda.device_count(),
        "cuda_runtime": torch.version.cuda,
        "hip_runtime": torch.version.hip,
    }
    arch = getattr(props, "gcnArchName", None)
    if arch:
        facts["arch"] = arch
    return facts


def machine_facts(device) -> dict:
    """The ``machine_info`` entries a run adds: GPU facts (or ``"cpu"``), versions, gpu_type."""
    import torch

    gpu = gpu_facts(device) if device is not None else CPU_GPU_TYPE
    return {
        "gpu_type": gpu_type_slug(gpu["name"]) if isinstance(gpu, dict) else CPU_GPU_TYPE,
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        "numpy": _package_version("numpy"),
    }
