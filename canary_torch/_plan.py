"""The plan kernel of ``canary_torch``: an engine's batch becomes a VerifyPlan and a WritePlan
(CONTRACT §12), written from the contract alone.

``plan_launch`` makes every check of the launch, P1 to P13 in the contract's order, and
returns the work to do; ``fill_plans`` then writes it into the plans. Nothing is written
before the last check has passed, so a launch that raises leaves both plans as they were.

Everything is vectorised over the batch: the verify entries of all rows are laid out with one
``repeat_interleave``, their slots gathered from the page table in one indexed read. Entries
are made in chunks of rows, so that a batch whose verify plan overflows (whose entries are
checked against the SWA table but never stored) needs no memory in proportion to its size.
All index arithmetic is int64.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

from ._contract import VerifyPlan, WritePlan

REQ_POOL_IDX_PADDING = 0  # CONTRACT §12, §14: the pool row that marks a padding row
PLAN_MAX_REQS = 4096  # CONTRACT §12 P4: the per-launch cap on bs

_NAME = "launch_canary_plan_kernels"
# Verify entries made at once; a batch with more is made in chunks of rows.
_CHUNK_ENTRIES = 1 << 20
# |offset| and window lengths past this are cut to it: every position and length the plan
# compares them with is far below, so the comparisons keep their truth, and int64 never wraps.
_HUGE = 1 << 62

_VERIFY_FIELDS = (
    "verify_slot_indices",
    "verify_expected_tokens",
    "verify_expected_positions",
    "verify_prev_slot_indices",
    "verify_num_valid",
    "enable",
)
_WRITE_FIELDS = ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs")


def is_int(value: object) -> bool:
    """CONTRACT §11: a Python or numpy integer, never a bool of either kind."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _length(tensor: torch.Tensor) -> int | None:
    """``shape[0]``, or None for a 0-D tensor (which the shape check refuses later)."""
    return int(tensor.shape[0]) if tensor.dim() >= 1 else None


def _dtype_shape_device(
    name: str,
    tensor: torch.Tensor,
    dtype: torch.dtype,
    shape: tuple[int | None, ...],
    device: torch.device,
) -> None:
    """P9 for one tensor: its dtype, then its shape (None: any size), then its device."""
    if tensor.dtype != dtype:
        raise ValueError(
            f"kv-canary: {name} has dtype {tensor.dtype}, expected {str(dtype).removeprefix('torch.')}"
        )
    fits = tensor.dim() == len(shape) and all(
        want is None or have == want for have, want in zip(tensor.shape, shape)
    )
    if not fits:
        sizes = ["any" if n is None else str(n) for n in shape]
        wanted = "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"
        raise ValueError(
            f"kv-canary: {name} has shape {tuple(tensor.shape)}, expected shape {wanted}"
        )
    if tensor.device != device:
        raise ValueError(
            f"kv-canary: {name} is on {tensor.device}, expected the device of "
            f"verify_plan_out.verify_slot_indices, {device}"
        )


class Entries(NamedTuple):
    """Verify entries of some rows, in plan order (int64 ``[n]`` each)."""

    slots: torch.Tensor
    expected_tokens: torch.Tensor
    positions: torch.Tensor
    prev_slots: torch.Tensor


class PlanLaunch(NamedTuple):
    """What a checked plan launch writes: the verify plan's entries (None when they overflow
    its capacity, and then none is written), its count and flag, and the write plan."""

    verify_plan: VerifyPlan
    write_plan: WritePlan
    entries: Entries | None
    num_valid: int
    enable: int
    write_offsets: torch.Tensor  # int64 [bs + 1]
    write_seeds: torch.Tensor  # int64 [bs]


class _Batch(NamedTuple):
    """The checked arguments, with padding rows' lengths zeroed (they are never read)."""

    pool_rows: torch.Tensor  # rp
    prefix: torch.Tensor  # max(p, 0); 0 for padding
    window_start: torch.Tensor
    entries: torch.Tensor  # verify entries of each row: prefix - window_start
    valid_lens: torch.Tensor | None  # 0 for padding
    req_to_token: torch.Tensor
    table: torch.Tensor | None
    pool: torch.Tensor | None
    offset: int


