"""Triton kernel bodies of the plan (CONTRACT §12) and of the expected-token scatter (§13).

Undecorated, like ``canary.kernels``: ``canary._runtime`` binds this module twice too,
compiled for CUDA/ROCm tensors and interpreted for CPU tensors, each binding in a namespace of
its own. The kernels use Triton builtins and each other only; prefix sums and totals go
through ``tl.associative_scan`` / ``tl.reduce`` with ``tl.standard._sum_combine``, the
combine function ``tl.cumsum`` and ``tl.sum`` use: compiled, it is an ordinary ``@jit``
helper; interpreted, Triton recognises it and runs numpy's ``cumsum`` / ``sum`` instead of
calling it element by element.

Units: a *row* is a request of the batch (index into ``req_pool_indices``), a *pool row* is a
row of ``req_to_token`` (or of the expected-token pool), a *position* is a token index inside a
pool row, an *entry* is an index into the verify plan's entry tensors, a *slot* a KV slot.
Every address is computed in int64: a page table or a pool may hold more than 2^31 elements.
"""

import triton.language as tl


def window_first(prefix_len, swa_window):
    # First position of a row's verify window: max(0, prefix_len - swa_window) for a sliding
    # window (swa_window > 0), else 0. prefix_len >= 0 here (the callers clear negative ones).
    return tl.where(swa_window > 0, tl.maximum(prefix_len - swa_window, 0), 0)


def to_swa(slots, mask, swa_lut_ptr):
    # T(s): the SWA slot of full-pool slot s >= 0 (int64), a negative slot unchanged. Only the
    # lanes of `mask` load; the host has checked that each such slot is below the table length.
    mapped = mask & (slots >= 0)
    swa = tl.load(swa_lut_ptr + tl.where(mapped, slots, 0), mask=mapped, other=0)
    return tl.where(slots >= 0, swa, slots)


def find_row(items, live, offsets_ptr, num_rows, search_steps):
    # For each item index (int64), the row r in [0, num_rows) with
    # offsets[r] <= item < offsets[r + 1], by binary search over the exclusive prefix sums
    # `offsets` (int64 [num_rows + 1], non-decreasing, offsets[num_rows] > every live item).
    # Invariant: offsets[lo] <= item < offsets[hi]; each step halves hi - lo, so
    # search_steps = num_rows.bit_length() steps leave hi = lo + 1. Dead lanes load nothing.
    lo = items * 0
    hi = lo + num_rows
    for _ in range(search_steps):
        mid = (lo + hi) >> 1
        below = tl.load(offsets_ptr + mid, mask=live, other=0) <= items
        lo = tl.where(below, mid, lo)
        hi = tl.where(below, hi, mid)
    return lo


