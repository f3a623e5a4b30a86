"""The plan launcher (CONTRACT §12): an engine's batch becomes a VerifyPlan and a WritePlan.

Every rule P1 to P13 is checked on the host, in the contract's order, before any kernel runs:
a launch that raises leaves both plans as they were. P10 to P13 need values, so the host
reads the batch's rows (and, with an SWA table, exactly the page-table slots the plan would
translate). Two kernels then fill the plans: ``plan_offsets_kernel`` (one program over the
batch: prefix sums, write offsets, seeds, the verify total, overflow) and
``plan_entries_kernel`` (one program per block of verify entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from ._runtime import launch_kernel
from .buffers import VerifyPlan, WritePlan
from .constants import REQ_POOL_IDX_PADDING
from .source import is_int

# SGLang's _PLAN_BS_BLOCK_SIZE: the most rows one launch plans (P4)
PLAN_BS_BLOCK_SIZE = 4096
# Rows per step of the offsets kernel's one program, and its warps: 4 rows a thread keep it
# under 128 registers on sm90 with Triton 3.6 (over 200 with 4 warps).
PLAN_OFFSETS_BLOCK = 1024
PLAN_OFFSETS_NUM_WARPS = 8
# Verify entries per program of the entries kernel, and its warps: 8 lanes a thread keep it
# under 128 registers on sm90, and a block this wide halves the interpreter's per-program cost.
PLAN_ENTRIES_BLOCK = 2048
PLAN_ENTRIES_NUM_WARPS = 8

_VERIFY_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "enable",
)
_WRITE_FIELDS = ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs")
_NAME = "launch_canary_plan_kernels"


def _refuse_non_tensor(name: str, value: object, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, torch.Tensor):
        wanted = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise TypeError(f"kv-canary: {name} must be {wanted}, got {type(value).__name__}")


def _refuse_non_int(name: str, value: object) -> None:
    if not is_int(value):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__}")


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join("*" if n is None else str(n) for n in shape) + "]"


def _check_kind(name: str, tensor: torch.Tensor, dtype: torch.dtype, shape: tuple, device) -> None:
    """P9 for one tensor: its dtype, its shape (None: any length) and its device."""
    if tensor.dtype != dtype:
        raise ValueError(f"kv-canary: {name} must have dtype {dtype}, got {tensor.dtype}")
    if tensor.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(tensor.shape, shape)
    ):
        raise ValueError(
            f"kv-canary: {name} must have shape {_shape_text(shape)}, got {list(tensor.shape)}"
        )
    if tensor.device != device:
        raise ValueError(
            f"kv-canary: {name} must be on the device of verify_plan_out.verify_slot_indices "
            f"({device}), got {tensor.device}"
        )


def _first(flags: torch.Tensor) -> int | None:
    """The index of the first true element of a host bool tensor, or None."""
    found = torch.nonzero(flags)
    return int(found[0, 0]) if found.numel() else None


@dataclass(frozen=True)
class CheckedPlan:
    """What the checks of a plan launch found out, for the launcher that runs it."""

    device: torch.device
    bs: int
    verify_capacity: int
    write_capacity: int
    total: int  # verify entries of all rows
    swa_window: int  # swa_window_size, clamped to the row length (same windows)
    token_offset: int  # kv_token_id_vs_position_offset, clamped (same reads)


class _Arguments(NamedTuple):
    """A plan launch's arguments, as the checks read them (the optional tensors by short name)."""

    verify_plan_out: VerifyPlan
    write_plan_out: WritePlan
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    req_to_token: torch.Tensor
    swa_window_size: int
    lut: torch.Tensor | None  # full_to_swa_index_mapping
    verify_capacity: int
    pool: torch.Tensor | None  # req_to_verify_expected_tokens
    valid_lens: torch.Tensor | None  # req_to_verify_expected_tokens_valid_lens
    kv_token_id_vs_position_offset: int


