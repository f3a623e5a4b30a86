"""The plan: an engine's batch becomes a verify plan and a write plan (CONTRACT §12).

Written from the contract alone, on numpy arrays, vectorised so that engine-scale batches
(4096 requests, prefixes of 8k+ tokens, 70,000+ verify entries) take milliseconds. Every rule
that a value can break (P2 to P6 and P8 to P13) is checked before any array is written, so a
plan that raises leaves both plans as they were; the rules about kinds, contiguity, dtypes and
devices of tensors (P1, P7, P9) have no numpy counterpart and are the suite's to check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.chain import VerifyPlan, WritePlan

#: REQ_POOL_IDX_PADDING: pool row 0 is the padding row of a batch.
REQ_POOL_IDX_PADDING = 0
#: The per-launch cap on the rows of a batch (P4).
MAX_PLAN_REQS = 4096


@dataclass(frozen=True)
class PlannedEntries:
    """The verify entries a batch asks for, before the capacity is applied (§12 items 2, 3)."""

    slots: np.ndarray  # int64 [total]
    prev_slots: np.ndarray  # int64 [total]
    positions: np.ndarray  # int64 [total]
    expected_tokens: np.ndarray  # int64 [total]
    rows: np.ndarray  # int64 [total]: the batch row of each entry


def plan(
    verify_plan: VerifyPlan,
    write_plan: WritePlan,
    *,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token: np.ndarray,
    swa_window_size: int,
    full_to_swa_index_mapping: np.ndarray | None,
    verify_capacity: int,
    req_to_verify_expected_tokens: np.ndarray | None,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset: int,
) -> None:
    """``launch_canary_plan_kernels`` on numpy arrays: fill both plans in place (§12)."""
    _check_optional_arguments(
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
    )
    rows = _vector(req_pool_indices, "req_pool_indices")
    bs = rows.shape[0]
    capacity = _check_sizes(
        verify_plan,
        write_plan,
        bs=bs,
        verify_capacity=verify_capacity,
        swa_window_size=swa_window_size,
    )
    prefixes = _vector(prefix_lens, "prefix_lens", bs)
    extends = _vector(extend_seq_lens, "extend_seq_lens", bs)
    valid_lens = (
        None
        if req_to_verify_expected_tokens is None
        else _vector(
            req_to_verify_expected_tokens_valid_lens, "req_to_verify_expected_tokens_valid_lens", bs
        )
    )
    _check_rows(rows, prefixes, valid_lens, req_to_token, req_to_verify_expected_tokens)

    entries = plan_entries(
        req_pool_indices=rows,
        prefix_lens=prefixes,
        req_to_token=req_to_token,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    )
    writes, seeds = _write_metadata(rows, prefixes, extends, req_to_token)
    entries, seeds = _translated(entries, seeds, full_to_swa_index_mapping)

    # the checks are done: from here on the plans change
    _fill_verify_plan(verify_plan, entries, capacity)
    _fill_write_plan(write_plan, writes, seeds)


def _check_optional_arguments(
    *,
    swa_window_size: int,
    full_to_swa_index_mapping: np.ndarray | None,
    req_to_verify_expected_tokens: np.ndarray | None,
    req_to_verify_expected_tokens_valid_lens,
) -> None:
    """Refuse an SWA window without its mapping (P2), expected tokens without their lengths (P3)."""
    if swa_window_size > 0 and full_to_swa_index_mapping is None:
        raise ValueError(
            "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when "
            "swa_window_size > 0"
        )
    if (
        req_to_verify_expected_tokens is not None
        and req_to_verify_expected_tokens_valid_lens is None
    ):
        raise ValueError(
            "kv-canary: launch_canary_plan_kernels requires "
            "req_to_verify_expected_tokens_valid_lens when req_to_verify_expected_tokens is set"
        )


def _check_sizes(
    verify_plan: VerifyPlan,
    write_plan: WritePlan,
    *,
    bs: int,
    verify_capacity: int,
    swa_window_size: int,
) -> int:
    """Check the batch size against the cap and both plans' capacities (P4 to P6) and the
    window's sign (P8); return the verify plan's capacity."""
    if bs > MAX_PLAN_REQS:
        raise ValueError(
            f"kv-canary: launch_canary_plan_kernels supports at most bs={MAX_PLAN_REQS} reqs per "
            f"launch, got bs={bs}. Bump _PLAN_BS_BLOCK_SIZE if real workloads need this."
        )
    capacity = verify_plan.verify_slot_indices.shape[0]
    if verify_capacity != capacity:
        raise ValueError(
            f"kv-canary: launch_canary_plan_kernels verify_capacity={verify_capacity} does not "
            f"match verify_plan_out.verify_slot_indices.shape[0]={capacity}"
        )
    write_req_capacity = write_plan.write_seed_slot_indices.shape[0]
    if bs > write_req_capacity:
        raise ValueError(f"kv-canary: bs={bs} exceeds write_req_capacity={write_req_capacity}")
    if swa_window_size < 0:
        raise ValueError(
            f"kv-canary: launch_canary_plan_kernels swa_window_size must be >= 0, got "
            f"{swa_window_size}"
        )
    return int(capacity)


def _translated(
    entries: PlannedEntries, seeds: np.ndarray, lut: np.ndarray | None
) -> tuple[PlannedEntries, np.ndarray]:
    """The entries' slots and the seeds through the SWA mapping ``lut`` (§12 item 3), each
    checked to be inside it (P13); unchanged without one."""
    # P13: every slot the plan translates, also those of entries an overflow leaves unwritten
    if lut is not None:
        for raw in (entries.slots, entries.prev_slots, seeds):
            _check_translatable(raw, lut)
        entries = PlannedEntries(
            slots=translate(entries.slots, lut),
            prev_slots=translate(entries.prev_slots, lut),
            positions=entries.positions,
            expected_tokens=entries.expected_tokens,
            rows=entries.rows,
        )
        seeds = translate(seeds, lut)
    return entries, seeds


def _fill_verify_plan(verify_plan: VerifyPlan, entries: PlannedEntries, capacity: int) -> None:
    """Write the entries into the verify plan, or disable it where they overflow its capacity."""
    total = entries.slots.shape[0]
    if total <= capacity:
        verify_plan.verify_slot_indices[:total] = entries.slots
        verify_plan.verify_prev_slot_indices[:total] = entries.prev_slots
        verify_plan.verify_expected_positions[:total] = entries.positions
        verify_plan.verify_expected_tokens[:total] = entries.expected_tokens
        verify_plan.verify_num_valid[0] = total
        verify_plan.enable[0] = 1
    else:
        verify_plan.verify_num_valid[0] = capacity
        verify_plan.enable[0] = 0


def _fill_write_plan(write_plan: WritePlan, writes: np.ndarray, seeds: np.ndarray) -> None:
    """Write each row's offsets (of its ``writes`` tokens) and seed into the write plan."""
    bs = writes.shape[0]
    write_plan.write_offsets[:] = 0
    write_plan.write_offsets[1 : bs + 1] = np.cumsum(writes)
    write_plan.write_seed_slot_indices[:bs] = seeds
    write_plan.write_num_valid_reqs[0] = bs