def plan_offsets_kernel(
    req_pool_indices_ptr,  # int64 [bs]: pool row of each row; 0 = padding row
    prefix_lens_ptr,  # int64 [bs]: positions already written (the verify window ends there)
    extend_seq_lens_ptr,  # int64 [bs]: positions written this step
    req_to_token_ptr,  # int32 [pool rows, row_len]: full-pool slot of each position
    row_len,  # positions per pool row (req_to_token is contiguous: also its row stride)
    swa_lut_ptr,  # int64 [lut_len]: SWA slot of each full-pool slot; read only with HAS_SWA
    swa_window,  # positions of a sliding window, 0 = full attention (host-clamped to row_len)
    bs,  # rows of the batch, <= 4096
    verify_capacity,  # entries of the verify plan
    write_capacity,  # rows of the write plan, >= bs
    verify_offsets_ptr,  # int64 [bs + 1], out: exclusive prefix sums of each row's entries
    write_offsets_ptr,  # int64 [write_capacity + 1], out
    write_seeds_ptr,  # int64 [write_capacity], out for [0, bs): slot a row's chain continues
    write_num_valid_ptr,  # int32 [1], out: bs
    verify_num_valid_ptr,  # int32 [1], out: entries planned, capacity on overflow
    enable_ptr,  # int32 [1], out: 0 on overflow
    HAS_SWA: tl.constexpr,
    BLOCK: tl.constexpr,  # rows per step of the one program
):
    # One program walks the batch BLOCK rows at a time, carrying both running totals; lanes
    # past bs count nothing, so lane bs of the last step stores the totals into
    # offsets[bs].
    lanes = tl.arange(0, BLOCK)
    verify_total = (bs * 0).to(tl.int64)
    write_total = (bs * 0).to(tl.int64)
    for start in range(0, bs + 1, BLOCK):
        rows = (start + lanes).to(tl.int64)
        in_batch = rows < bs
        pool_row = tl.load(req_pool_indices_ptr + rows, mask=in_batch, other=0)
        real = in_batch & (pool_row != 0)  # a padding row's lengths are never read
        prefix_len = tl.load(prefix_lens_ptr + rows, mask=real, other=0)
        prefix_len = tl.maximum(prefix_len, 0)  # a negative prefix has no entry and no seed
        extend_len = tl.load(extend_seq_lens_ptr + rows, mask=real, other=0)
        num_verify = prefix_len - window_first(prefix_len, swa_window)
        num_write = tl.maximum(extend_len, 0)
        verify_incl = tl.associative_scan(num_verify, 0, tl.standard._sum_combine)
        write_incl = tl.associative_scan(num_write, 0, tl.standard._sum_combine)
        upto_bs = rows <= bs
        tl.store(verify_offsets_ptr + rows, verify_total + verify_incl - num_verify, mask=upto_bs)
        tl.store(write_offsets_ptr + rows, write_total + write_incl - num_write, mask=upto_bs)
        # seed: the slot of position prefix_len - 1, for a row that writes after a prefix
        seeded = real & (num_write > 0) & (prefix_len > 0)
        seed_at = req_to_token_ptr + pool_row * row_len + prefix_len - 1
        seed = tl.load(seed_at, mask=seeded, other=0).to(tl.int64)
        if HAS_SWA:
            seed = to_swa(seed, seeded, swa_lut_ptr)
        tl.store(write_seeds_ptr + rows, tl.where(seeded, seed, -1), mask=in_batch)
        verify_total += tl.reduce(num_verify, 0, tl.standard._sum_combine)
        write_total += tl.reduce(num_write, 0, tl.standard._sum_combine)
    # write_offsets[bs + 1:] = 0
    for start in range(bs + 1, write_capacity + 1, BLOCK):
        rows = (start + lanes).to(tl.int64)
        tl.store(write_offsets_ptr + rows, rows * 0, mask=rows <= write_capacity)
    fits = verify_total <= verify_capacity
    tl.store(verify_num_valid_ptr, tl.where(fits, verify_total, verify_capacity).to(tl.int32))
    tl.store(enable_ptr, tl.where(fits, 1, 0).to(tl.int32))
    tl.store(write_num_valid_ptr, bs.to(tl.int32))