def plan_launch(
    *,
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
) -> PlanLaunch:
    """Every check of CONTRACT §12 in its order (P1 to P13), then the plans' new contents.

    Reads the arguments and never writes them.
    """
    table, pool, valid_lens = (
        full_to_swa_index_mapping,
        req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens,
    )
    arguments = _check_kinds(
        verify_plan_out,
        write_plan_out,
        [
            ("req_pool_indices", req_pool_indices, False),
            ("prefix_lens", prefix_lens, False),
            ("extend_seq_lens", extend_seq_lens, False),
            ("req_to_token", req_to_token, False),
            ("swa_window_size", swa_window_size, False),
            ("full_to_swa_index_mapping", table, True),
            ("verify_capacity", verify_capacity, False),
            ("req_to_verify_expected_tokens", pool, True),
            ("req_to_verify_expected_tokens_valid_lens", valid_lens, True),
            ("kv_token_id_vs_position_offset", kv_token_id_vs_position_offset, False),
        ],
    )
    window, capacity, offset = (
        int(swa_window_size),
        int(verify_capacity),
        int(kv_token_id_vs_position_offset),
    )

    # --- P2, P3: the optional tensors that go together
    if window > 0 and table is None:
        raise ValueError(
            f"kv-canary: {_NAME} requires full_to_swa_index_mapping when swa_window_size > 0"
        )
    if pool is not None and valid_lens is None:
        raise ValueError(
            f"kv-canary: {_NAME} requires req_to_verify_expected_tokens_valid_lens when "
            f"req_to_verify_expected_tokens is set"
        )
    bs, write_capacity = _check_sizes(verify_plan_out, write_plan_out, req_pool_indices, capacity)

    # --- P7: contiguity, every tensor in the order of the signature
    given = [(name, value) for name, value, _ in arguments if isinstance(value, torch.Tensor)]
    for name, value in given:
        if not value.is_contiguous():
            raise ValueError(f"kv-canary: {name} must be contiguous")

    # --- P8
    if window < 0:
        raise ValueError(f"kv-canary: swa_window_size must be >= 0, got {window}")

    _check_dtypes(given, verify_plan_out.verify_slot_indices.device, capacity, write_capacity, bs)
    assert bs is not None  # req_pool_indices passed P9: it is 1-D
    real = req_pool_indices != REQ_POOL_IDX_PADDING
    _check_rows(real, req_pool_indices, prefix_lens, req_to_token, pool, valid_lens)
    batch = _batch(
        real, req_pool_indices, prefix_lens, req_to_token, window, table, pool, valid_lens, offset
    )
    return _plans(batch, real, extend_seq_lens, capacity, verify_plan_out, write_plan_out)


def _check_kinds(
    verify_plan_out, write_plan_out, inputs: list[tuple[str, object, bool]]
) -> list[tuple[str, object, bool]]:
    """P1: the kind of each argument, in the order of the signature. ``inputs`` are the
    arguments after the plans, as ``(name, value, may be None)``; returns every argument so."""
    if not isinstance(verify_plan_out, VerifyPlan):
        raise TypeError(
            f"kv-canary: verify_plan_out must be a VerifyPlan, got {type(verify_plan_out).__name__}"
        )
    if not isinstance(write_plan_out, WritePlan):
        raise TypeError(
            f"kv-canary: write_plan_out must be a WritePlan, got {type(write_plan_out).__name__}"
        )
    tensors: dict[str, object] = {}
    tensors.update({f"verify_plan_out.{f}": getattr(verify_plan_out, f) for f in _VERIFY_FIELDS})
    tensors.update({f"write_plan_out.{f}": getattr(write_plan_out, f) for f in _WRITE_FIELDS})
    arguments: list[tuple[str, object, bool]] = [  # (name, value, may be None)
        *((name, value, False) for name, value in tensors.items()),
        *inputs,
    ]
    integers = ("swa_window_size", "verify_capacity", "kv_token_id_vs_position_offset")
    for name, value, optional in arguments:
        if name in integers:
            if not is_int(value):
                raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__}")
        elif not (isinstance(value, torch.Tensor) or (optional and value is None)):
            what = "a torch.Tensor or None" if optional else "a torch.Tensor"
            raise TypeError(f"kv-canary: {name} must be {what}, got {type(value).__name__}")
    return arguments


