"""canary.compile_check: it finds every variant, compiles each for a GPU target without a GPU,
and fails when a kernel cannot be compiled."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton.runtime import driver

from canary import _runtime, compile_check
from canary.gpu_types import compile_targets

ROOT = Path(__file__).resolve().parents[1]


def constexprs(launch) -> dict:
    return {key: value for key, value in launch.kwargs.items() if key.isupper()}


def test_variants_cover_every_constexpr_combination():
    """Every NUM_SOURCES, mode, token flag, input assert and hash kind a launcher can select."""
    seen: dict[str, set] = {}
    for launch in compile_check.variants():
        seen.setdefault(launch.name, set()).add(tuple(sorted(constexprs(launch).items())))
    assert {dict(c)["NUM_SOURCES"] for c in seen["fingerprint_kernel"]} == {1, 2, 3, 4}
    assert {(dict(c)["NUM_SOURCES"], dict(c)["CHECK_TOKEN"]) for c in seen["verify_kernel"]} == {
        (n, flag) for n in range(5) for flag in (False, True)
    }
    assert {dict(c)["INPUT_ASSERT"] for c in seen["write_kernel"]} == {False, True}
    assert {dict(c)["MIX3"] for c in seen["hash_kernel"]} == {False, True}


def test_variants_include_int32_token_arrays_and_an_8_byte_aligned_buffer():
    """Specialisations a launch derives from its tensors (dtype, 16-byte alignment) are covered."""
    texts = [compile_check._spec_text(launch) for launch in compile_check.variants()]
    write = [text for text in texts if "INPUT_ASSERT" in text]
    assert any("int32,int32,int32" in text for text in write)
    assert any("unaligned" in text for text in texts if "CHECK_TOKEN" in text)
    assert any("unaligned" in text for text in write)


@pytest.mark.parametrize("text", ["cuda:90", "sm90", "compile-sm90", "h200", "cuda-h200", "H100"])
def test_target_names(text):
    """A target is named by its compiler name, its compile leg or a GPU type."""
    assert compile_check.parse_target(text).compile_leg == "sm90"


def test_unknown_target_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown target 'sm75'.*cuda:90 \(sm90\)"):
        compile_check.parse_target("sm75")


def test_local_target_without_a_gpu_is_a_clear_error():
    """``--target local`` names this machine's GPU; without one it says so."""
    if torch.cuda.is_available():
        assert compile_check.parse_target("local").label == "local"
    else:
        with pytest.raises(ValueError, match="no local GPU target"):
            compile_check.parse_target("local")


def test_the_inactive_driver_is_put_back():
    """Whatever driver was active before a compile is active after it, even none."""
    before = getattr(driver, "_active", None)
    result = compile_check.check_target(compile_targets()["sm90"], compile_check.variants()[:1])
    assert result[0].error is None, result[0].error
    assert getattr(driver, "_active", None) is before


def run_check(*args: str, mutant: str | None = None) -> subprocess.CompletedProcess:
    prelude = f"import {mutant}; " if mutant else ""
    script = f"{prelude}import sys; from canary import compile_check; sys.exit(compile_check.main({list(args)!r}))"
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_check_passes_and_prints_a_line_per_variant():
    done = run_check("--target", "sm90", "--kernel", "hash_kernel")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert (
        sum(bool(re.match(r"sm90 +hash_kernel +ok +regs +\d+ +spills +0 ", x)) for x in lines) == 2
    )
    assert "cuda:90 (sm90): 2 of 2 variants compiled" in done.stdout


@pytest.mark.parametrize("target", ["sm90", "gfx942"])
def test_check_fails_when_the_binding_loses_constexpr(target):
    """With the annotation bug put back, the check fails and says why (the CPU suite passes)."""
    done = run_check("--target", target, mutant="known_bad.compile_constexpr_lost")
    assert done.returncode != 0
    assert "arange's arguments must be of type tl.constexpr" in done.stdout
    failed = re.search(r"(\d+) of (\d+) variants compiled .*; (\d+) FAILED", done.stdout)
    assert failed, done.stdout[-2000:]
    # every variant of the kernels that take a block size fails (write_kernel has none)
    assert int(failed.group(3)) >= 4 + 10 * 2 + 2


def test_a_launch_specialisation_names_integer_widths_and_pointer_alignment():
    """Two launches compile to one kernel exactly when their specialisation text is equal:
    integers are i32 inside [-2**31, 2**31) and i64 outside it, a bool is i1, a tensor is its
    dtype, marked when its address is not 16-byte aligned; constexprs come first, sorted."""
    aligned = torch.zeros(4, dtype=torch.int64)
    unaligned = torch.zeros(8, dtype=torch.int32)[1:]
    edges = (0, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, True, False)
    launch = _runtime.Launch("k", (1,), (aligned, unaligned, *edges), {"B": 128, "A": False})
    assert compile_check._spec_text(launch) == (
        "A=False B=128 | int64,int32/unaligned,i32,i32,i64,i32,i64,i1,i1"
    )


def test_the_variants_are_34_distinct_builds():
    """The matrix the check compiles: 4 fingerprint builds (1-4 sources), 20 verify builds (0-4
    sources x token check x a 16- or 8-byte aligned canary buffer), 8 write builds (input
    assert x int64/int32 token arrays x buffer alignment) and 2 hash builds; each one distinct.
    A change of these numbers changes what every GPU target is checked on: make it on purpose."""
    launches = compile_check.variants()
    keys = [(launch.name, compile_check._spec_text(launch)) for launch in launches]
    assert len(set(keys)) == len(keys)
    counts: dict[str, int] = {}
    for name, _ in keys:
        counts[name] = counts.get(name, 0) + 1
    assert counts == {
        "fingerprint_kernel": 4,
        "verify_kernel": 20,
        "write_kernel": 8,
        "hash_kernel": 2,
    }
