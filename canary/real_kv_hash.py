"""fingerprint: the real-KV hash of slots (CONTRACT §4), and the launch checks it shares."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum

import torch
import triton

from ._runtime import launch_kernel
from .constants import MAX_REAL_KV_SOURCES, PARTIAL_READ_BYTES, RealKvHashMode
from .source import RealKvSource, is_int

FINGERPRINT_BLOCK = 128  # slots per program
# Warps per program of the kernels that fold sources: the fold reads [BLOCK, 2]-word tiles,
# and with 2 warps each thread holds at least two words of a slot on NVIDIA (32 lanes) and
# on AMD (64 lanes), which is what lets the compiler issue 16-byte loads (see
# tests/canary/test_codegen.py).
FOLD_NUM_WARPS = 2


def as_mode(mode: object, name: str = "mode") -> RealKvHashMode:
    """``mode`` as a RealKvHashMode: a member or its int value, not a bool nor another enum's
    member; errors name the argument as ``name`` (``context.real_kv_hash_mode`` for launches)."""
    other_enum = isinstance(mode, Enum) and type(mode).__name__ != "RealKvHashMode"
    if not is_int(mode) or other_enum:
        raise TypeError(
            f"kv-canary: {name} must be a RealKvHashMode or its int value, got {type(mode).__name__}"
        )
    try:
        return RealKvHashMode(int(mode))
    except ValueError:
        raise ValueError(
            f"kv-canary: {name} must be one of {[m.value for m in RealKvHashMode]}, got {int(mode)}"
        ) from None


def check_source_count(sources: Sequence[RealKvSource]) -> None:
    if len(sources) > MAX_REAL_KV_SOURCES:
        raise ValueError(
            f"kv-canary: at most {MAX_REAL_KV_SOURCES} RealKvSource entries supported by the "
            f"CUDA ABI, got {len(sources)}"
        )


def check_sources(sources: Sequence[RealKvSource], device: torch.device, what: str) -> None:
    """Source count, type and device rules, before any slot is looked at."""
    check_source_count(sources)
    for index, source in enumerate(sources):
        if not isinstance(source, RealKvSource):
            raise TypeError(
                f"kv-canary: real_kv_sources[{index}] must be a RealKvSource, "
                f"got {type(source).__name__}"
            )
        if source.tensor.device != device:
            raise ValueError(
                f"kv-canary: real_kv_sources[{index}] is on {source.tensor.device}, "
                f"but {what} is on {device}"
            )


def check_slots_in_sources(
    sources: Sequence[RealKvSource],
    slots: torch.Tensor,
    what: str = "slot",
    given: torch.Tensor | None = None,
) -> None:
    """Every slot in ``slots`` (a host int64 tensor) is addressable in every source.

    A slot outside is named as ``given`` holds it (the caller's tensor, of any integer dtype,
    that ``slots`` was cast from; default ``slots``): a uint64 2^63 is 9223372036854775808,
    not the -9223372036854775808 of its int64 cast (CONTRACT §4)."""
    if slots.numel() == 0:
        return
    low_at = int(slots.argmin())
    high_at = int(slots.argmax())
    low = int(slots[low_at])
    high = int(slots[high_at])
    for index, source in enumerate(sources):
        capacity = source.capacity
        if low < 0 or high >= capacity:
            at = low_at if low < 0 else high_at
            bad = (slots if given is None else given)[at].item()
            raise IndexError(
                f"kv-canary: {what} {bad} is out of range for real_kv_sources[{index}] "
                f"with capacity {capacity} slots"
            )


def source_args(sources: Sequence[RealKvSource], mode: RealKvHashMode) -> tuple[list[int], int]:
    """Flat kernel arguments for up to four sources, and how many the kernel folds.

    Each source travels as (address, row stride in bytes, page size in slots, bytes per
    token, u64 words read per slot); the address is the view's own ``data_ptr()`` so
    its storage offset and strides are honoured, and nothing is copied.
    """
    if mode == RealKvHashMode.NONE:
        return [0] * 5 * MAX_REAL_KV_SOURCES, 0
    args: list[int] = []
    for source in sources:
        read = PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(source.read_bytes)
        args += [
            source.tensor.data_ptr(),
            source.row_stride_bytes,
            int(source.page_size),
            int(source.num_bytes_per_token),
            read // 8,
        ]
    args += [0] * 5 * (MAX_REAL_KV_SOURCES - len(sources))
    return args, len(sources)


def launch_fingerprint(
    out: torch.Tensor,
    slots: torch.Tensor,
    sources: Sequence[RealKvSource],
    mode: RealKvHashMode,
) -> None:
    """Hash ``slots`` (int64, may hold negative 'skip' entries) into ``out`` (int64)."""
    num_entries = slots.numel()
    args, num_sources = source_args(sources, mode)
    if num_entries == 0:
        return
    if num_sources == 0:
        out.zero_()
        return
    grid = (triton.cdiv(num_entries, FINGERPRINT_BLOCK),)
    launch_kernel(
        slots.device,
        "fingerprint_kernel",
        grid,
        out,
        slots,
        num_entries,
        *args,
        NUM_SOURCES=num_sources,
        BLOCK=FINGERPRINT_BLOCK,
        num_warps=FOLD_NUM_WARPS,
    )


def check_fingerprint_args(
    sources: Sequence[RealKvSource], slot_indices: torch.Tensor, mode: RealKvHashMode | int
) -> tuple[tuple[RealKvSource, ...], torch.Tensor, RealKvHashMode]:
    """CONTRACT §4's launch checks, in order, and the arguments in the form a launch uses:
    the sources as a tuple, the slots as a contiguous int64 tensor, the mode as the enum.

    Arguments of the wrong kind are refused with a kv-canary error naming the argument: the
    sources must be a list or tuple (one that cannot be counted has no source cap to check),
    the mode a RealKvHashMode or its int value (not another enum)."""
    if not isinstance(sources, (list, tuple)):
        raise TypeError(
            "kv-canary: sources must be a list or tuple of RealKvSource, "
            f"got {type(sources).__name__}"
        )
    sources = tuple(sources)
    check_source_count(sources)  # CONTRACT §4: the first launch check, whatever else is wrong
    mode = as_mode(mode)
    if not isinstance(slot_indices, torch.Tensor):
        raise TypeError(
            f"kv-canary: slot_indices must be a torch.Tensor, got {type(slot_indices).__name__}"
        )
    if (
        slot_indices.ndim != 1
        or slot_indices.dtype.is_floating_point
        or slot_indices.is_complex()
        or slot_indices.dtype == torch.bool
    ):
        raise ValueError(
            "kv-canary: slot_indices must be a 1-D integer tensor, got "
            f"shape {tuple(slot_indices.shape)} of {slot_indices.dtype}"
        )
    check_sources(sources, slot_indices.device, "slot_indices")
    slots = slot_indices.to(torch.int64).contiguous()
    if mode != RealKvHashMode.NONE and sources:
        check_slots_in_sources(sources, slots.cpu(), given=slot_indices)
    return sources, slots, mode


def fingerprint(
    sources: Sequence[RealKvSource],
    slot_indices: torch.Tensor,
    *,
    mode: RealKvHashMode | int = RealKvHashMode.ALL,
) -> torch.Tensor:
    """The real-KV hash of each slot in ``slot_indices``, as int64 on its device.

    Per slot, each source's read window is folded as little-endian u64 words
    (``acc = splitmix64(acc ^ w)``), and the per-source folds are combined in tuple order
    (``h = splitmix64(h ^ fold)``). Mode NONE, or no sources, gives zeros and reads nothing.
    """
    sources, slots, mode = check_fingerprint_args(sources, slot_indices, mode)
    out = torch.zeros(slots.numel(), dtype=torch.int64, device=slots.device)
    launch_fingerprint(out, slots, sources, mode)
    return out
