"""The write and verify launchers (CONTRACT §6-§8).

Every rule of CONTRACT §8 is checked on the host before any kernel runs, even for an empty
plan, so that no launch reads or writes outside its buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch
import triton

from ._runtime import launch_kernel
from .buffers import VerifyOrWriteContext, VerifyPlan, WritePlan
from .constants import CANARY_SLOT_BYTES, VIOLATION_FIELDS, CanaryLaunchTag, RealKvHashMode
from .real_kv_hash import (
    FOLD_NUM_WARPS,
    as_mode,
    check_slots_in_sources,
    check_source_count,
    check_sources,
    launch_fingerprint,
    source_args,
)
from .source import is_int

VERIFY_BLOCK = 128  # plan entries per program
# The write kernel's work per request is one serial chain of scalar code: one warp runs it
# (more warps would only repeat it, and share its scalar loads and atomics).
WRITE_NUM_WARPS = 1

_INT64 = (torch.int64,)
_INT32 = (torch.int32,)
_TOKEN_DTYPES = (torch.int64, torch.int32)


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"


def _check_tensor(name: str, value: object, dtypes: tuple, shape: tuple, device) -> torch.Tensor:
    """One tensor argument: a contiguous tensor of one of ``dtypes`` and ``shape`` on ``device``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_contiguous():
        raise ValueError(f"kv-canary: {name} must be contiguous")
    if value.dtype not in dtypes:
        wanted = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"kv-canary: {name} must have dtype {wanted}, got {value.dtype}")
    if value.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(value.shape, shape)
    ):
        raise ValueError(
            f"kv-canary: {name} must have shape {_shape_text(shape)}, got {list(value.shape)}"
        )
    if device is not None and value.device != device:
        raise ValueError(
            f"kv-canary: {name} must be on the canary buffer's device {device}, got {value.device}"
        )
    return value


def _context_sources(context: VerifyOrWriteContext) -> tuple:
    """``context.real_kv_sources`` as a tuple, refused unless it is a list or tuple."""
    sources = context.real_kv_sources
    if not isinstance(sources, (list, tuple)):
        raise TypeError(
            "kv-canary: context.real_kv_sources must be a tuple of RealKvSource, "
            f"got {type(sources).__name__}"
        )
    return tuple(sources)


def _check_flag(name: str, value: object) -> bool:
    """A launch flag: a Python bool, nothing that merely converts to one."""
    if not isinstance(value, bool):
        raise TypeError(f"kv-canary: {name} must be a bool, got {type(value).__name__}")
    return value


def _check_context(context: VerifyOrWriteContext):
    """Context tensors, kind, mode and sources; returns (device, num_slots, mode, sources)."""
    if not isinstance(context, VerifyOrWriteContext):
        raise TypeError(
            f"kv-canary: context must be a VerifyOrWriteContext, got {type(context).__name__}"
        )
    sources = _context_sources(context)
    check_source_count(sources)
    buf = _check_tensor(
        "context.canary_buf", context.canary_buf, (torch.uint8,), (None, None), None
    )
    device = buf.device
    slot_stride_bytes = buf.shape[1]
    if slot_stride_bytes < CANARY_SLOT_BYTES or slot_stride_bytes % 8 != 0:
        raise ValueError(
            "kv-canary: context.canary_buf slot stride must be a multiple of 8 bytes and at least "
            f"{CANARY_SLOT_BYTES}, got {slot_stride_bytes} bytes"
        )
    if buf.data_ptr() % 8 != 0:
        raise ValueError(
            "kv-canary: context.canary_buf data pointer must be 8-byte aligned, got "
            f"data_ptr % 8 == {buf.data_ptr() % 8}"
        )
    _check_tensor(
        "context.violation_ring", context.violation_ring, _INT64, (None, VIOLATION_FIELDS), device
    )
    _check_tensor(
        "context.violation_write_index", context.violation_write_index, _INT32, (1,), device
    )
    _check_tensor("context.slot_run_counter", context.slot_run_counter, _INT64, (1,), device)
    _check_tensor("context.kernel_run_counter", context.kernel_run_counter, _INT64, (1,), device)
    _check_tensor(
        "context.enable_chain_position_assert",
        context.enable_chain_position_assert,
        _INT32,
        (1,),
        device,
    )
    kind = context.kernel_kind
    if not is_int(kind) or (isinstance(kind, Enum) and type(kind).__name__ != "CanaryLaunchTag"):
        raise TypeError(
            f"kv-canary: context.kernel_kind must be a CanaryLaunchTag, got {type(kind).__name__}"
        )
    try:
        CanaryLaunchTag(int(kind))
    except ValueError:
        raise ValueError(
            f"kv-canary: context.kernel_kind must be a CanaryLaunchTag, got {int(kind)}"
        ) from None
    mode = as_mode(context.real_kv_hash_mode, "context.real_kv_hash_mode")
    check_sources(sources, device, "context.canary_buf")
    return device, buf.shape[0], mode, sources