def plan_entries_kernel(
    req_pool_indices_ptr,  # int64 [bs]
    prefix_lens_ptr,  # int64 [bs]
    req_to_token_ptr,  # int32 [pool rows, row_len]
    row_len,  # positions per pool row of req_to_token
    swa_lut_ptr,  # int64 [lut_len]; read only with HAS_SWA
    swa_window,  # positions, 0 = full attention (host-clamped)
    pool_ptr,  # int32 [pool rows, pool_len]: expected tokens; read only with HAS_POOL
    pool_len,  # positions per row of the expected-token pool
    valid_lens_ptr,  # int64 [bs]: valid leading positions of each row's pool row (HAS_POOL)
    token_offset,  # positions added before indexing the pool (host-clamped, see the launcher)
    bs,  # rows of the batch
    search_steps,  # bs.bit_length(): binary-search steps over verify_offsets
    verify_offsets_ptr,  # int64 [bs + 1], from plan_offsets_kernel: [bs] is the total
    enable_ptr,  # int32 [1], from plan_offsets_kernel: 0 on overflow
    slot_out_ptr,  # int64 [capacity]: verify_slot_indices
    token_out_ptr,  # int64 [capacity]: verify_expected_tokens
    position_out_ptr,  # int64 [capacity]: verify_expected_positions
    prev_out_ptr,  # int64 [capacity]: verify_prev_slot_indices
    HAS_SWA: tl.constexpr,
    HAS_POOL: tl.constexpr,
    BLOCK: tl.constexpr,  # entries per program
):
    entries = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    total = tl.load(verify_offsets_ptr + bs)
    # per lane, like the verify kernel: the interpreter mistypes a block `&` a scalar bool
    enabled = tl.load(enable_ptr + entries * 0) != 0
    live = enabled & (entries < total)  # enabled means total <= capacity
    row = find_row(entries, live, verify_offsets_ptr, bs, search_steps)
    first_entry = tl.load(verify_offsets_ptr + row, mask=live, other=0)
    pool_row = tl.load(req_pool_indices_ptr + row, mask=live, other=0)
    prefix_len = tl.load(prefix_lens_ptr + row, mask=live, other=0)  # > 0: the row has entries
    position = window_first(prefix_len, swa_window) + (entries - first_entry)
    row_start = req_to_token_ptr + pool_row * row_len
    slot = tl.load(row_start + position, mask=live, other=0).to(tl.int64)
    has_prev = live & (position > 0)
    prev = tl.load(row_start + position - 1, mask=has_prev, other=0).to(tl.int64)
    if HAS_SWA:
        slot = to_swa(slot, live, swa_lut_ptr)
        prev = to_swa(prev, has_prev, swa_lut_ptr)
    prev = tl.where(position > 0, prev, -1)  # position 0 is the chain head
    expected = entries * 0 - 1  # -1: do not check
    if HAS_POOL:
        at = position + token_offset
        valid_len = tl.load(valid_lens_ptr + row, mask=live, other=0)
        known = live & (at >= 0) & (at < valid_len)  # never past the valid length
        token = tl.load(pool_ptr + pool_row * pool_len + at, mask=known, other=0)
        expected = tl.where(known, token.to(tl.int64), expected)
    tl.store(slot_out_ptr + entries, slot, mask=live)
    tl.store(token_out_ptr + entries, expected, mask=live)
    tl.store(position_out_ptr + entries, position, mask=live)
    tl.store(prev_out_ptr + entries, prev, mask=live)


def scatter_req_token_ids_kernel(
    flat_in_ptr,  # int64 [num_tokens]: every request's tokens, one request after another
    offsets_ptr,  # int64 [bs + 1]: request r owns tokens [offsets[r], offsets[r + 1])
    req_pool_indices_ptr,  # int64 [bs]: pool row of each request
    pool_out_ptr,  # int32 [pool rows, row_len], written in place
    num_tokens,  # tokens of flat_in (== offsets[bs])
    bs,  # requests
    search_steps,  # bs.bit_length(): binary-search steps over offsets
    row_len,  # positions per pool row (pool_out is contiguous: also its row stride)
    BLOCK: tl.constexpr,  # tokens per program
):
    tokens = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = tokens < num_tokens
    request = find_row(tokens, live, offsets_ptr, bs, search_steps)
    position = tokens - tl.load(offsets_ptr + request, mask=live, other=0)
    pool_row = tl.load(req_pool_indices_ptr + request, mask=live, other=0)
    kept = live & (position < row_len)  # a token past the row's end is dropped
    value = tl.load(flat_in_ptr + tokens, mask=kept, other=0).to(tl.int32)  # low 32 bits
    tl.store(pool_out_ptr + pool_row * row_len + position, value, mask=kept)