def check_plan_launch(
    verify_plan_out: VerifyPlan,
    write_plan_out: WritePlan,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int,
    full_to_swa_index_mapping: torch.Tensor | None,
    verify_capacity: int,
    req_to_verify_expected_tokens: torch.Tensor | None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None,
    kv_token_id_vs_position_offset: int,
) -> CheckedPlan:
    """Every rule of CONTRACT §12, P1 to P13 in order; raises the first that is broken."""
    a = _Arguments(
        verify_plan_out,
        write_plan_out,
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        swa_window_size,
        full_to_swa_index_mapping,
        verify_capacity,
        req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset,
    )
    _check_kinds(a)
    # numpy integers are valid values, but their arithmetic wraps at their own width
    window, capacity = int(swa_window_size), int(verify_capacity)
    token_offset = int(kv_token_id_vs_position_offset)
    _check_sizes(a, window, capacity)
    _check_contiguous(a)
    # P8
    if window < 0:
        raise ValueError(f"kv-canary: swa_window_size must be >= 0, got {swa_window_size}")
    device, cap, write_cap, bs = _check_dtypes_shapes_devices(a)
    window, total = _check_rows(a, window)
    # An offset that puts every position below 0 or at/after the pool's row length (so past
    # every valid length, P12) reads nothing; clamped, it stays so, and fits in int32.
    row_len = req_to_token.shape[1]
    pool_len = a.pool.shape[1] if a.pool is not None else 0
    token_offset = max(-row_len, min(token_offset, pool_len))
    return CheckedPlan(device, bs, cap, write_cap, total, window, token_offset)


def _check_kinds(a: _Arguments) -> None:
    """P1: kinds, in the order of the arguments."""
    verify_plan_out, write_plan_out = a.verify_plan_out, a.write_plan_out
    if not isinstance(verify_plan_out, VerifyPlan):
        raise TypeError(
            f"kv-canary: verify_plan_out must be a VerifyPlan, got {type(verify_plan_out).__name__}"
        )
    for field in _VERIFY_FIELDS:
        _refuse_non_tensor(f"verify_plan_out.{field}", getattr(verify_plan_out, field))
    if not isinstance(write_plan_out, WritePlan):
        raise TypeError(
            f"kv-canary: write_plan_out must be a WritePlan, got {type(write_plan_out).__name__}"
        )
    for field in _WRITE_FIELDS:
        _refuse_non_tensor(f"write_plan_out.{field}", getattr(write_plan_out, field))
    _refuse_non_tensor("req_pool_indices", a.req_pool_indices)
    _refuse_non_tensor("prefix_lens", a.prefix_lens)
    _refuse_non_tensor("extend_seq_lens", a.extend_seq_lens)
    _refuse_non_tensor("req_to_token", a.req_to_token)
    _refuse_non_int("swa_window_size", a.swa_window_size)
    _refuse_non_tensor("full_to_swa_index_mapping", a.lut, optional=True)
    _refuse_non_int("verify_capacity", a.verify_capacity)
    _refuse_non_tensor("req_to_verify_expected_tokens", a.pool, optional=True)
    _refuse_non_tensor("req_to_verify_expected_tokens_valid_lens", a.valid_lens, optional=True)
    _refuse_non_int("kv_token_id_vs_position_offset", a.kv_token_id_vs_position_offset)


def _check_sizes(a: _Arguments, window: int, capacity: int) -> None:
    """P2 and P3 (the tensors a setting requires), P4 to P6 (the batch fits the launch and the
    plans); a tensor without a first dimension has no length here and is refused by P9."""
    if window > 0 and a.lut is None:
        raise ValueError(
            f"kv-canary: {_NAME} requires full_to_swa_index_mapping when swa_window_size > 0"
        )
    if a.pool is not None and a.valid_lens is None:
        raise ValueError(
            f"kv-canary: {_NAME} requires req_to_verify_expected_tokens_valid_lens when "
            "req_to_verify_expected_tokens is set"
        )
    req_pool_indices = a.req_pool_indices
    bs = req_pool_indices.shape[0] if req_pool_indices.ndim else None
    if bs is not None and bs > PLAN_BS_BLOCK_SIZE:
        raise ValueError(
            f"kv-canary: {_NAME} supports at most bs={PLAN_BS_BLOCK_SIZE} reqs per launch, "
            f"got bs={bs}. Bump _PLAN_BS_BLOCK_SIZE if real workloads need this."
        )
    slots = a.verify_plan_out.verify_slot_indices
    if slots.ndim and capacity != slots.shape[0]:
        raise ValueError(
            f"kv-canary: {_NAME} verify_capacity={a.verify_capacity} does not match "
            f"verify_plan_out.verify_slot_indices.shape[0]={slots.shape[0]}"
        )
    seeds = a.write_plan_out.write_seed_slot_indices
    if bs is not None and seeds.ndim and bs > seeds.shape[0]:
        raise ValueError(f"kv-canary: bs={bs} exceeds write_req_capacity={seeds.shape[0]}")


