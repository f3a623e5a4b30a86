"""tools.compile_check: it finds every variant, compiles each for a GPU target without a GPU,
and fails when a kernel cannot be compiled."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from triton.runtime import driver

from canary import _runtime
from tools import compile_check
from tools.gpu_types import GpuType, compile_targets

ROOT = Path(__file__).resolve().parents[2]


def constexprs(launch) -> dict:
    return {key: value for key, value in launch.kwargs.items() if key.isupper()}


def test_variants_cover_every_constexpr_combination():
    """Every NUM_SOURCES, mode, token flag, input assert, hash kind, SWA table and expected-token
    pool a launcher can select."""
    seen: dict[str, set] = {}
    for launch in compile_check.variants():
        seen.setdefault(launch.name, set()).add(tuple(sorted(constexprs(launch).items())))
    assert {dict(c)["NUM_SOURCES"] for c in seen["fingerprint_kernel"]} == {1, 2, 3, 4}
    assert {(dict(c)["NUM_SOURCES"], dict(c)["CHECK_TOKEN"]) for c in seen["verify_kernel"]} == {
        (n, flag) for n in range(5) for flag in (False, True)
    }
    assert {dict(c)["INPUT_ASSERT"] for c in seen["write_kernel"]} == {False, True}
    assert {dict(c)["MIX3"] for c in seen["hash_kernel"]} == {False, True}
    assert {dict(c)["HAS_SWA"] for c in seen["plan_offsets_kernel"]} == {False, True}
    assert {(dict(c)["HAS_SWA"], dict(c)["HAS_POOL"]) for c in seen["plan_entries_kernel"]} == {
        (swa, pool) for swa in (False, True) for pool in (False, True)
    }
    assert len(seen["scatter_req_token_ids_kernel"]) == 1


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


def test_integers_far_outside_int32_are_i64():
    """Not only the edges: any integer above 2**31 or below -(2**31) is an i64."""
    edges = (2**40, -(2**40), 2**63 - 1, -(2**63))
    launch = _runtime.Launch("k", (1,), edges, {})
    assert compile_check._spec_text(launch) == " | i64,i64,i64,i64"


def test_the_variants_are_41_distinct_builds():
    """The matrix the check compiles: 4 fingerprint builds (1-4 sources), 20 verify builds (0-4
    sources x token check x a 16- or 8-byte aligned canary buffer), 8 write builds (input
    assert x int64/int32 token arrays x buffer alignment), 2 hash builds, 2 plan-offsets builds
    (with/without an SWA table), 4 plan-entries builds (SWA table x expected-token pool) and 1
    scatter build; each one distinct. A change of these numbers changes what every GPU target
    is checked on: make it on purpose."""
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
        "plan_offsets_kernel": 2,
        "plan_entries_kernel": 4,
        "scatter_req_token_ids_kernel": 1,
    }


# ----------------------------------------------------------------------------- units
# The tests below drive each part of the check with fakes (a fake cuobjdump, fake compiled
# kernels, a fake check_target), so they fail on a wrong line of the check without compiling.

SM90 = compile_targets()["sm90"]
GFX942 = compile_targets()["gfx942"]

CUOBJDUMP_OUTPUT = """\
Resource usage:
 Common:
  GLOBAL:0
 Function verify_kernel:
  REG:40 STACK:0 SHARED:0 LOCAL:{local} CONSTANT[0]:560 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def fake_cuobjdump(tmp_path: Path, cubin: bytes, output: str, status: int = 0) -> str:
    """A cuobjdump that prints ``output`` only when called as ``--dump-resource-usage FILE``
    with FILE holding ``cubin``; it logs its arguments to ``tmp_path / 'calls'``."""
    (tmp_path / "expected.cubin").write_bytes(cubin)
    (tmp_path / "output.txt").write_text(output)
    tool = tmp_path / "cuobjdump"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{tmp_path}/calls"\n'
        f'[ "$#" = 2 ] && [ "$1" = --dump-resource-usage ] && cmp -s "$2" "{tmp_path}/expected.cubin"'
        f' && cat "{tmp_path}/output.txt"\n'
        f"exit {status}\n"
    )
    tool.chmod(0o755)
    return str(tool)