def _check_sizes(
    verify_plan_out, write_plan_out, req_pool_indices, capacity: int
) -> tuple[int | None, int | None]:
    """P4 to P6: the batch fits the launch and the plans. Returns the batch size and the write
    plan's capacity (None where a tensor has no first dimension: P9 refuses it)."""
    bs = _length(req_pool_indices)
    if bs is not None and bs > PLAN_MAX_REQS:
        raise ValueError(
            f"kv-canary: {_NAME} supports at most bs={PLAN_MAX_REQS} reqs per launch, got "
            f"bs={bs}. Bump _PLAN_BS_BLOCK_SIZE if real workloads need this."
        )
    plan_capacity = _length(verify_plan_out.verify_slot_indices)
    if plan_capacity is not None and capacity != plan_capacity:
        raise ValueError(
            f"kv-canary: {_NAME} verify_capacity={capacity} does not match "
            f"verify_plan_out.verify_slot_indices.shape[0]={plan_capacity}"
        )
    write_capacity = _length(write_plan_out.write_seed_slot_indices)
    if bs is not None and write_capacity is not None and bs > write_capacity:
        raise ValueError(f"kv-canary: bs={bs} exceeds write_req_capacity={write_capacity}")
    return bs, write_capacity


def _check_dtypes(
    given: list[tuple[str, torch.Tensor]],
    device: torch.device,
    capacity: int,
    write_capacity: int | None,
    bs: int | None,
) -> None:
    """P9: dtype, shape and device of each tensor given."""
    i64, i32 = torch.int64, torch.int32
    shapes: dict[str, tuple[torch.dtype, tuple[int | None, ...]]] = {
        "verify_plan_out.verify_slot_indices": (i64, (capacity,)),
        "verify_plan_out.verify_expected_tokens": (i64, (capacity,)),
        "verify_plan_out.verify_expected_positions": (i64, (capacity,)),
        "verify_plan_out.verify_prev_slot_indices": (i64, (capacity,)),
        "verify_plan_out.verify_num_valid": (i32, (1,)),
        "verify_plan_out.enable": (i32, (1,)),
        "write_plan_out.write_offsets": (
            i64,
            (None if write_capacity is None else write_capacity + 1,),
        ),
        "write_plan_out.write_seed_slot_indices": (i64, (write_capacity,)),
        "write_plan_out.write_num_valid_reqs": (i32, (1,)),
        "req_pool_indices": (i64, (bs,)),
        "prefix_lens": (i64, (bs,)),
        "extend_seq_lens": (i64, (bs,)),
        "req_to_token": (i32, (None, None)),
        "full_to_swa_index_mapping": (i64, (None,)),
        "req_to_verify_expected_tokens": (i32, (None, None)),
        "req_to_verify_expected_tokens_valid_lens": (i64, (bs,)),
    }
    for name, value in given:
        dtype, shape = shapes[name]
        _dtype_shape_device(name, value, dtype, shape, device)


def _check_rows(real, pool_rows, prefix_lens, req_to_token, pool, valid_lens) -> None:
    """P10 to P12: each row that is not padding (``real``) fits the tables it reads."""
    rows, row_length = int(req_to_token.shape[0]), int(req_to_token.shape[1])
    bounds = [("req_to_token", rows)] + (
        [] if pool is None else [("req_to_verify_expected_tokens", int(pool.shape[0]))]
    )
    outside = torch.zeros_like(real)
    for _, limit in bounds:
        outside |= (pool_rows < 0) | (pool_rows >= limit)
    r = _first(real & outside)
    if r is not None:
        value = int(pool_rows[r])
        table_name, limit = next((n, k) for n, k in bounds if not 0 <= value < k)
        raise IndexError(
            f"kv-canary: req_pool_indices[{r}]={value} is not a row of {table_name}, which has "
            f"{limit} rows"
        )
    r = _first(real & (prefix_lens > row_length))
    if r is not None:
        raise ValueError(
            f"kv-canary: prefix_lens[{r}]={int(prefix_lens[r])} exceeds the row length of "
            f"req_to_token, {row_length}"
        )
    if pool is not None:
        assert valid_lens is not None  # P3
        pool_length = int(pool.shape[1])
        r = _first(real & (valid_lens > pool_length))
        if r is not None:
            raise ValueError(
                f"kv-canary: req_to_verify_expected_tokens_valid_lens[{r}]={int(valid_lens[r])} "
                f"exceeds the row length of req_to_verify_expected_tokens, {pool_length}"
            )