def _check_slots_below(name: str, slots: torch.Tensor, num_slots: int, lowest: int) -> None:
    """Every value of ``slots`` (host int64) is in [lowest, num_slots)."""
    if slots.numel() == 0:
        return
    bad = slots[(slots < lowest) | (slots >= num_slots)]
    if bad.numel():
        raise IndexError(
            f"kv-canary: {name} holds slot {int(bad[0])}, outside the canary buffer's "
            f"{num_slots} slots"
        )


def _common_launch_args(context: VerifyOrWriteContext):
    buf = context.canary_buf
    return (
        buf.view(torch.int64),
        buf.shape[1] // 8,
        int(context.kernel_kind),
        context.violation_ring,
        context.violation_ring.shape[0],
        context.violation_write_index,
        context.slot_run_counter,
        context.kernel_run_counter,
    )


@dataclass(frozen=True)
class CheckedVerify:
    """What the checks of a verify launch found out, for the launcher that runs it."""

    device: torch.device
    mode: RealKvHashMode
    sources: tuple
    capacity: int


def check_verify_launch(
    context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool = False
) -> CheckedVerify:
    """Every CONTRACT §8 rule of a verify launch, in order; raises the first that is broken."""
    device, num_slots, mode, sources = _check_context(context)
    _check_flag("check_verify_expected_token", check_verify_expected_token)
    if not isinstance(plan, VerifyPlan):
        raise TypeError(f"kv-canary: plan must be a VerifyPlan, got {type(plan).__name__}")
    slots = _check_tensor(
        "plan.verify_slot_indices", plan.verify_slot_indices, _INT64, (None,), device
    )
    cap = slots.shape[0]
    for name in ("verify_expected_tokens", "verify_expected_positions", "verify_prev_slot_indices"):
        _check_tensor(f"plan.{name}", getattr(plan, name), _INT64, (cap,), device)
    _check_tensor("plan.verify_num_valid", plan.verify_num_valid, _INT32, (1,), device)
    _check_tensor("plan.enable", plan.enable, _INT32, (1,), device)

    if int(plan.enable.item()) != 0:
        # A plan disabled for overflow leaves its entries unwritten: only an enabled one is read.
        active = min(max(int(plan.verify_num_valid.item()), 0), cap)
        host_slots = slots[:active].cpu()
        host_prev = plan.verify_prev_slot_indices[:active].cpu()
        _check_slots_below("plan.verify_slot_indices", host_slots, num_slots, 0)
        _check_slots_below("plan.verify_prev_slot_indices", host_prev[host_prev >= 0], num_slots, 0)
        if mode and sources:
            check_slots_in_sources(sources, host_slots[host_slots != 0], "plan.verify_slot_indices")
    return CheckedVerify(device, mode, sources, cap)


def launch_canary_verify_kernel(
    *, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool
) -> None:
    """Verify the canary records named by ``plan``; violations go to the context's ring."""
    checked = check_verify_launch(context, plan, check_verify_expected_token)
    args, num_sources = source_args(checked.sources, checked.mode)
    grid = (max(1, triton.cdiv(checked.capacity, VERIFY_BLOCK)),)
    launch_kernel(
        checked.device,
        "verify_kernel",
        grid,
        *_common_launch_args(context),
        plan.verify_slot_indices,
        plan.verify_expected_tokens,
        plan.verify_expected_positions,
        plan.verify_prev_slot_indices,
        plan.verify_num_valid,
        plan.enable,
        checked.capacity,
        *args,
        NUM_SOURCES=num_sources,
        CHECK_TOKEN=bool(check_verify_expected_token),
        BLOCK=VERIFY_BLOCK,
        num_warps=FOLD_NUM_WARPS,
    )


@dataclass(frozen=True)
class CheckedWrite:
    """What the checks of a write launch found out, for the launcher that runs it."""

    device: torch.device
    mode: RealKvHashMode
    sources: tuple
    capacity: int
    active: int  # clamp(write_num_valid_reqs, 0, capacity)
    first: int  # the valid requests' entries are [first, last) of the token arrays
    last: int
    written_slots: torch.Tensor  # host int64: the slots >= 0 among those entries


