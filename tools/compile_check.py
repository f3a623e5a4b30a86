"""Compile every kernel variant canary's launchers can produce, for a GPU target, without a GPU.

    python -m tools.compile_check --target cuda:90          # or sm90, h200, hip:gfx942, ...
    python -m tools.compile_check --all                     # every target of the GPU matrix
    python -m tools.compile_check --target sm90 --asm-dir out/   # also keep PTX / AMDGCN
    python -m tools.compile_check --target local            # this machine's own GPU

Triton's interpreter runs code that its compiler rejects (a parameter that lost its
``tl.constexpr`` runs interpreted and fails to compile for every GPU), so the CPU leg alone
proves nothing about GPUs. This check drives canary's own public launchers with small valid
CPU inputs, inside ``canary._runtime.capture_launches``: every host check runs and every
argument is derived exactly as for a real launch, but the launches are recorded instead of
run. Each distinct launch is then handed to the compiled binding of its kernel
(``JITFunction.warmup``: the same binder, so the same signature, constexpr and pointer
alignment specialisation a launch derives) and compiled by Triton's own compiler for the
target, through to a GPU binary (cubin, hsaco).

The one piece that is not Triton's own is :class:`InactiveDriver`: the stand-in for the GPU
driver that ``JITFunction`` asks for the current target, device and stream. It answers those
three questions with the target being checked and refuses everything else, so nothing is
ever loaded or launched.

Each variant prints one line (kernel, specialisation, registers, spills, shared memory,
compile time); a summary per target follows; the exit status is the number of variants that
failed to compile (capped at 100), 0 when all compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

import canary
from canary import _runtime, hashing
from tools.gpu_types import GPU_TYPES, GpuType, compile_targets


class InactiveDriver:
    """The GPU driver as ``JITFunction`` sees it while compiling for ``target``: inactive.

    It names the target, device 0 and stream 0, and has nothing else: any attempt to load
    a binary or launch a kernel through it fails with an ``AttributeError``.
    """

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_target(self) -> GPUTarget:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def is_active(self) -> bool:
        return False


@contextlib.contextmanager
def inactive_driver(target: GPUTarget) -> Iterator[None]:
    """Make :class:`InactiveDriver` Triton's active driver inside the block."""
    # Put back whatever was active before, even nothing: ``reset_active`` would look for a
    # real driver, and on a machine without a GPU there is none.
    previous = getattr(driver, "_active", None)
    driver.set_active(InactiveDriver(target))
    try:
        yield
    finally:
        driver.set_active(previous)


def local_target() -> GpuType:
    """The target of this machine's current GPU, as Triton's real driver reports it."""
    try:
        target = driver.active.get_current_target()
    except Exception as error:  # no GPU, or no driver for it
        raise ValueError(f"no local GPU target: {type(error).__name__}: {error}") from None
    vendor = "cuda" if target.backend == "cuda" else "rocm"
    return GpuType("local", vendor, (), target.arch, target.warp_size)


def parse_target(text: str) -> GpuType:
    """``cuda:90``, ``hip:gfx942``, a compile leg (``sm90``, ``compile-sm90``) or a GPU type
    (``h200``, ``cuda-h200``)."""
    wanted = text.strip().lower().removeprefix("compile-")  # a tox env name works too
    if wanted == "local":
        return local_target()
    for gpu in GPU_TYPES:
        if wanted in (gpu.target_name, gpu.compile_leg, gpu.label, gpu.leg):
            return gpu
    known = ", ".join(
        f"{gpu.target_name} ({gpu.compile_leg})" for gpu in compile_targets().values()
    )
    raise ValueError(f"unknown target {text!r}; known targets: {known}")


# ----------------------------------------------------------------------------- variants


def _sources(count: int) -> tuple[canary.RealKvSource, ...]:
    """``count`` small valid sources of different widths, each holding slots 0..7."""
    made = []
    for index in range(count):
        row_bytes = 64 * (index + 1)
        tensor = (torch.arange(8 * row_bytes) % 251 + 1).to(torch.uint8).view(8, row_bytes)
        made.append(
            canary.RealKvSource(
                tensor=tensor, page_size=1, num_bytes_per_token=row_bytes, read_bytes=row_bytes // 2
            )
        )
    return tuple(made)