def test_nvidia_resources_are_registers_and_local_bytes_of_the_given_cubin(tmp_path, monkeypatch):
    """Registers are cuobjdump's REG and spills its LOCAL (bytes per thread), read from the
    output for a file holding exactly the cubin's bytes; the tool is looked up as cuobjdump."""
    cubin = bytes(range(256)) * 3
    tool = fake_cuobjdump(tmp_path, cubin, CUOBJDUMP_OUTPUT.format(local=1296))
    asked = []
    monkeypatch.setattr(compile_check, "_nvidia_tool", lambda name: asked.append(name) or tool)
    assert compile_check._nvidia_resources(cubin) == (40, 1296)
    assert asked == ["cuobjdump"]
    assert (tmp_path / "calls").read_text().startswith("--dump-resource-usage ")
    assert (tmp_path / "calls").read_text().strip().endswith(".cubin")


def test_nvidia_resources_unknown_without_the_tool_or_its_fields(tmp_path, monkeypatch):
    """No cuobjdump: (None, None). A missing field is None, the other one still read. A tool
    that fails is not an error: what it printed (here nothing) is all there is."""
    monkeypatch.setattr(compile_check, "_nvidia_tool", lambda name: None)
    assert compile_check._nvidia_resources(b"\x7fELF") == (None, None)
    no_local = CUOBJDUMP_OUTPUT.format(local=0).replace("LOCAL:0 ", "")
    tool = fake_cuobjdump(tmp_path, b"\x7fELF", no_local)
    monkeypatch.setattr(compile_check, "_nvidia_tool", lambda name: tool)
    assert compile_check._nvidia_resources(b"\x7fELF") == (40, None)
    no_reg = CUOBJDUMP_OUTPUT.format(local=16).replace("REG:40 ", "")
    tool = fake_cuobjdump(tmp_path, b"\x7fELF", no_reg)
    assert compile_check._nvidia_resources(b"\x7fELF") == (None, 16)
    tool = fake_cuobjdump(tmp_path, b"\x7fELF", "", status=1)
    assert compile_check._nvidia_resources(b"\x7fELF") == (None, None)


AMD_METADATA = """\
    .sgpr_count:     24
    .sgpr_spill_count: {sgpr_spill}
    .symbol:         verify_kernel.kd
    .vgpr_count:     {vgpr}
    .vgpr_spill_count: {vgpr_spill}
    .wavefront_size: 64
"""


def test_amd_resources_are_vgprs_and_the_sum_of_vgpr_and_sgpr_spills():
    """From the AMDGCN kernel metadata: registers are ``.vgpr_count``, spills are
    ``.vgpr_spill_count + .sgpr_spill_count``; a missing count is None (spills: either)."""
    text = AMD_METADATA.format(vgpr=128, vgpr_spill=17, sgpr_spill=5)
    assert compile_check._amd_resources(text) == (128, 22)
    assert compile_check._amd_resources(text.replace(".sgpr_spill_count", ".x")) == (128, None)
    assert compile_check._amd_resources(text.replace(".vgpr_spill_count", ".x")) == (128, None)
    assert compile_check._amd_resources(text.replace(".vgpr_count", ".x")) == (None, 22)
    assert compile_check._amd_resources("") == (None, None)


def a_launch(name: str = "verify_kernel") -> _runtime.Launch:
    return _runtime.Launch(name, (2,), (torch.zeros(4, dtype=torch.int64), 7), {"NUM_SOURCES": 1})


class FakeClock:
    """``time`` for compile_check: perf_counter answers 2.0, then 7.5, then fails."""

    def __init__(self) -> None:
        self.times = [2.0, 7.5]

    def perf_counter(self) -> float:
        return self.times.pop(0)


class RaisingKernels:
    def __getattr__(self, name):
        raise RuntimeError(f"no binding for {name}\nsecond line")


class FakeJit:
    """A kernel binding's JITFunction: warmup records what it was given and the driver's
    target at that time, then raises ``error`` or returns ``compiled``."""

    def __init__(self, compiled=None, error: Exception | None = None) -> None:
        self.compiled, self.error, self.calls = compiled, error, []

    def warmup(self, *args, **kwargs):
        self.calls.append((args, kwargs, driver.active.get_current_target()))
        if self.error is not None:
            raise self.error
        return self.compiled