def _check_contiguous(a: _Arguments) -> None:
    """P7: every tensor given is contiguous, in the order of the arguments."""
    verify_plan_out, write_plan_out = a.verify_plan_out, a.write_plan_out
    tensors = [(f"verify_plan_out.{f}", getattr(verify_plan_out, f)) for f in _VERIFY_FIELDS]
    tensors += [(f"write_plan_out.{f}", getattr(write_plan_out, f)) for f in _WRITE_FIELDS]
    tensors += [
        ("req_pool_indices", a.req_pool_indices),
        ("prefix_lens", a.prefix_lens),
        ("extend_seq_lens", a.extend_seq_lens),
        ("req_to_token", a.req_to_token),
        ("full_to_swa_index_mapping", a.lut),
        ("req_to_verify_expected_tokens", a.pool),
        ("req_to_verify_expected_tokens_valid_lens", a.valid_lens),
    ]
    for name, tensor in tensors:
        if tensor is not None and not tensor.is_contiguous():
            raise ValueError(f"kv-canary: {name} must be contiguous")


def _check_dtypes_shapes_devices(a: _Arguments) -> tuple[torch.device, int, int, int]:
    """P9: every tensor's dtype, shape and device; returns the device, both capacities and
    the batch size."""
    verify_plan_out, write_plan_out = a.verify_plan_out, a.write_plan_out
    slots = verify_plan_out.verify_slot_indices
    seeds = write_plan_out.write_seed_slot_indices
    device = slots.device
    i64, i32 = torch.int64, torch.int32
    _check_kind("verify_plan_out.verify_slot_indices", slots, i64, (None,), device)
    cap = slots.shape[0]
    for field in _VERIFY_FIELDS[1:4]:
        _check_kind(
            f"verify_plan_out.{field}", getattr(verify_plan_out, field), i64, (cap,), device
        )
    for field in _VERIFY_FIELDS[4:]:
        _check_kind(f"verify_plan_out.{field}", getattr(verify_plan_out, field), i32, (1,), device)
    # write_offsets holds write_req_capacity + 1 entries, the capacity being the seeds' length
    offsets_len = seeds.shape[0] + 1 if seeds.ndim else None
    offsets = write_plan_out.write_offsets
    _check_kind("write_plan_out.write_offsets", offsets, i64, (offsets_len,), device)
    _check_kind("write_plan_out.write_seed_slot_indices", seeds, i64, (None,), device)
    write_cap = seeds.shape[0]
    _check_kind(
        "write_plan_out.write_num_valid_reqs",
        write_plan_out.write_num_valid_reqs,
        i32,
        (1,),
        device,
    )
    _check_kind("req_pool_indices", a.req_pool_indices, i64, (None,), device)
    bs = a.req_pool_indices.shape[0]
    _check_kind("prefix_lens", a.prefix_lens, i64, (bs,), device)
    _check_kind("extend_seq_lens", a.extend_seq_lens, i64, (bs,), device)
    _check_kind("req_to_token", a.req_to_token, i32, (None, None), device)
    if a.lut is not None:
        _check_kind("full_to_swa_index_mapping", a.lut, i64, (None,), device)
    if a.pool is not None:
        _check_kind("req_to_verify_expected_tokens", a.pool, i32, (None, None), device)
    if a.valid_lens is not None:
        _check_kind("req_to_verify_expected_tokens_valid_lens", a.valid_lens, i64, (bs,), device)
    return device, cap, write_cap, bs