def _batch(
    real, pool_rows, prefix_lens, req_to_token, window: int, table, pool, valid_lens, offset: int
) -> _Batch:
    """The checked batch, each row's window worked out. Padding rows contribute nothing,
    whatever their lengths hold (CONTRACT §12 item 1)."""
    zero = torch.zeros_like(prefix_lens)
    prefix = torch.where(real, prefix_lens.clamp(min=0), zero)
    if window > 0:
        window_start = (prefix - min(window, _HUGE)).clamp(min=0)
    else:
        window_start = zero
    return _Batch(
        pool_rows=torch.where(real, pool_rows, zero),
        prefix=prefix,
        window_start=window_start,
        entries=prefix - window_start,
        valid_lens=None
        if pool is None or valid_lens is None
        else torch.where(real, valid_lens, zero),
        req_to_token=req_to_token,
        table=table,
        pool=pool,
        offset=max(-_HUGE, min(offset, _HUGE)),
    )


def _plans(
    batch: _Batch, real, extend_seq_lens, capacity: int, verify_plan_out, write_plan_out
) -> PlanLaunch:
    """P13 (with the entries themselves when they fit the plan: every slot translated), then
    what the launch writes into both plans."""
    total = int(batch.entries.sum())
    overflow = total > capacity
    kept: list[Entries] = []
    if not overflow:
        kept = list(_entry_chunks(batch))
    elif batch.table is not None:
        _refuse_rows_past_table(batch)
    zero, prefix = torch.zeros_like(batch.prefix), batch.prefix
    writes = torch.where(real, extend_seq_lens.clamp(min=0), zero)
    seeded = real & (writes > 0) & (prefix > 0)
    seeds = torch.full_like(batch.pool_rows, -1)
    seed_slots = _table_at(batch, batch.pool_rows[seeded], prefix[seeded] - 1)
    _refuse_past_table(batch, seed_slots)
    seeds[seeded] = _translate(batch, seed_slots)

    write_offsets = torch.zeros(real.shape[0] + 1, dtype=torch.int64, device=real.device)
    write_offsets[1:] = torch.cumsum(writes, 0)
    entries = None
    if not overflow:
        entries = Entries(*(torch.cat(parts) for parts in zip(*kept))) if kept else None
    return PlanLaunch(
        verify_plan=verify_plan_out,
        write_plan=write_plan_out,
        entries=entries,
        num_valid=capacity if overflow else total,
        enable=0 if overflow else 1,
        write_offsets=write_offsets,
        write_seeds=seeds,
    )


def _first(mask: torch.Tensor) -> int | None:
    """The index of the first true element of a 1-D bool tensor, or None."""
    found = torch.nonzero(mask)
    return int(found[0, 0]) if found.numel() else None