def plan_entries(
    *,
    req_pool_indices: np.ndarray,
    prefix_lens: np.ndarray,
    req_to_token: np.ndarray,
    swa_window_size: int,
    full_to_swa_index_mapping: np.ndarray | None,
    req_to_verify_expected_tokens: np.ndarray | None,
    req_to_verify_expected_tokens_valid_lens: np.ndarray | None,
    kv_token_id_vs_position_offset: int,
) -> PlannedEntries:
    """Every verify entry of a batch, in plan order, with untranslated slots (§12 item 2).

    ``full_to_swa_index_mapping`` is not applied here (``translate`` does it); it is taken so
    that a caller can pass the plan's arguments unchanged.
    """
    del full_to_swa_index_mapping
    rows = np.asarray(req_pool_indices, dtype=np.int64)
    prefixes = np.asarray(prefix_lens, dtype=np.int64)
    starts = window_starts(prefixes, swa_window_size)
    counts = np.where(rows != REQ_POOL_IDX_PADDING, np.maximum(prefixes - starts, 0), 0)
    total = int(counts.sum())
    entry_rows = np.repeat(np.arange(rows.shape[0], dtype=np.int64), counts)
    first_entry = np.cumsum(counts) - counts  # the plan index of each row's first entry
    positions = starts[entry_rows] + (np.arange(total, dtype=np.int64) - first_entry[entry_rows])
    pool_rows = rows[entry_rows]
    table = np.asarray(req_to_token)
    slots = table[pool_rows, positions].astype(np.int64)
    prev_slots = np.full(total, -1, dtype=np.int64)
    has_prev = positions > 0
    prev_slots[has_prev] = table[pool_rows[has_prev], positions[has_prev] - 1]

    expected = np.full(total, -1, dtype=np.int64)
    if req_to_verify_expected_tokens is not None:
        assert req_to_verify_expected_tokens_valid_lens is not None
        valid_lens = np.asarray(req_to_verify_expected_tokens_valid_lens, dtype=np.int64)
        token_positions = positions + int(kv_token_id_vs_position_offset)
        readable = (token_positions >= 0) & (token_positions < valid_lens[entry_rows])
        pool = np.asarray(req_to_verify_expected_tokens)
        expected[readable] = pool[pool_rows[readable], token_positions[readable]]
    return PlannedEntries(
        slots=np.asarray(slots, dtype=np.int64),
        prev_slots=prev_slots,
        positions=positions,
        expected_tokens=expected,
        rows=entry_rows,
    )


