"""Triton kernel bodies of the canary.

The functions here are deliberately *not* decorated: ``canary._runtime`` binds each of them
twice, once as a compiled ``JITFunction`` (CUDA/ROCm tensors) and once as an interpreted
function (CPU tensors), so both can run in one process without ``TRITON_INTERPRET``.
Because of that, kernels call only Triton builtins and each other — never the ``@jit``
helpers of ``triton.language.standard`` (``tl.zeros``, ``tl.sum``, ...), which are bound to
one mode when Triton is imported.

Conventions: every address is computed in int64 (a KV pool is many GiB); hash state is
``tl.uint64`` so that ``>>`` is logical; int64 fields are bitcast to and from uint64.
"""

import triton.language as tl

SPLITMIX_MUL_1 = tl.constexpr(0xBF58476D1CE4E5B9)
SPLITMIX_MUL_2 = tl.constexpr(0x94D049BB133111EB)
# splitmix64(CANARY_CHAIN_ANCHOR), the chain value before the first token of a sequence
ANCHOR_HASH = tl.constexpr(0xDE7FAE23A9A1B716)
FAIL_CHAIN = tl.constexpr(1)
FAIL_POSITION = tl.constexpr(2)
FAIL_REAL_KV = tl.constexpr(4)
FAIL_WRITE_TOKEN = tl.constexpr(8)
FAIL_WRITE_POSITION = tl.constexpr(16)
FAIL_TOKEN = tl.constexpr(32)


def splitmix64(x):
    x = x ^ (x >> 30)
    x = x * SPLITMIX_MUL_1
    x = x ^ (x >> 27)
    x = x * SPLITMIX_MUL_2
    return x ^ (x >> 31)


def splitmix64_mix3(a, b, c):
    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)


def as_u64(x):
    return x.to(tl.uint64, bitcast=True)


def as_i64(x):
    return x.to(tl.int64, bitcast=True)