def _table_at(batch: _Batch, pool_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``req_to_token[pool_rows, positions]`` as int64 (all indices already checked)."""
    flat = batch.req_to_token.view(-1)
    return flat[pool_rows * batch.req_to_token.shape[1] + positions].to(torch.int64)


def _refuse_past_table(batch: _Batch, *slots: torch.Tensor) -> None:
    """P13: the first non-negative slot at or past the SWA table's length, the slots of
    ``slots`` taken element by element, each element's slots in the order given."""
    if batch.table is None:
        return
    length = batch.table.shape[0]
    stacked = torch.stack(slots, dim=1).reshape(-1)  # element-major order
    k = _first(stacked >= length)
    if k is not None:
        raise ValueError(
            f"kv-canary: SWA slot {int(stacked[k])} is outside full_to_swa_index_mapping length "
            f"{length}"
        )


def _translate(batch: _Batch, slots: torch.Tensor) -> torch.Tensor:
    """T(s) of CONTRACT §12 item 3: through the SWA table for s >= 0, s itself otherwise."""
    if batch.table is None:
        return slots
    translated = batch.table[slots.clamp(min=0)]
    return torch.where(slots >= 0, translated, slots)


def _entry_chunks(batch: _Batch) -> Iterator[Entries]:
    """The verify entries of all rows in plan order, a chunk of whole rows at a time, each
    chunk checked against P13 before it is translated (so nothing past the table is read)."""
    counts = batch.entries
    ends = torch.cumsum(counts, 0).tolist()
    bs = len(ends)
    start = 0
    while start < bs:
        before = ends[start - 1] if start else 0
        stop = max(bisect.bisect_right(ends, before + _CHUNK_ENTRIES, lo=start), start + 1)
        if ends[stop - 1] > before:
            yield _entries(batch, start, stop, ends[stop - 1] - before)
        start = stop


def _refuse_rows_past_table(batch: _Batch) -> None:
    """P13 for a plan whose entries overflow it, so are checked but never made.

    The slots an entry of row ``r`` translates are ``req_to_token[rp, lo:prefix]`` with
    ``lo = max(window_start - 1, 0)`` (its own, and its predecessor's); the seed is among
    them. A block of rows is read at a time, as whole column ranges, to find the first row
    that holds a slot past the table; that row's entries are then made, which raises P13 for
    the slot that comes first in plan order.
    """
    assert batch.table is not None
    length = batch.table.shape[0]
    rows = torch.nonzero(batch.entries > 0).flatten()
    if rows.numel() == 0:
        return
    low = (batch.window_start[rows] - 1).clamp(min=0)
    high = batch.prefix[rows]
    first_column, last_column = int(low.min()), int(high.max())
    width = last_column - first_column
    columns = torch.arange(first_column, last_column, device=rows.device)
    step = max(1, _CHUNK_ENTRIES // width)
    # Only the columns some row needs, never the whole width of the table.
    table_columns = batch.req_to_token[:, first_column:last_column]
    for start in range(0, rows.numel(), step):
        block = table_columns[batch.pool_rows[rows[start : start + step]]]
        inside = (columns >= low[start : start + step, None]) & (
            columns < high[start : start + step, None]
        )
        found = _first((inside & (block >= length)).any(dim=1))
        if found is not None:
            row = int(rows[start + found])
            _entries(batch, row, row + 1, int(batch.entries[row]))  # raises P13
            raise AssertionError("unreachable: the row holds a slot past the table")


def _entries(batch: _Batch, start: int, stop: int, total: int) -> Entries:
    """The ``total`` verify entries of rows ``[start, stop)``, in plan order."""
    counts = batch.entries[start:stop]
    device = counts.device
    row = torch.repeat_interleave(
        torch.arange(start, stop, device=device), counts, output_size=total
    )
    first_entry = torch.cumsum(counts, 0) - counts  # of each row, within the chunk
    rank = torch.arange(total, device=device) - first_entry[row - start]
    positions = batch.window_start[row] + rank
    pool_rows = batch.pool_rows[row]
    slots = _table_at(batch, pool_rows, positions)
    has_prev = positions > 0
    prev = _table_at(batch, pool_rows, (positions - 1).clamp(min=0))
    prev = torch.where(has_prev, prev, -1)  # -1 at position 0: the chain head (§7)
    _refuse_past_table(batch, slots, prev)

    expected = torch.full_like(positions, -1)
    if batch.pool is not None and batch.valid_lens is not None:
        pool = batch.pool
        index = positions + batch.offset
        read = (index >= 0) & (index < batch.valid_lens[row])
        flat = pool.view(-1)
        expected[read] = flat[pool_rows[read] * pool.shape[1] + index[read]].to(torch.int64)
    return Entries(
        slots=_translate(batch, slots),
        expected_tokens=expected,
        positions=positions,
        prev_slots=torch.where(has_prev, _translate(batch, prev), -1),
    )


def fill_plans(launch: PlanLaunch) -> None:
    """Write a checked launch's results into its plans: nothing else is written."""
    verify, write = launch.verify_plan, launch.write_plan
    if launch.entries is not None:
        total = launch.entries.slots.shape[0]
        verify.verify_slot_indices[:total] = launch.entries.slots
        verify.verify_expected_tokens[:total] = launch.entries.expected_tokens
        verify.verify_expected_positions[:total] = launch.entries.positions
        verify.verify_prev_slot_indices[:total] = launch.entries.prev_slots
    verify.verify_num_valid.fill_(launch.num_valid)
    verify.enable.fill_(launch.enable)
    bs = launch.write_seeds.shape[0]
    write.write_offsets[: bs + 1] = launch.write_offsets
    write.write_offsets[bs + 1 :] = 0
    write.write_seed_slot_indices[:bs] = launch.write_seeds
    write.write_num_valid_reqs.fill_(bs)