def window_starts(prefix_lens: np.ndarray, swa_window_size: int) -> np.ndarray:
    """The first verified position of each row: ``max(0, p - window)``, or 0 without a window."""
    prefixes = np.asarray(prefix_lens, dtype=np.int64)
    if swa_window_size > 0:
        return np.maximum(prefixes - int(swa_window_size), 0)
    return np.zeros_like(prefixes)


def translate(slots: np.ndarray, lut: np.ndarray) -> np.ndarray:
    """§12 item 3: ``lut[s]`` for ``s >= 0``, a negative ``s`` unchanged."""
    slots = np.asarray(slots, dtype=np.int64)
    table = np.asarray(lut)
    out: np.ndarray = slots.copy()
    real = slots >= 0
    out[real] = table[slots[real]]
    return out


def _write_metadata(
    rows: np.ndarray, prefixes: np.ndarray, extends: np.ndarray, req_to_token: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: tokens written (item 5) and the untranslated seed slot (-1: the anchor)."""
    active = rows != REQ_POOL_IDX_PADDING
    writes = np.where(active, np.maximum(extends, 0), 0)
    seeded = active & (writes > 0) & (prefixes > 0)
    seeds = np.full(rows.shape[0], -1, dtype=np.int64)
    if seeded.any():
        table = np.asarray(req_to_token)
        seeds[seeded] = table[rows[seeded], prefixes[seeded] - 1]
    return writes, seeds


def _check_rows(
    rows: np.ndarray,
    prefixes: np.ndarray,
    valid_lens: np.ndarray | None,
    req_to_token: np.ndarray,
    pool: np.ndarray | None,
) -> None:
    """P10 to P12, for the rows that are not padding: the first broken row raises, and within a
    row P10 comes before P11 and P12."""
    active = rows != REQ_POOL_IDX_PADDING
    table_rows, row_len = req_to_token.shape
    limits = [("req_to_token", table_rows)]
    if pool is not None:
        limits.append(("req_to_verify_expected_tokens", pool.shape[0]))
    broken = np.zeros(rows.shape[0], dtype=bool)
    for _, n_rows in limits:
        broken |= (rows < 0) | (rows >= n_rows)
    broken |= prefixes > row_len
    if valid_lens is not None and pool is not None:
        broken |= valid_lens > pool.shape[1]
    broken &= active
    if not broken.any():
        return
    r = int(np.flatnonzero(broken)[0])
    rp = int(rows[r])
    for name, n_rows in limits:
        if not 0 <= rp < n_rows:
            raise IndexError(
                f"kv-canary: req_pool_indices[{r}]={rp} is outside {name}'s {n_rows} rows"
            )
    if prefixes[r] > row_len:
        raise ValueError(
            f"kv-canary: prefix_lens[{r}]={int(prefixes[r])} exceeds req_to_token's row of "
            f"{row_len} entries"
        )
    assert valid_lens is not None and pool is not None
    raise ValueError(
        f"kv-canary: req_to_verify_expected_tokens_valid_lens[{r}]={int(valid_lens[r])} "
        f"exceeds req_to_verify_expected_tokens's row of {pool.shape[1]} entries"
    )


def _check_translatable(slots: np.ndarray, lut: np.ndarray) -> None:
    lut_len = lut.shape[0]
    outside = slots[slots >= lut_len]
    if outside.size:
        raise ValueError(
            f"kv-canary: SWA slot {int(outside[0])} is outside full_to_swa_index_mapping length "
            f"{lut_len}"
        )


def _vector(values, name: str, length: int | None = None) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or (length is not None and array.shape[0] != length):
        want = "1-D" if length is None else f"[{length}]"
        raise ValueError(f"kv-canary: {name} must be {want}, got shape {array.shape}")
    return array.astype(np.int64)