def _check_rows(a: _Arguments, window: int) -> tuple[int, int]:
    """P10 to P13: values of the rows that are not padding. Returns the window, clamped to the
    row length (the same windows), and the verify entries of all rows."""
    req_to_token, pool, valid_lens, lut = a.req_to_token, a.pool, a.valid_lens, a.lut
    table_rows, row_len = req_to_token.shape
    pool_rows, pool_len = pool.shape if pool is not None else (0, 0)
    pool_row = a.req_pool_indices.cpu()
    real = pool_row != REQ_POOL_IDX_PADDING
    outside_table = real & ((pool_row < 0) | (pool_row >= table_rows))
    outside_pool = real & (pool_row >= pool_rows) if pool is not None else outside_table
    r = _first(outside_table | outside_pool)
    if r is not None:
        table, rows = (
            ("req_to_token", table_rows)
            if outside_table[r]
            else ("req_to_verify_expected_tokens", pool_rows)
        )
        raise IndexError(
            f"kv-canary: req_pool_indices[{r}] = {int(pool_row[r])} is not a row of {table} "
            f"({rows} rows)"
        )
    prefix = a.prefix_lens.cpu()
    r = _first(real & (prefix > row_len))
    if r is not None:
        raise ValueError(
            f"kv-canary: prefix_lens[{r}] = {int(prefix[r])} exceeds the row length of "
            f"req_to_token ({row_len})"
        )
    if pool is not None and valid_lens is not None:  # P3: the pool comes with its lengths
        lens = valid_lens.cpu()
        r = _first(real & (lens > pool_len))
        if r is not None:
            raise ValueError(
                f"kv-canary: req_to_verify_expected_tokens_valid_lens[{r}] = {int(lens[r])} "
                f"exceeds the row length of req_to_verify_expected_tokens ({pool_len})"
            )
    # each row's window, [first, prefix): rows with no entry count 0
    window = min(window, row_len)  # every prefix is <= row_len: the same windows
    prefix = torch.where(real & (prefix > 0), prefix, 0)
    first = (prefix - window).clamp(min=0) if window > 0 else torch.zeros_like(prefix)
    total = int((prefix - first).sum())
    if lut is not None:
        _check_translated_slots(req_to_token, lut, pool_row, first, prefix)
    return window, total


def _check_translated_slots(
    req_to_token: torch.Tensor,
    lut: torch.Tensor,
    pool_row: torch.Tensor,
    first: torch.Tensor,
    prefix: torch.Tensor,
) -> None:
    """P13: every slot >= 0 the plan translates is below the table's length.

    A row's entries read positions [first, prefix), their previous slots [first - 1,
    prefix - 1) from position 1, its seed prefix - 1 (inside the entries: every row with
    prefix > 0 has at least its last position in the window), so the translated slots are
    those of positions [max(first - 1, 0), prefix) of the rows with prefix > 0 (host int64
    ``first`` and ``prefix``, 0 for padding rows). They are gathered on the table's device.
    """
    start = (first - 1).clamp(min=0)
    lengths = torch.where(prefix > 0, prefix - start, 0)
    count = int(lengths.sum())
    if count == 0:
        return
    row_len = req_to_token.shape[1]
    bases = pool_row * row_len + start - (torch.cumsum(lengths, 0) - lengths)
    device = req_to_token.device
    index = torch.repeat_interleave(bases.to(device), lengths.to(device), output_size=count)
    index += torch.arange(count, dtype=torch.int64, device=device)
    translated = req_to_token.view(-1)[index]
    outside = translated >= lut.shape[0]
    if bool(outside.any()):
        slot = int(translated[outside][0])
        raise ValueError(
            f"kv-canary: SWA slot {slot} is outside full_to_swa_index_mapping length {lut.shape[0]}"
        )