def _context(sources: tuple, mode: canary.RealKvHashMode, buf_offset: int = 0):
    storage = torch.zeros(8 * 32 + 16, dtype=torch.uint8)
    start = (-storage.data_ptr()) % 16 + buf_offset  # 16-byte aligned, or 8 past that
    return canary.VerifyOrWriteContext(
        canary_buf=storage[start : start + 8 * 32].view(8, 32),
        kernel_kind=canary.CanaryLaunchTag.HEAD_K_FULL,
        violation_ring=torch.zeros(4, 8, dtype=torch.int64),
        violation_write_index=torch.zeros(1, dtype=torch.int32),
        slot_run_counter=torch.zeros(1, dtype=torch.int64),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64),
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        enable_chain_position_assert=torch.ones(1, dtype=torch.int32),
    )


def _modes(num_sources: int) -> tuple[canary.RealKvHashMode, ...]:
    mode = canary.RealKvHashMode
    return (mode.NONE,) if num_sources == 0 else (mode.PARTIAL, mode.ALL)


def _drive_launchers() -> None:
    """Call every launcher with every combination that selects a different kernel build."""
    for num_sources in range(1, canary.MAX_REAL_KV_SOURCES + 1):
        for mode in _modes(num_sources):
            canary.fingerprint(_sources(num_sources), torch.tensor([1, 2, 5]), mode=mode)
    slots = torch.tensor([3, 4], dtype=torch.int64)
    for num_sources in range(0, canary.MAX_REAL_KV_SOURCES + 1):
        for mode in _modes(num_sources):
            for buf_offset in (0, 8):  # canary_buf need only be 8-byte aligned (CONTRACT §10)
                context = _context(_sources(num_sources), mode, buf_offset)
                plan = canary.VerifyPlan.allocate(verify_capacity=4, device="cpu")
                plan.verify_slot_indices[:2] = slots
                plan.verify_prev_slot_indices[:2] = torch.tensor([-1, 3])
                plan.verify_num_valid.fill_(2)
                plan.enable.fill_(1)
                for check_token in (False, True):
                    canary.launch_canary_verify_kernel(
                        context=context, plan=plan, check_verify_expected_token=check_token
                    )
                plan = canary.WritePlan.allocate(write_req_capacity=2, device="cpu")
                plan.write_offsets.copy_(torch.tensor([0, 2, 2]))
                plan.write_seed_slot_indices.fill_(-1)
                plan.write_num_valid_reqs.fill_(1)
                for token_dtype in (torch.int64, torch.int32):  # CONTRACT §10: either is valid
                    tokens = torch.tensor([7, 8], dtype=token_dtype)
                    positions = torch.tensor([0, 1], dtype=token_dtype)
                    loc = slots.to(token_dtype)
                    for input_assert in (False, True):
                        expected = (tokens, positions) if input_assert else (None, None)
                        canary.launch_canary_write_kernel(
                            context=context,
                            plan=plan,
                            input_ids=tokens,
                            positions=positions,
                            out_cache_loc=loc,
                            enable_write_input_assert=input_assert,
                            expected_input_tokens=expected[0],
                            expected_input_positions=expected[1],
                        )
    _drive_plan_launchers()
    words = torch.tensor([1, 2, 3], dtype=torch.int64)
    hashing.splitmix64(words)
    hashing.splitmix64_mix3(words, words + 1, words + 2)


def _drive_plan_launchers() -> None:
    """The plan launcher with and without an SWA table and an expected-token pool (each
    selects a different build), and the scatter."""
    req_to_token = (torch.arange(4 * 8, dtype=torch.int32) + 1).view(4, 8)
    rows = torch.tensor([1, 0, 3], dtype=torch.int64)
    for with_swa in (False, True):
        for with_pool in (False, True):
            verify_plan = canary.VerifyPlan.allocate(verify_capacity=16, device="cpu")
            write_plan = canary.WritePlan.allocate(write_req_capacity=4, device="cpu")
            canary.launch_canary_plan_kernels(
                verify_plan_out=verify_plan,
                write_plan_out=write_plan,
                req_pool_indices=rows,
                prefix_lens=torch.tensor([3, 0, 5], dtype=torch.int64),
                extend_seq_lens=torch.tensor([1, 0, 2], dtype=torch.int64),
                req_to_token=req_to_token,
                swa_window_size=2 if with_swa else 0,
                full_to_swa_index_mapping=torch.arange(64, dtype=torch.int64) if with_swa else None,
                verify_capacity=16,
                req_to_verify_expected_tokens=req_to_token if with_pool else None,
                req_to_verify_expected_tokens_valid_lens=(
                    torch.tensor([2, 0, 4], dtype=torch.int64) if with_pool else None
                ),
                kv_token_id_vs_position_offset=1 if with_pool else 0,
            )
    canary.launch_scatter_req_token_ids_kernel(
        flat_in=torch.arange(7, dtype=torch.int64),
        offsets=torch.tensor([0, 3, 7], dtype=torch.int64),
        req_pool_indices=torch.tensor([1, 2], dtype=torch.int64),
        pool_out=torch.zeros(4, 8, dtype=torch.int32),
    )