def fold_source(slots, mask, base_addr, row_stride_bytes, page_size, bytes_per_token, num_words):
    # One source's bytes for every lane: little-endian u64 words, acc = splitmix64(acc ^ w).
    # Lanes that are masked off (or hold a negative slot) load nothing and fold to garbage
    # that the caller discards.
    live = mask & (slots >= 0)
    # The division by page_size happens here, once per slot and source, never per word.
    rows = slots // page_size
    cols = (slots % page_size) * bytes_per_token
    starts = base_addr + rows * row_stride_bytes + cols  # int64 byte addresses
    # Every window starts 16-byte aligned (16-aligned data_ptr, row stride and bytes per
    # token, CONTRACT §3) and is a whole number of 16-byte chunks, so each lane reads its window
    # as [2]-word tiles: the compiler, told the alignment, issues one 16-byte load per chunk.
    pair = tl.arange(0, 2)
    words = starts.to(tl.pointer_type(tl.uint64))[:, None] + pair[None, :]  # [BLOCK, 2]
    words = tl.max_contiguous(tl.multiple_of(words, [16, 2]), [1, 2])
    live_pair = live[:, None] & (pair[None, :] < 2)
    acc = as_u64(slots * 0)
    for chunk in range(0, num_words // 2):
        low, high = tl.split(tl.load(words + 2 * chunk, mask=live_pair, other=0))
        acc = splitmix64(acc ^ low)
        acc = splitmix64(acc ^ high)
    return acc


def fold_sources(
    slots,
    mask,
    addr0, stride0, page0, bpt0, words0,  # source 0: base address (bytes), row stride (bytes),
    addr1, stride1, page1, bpt1, words1,  # page size (slots), bytes per token, u64 words read
    addr2, stride2, page2, bpt2, words2,
    addr3, stride3, page3, bpt3, words3,
    NUM_SOURCES: tl.constexpr,
):
    # h = 0; for each source in order: h = splitmix64(h ^ fold(source))
    h = as_u64(slots * 0)
    if NUM_SOURCES > 0:
        h = splitmix64(h ^ fold_source(slots, mask, addr0, stride0, page0, bpt0, words0))
    if NUM_SOURCES > 1:
        h = splitmix64(h ^ fold_source(slots, mask, addr1, stride1, page1, bpt1, words1))
    if NUM_SOURCES > 2:
        h = splitmix64(h ^ fold_source(slots, mask, addr2, stride2, page2, bpt2, words2))
    if NUM_SOURCES > 3:
        h = splitmix64(h ^ fold_source(slots, mask, addr3, stride3, page3, bpt3, words3))
    return h


def fingerprint_kernel(
    out_ptr,  # int64 [num_entries]: the real-KV hash of each entry
    slot_ptr,  # int64 [num_entries]: slot of each entry; negative slots hash nothing
    num_entries,  # entries in slot_ptr / out_ptr
    addr0, stride0, page0, bpt0, words0,
    addr1, stride1, page1, bpt1, words1,
    addr2, stride2, page2, bpt2, words2,
    addr3, stride3, page3, bpt3, words3,
    NUM_SOURCES: tl.constexpr,
    BLOCK: tl.constexpr,  # entries per program
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_entries
    slots = tl.load(slot_ptr + offs, mask=mask, other=0).to(tl.int64)
    h = fold_sources(
        slots, mask,
        addr0, stride0, page0, bpt0, words0,
        addr1, stride1, page1, bpt1, words1,
        addr2, stride2, page2, bpt2, words2,
        addr3, stride3, page3, bpt3, words3,
        NUM_SOURCES,
    )
    tl.store(out_ptr + offs, as_i64(h), mask=mask)


def append_violation(
    ring_ptr,  # int64 [ring_capacity, 8]
    ring_capacity,  # rows of the ring
    write_index_ptr,  # int32 [1]: next row to take; counts past the capacity
    kind, slot, position, stored_token, expected_token, chain, aux, bits,
    emit,  # which lanes report a violation
):
    # Fill-once ring: every violation takes an index; only those in [0, capacity) are stored
    # (an index driven negative, by its caller or by wrapping past 2**31, stores nothing).
    # relaxed: the index only has to be unique; the host reads the ring after the launch
    idx = tl.atomic_add(write_index_ptr + slot * 0, 1, mask=emit, sem="relaxed")
    keep = emit & (idx < ring_capacity) & (idx >= 0)
    row = ring_ptr + idx.to(tl.int64) * 8
    tl.store(row + 0, kind + slot * 0, mask=keep)
    tl.store(row + 1, slot, mask=keep)
    tl.store(row + 2, position, mask=keep)
    tl.store(row + 3, stored_token, mask=keep)
    tl.store(row + 4, expected_token, mask=keep)
    tl.store(row + 5, chain, mask=keep)
    tl.store(row + 6, aux, mask=keep)
    tl.store(row + 7, bits.to(tl.int64), mask=keep)


def verify_kernel(
    buf_ptr,  # int64 view of canary_buf: [num_slots, slot_stride_words]
    slot_stride_words,  # int64 words between slots
    kind,  # CanaryLaunchTag stamped into each row
    ring_ptr, ring_capacity, write_index_ptr,
    slot_run_counter_ptr,  # int64 [1]
    kernel_run_counter_ptr,  # int64 [1]
    slot_idx_ptr,  # int64 [capacity]
    expected_token_ptr,  # int64 [capacity], -1 = do not check
    expected_pos_ptr,  # int64 [capacity]
    prev_slot_ptr,  # int64 [capacity]: < 0 anchor, 0 unchecked, else predecessor slot
    num_valid_ptr,  # int32 [1]
    enable_ptr,  # int32 [1]
    capacity,  # entries in the plan
    addr0, stride0, page0, bpt0, words0,
    addr1, stride1, page1, bpt1, words1,
    addr2, stride2, page2, bpt2, words2,
    addr3, stride3, page3, bpt3, words3,
    NUM_SOURCES: tl.constexpr,  # 0 in mode NONE
    CHECK_TOKEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    enabled = tl.load(enable_ptr) != 0
    num_valid = tl.load(num_valid_ptr).to(tl.int64)
    active = tl.minimum(tl.maximum(num_valid, 0), capacity)
    if pid == 0:
        tl.atomic_add(kernel_run_counter_ptr, 1, sem="relaxed")
        if enabled:
            tl.atomic_add(slot_run_counter_ptr, active, sem="relaxed")
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    in_plan = offs < capacity
    slots = tl.load(slot_idx_ptr + offs, mask=in_plan, other=0)
    # `enabled` is re-read per lane: the interpreter mistypes a block `&` a scalar bool.
    enabled_lanes = tl.load(enable_ptr + offs * 0) != 0
    live = in_plan & (offs < active) & enabled_lanes & (slots != 0)
    fields = buf_ptr + slots * slot_stride_words
    token = tl.load(fields + 0, mask=live, other=0)
    position = tl.load(fields + 1, mask=live, other=0)
    prev_hash = tl.load(fields + 2, mask=live, other=0)
    real_kv = tl.load(fields + 3, mask=live, other=0)

    prev = tl.load(prev_slot_ptr + offs, mask=live, other=0)
    has_prev = live & (prev > 0)
    prev_fields = buf_ptr + tl.where(has_prev, prev, 0) * slot_stride_words
    p_token = tl.load(prev_fields + 0, mask=has_prev, other=0)
    p_position = tl.load(prev_fields + 1, mask=has_prev, other=0)
    p_prev_hash = tl.load(prev_fields + 2, mask=has_prev, other=0)
    linked = as_i64(splitmix64_mix3(as_u64(p_prev_hash), as_u64(p_token), as_u64(p_position)))
    anchor = as_i64(as_u64(slots * 0) + ANCHOR_HASH)
    expected_chain = tl.where(prev < 0, anchor, tl.where(prev == 0, prev_hash, linked))
    bits = tl.where(expected_chain != prev_hash, FAIL_CHAIN, 0)

    expected_token = slots * 0 - 1
    if CHECK_TOKEN:
        expected_token = tl.load(expected_token_ptr + offs, mask=live, other=-1)
        bits |= tl.where((expected_token != -1) & (token != expected_token), FAIL_TOKEN, 0)
    expected_pos = tl.load(expected_pos_ptr + offs, mask=live, other=0)
    bits |= tl.where(position != expected_pos, FAIL_POSITION, 0)
    current = as_i64(
        fold_sources(
            slots, live,
            addr0, stride0, page0, bpt0, words0,
            addr1, stride1, page1, bpt1, words1,
            addr2, stride2, page2, bpt2, words2,
            addr3, stride3, page3, bpt3, words3,
            NUM_SOURCES,
        )
    )
    bits |= tl.where(current != real_kv, FAIL_REAL_KV, 0)
    append_violation(
        ring_ptr, ring_capacity, write_index_ptr,
        kind, slots, position, token, expected_token, prev_hash, expected_chain, bits,
        live & (bits != 0),
    )


def write_kernel(
    buf_ptr,  # int64 view of canary_buf: [num_slots, slot_stride_words]
    slot_stride_words,
    kind,
    ring_ptr, ring_capacity, write_index_ptr,
    slot_run_counter_ptr, kernel_run_counter_ptr,
    chain_assert_ptr,  # int32 [1]: enable_chain_position_assert
    offsets_ptr,  # int64 [capacity + 1]: entry range of each request
    seed_ptr,  # int64 [capacity]: slot continuing the chain, < 0 = anchor
    num_valid_ptr,  # int32 [1]
    capacity,  # requests in the plan
    input_ids_ptr, positions_ptr, out_cache_loc_ptr,  # [num_entries] each
    real_kv_ptr,  # int64 [num_entries]: fingerprint of each entry's slot (0 in mode NONE)
    expected_tokens_ptr, expected_positions_ptr,  # [num_entries], read only with INPUT_ASSERT
    INPUT_ASSERT: tl.constexpr,
):
    # One program (one warp) per request: the chain is serial along a request, parallel
    # across requests. The chain itself is a few dozen dependent integer operations per
    # entry; what would make it slow is memory latency, so each entry's inputs are loaded
    # together, unconditionally, one entry ahead of the chain (the loads of entry i + 1 are in
    # flight while entry i is hashed), skipped entries (slot < 0) are masked rather than
    # branched around, stores are never waited for, and atomics are relaxed.
    req = tl.program_id(0).to(tl.int64)
    if req == 0:
        tl.atomic_add(kernel_run_counter_ptr, 1, sem="relaxed")
    num_valid = tl.load(num_valid_ptr).to(tl.int64)
    active = tl.minimum(tl.maximum(num_valid, 0), capacity)
    if req < active:
        start = tl.load(offsets_ptr + req)
        end = tl.load(offsets_ptr + req + 1)
        seed = tl.load(seed_ptr + req)
        seeded = seed >= 0
        seed_fields = buf_ptr + tl.where(seeded, seed, 0) * slot_stride_words
        s_token = tl.load(seed_fields + 0, mask=seeded, other=0)
        s_position = tl.load(seed_fields + 1, mask=seeded, other=0)
        s_prev_hash = tl.load(seed_fields + 2, mask=seeded, other=0)
        running = tl.where(
            seeded,
            splitmix64_mix3(as_u64(s_prev_hash), as_u64(s_token), as_u64(s_position)),
            as_u64(seed * 0) + ANCHOR_HASH,
        )
        check_position = seeded & (tl.load(chain_assert_ptr) != 0)
        prev_position = s_position
        written = start * 0
        # entry `start`'s inputs; an empty request loads nothing
        has_next = start < end
        next_slot = tl.load(out_cache_loc_ptr + start, mask=has_next, other=-1).to(tl.int64)
        next_token = tl.load(input_ids_ptr + start, mask=has_next, other=0).to(tl.int64)
        next_position = tl.load(positions_ptr + start, mask=has_next, other=0).to(tl.int64)
        next_real_kv = tl.load(real_kv_ptr + start, mask=has_next, other=0)
        for i in range(start, end):
            slot = next_slot
            token = next_token
            position = next_position
            real_kv = next_real_kv
            has_next = i + 1 < end
            next_slot = tl.load(out_cache_loc_ptr + i + 1, mask=has_next, other=-1).to(tl.int64)
            next_token = tl.load(input_ids_ptr + i + 1, mask=has_next, other=0).to(tl.int64)
            next_position = tl.load(positions_ptr + i + 1, mask=has_next, other=0).to(tl.int64)
            next_real_kv = tl.load(real_kv_ptr + i + 1, mask=has_next, other=0)
            writing = slot >= 0  # a negative slot is skipped entirely
            if INPUT_ASSERT:
                want_token = tl.load(expected_tokens_ptr + i, mask=writing, other=0).to(tl.int64)
                want_position = tl.load(expected_positions_ptr + i, mask=writing, other=0)
                want_position = want_position.to(tl.int64)
                input_bits = tl.where(token != want_token, FAIL_WRITE_TOKEN, 0)
                input_bits |= tl.where(position != want_position, FAIL_WRITE_POSITION, 0)
                append_violation(
                    ring_ptr, ring_capacity, write_index_ptr,
                    kind, slot, position, token, want_token, as_i64(running), want_position,
                    input_bits, writing & (input_bits != 0),
                )
            successor = prev_position + 1  # int64: wraps from 2**63 - 1 to -2**63
            # Uniform across the program (one request), so a branch, not a mask: a request
            # from the anchor, or with the assert off, skips the append entirely (a third of
            # an entry's work under the CPU interpreter, which runs masked-off code too).
            if check_position:
                append_violation(
                    ring_ptr, ring_capacity, write_index_ptr,
                    kind, slot, position, token, token, as_i64(running), successor,
                    slot * 0 + FAIL_WRITE_POSITION,
                    writing & check_position & (position != successor),
                )
            prev_position = tl.where(writing & check_position, position, prev_position)
            fields = buf_ptr + tl.where(writing, slot, 0) * slot_stride_words
            tl.store(fields + 0, token, mask=writing)
            tl.store(fields + 1, position, mask=writing)
            tl.store(fields + 2, as_i64(running), mask=writing)
            tl.store(fields + 3, real_kv, mask=writing)
            running = tl.where(
                writing, splitmix64_mix3(running, as_u64(token), as_u64(position)), running
            )
            written += tl.where(writing, 1, 0)
        tl.atomic_add(slot_run_counter_ptr, written, sem="relaxed")


def hash_kernel(
    out_ptr,  # int64 [n]: the hash of each element
    a_ptr, b_ptr, c_ptr,  # int64 [n] each; b and c are read only by MIX3
    n,  # elements
    MIX3: tl.constexpr,  # False: splitmix64(a); True: splitmix64_mix3(a, b, c)
    BLOCK: tl.constexpr,
):
    # The hash primitives on their own, so that they can be pinned against CONTRACT §2.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = as_u64(tl.load(a_ptr + offs, mask=mask, other=0))
    if MIX3:
        b = as_u64(tl.load(b_ptr + offs, mask=mask, other=0))
        c = as_u64(tl.load(c_ptr + offs, mask=mask, other=0))
        h = splitmix64_mix3(a, b, c)
    else:
        h = splitmix64(a)
    tl.store(out_ptr + offs, as_i64(h), mask=mask)