def test_compile_variant_reports_a_failure_with_its_type_message_and_time(monkeypatch):
    """A binding without the kernel, or a compile that raises: the result keeps the launch's
    kernel and specialisation, ``error`` is the exception's type and message, ``seconds`` the
    time taken, no resources; the driver active before is active again."""
    before = getattr(driver, "_active", None)
    monkeypatch.setattr(compile_check, "time", FakeClock())
    result = compile_check.compile_variant(RaisingKernels(), a_launch(), SM90)
    assert result == compile_check.Compiled(
        "verify_kernel",
        "NUM_SOURCES=1 | int64,i32",
        5.5,
        error="RuntimeError: no binding for verify_kernel\nsecond line",
    )
    monkeypatch.setattr(compile_check, "time", FakeClock())
    jit = FakeJit(error=ValueError("arange's arguments must be of type tl.constexpr"))
    kernels = types.SimpleNamespace(verify_kernel=jit)
    result = compile_check.compile_variant(kernels, a_launch(), GFX942)
    assert (result.error, result.seconds, result.asm) == (
        "ValueError: arange's arguments must be of type tl.constexpr",
        5.5,
        {},
    )
    assert getattr(driver, "_active", None) is before


def test_compile_variant_hands_the_launch_to_warmup_and_reads_the_binary(monkeypatch):
    """The launch's arguments, grid and keywords go to ``warmup`` as they are, with the
    inactive driver naming the target; an NVIDIA result keeps TTIR and PTX and reads the
    cubin's resources, an AMD one keeps TTIR and AMDGCN and reads its metadata; shared memory
    is the compiled kernel's ``metadata.shared`` (None without one)."""
    launch = a_launch()
    cuda = types.SimpleNamespace(
        metadata=types.SimpleNamespace(shared=3072),
        asm={"ttir": "tt", "ptx": "px", "cubin": b"\x7fELF-cubin", "ttgir": "g"},
    )
    got = []
    monkeypatch.setattr(
        compile_check, "_nvidia_resources", lambda cubin: got.append(cubin) or (77, 12)
    )
    monkeypatch.setattr(compile_check, "time", FakeClock())
    jit = FakeJit(cuda)
    result = compile_check.compile_variant(types.SimpleNamespace(verify_kernel=jit), launch, SM90)
    assert result == compile_check.Compiled(
        "verify_kernel", "NUM_SOURCES=1 | int64,i32", 5.5, 77, 12, 3072, {"ttir": "tt", "ptx": "px"}
    )
    assert got == [b"\x7fELF-cubin"]
    assert jit.calls == [
        (launch.args, {"grid": (2,), "NUM_SOURCES": 1}, compile_check.GPUTarget("cuda", 90, 32))
    ]
    amdgcn = AMD_METADATA.format(vgpr=96, vgpr_spill=30, sgpr_spill=4)
    hip = types.SimpleNamespace(
        metadata=types.SimpleNamespace(), asm={"ttir": "t", "amdgcn": amdgcn}
    )
    monkeypatch.setattr(compile_check, "time", FakeClock())
    jit = FakeJit(hip)
    result = compile_check.compile_variant(types.SimpleNamespace(verify_kernel=jit), launch, GFX942)
    assert result == compile_check.Compiled(
        "verify_kernel",
        "NUM_SOURCES=1 | int64,i32",
        5.5,
        96,
        34,
        None,
        {"ttir": "t", "amdgcn": amdgcn},
    )
    assert jit.calls[0][2] == compile_check.GPUTarget("hip", "gfx942", 64)
    assert got == [b"\x7fELF-cubin"]


@pytest.mark.parametrize("target, kind", [("sm90", "ptx"), ("gfx942", "amdgcn")])
def test_a_hash_kernel_compiles_for_real_with_its_resources(target, kind):
    """One real compile per vendor: TTIR and the target's assembly, an int register count,
    no spills, an int shared memory size."""
    launch = [x for x in compile_check.variants() if x.name == "hash_kernel"][:1]
    (result,) = compile_check.check_target(compile_targets()[target], launch)
    assert result.error is None, result.error
    assert sorted(result.asm) == sorted(["ttir", kind])
    assert "tt.func" in result.asm["ttir"]
    assert type(result.registers) is int and result.registers > 0
    assert result.spill_bytes == 0
    assert type(result.shared_bytes) is int
    assert 0 < result.seconds < 60


def test_the_inactive_driver_names_target_device_and_stream_and_nothing_else():
    """Device 0, stream 0, not active; it cannot load or launch anything."""
    target = compile_check.GPUTarget("hip", "gfx942", 64)
    inactive = compile_check.InactiveDriver(target)
    assert inactive.get_current_target() is target
    assert (inactive.get_current_device(), inactive.get_current_stream()) == (0, 0)
    assert inactive.get_current_stream(3) == 0
    assert inactive.is_active() is False
    assert not hasattr(inactive, "utils") and not hasattr(inactive, "launcher_cls")


