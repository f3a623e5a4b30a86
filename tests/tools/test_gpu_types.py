"""One table of GPU types: tox's GPU legs and compile legs, and the hardware check, use it."""

from __future__ import annotations

import configparser
import itertools
import re
import sys
from pathlib import Path

import pytest

from tools import gpu_types
from tools.gpu_types import GPU_TYPES, compile_targets

ROOT = Path(__file__).resolve().parents[2]


def tox_envs() -> dict[str, str]:
    """Every env tox.ini defines (factor lists expanded) -> the labels it carries."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    envs = {}
    for section in parser.sections():
        if not section.startswith("testenv:"):
            continue
        name = section.removeprefix("testenv:")
        parts = re.split(r"(\{[^}]*\})", name)
        choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
        for combination in itertools.product(*choices):
            envs["".join(c.strip() for c in combination)] = parser[section].get("labels", "")
    return envs


def test_gpu_legs_are_the_gpu_types():
    """tox has one GPU leg per GPU type of the table, labelled gpu, and no other."""
    envs = tox_envs()
    legs = {name for name in envs if name.startswith(("cuda-", "rocm-"))}
    assert legs == {gpu.leg for gpu in GPU_TYPES}
    assert all("gpu" in envs[leg] for leg in legs)


def test_compile_legs_are_the_targets():
    """tox has one compile leg per distinct compile target, labelled compile, and no other."""
    envs = tox_envs()
    legs = {name.removeprefix("compile-") for name in envs if name.startswith("compile-")}
    assert legs == set(compile_targets())
    assert set(compile_targets()) == {"sm80", "sm90", "sm100", "gfx942", "gfx950"}
    assert all("compile" in envs[f"compile-{leg}"] for leg in legs)


def test_hardware_check_knows_every_gpu_type():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import check_gpu_type
    finally:
        sys.path.pop(0)
    for gpu in GPU_TYPES:
        assert check_gpu_type.parse_label(gpu.leg) == (gpu.vendor, gpu.label)


# Each GPU type as the table must spell it: (label, leg, Triton target, compile leg, warp size).
EXPECTED = [
    ("a100", "cuda-a100", "cuda:80", "sm80", 32),
    ("h100", "cuda-h100", "cuda:90", "sm90", 32),
    ("h200", "cuda-h200", "cuda:90", "sm90", 32),
    ("b200", "cuda-b200", "cuda:100", "sm100", 32),
    ("mi300", "rocm-mi300", "hip:gfx942", "gfx942", 64),
    ("mi355", "rocm-mi355", "hip:gfx950", "gfx950", 64),
]


def test_every_gpu_type_names_its_targets():
    """Legs, Triton targets, compile legs and warp sizes, type by type, found by label."""
    got = [
        (g.label, g.leg, g.target_name, g.compile_leg, g.warp_size)
        for g in (gpu_types.by_label(label) for label, *_ in EXPECTED)
    ]
    assert got == EXPECTED
    assert [g.label for g in gpu_types.GPU_TYPES] == [label for label, *_ in EXPECTED]
    with pytest.raises(KeyError):
        gpu_types.by_label("h20")
    # a label built at run time (as from a command line) is found by value
    assert gpu_types.by_label("".join(["h", "200"])) is gpu_types.by_label("h200")


def test_gpu_types_are_frozen():
    with pytest.raises(AttributeError):
        gpu_types.GPU_TYPES[0].arch = 0