def _spec_text(launch: _runtime.Launch) -> str:
    """The specialisation a launch selects, as text: constexprs, pointer dtypes and alignment,
    integer widths. Two launches with the same text compile to the same kernel."""
    parts = [f"{key}={value}" for key, value in sorted(launch.kwargs.items())]
    pointers = []
    for arg in launch.args:
        if isinstance(arg, torch.Tensor):
            aligned = "" if arg.data_ptr() % 16 == 0 else "/unaligned"
            pointers.append(f"{str(arg.dtype).removeprefix('torch.')}{aligned}")
        elif isinstance(arg, bool):
            pointers.append("i1")
        elif isinstance(arg, int):
            pointers.append("i32" if -(2**31) <= arg < 2**31 else "i64")
    return " ".join(parts) + " | " + ",".join(pointers)


def variants() -> list[_runtime.Launch]:
    """Every distinct kernel launch canary's launchers make, in a stable order."""
    with _runtime.capture_launches() as launches:
        _drive_launchers()
    distinct: dict[tuple[str, str], _runtime.Launch] = {}
    for launch in launches:
        distinct.setdefault((launch.name, _spec_text(launch)), launch)
    return list(distinct.values())


# ----------------------------------------------------------------------------- resources


@dataclasses.dataclass
class Compiled:
    """One variant compiled for one target."""

    kernel: str
    specialization: str
    seconds: float
    registers: int | None = None  # per thread: NVIDIA regs, AMD VGPRs
    spill_bytes: int | None = None  # NVIDIA: local memory per thread; AMD: VGPR+SGPR spills
    shared_bytes: int | None = None
    asm: dict = dataclasses.field(default_factory=dict)  # "ttir" and "ptx"/"amdgcn" text
    error: str | None = None


def _nvidia_tool(name: str) -> str | None:
    import triton.backends.nvidia as nvidia

    bundled = Path(nvidia.__file__).parent / "bin" / name
    return str(bundled) if bundled.exists() else shutil.which(name)