@pytest.mark.parametrize(
    "target, expected",
    [
        (("cuda", 89, 32), GpuType("local", "cuda", (), 89, 32)),
        (("hip", "gfx90a", 64), GpuType("local", "rocm", (), "gfx90a", 64)),
    ],
)
def test_local_target_is_what_the_real_driver_reports(monkeypatch, target, expected):
    """``local`` is the current GPU's target: an NVIDIA one is vendor cuda, any other rocm."""
    active = types.SimpleNamespace(get_current_target=lambda: compile_check.GPUTarget(*target))
    monkeypatch.setattr(compile_check, "driver", types.SimpleNamespace(active=active))
    assert compile_check.parse_target("local") == expected


def test_local_target_compares_the_backend_name_by_value(monkeypatch):
    """A backend name made at run time (not the interned literal) is still NVIDIA's."""
    backend = "".join(["cu", "da"])
    active = types.SimpleNamespace(
        get_current_target=lambda: compile_check.GPUTarget(backend, 100, 32)
    )
    monkeypatch.setattr(compile_check, "driver", types.SimpleNamespace(active=active))
    assert compile_check.parse_target("local").vendor == "cuda"


# ----------------------------------------------------------------------------- report

REPORT_ITEMS = [
    compile_check.Compiled("verify_kernel", "NUM_SOURCES=0 | int64", 1.25, 40, 8, 1024),
    compile_check.Compiled("write_kernel", "INPUT_ASSERT=True | int32", 0.5),
    compile_check.Compiled(
        "fingerprint_kernel",
        "NUM_SOURCES=3 | uint8",
        0.25,
        255,
        999,
        error="\n".join(["one", "two", "three", "four", "x" * 201 + "y", "six", "seven", "end"]),
    ),
    compile_check.Compiled("verify_kernel", "NUM_SOURCES=1 | int64", 2.0, 128, None, 0),
]


def test_report_prints_a_line_per_variant_the_error_tail_and_a_summary():
    """One fixed-width line per variant; under a failed one the last 6 lines of its error,
    each cut to 200 characters; the summary counts the variants per kernel in order of first
    appearance and takes the most registers and spills of the compiled ones; it returns the
    number of failures."""
    out = io.StringIO()
    assert compile_check.report(SM90, REPORT_ITEMS, out=out) == 1
    assert out.getvalue().splitlines() == [
        "sm90    verify_kernel      ok     regs  40  spills   8  smem  1024   1.25s  "
        "NUM_SOURCES=0 | int64",
        "sm90    write_kernel       ok     regs   ?  spills   ?  smem     ?   0.50s  "
        "INPUT_ASSERT=True | int32",
        "sm90    fingerprint_kernel FAILED regs 255  spills 999  smem     ?   0.25s  "
        "NUM_SOURCES=3 | uint8",
        "          three",
        "          four",
        "          " + "x" * 200,
        "          six",
        "          seven",
        "          end",
        "sm90    verify_kernel      ok     regs 128  spills   ?  smem     0   2.00s  "
        "NUM_SOURCES=1 | int64",
        "cuda:90 (sm90): 3 of 4 variants compiled (verify_kernel 2, write_kernel 1, "
        "fingerprint_kernel 1); max registers 128, max spills 8, 4.0s; 1 FAILED",
    ]


def test_report_summary_without_failures_or_without_resources():
    """Without failures the summary has no FAILED part; 0 spills is a value; with no
    resources among the compiled variants (a failed one's do not count) they are '?'."""
    out = io.StringIO()
    ok = [compile_check.Compiled("hash_kernel", "MIX3=False | int64", 0.75, 11, 0, 0)]
    assert compile_check.report(GFX942, ok, out=out) == 0
    assert out.getvalue().splitlines()[-1] == (
        "hip:gfx942 (gfx942): 1 of 1 variants compiled (hash_kernel 1); "
        "max registers 11, max spills 0, 0.8s"
    )
    out = io.StringIO()
    unknown = [
        compile_check.Compiled("hash_kernel", "a", 0.5),
        compile_check.Compiled("hash_kernel", "b", 0.5, 50, 4, error="E: x"),
    ]
    assert compile_check.report(GFX942, unknown, out=out) == 1
    assert out.getvalue().splitlines()[-1] == (
        "hip:gfx942 (gfx942): 1 of 2 variants compiled (hash_kernel 2); "
        "max registers ?, max spills ?, 1.0s; 1 FAILED"
    )