def check_write_launch(
    context: VerifyOrWriteContext,
    plan: WritePlan,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    enable_write_input_assert: bool,
    expected_input_tokens: torch.Tensor | None,
    expected_input_positions: torch.Tensor | None,
) -> CheckedWrite:
    """Every CONTRACT §6/§8 rule of a write launch, in order; raises the first that is broken."""
    if isinstance(context, VerifyOrWriteContext):
        check_source_count(_context_sources(context))
    _check_flag("enable_write_input_assert", enable_write_input_assert)
    expected = (expected_input_tokens, expected_input_positions)
    if enable_write_input_assert:
        if any(t is None for t in expected):
            raise ValueError(
                "kv-canary: expected input tensors are required when enable_write_input_assert=True"
            )
    elif any(t is not None for t in expected):
        raise ValueError(
            "kv-canary: expected input tensors must be None when enable_write_input_assert=False"
        )
    device, num_slots, mode, sources = _check_context(context)
    if not isinstance(plan, WritePlan):
        raise TypeError(f"kv-canary: plan must be a WritePlan, got {type(plan).__name__}")
    seeds = _check_tensor(
        "plan.write_seed_slot_indices", plan.write_seed_slot_indices, _INT64, (None,), device
    )
    cap = seeds.shape[0]
    offsets = _check_tensor("plan.write_offsets", plan.write_offsets, _INT64, (cap + 1,), device)
    _check_tensor("plan.write_num_valid_reqs", plan.write_num_valid_reqs, _INT32, (1,), device)
    loc = _check_tensor("out_cache_loc", out_cache_loc, _TOKEN_DTYPES, (None,), device)
    num_entries = loc.shape[0]
    _check_tensor("input_ids", input_ids, _TOKEN_DTYPES, (num_entries,), device)
    _check_tensor("positions", positions, _TOKEN_DTYPES, (num_entries,), device)
    if enable_write_input_assert:
        for name, tensor in zip(("expected_input_tokens", "expected_input_positions"), expected):
            _check_tensor(name, tensor, _TOKEN_DTYPES, (num_entries,), device)

    active = min(max(int(plan.write_num_valid_reqs.item()), 0), cap)
    host_seeds = seeds[:active].cpu()
    _check_slots_below("plan.write_seed_slot_indices", host_seeds[host_seeds >= 0], num_slots, 0)
    bounds = [int(v) for v in offsets[: active + 1].cpu()]
    if active and (
        bounds[0] < 0 or bounds[-1] > num_entries or any(a > b for a, b in zip(bounds, bounds[1:]))
    ):
        raise ValueError(
            f"kv-canary: plan.write_offsets must be non-decreasing within [0, {num_entries}] "
            f"for the {active} valid requests, got {bounds}"
        )
    first, last = (bounds[0], bounds[-1]) if active else (0, 0)
    host_written = loc[first:last].to(torch.int64).cpu()
    host_written = host_written[host_written >= 0]
    _check_slots_below("out_cache_loc", host_written, num_slots, 0)
    if mode and sources:
        check_slots_in_sources(sources, host_written, "out_cache_loc")
    return CheckedWrite(device, mode, sources, cap, active, first, last, host_written)


def launch_canary_write_kernel(
    *,
    context: VerifyOrWriteContext,
    plan: WritePlan,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    enable_write_input_assert: bool,
    expected_input_tokens: torch.Tensor | None,
    expected_input_positions: torch.Tensor | None,
) -> None:
    """Write the canary records of ``plan``'s requests, continuing each request's chain."""
    checked = check_write_launch(
        context,
        plan,
        input_ids,
        positions,
        out_cache_loc,
        enable_write_input_assert,
        expected_input_tokens,
        expected_input_positions,
    )
    device, first, last = checked.device, checked.first, checked.last
    real_kv = torch.zeros(out_cache_loc.shape[0], dtype=torch.int64, device=device)
    if checked.mode and checked.sources:
        # Hash every written slot in parallel first; the chain kernel then only walks the chain.
        written_slots = out_cache_loc[first:last].to(torch.int64)
        launch_fingerprint(real_kv[first:last], written_slots, checked.sources, checked.mode)

    if enable_write_input_assert:
        want_tokens, want_positions = expected_input_tokens, expected_input_positions
    else:
        want_tokens, want_positions = input_ids, positions  # never read
    launch_kernel(
        device,
        "write_kernel",
        (max(checked.capacity, 1),),
        *_common_launch_args(context),
        context.enable_chain_position_assert,
        plan.write_offsets,
        plan.write_seed_slot_indices,
        plan.write_num_valid_reqs,
        checked.capacity,
        input_ids,
        positions,
        out_cache_loc,
        real_kv,
        want_tokens,
        want_positions,
        INPUT_ASSERT=bool(enable_write_input_assert),
        num_warps=WRITE_NUM_WARPS,
    )
