"""Check that this machine has the GPU a tox leg is labelled for, before the leg runs.

    python tools/check_gpu_type.py h200          # or the tox env name: cuda-h200
    python tools/check_gpu_type.py rocm-mi300

Exit status 0 when every visible GPU matches the label and torch's build matches its
vendor (CUDA for cuda-*, ROCm for rocm-*); 1, with the reason, when there is no GPU or a
different one; 2 for a label this script does not know. A leg that ran on the wrong
hardware would store and compare its timings under the wrong name, so it must not run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# run as a script from anywhere: the project root (canary's table of GPU types) comes first
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from tools.gpu_types import GPU_TYPES, VENDORS

# label -> (vendor, names that identify it in torch.cuda.get_device_name or the gfx arch)
KNOWN = {gpu.label: (gpu.vendor, gpu.aliases) for gpu in GPU_TYPES}


def parse_label(label: str) -> tuple[str, str]:
    """``"h200"`` or ``"cuda-h200"`` -> ``("cuda", "h200")``; ``ValueError`` if unknown."""
    parts = label.strip().lower().split("-")
    model = parts[-1]
    if model not in KNOWN or len(parts) > 2 or (len(parts) == 2 and parts[0] not in VENDORS):
        known = ", ".join(f"{vendor}-{name}" for name, (vendor, _) in KNOWN.items())
        raise ValueError(f"unknown GPU label {label!r}; known: {known}")
    vendor = KNOWN[model][0]
    if len(parts) == 2 and parts[0] != vendor:
        raise ValueError(
            f"GPU label {label!r}: {model.upper()} is a {vendor} GPU; its leg is {vendor}-{model}"
        )
    return vendor, model


def name_matches(model: str, device_name: str) -> bool:
    """Whether ``device_name`` names a ``model`` GPU.

    The model must stand as its own token start and not continue with a digit: ``H100``
    matches ``NVIDIA H100 80GB HBM3`` but neither ``NVIDIA GH100`` nor ``RTX A1000``-style
    names; ``MI300`` matches ``AMD Instinct MI300X``.
    """
    lowered = device_name.lower()
    return any(
        re.search(rf"(?<![a-z0-9]){re.escape(alias)}(?![0-9])", lowered)
        for alias in KNOWN[model][1]
    )


def check(label: str) -> tuple[bool, str]:
    """``(ok, message)`` for this machine against ``label``."""
    vendor, model = parse_label(label)
    want = f"{model.upper()} ({vendor}-{model})"
    try:
        import torch
    except ImportError as error:
        return False, f"expected an {want} GPU, but torch cannot be imported: {error}"
    build = (
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"HIP {getattr(torch.version, 'hip', None)}"
    )
    if not torch.cuda.is_available():
        return False, (
            f"expected an {want} GPU, but torch sees no GPU ({build}). On a GPU machine, set "
            "CANARY_TORCH to the torch build of that machine."
        )
    is_rocm = getattr(torch.version, "hip", None) is not None
    if (vendor == "rocm") != is_rocm:
        return (
            False,
            f"expected an {want} GPU, but this torch is a {'ROCm' if is_rocm else 'CUDA'} build ({build})",
        )
    found = []
    for index in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(index)
        arch = getattr(torch.cuda.get_device_properties(index), "gcnArchName", "") or ""
        found.append((index, name, arch))
    wrong = [item for item in found if not name_matches(model, f"{item[1]} {item[2]}")]
    described = ", ".join(
        f"cuda:{index} {name!r}" + (f" [{arch}]" if arch else "") for index, name, arch in found
    )
    if wrong:
        return False, f"expected every GPU to be an {want}, found: {described}"
    return True, f"GPU check passed for {vendor}-{model}: {described} ({build})"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python tools/check_gpu_type.py LABEL", file=sys.stderr)
        return 2
    try:
        ok, message = check(argv[0])
    except ValueError as error:
        print(f"check_gpu_type: {error}", file=sys.stderr)
        return 2
    print(f"check_gpu_type: {message}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