def launch_canary_plan_kernels(
    *,
    verify_plan_out: VerifyPlan,
    write_plan_out: WritePlan,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int,
    full_to_swa_index_mapping: torch.Tensor | None,
    verify_capacity: int,
    req_to_verify_expected_tokens: torch.Tensor | None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None,
    kv_token_id_vs_position_offset: int,
) -> None:
    """Fill ``verify_plan_out`` and ``write_plan_out`` from one step's batch (CONTRACT §12)."""
    a = _Arguments(
        verify_plan_out,
        write_plan_out,
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        swa_window_size,
        full_to_swa_index_mapping,
        verify_capacity,
        req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset,
    )
    checked = check_plan_launch(*a)
    verify_offsets = _launch_offsets_kernel(a, checked)
    _launch_entries_kernel(a, checked, verify_offsets)


def _launch_offsets_kernel(a: _Arguments, checked: CheckedPlan) -> torch.Tensor:
    """Run ``plan_offsets_kernel`` over the batch: the write plan, the verify total and its
    overflow; return each row's first verify entry (``bs + 1`` prefix sums)."""
    device, bs = checked.device, checked.bs
    verify_plan_out, write_plan_out = a.verify_plan_out, a.write_plan_out
    req_pool_indices, prefix_lens, req_to_token = a.req_pool_indices, a.prefix_lens, a.req_to_token
    extend_seq_lens = a.extend_seq_lens
    lut = a.lut
    # Absent tensors are never read; a tensor of the same dtype stands in for each.
    lut_arg = lut if lut is not None else req_pool_indices
    row_len = req_to_token.shape[1]
    verify_offsets = torch.empty(bs + 1, dtype=torch.int64, device=device)
    launch_kernel(
        device,
        "plan_offsets_kernel",
        (1,),
        req_pool_indices,
        prefix_lens,
        extend_seq_lens,
        req_to_token,
        row_len,
        lut_arg,
        checked.swa_window,
        bs,
        checked.verify_capacity,
        checked.write_capacity,
        verify_offsets,
        write_plan_out.write_offsets,
        write_plan_out.write_seed_slot_indices,
        write_plan_out.write_num_valid_reqs,
        verify_plan_out.verify_num_valid,
        verify_plan_out.enable,
        HAS_SWA=lut is not None,
        BLOCK=PLAN_OFFSETS_BLOCK,
        num_warps=PLAN_OFFSETS_NUM_WARPS,
    )
    return verify_offsets


def _launch_entries_kernel(
    a: _Arguments, checked: CheckedPlan, verify_offsets: torch.Tensor
) -> None:
    """Run ``plan_entries_kernel``, one program per block of verify entries, to fill the
    verify plan's entries from the rows' first entries ``verify_offsets``."""
    device, bs = checked.device, checked.bs
    verify_plan_out = a.verify_plan_out
    req_pool_indices, prefix_lens, req_to_token = a.req_pool_indices, a.prefix_lens, a.req_to_token
    lut, pool, valid_lens = a.lut, a.pool, a.valid_lens
    # Absent tensors are never read; a tensor of the same dtype stands in for each.
    lut_arg = lut if lut is not None else req_pool_indices
    pool_arg = pool if pool is not None else req_to_token
    valid_lens_arg = valid_lens if pool is not None else prefix_lens
    row_len = req_to_token.shape[1]
    pool_len = pool.shape[1] if pool is not None else 0
    # The kernel finds the total and the overflow itself; the host's total only sizes the
    # grid (one program on overflow, which then writes nothing).
    planned = checked.total if checked.total <= checked.verify_capacity else 0
    launch_kernel(
        device,
        "plan_entries_kernel",
        (max(1, triton.cdiv(planned, PLAN_ENTRIES_BLOCK)),),
        req_pool_indices,
        prefix_lens,
        req_to_token,
        row_len,
        lut_arg,
        checked.swa_window,
        pool_arg,
        pool_len,
        valid_lens_arg,
        checked.token_offset,
        bs,
        bs.bit_length(),
        verify_offsets,
        verify_plan_out.enable,
        verify_plan_out.verify_slot_indices,
        verify_plan_out.verify_expected_tokens,
        verify_plan_out.verify_expected_positions,
        verify_plan_out.verify_prev_slot_indices,
        HAS_SWA=lut is not None,
        HAS_POOL=pool is not None,
        BLOCK=PLAN_ENTRIES_BLOCK,
        num_warps=PLAN_ENTRIES_NUM_WARPS,
    )