# ----------------------------------------------------------------------------- write_asm


def test_write_asm_writes_each_assembly_and_an_index(tmp_path):
    """``<leg>-<NN>-<kernel>.<kind>`` per assembly text, and ``<leg>-variants.json``: each
    result's fields with ``asm`` mapping a kind to its file's name; the directory is made
    (with its parents), and another target's files can join it."""
    directory = tmp_path / "out" / "asm"
    results = [
        compile_check.Compiled("hash_kernel", "s", 0.5, 11, 0, 0, {"ttir": "T0", "ptx": "P0"})
    ]
    results += [
        compile_check.Compiled("write_kernel", f"s{n}", 0.25, error="E") for n in range(1, 10)
    ]
    results.append(compile_check.Compiled("verify_kernel", "v", 1.0, 7, None, 64, {"ttir": "T10"}))
    compile_check.write_asm(directory, SM90, results)
    compile_check.write_asm(directory, GFX942, results[-1:])
    assert sorted(path.name for path in directory.iterdir()) == [
        "gfx942-00-verify_kernel.ttir",
        "gfx942-variants.json",
        "sm90-00-hash_kernel.ptx",
        "sm90-00-hash_kernel.ttir",
        "sm90-10-verify_kernel.ttir",
        "sm90-variants.json",
    ]
    assert (directory / "sm90-00-hash_kernel.ptx").read_text() == "P0"
    assert (directory / "sm90-00-hash_kernel.ttir").read_text() == "T0"
    assert (directory / "sm90-10-verify_kernel.ttir").read_text() == "T10"
    index = json.loads((directory / "sm90-variants.json").read_text())
    assert len(index) == 11
    assert index[0] == {
        "kernel": "hash_kernel",
        "specialization": "s",
        "seconds": 0.5,
        "registers": 11,
        "spill_bytes": 0,
        "shared_bytes": 0,
        "asm": {"ttir": "sm90-00-hash_kernel.ttir", "ptx": "sm90-00-hash_kernel.ptx"},
        "error": None,
    }
    assert index[1]["asm"] == {} and index[1]["error"] == "E"
    assert index[10]["asm"] == {"ttir": "sm90-10-verify_kernel.ttir"}
    text = (directory / "gfx942-variants.json").read_text()
    assert text == json.dumps(
        [{**dataclasses.asdict(results[-1]), "asm": {"ttir": "gfx942-00-verify_kernel.ttir"}}],
        indent=1,
    )


# ----------------------------------------------------------------------------- main

FAKE_LAUNCHES = [
    _runtime.Launch(name, (1,), (), {}) for name in ("write_kernel", "hash_kernel") * 30
]


@pytest.fixture
def fake_checks(monkeypatch):
    """``main`` with 60 fake variants (30 write, 30 hash) and a fake ``check_target`` that
    compiles nothing: a variant fails when its kernel is in ``failing``; ``calls`` logs
    (compile leg, kernels given)."""
    state = types.SimpleNamespace(calls=[], failing=set())

    def check_target(gpu, launches):
        state.calls.append((gpu.compile_leg, [launch.name for launch in launches]))
        return [
            compile_check.Compiled(
                launch.name,
                "s",
                0.0,
                asm={"ttir": "T"},
                error="E" if launch.name in state.failing else None,
            )
            for launch in launches
        ]

    monkeypatch.setattr(compile_check, "variants", lambda: list(FAKE_LAUNCHES))
    monkeypatch.setattr(compile_check, "check_target", check_target)
    return state


def test_main_exit_status_is_the_failures_capped_at_100(fake_checks, capsys):
    """Every failed variant of every target counts, capped at 100; with more than one target
    a last line sums them up."""
    fake_checks.failing = {"write_kernel", "hash_kernel"}
    assert compile_check.main(["--target", "sm90", "--target", "gfx942"]) == 100
    assert capsys.readouterr().out.splitlines()[-1] == "all targets: 120 variant(s) failed"
    fake_checks.failing = {"hash_kernel"}
    assert compile_check.main(["--target", "sm90", "--target", "hip:gfx950"]) == 60
    assert capsys.readouterr().out.splitlines()[-1] == "all targets: 60 variant(s) failed"
    assert compile_check.main(["--target", "sm90"]) == 30
    assert "all targets" not in capsys.readouterr().out