def _nvidia_resources(cubin: bytes) -> tuple[int | None, int | None]:
    """Registers and local (spill) bytes per thread, from ``cuobjdump --dump-resource-usage``."""
    tool = _nvidia_tool("cuobjdump")
    if tool is None:
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        text = subprocess.run(
            [tool, "--dump-resource-usage", handle.name],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    registers = re.search(r"\bREG:(\d+)", text)
    local = re.search(r"\bLOCAL:(\d+)", text)
    return (
        int(registers.group(1)) if registers else None,
        int(local.group(1)) if local else None,
    )


def _amd_resources(amdgcn: str) -> tuple[int | None, int | None]:
    """VGPRs and spilled registers, from the kernel metadata in the AMDGCN text."""

    def field(name: str) -> int | None:
        found = re.search(rf"\.{name}:\s+(\d+)", amdgcn)
        return int(found.group(1)) if found else None

    spills = [field("vgpr_spill_count"), field("sgpr_spill_count")]
    return field("vgpr_count"), None if None in spills else sum(spills)


def compile_variant(kernels, launch: _runtime.Launch, gpu: GpuType) -> Compiled:
    """Compile ``launch`` with ``kernels`` (a compiled binding) for ``gpu``'s target."""
    result = Compiled(launch.name, _spec_text(launch), 0.0)
    start = time.perf_counter()
    try:
        jit = getattr(kernels, launch.name)
        with inactive_driver(GPUTarget(gpu.backend, gpu.arch, gpu.warp_size)):
            compiled = jit.warmup(*launch.args, grid=launch.grid, **launch.kwargs)
    except Exception as error:  # every failure is reported, with its first lines
        result.seconds = time.perf_counter() - start
        lines = traceback.format_exception_only(type(error), error)
        result.error = "".join(lines).strip()
        return result
    result.seconds = time.perf_counter() - start
    result.shared_bytes = getattr(compiled.metadata, "shared", None)
    result.asm = {"ttir": compiled.asm["ttir"]}
    if gpu.backend == "cuda":
        result.asm["ptx"] = compiled.asm["ptx"]
        result.registers, result.spill_bytes = _nvidia_resources(compiled.asm["cubin"])
    else:
        result.asm["amdgcn"] = compiled.asm["amdgcn"]
        result.registers, result.spill_bytes = _amd_resources(compiled.asm["amdgcn"])
    return result


def check_target(gpu: GpuType, launches: list[_runtime.Launch] | None = None) -> list[Compiled]:
    """Compile every variant for ``gpu``'s target, with a fresh binding of the kernels."""
    launches = variants() if launches is None else launches
    kernels = _runtime.fresh_compiled_kernels()
    return [compile_variant(kernels, launch, gpu) for launch in launches]


def _show(value: int | None) -> str:
    return "?" if value is None else str(value)


def report(gpu: GpuType, results: list[Compiled], out=sys.stdout) -> int:
    """Print one line per variant and a summary; return the number of failures."""
    name = f"{gpu.target_name} ({gpu.compile_leg})"
    for item in results:
        status = "ok" if item.error is None else "FAILED"
        print(
            f"{gpu.compile_leg:7} {item.kernel:18} {status:6} regs {_show(item.registers):>3}  "
            f"spills {_show(item.spill_bytes):>3}  smem {_show(item.shared_bytes):>5}  "
            f"{item.seconds:5.2f}s  {item.specialization}",
            file=out,
        )
        if item.error is not None:
            for line in item.error.splitlines()[-6:]:
                print(f"          {line[:200]}", file=out)
    failed = sum(item.error is not None for item in results)
    done = [item for item in results if item.error is None]
    registers = [item.registers for item in done if item.registers is not None]
    spills = [item.spill_bytes for item in done if item.spill_bytes is not None]
    per_kernel = {}
    for item in results:
        per_kernel[item.kernel] = per_kernel.get(item.kernel, 0) + 1
    kinds = ", ".join(f"{kernel} {count}" for kernel, count in per_kernel.items())
    print(
        f"{name}: {len(results) - failed} of {len(results)} variants compiled ({kinds}); "
        f"max registers {max(registers, default='?')}, max spills {max(spills, default='?')}, "
        f"{sum(item.seconds for item in results):.1f}s" + (f"; {failed} FAILED" if failed else ""),
        file=out,
    )
    return failed


def write_asm(directory: Path, gpu: GpuType, results: list[Compiled]) -> None:
    """Each variant's TTIR and PTX/AMDGCN as files, and ``<leg>-variants.json`` indexing them."""
    directory.mkdir(parents=True, exist_ok=True)
    index = []
    for number, item in enumerate(results):
        files = {}
        for kind, text in item.asm.items():
            path = directory / f"{gpu.compile_leg}-{number:02d}-{item.kernel}.{kind}"
            path.write_text(text)
            files[kind] = path.name
        fields = dataclasses.asdict(item)
        fields["asm"] = files
        index.append(fields)
    (directory / f"{gpu.compile_leg}-variants.json").write_text(json.dumps(index, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.compile_check",
        description="Compile every canary kernel variant for GPU targets, without a GPU.",
    )
    parser.add_argument(
        "--target",
        action="append",
        default=[],
        help="cuda:90, hip:gfx942, a compile leg (sm90, gfx950), a GPU label (h200), or local "
        "(this machine's GPU); repeatable",
    )
    parser.add_argument("--all", action="store_true", help="every target of the GPU matrix")
    parser.add_argument(
        "--asm-dir", type=Path, help="also write each variant's TTIR, PTX/AMDGCN here"
    )
    parser.add_argument(
        "--kernel", action="append", default=[], help="only this kernel's variants; repeatable"
    )
    options = parser.parse_args(argv)
    try:
        gpus = [parse_target(text) for text in options.target]
    except ValueError as error:
        parser.error(str(error))
    if options.all:
        gpus += compile_targets().values()
    # one check per compile target, however many of its names were given (h200 and h100 are
    # both sm90)
    unique: dict[str, GpuType] = {}
    for gpu in gpus:
        unique.setdefault(gpu.compile_leg, gpu)
    gpus = list(unique.values())
    if not gpus:
        parser.error("name a --target or give --all")
    launches = [
        launch for launch in variants() if launch.name in options.kernel or not options.kernel
    ]
    if not launches:
        parser.error(f"no variant of kernel(s) {options.kernel}")
    failed = 0
    for gpu in gpus:
        results = check_target(gpu, launches)
        failed += report(gpu, results)
        if options.asm_dir is not None:
            write_asm(options.asm_dir, gpu, results)
    if len(gpus) > 1:
        print(f"all targets: {failed} variant(s) failed" if failed else "all targets compiled")
    return min(failed, 100)


if __name__ == "__main__":
    raise SystemExit(main())
