"""The GPU types the project ships on: one table for the GPU legs, the compile legs and the
hardware check.

Each GPU type names its vendor, the words that identify it in a device name, and the
compiler target its kernels are built for. Several GPU types can share a target (H100 and
H200 are both sm_90); the compile legs are the distinct targets, in table order. ``tox.ini``
spells the same names (``cuda-h200``, ``compile-sm90``), and ``.github/workflows/gpu.yml`` has
one job per GPU type on that type's runner labels; ``tests/tools/test_gpu_types.py`` and
``tests/tools/test_workflows.py`` check that they do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuType:
    """One GPU type of the matrix."""

    label: str  # e.g. "h200": the tox GPU leg is f"{vendor}-{label}"
    vendor: str  # "cuda" (NVIDIA) or "rocm" (AMD)
    aliases: tuple[str, ...]  # words that name it in a device name or its gfx arch
    arch: int | str  # compute capability as an int (90) or the gfx name ("gfx942")
    warp_size: int  # 32 on NVIDIA; 64 on AMD's CDNA GPUs

    @property
    def leg(self) -> str:
        """The tox env of this GPU type's conformance leg, e.g. ``cuda-h200``."""
        return f"{self.vendor}-{self.label}"

    @property
    def runner_labels(self) -> tuple[str, ...]:
        """The ``runs-on`` labels of the self-hosted GitHub Actions runner that its job of
        ``.github/workflows/gpu.yml`` needs, e.g. ``("self-hosted", "linux", "x64", "gpu-h200")``."""
        return ("self-hosted", "linux", "x64", f"gpu-{self.label}")

    @property
    def backend(self) -> str:
        """Triton's backend name: ``cuda`` or ``hip``."""
        return "cuda" if self.vendor == "cuda" else "hip"

    @property
    def target_name(self) -> str:
        """The compile target, e.g. ``cuda:90`` or ``hip:gfx942``."""
        return f"{self.backend}:{self.arch}"

    @property
    def compile_leg(self) -> str:
        """The compile leg's factor, e.g. ``sm90`` or ``gfx942``."""
        return f"sm{self.arch}" if self.vendor == "cuda" else str(self.arch)


# fmt: off
GPU_TYPES: tuple[GpuType, ...] = (
    GpuType("a100", "cuda", ("a100",), 80, 32),
    GpuType("h100", "cuda", ("h100",), 90, 32),
    GpuType("h200", "cuda", ("h200",), 90, 32),
    GpuType("b200", "cuda", ("b200",), 100, 32),
    GpuType("mi300", "rocm", ("mi300", "gfx942"), "gfx942", 64),
    GpuType("mi355", "rocm", ("mi355", "gfx950"), "gfx950", 64),
)
# fmt: on

VENDORS = ("cuda", "rocm")


def by_label(label: str) -> GpuType:
    """The GPU type called ``label`` (``h200``); ``KeyError`` if there is none."""
    for gpu in GPU_TYPES:
        if gpu.label == label:
            return gpu
    raise KeyError(label)


def compile_targets() -> dict[str, GpuType]:
    """Compile leg factor -> a GPU type of that target, one per distinct target, table order."""
    targets: dict[str, GpuType] = {}
    for gpu in GPU_TYPES:
        targets.setdefault(gpu.compile_leg, gpu)
    return targets


__all__ = ["GPU_TYPES", "VENDORS", "GpuType", "by_label", "compile_targets"]