def test_main_all_adds_every_target_once(fake_checks, capsys):
    """``--all`` checks every compile target after the named ones, none twice; all compiled
    is exit 0 and says so."""
    assert compile_check.main(["--target", "sm90", "--all", "--target", "gfx942"]) == 0
    assert [leg for leg, _ in fake_checks.calls] == ["sm90", "gfx942", "sm80", "sm100", "gfx950"]
    assert capsys.readouterr().out.splitlines()[-1] == "all targets compiled"
    fake_checks.calls.clear()
    assert compile_check.main(["--all"]) == 0
    assert [leg for leg, _ in fake_checks.calls] == list(compile_targets())
    # a GPU type names its compile target: h200 is sm90 (whose entry is h100), checked once
    for argv in (["--target", "h200", "--all"], ["--target", "h200", "--target", "cuda:90"]):
        fake_checks.calls.clear()
        assert compile_check.main(argv) == 0
        legs = [leg for leg, _ in fake_checks.calls]
        assert legs[0] == "sm90" and sorted(legs) == sorted(set(legs)), legs


def test_main_kernel_selects_variants(fake_checks, capsys):
    """``--kernel`` keeps that kernel's variants (repeatable); one without variants is a usage
    error, as is no target or an unknown one (naming the known targets)."""
    assert compile_check.main(["--target", "sm90", "--kernel", "hash_kernel"]) == 0
    assert fake_checks.calls == [("sm90", ["hash_kernel"] * 30)]
    fake_checks.calls.clear()
    assert (
        compile_check.main(
            ["--target", "sm90", "--kernel", "hash_kernel", "--kernel", "write_kernel"]
        )
        == 0
    )
    assert fake_checks.calls == [("sm90", [launch.name for launch in FAKE_LAUNCHES])]
    fake_checks.calls.clear()
    capsys.readouterr()
    for argv, message in [
        (["--target", "sm90", "--kernel", "nope"], "no variant of kernel(s) ['nope']"),
        ([], "name a --target or give --all"),
        (["--kernel", "hash_kernel"], "name a --target or give --all"),
        (
            ["--target", "sm75", "--all"],
            "unknown target 'sm75'; known targets: cuda:80 (sm80), cuda:90 (sm90), "
            "cuda:100 (sm100), hip:gfx942 (gfx942), hip:gfx950 (gfx950)",
        ),
    ]:
        with pytest.raises(SystemExit) as exit:
            compile_check.main(argv)
        assert exit.value.code == 2
        assert capsys.readouterr().err.strip().endswith(f"error: {message}")
    assert fake_checks.calls == []


def test_main_asm_dir_writes_every_target(fake_checks, tmp_path, capsys):
    """``--asm-dir`` writes each target's assembly files and index there."""
    fake_checks.failing = {"write_kernel"}
    directory = tmp_path / "asm"
    assert (
        compile_check.main(
            [
                "--target",
                "sm90",
                "--target",
                "gfx950",
                "--kernel",
                "hash_kernel",
                "--asm-dir",
                str(directory),
            ]
        )
        == 0
    )
    names = sorted(path.name for path in directory.iterdir())
    assert len(names) == 2 * 31
    assert "sm90-variants.json" in names and "gfx950-29-hash_kernel.ttir" in names


# ----------------------------------------------------------------------------- the command line
# Last: these run the check in a subprocess (seconds each).


def python(*argv: str) -> subprocess.CompletedProcess:
    """``python -W ignore *argv`` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-W", "ignore", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_module_runs_as_a_program():
    """``python -m tools.compile_check`` is the command line (here: a usage error)."""
    done = python("-m", "tools.compile_check")
    assert done.returncode == 2
    assert "error: name a --target or give --all" in done.stderr


def run_check(*args: str, mutant: str | None = None) -> subprocess.CompletedProcess:
    prelude = f"import {mutant}; " if mutant else ""
    script = f"{prelude}import sys; from tools import compile_check; sys.exit(compile_check.main({list(args)!r}))"
    return python("-c", script)


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
    done = run_check("--target", target, mutant="strength.known_bad.compile_constexpr_lost")
    assert done.returncode != 0
    assert "arange's arguments must be of type tl.constexpr" in done.stdout
    failed = re.search(r"(\d+) of (\d+) variants compiled .*; (\d+) FAILED", done.stdout)
    assert failed, done.stdout[-2000:]
    # every variant of the kernels that take a block size fails (write_kernel has none)
    assert int(failed.group(3)) >= 4 + 10 * 2 + 2
