"""The oracle's write and verify follow CONTRACT §5-§7 on small hand-worked scenarios."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import reference
from reference import (
    CanaryLaunchTag,
    CanaryState,
    FailReason,
    RealKvHashMode,
    Source,
    VerifyPlan,
    WritePlan,
)

I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
KIND = int(CanaryLaunchTag.TAIL_V_SWA)
NUM_SLOTS = 16

CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)
W_TOKEN = int(FailReason.WRITE_TOKEN_MISMATCH)
W_POSITION = int(FailReason.WRITE_POSITION_MISMATCH)


def s64(u: int) -> int:
    return reference.to_signed64(u)


def anchor_hash() -> int:
    return reference.splitmix64(reference.CANARY_CHAIN_ANCHOR)


def step(running: int, token: int, pos: int) -> int:
    return reference.splitmix64_mix3(running, token, pos)


def kv_source(seed: int = 0) -> tuple[Source, np.ndarray]:
    """Four rows of four 16-byte slots (capacity 16), distinct non-zero bytes."""
    backing = np.random.default_rng(seed).integers(1, 256, (4, 64), dtype=np.uint8)
    return Source(backing, 4, 16, 16), backing


def new_state(
    *,
    ring_capacity: int = 8,
    sources: tuple[Source, ...] = (),
    mode: RealKvHashMode = RealKvHashMode.NONE,
    position_assert: bool = False,
    slot_stride_bytes: int = 32,
) -> CanaryState:
    return CanaryState.allocate(
        num_slots=NUM_SLOTS,
        ring_capacity=ring_capacity,
        slot_stride_bytes=slot_stride_bytes,
        kernel_kind=KIND,
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        enable_chain_position_assert=position_assert,
    )


def write_plan(requests: list[tuple[int, int]], *, capacity: int | None = None, num_valid=None):
    """``requests`` is ``[(seed_slot, num_entries), ...]`` laid out back to back."""
    capacity = len(requests) if capacity is None else capacity
    plan = WritePlan.allocate(write_req_capacity=capacity)
    offset = 0
    for index, (seed, count) in enumerate(requests):
        plan.write_seed_slot_indices[index] = seed
        plan.write_offsets[index] = offset
        offset += count
        plan.write_offsets[index + 1] = offset
    plan.write_num_valid_reqs[0] = len(requests) if num_valid is None else num_valid
    return plan


def do_write(state, plan, tokens, positions, slots, *, expected=None):
    reference.write(
        state,
        plan,
        input_ids=np.array(tokens, dtype=np.int64),
        positions=np.array(positions, dtype=np.int64),
        out_cache_loc=np.array(slots, dtype=np.int64),
        enable_write_input_assert=expected is not None,
        expected_input_tokens=None if expected is None else np.array(expected[0], np.int64),
        expected_input_positions=None if expected is None else np.array(expected[1], np.int64),
    )


def verify_plan(entries, *, capacity: int | None = None, num_valid=None, enable: int = 1):
    """``entries`` is ``[(slot, expected_token, expected_position, prev_slot), ...]``."""
    capacity = max(len(entries), 1) if capacity is None else capacity
    plan = VerifyPlan.allocate(verify_capacity=capacity)
    for index, (slot, token, pos, prev) in enumerate(entries):
        plan.verify_slot_indices[index] = slot
        plan.verify_expected_tokens[index] = token
        plan.verify_expected_positions[index] = pos
        plan.verify_prev_slot_indices[index] = prev
    plan.verify_num_valid[0] = len(entries) if num_valid is None else num_valid
    plan.enable[0] = enable
    return plan


def fields(state: CanaryState, slot: int) -> np.ndarray:
    """The four int64 fields of ``slot``, read straight from the little-endian bytes."""
    return state.canary_buf[slot, :32].copy().view("<i8").astype(np.int64)


def assert_fields(state, slot, token, pos, prev_hash, real_kv_hash):
    np.testing.assert_array_equal(
        fields(state, slot),
        np.array([token, pos, prev_hash, real_kv_hash], dtype=np.int64),
        strict=True,
        err_msg=f"canary fields of slot {slot}",
    )


def assert_ring(state, rows, *, write_index=None):
    np.testing.assert_array_equal(
        state.violation_write_index,
        np.array([len(rows) if write_index is None else write_index], dtype=np.int32),
        strict=True,
        err_msg="violation_write_index",
    )
    stored = state.violation_ring[: len(rows)]
    np.testing.assert_array_equal(
        stored, np.array(rows, dtype=np.int64).reshape(-1, 8), strict=True
    )


def assert_counters(state, *, kernel_runs: int, slot_runs: int):
    np.testing.assert_array_equal(
        state.kernel_run_counter, np.array([kernel_runs], np.int64), strict=True
    )
    np.testing.assert_array_equal(
        state.slot_run_counter, np.array([slot_runs], np.int64), strict=True
    )


def fp(source: Source, slot: int) -> int:
    return int(reference.fingerprint([source], [slot])[0])


# A three-token chain from the anchor in slots 3, 5, 7.
CHAIN_SLOTS = [3, 5, 7]
CHAIN_TOKENS = [11, 12, 13]
CHAIN_POSITIONS = [0, 1, 2]


def written_chain(**state_options) -> CanaryState:
    state = new_state(**state_options)
    do_write(state, write_plan([(-1, 3)]), CHAIN_TOKENS, CHAIN_POSITIONS, CHAIN_SLOTS)
    return state


def chain_verify_plan(**options):
    return verify_plan(
        [(3, 11, 0, -1), (5, 12, 1, 3), (7, 13, 2, 5)],
        **options,
    )


# ---------------------------------------------------------------------------------------------
# write


def test_write_chain_of_three_from_anchor():
    """A request seeded with -1 stamps token, position, the running chain and the real-KV hash."""
    source, _ = kv_source()
    state = written_chain(sources=(source,), mode=RealKvHashMode.ALL)
    h0 = anchor_hash()
    h1 = step(h0, 11, 0)
    h2 = step(h1, 12, 1)
    assert_fields(state, 3, 11, 0, s64(h0), fp(source, 3))
    assert_fields(state, 5, 12, 1, s64(h1), fp(source, 5))
    assert_fields(state, 7, 13, 2, s64(h2), fp(source, 7))
    untouched = [s for s in range(NUM_SLOTS) if s not in CHAIN_SLOTS]
    assert not state.canary_buf[untouched].any()
    assert_counters(state, kernel_runs=1, slot_runs=3)
    assert_ring(state, [])
    assert not state.violation_ring.any()


def test_write_mode_none_stores_zero_real_kv_hash():
    """In mode NONE the real-KV field is 0 even with sources present."""
    source, _ = kv_source()
    state = written_chain(sources=(source,), mode=RealKvHashMode.NONE)
    for slot in CHAIN_SLOTS:
        assert fields(state, slot)[3] == 0


def test_write_never_touches_bytes_past_32():
    """With a 48-byte slot stride only the first 32 bytes of each slot change."""
    state = new_state(slot_stride_bytes=48)
    state.canary_buf[:, 32:] = 0xAB
    do_write(state, write_plan([(-1, 3)]), CHAIN_TOKENS, CHAIN_POSITIONS, CHAIN_SLOTS)
    assert (state.canary_buf[:, 32:] == 0xAB).all()
    assert_fields(state, 5, 12, 1, s64(step(anchor_hash(), 11, 0)), 0)


def test_write_continues_chain_from_a_seed_slot():
    """A request seeded with a stored slot starts from mix3(prev_hash, token, position) of it."""
    state = written_chain()
    do_write(state, write_plan([(7, 2)]), [14, 15], [3, 4], [9, 2])
    h3 = step(step(step(anchor_hash(), 11, 0), 12, 1), 13, 2)
    assert_fields(state, 9, 14, 3, s64(h3), 0)
    assert_fields(state, 2, 15, 4, s64(step(h3, 14, 3)), 0)
    assert_counters(state, kernel_runs=2, slot_runs=5)


def test_write_two_requests_chain_independently():
    """Each request restarts its chain from its own seed; slot 0 is written like any other."""
    state = new_state()
    do_write(state, write_plan([(-1, 2), (-1, 1)]), [1, 2, 3], [0, 1, 0], [4, 6, 0])
    assert_fields(state, 4, 1, 0, s64(anchor_hash()), 0)
    assert_fields(state, 6, 2, 1, s64(step(anchor_hash(), 1, 0)), 0)
    assert_fields(state, 0, 3, 0, s64(anchor_hash()), 0)
    assert_counters(state, kernel_runs=1, slot_runs=3)


def test_write_skips_negative_slots():
    """A -1 slot is not written or counted and does not advance the chain."""
    state = new_state()
    do_write(state, write_plan([(-1, 3)]), [11, 12, 13], [0, 1, 2], [3, -1, 5])
    assert_fields(state, 3, 11, 0, s64(anchor_hash()), 0)
    assert_fields(state, 5, 13, 2, s64(step(anchor_hash(), 11, 0)), 0)
    assert not state.canary_buf[[s for s in range(NUM_SLOTS) if s not in (3, 5)]].any()
    assert_counters(state, kernel_runs=1, slot_runs=2)


def test_write_negative_slot_does_not_update_prev_pos():
    """With the position assert on, a skipped entry's position is not taken as the previous one."""
    state = written_chain(position_assert=True)  # slot 7 holds position 2
    do_write(state, write_plan([(7, 3)]), [1, 2, 3], [3, 99, 4], [8, -1, 9])
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=5)


def test_write_num_valid_is_clamped():
    """write_num_valid_reqs above the capacity runs every request; below 0 runs none."""
    state = new_state()
    plan = write_plan([(-1, 1), (-1, 1)], num_valid=7)
    do_write(state, plan, [1, 2], [0, 0], [4, 5])
    assert_counters(state, kernel_runs=1, slot_runs=2)
    assert fields(state, 5)[0] == 2

    state = new_state()
    plan = write_plan([(-1, 1), (-1, 1)], num_valid=-3)
    do_write(state, plan, [1, 2], [0, 0], [4, 5])
    assert_counters(state, kernel_runs=1, slot_runs=0)
    assert not state.canary_buf.any()


def test_write_requests_past_num_valid_are_ignored():
    """Requests at or beyond num_valid are not written, even if their entries are valid."""
    state = new_state()
    do_write(state, write_plan([(-1, 1), (-1, 1)], num_valid=1), [1, 2], [0, 0], [4, 5])
    assert_counters(state, kernel_runs=1, slot_runs=1)
    assert not state.canary_buf[5].any()


def test_write_empty_request_is_skipped():
    """An empty entry range writes nothing but the launch still counts."""
    state = new_state()
    do_write(state, write_plan([(-1, 0), (-1, 1)]), [7], [0], [2])
    assert_fields(state, 2, 7, 0, s64(anchor_hash()), 0)
    assert_counters(state, kernel_runs=1, slot_runs=1)


def test_write_input_assert_reports_token_and_position():
    """Each input mismatch gives one row with the running hash and the right bits."""
    state = new_state()
    expected = ([11, 99, 98], [0, 1, 7])
    do_write(
        state, write_plan([(-1, 3)]), CHAIN_TOKENS, CHAIN_POSITIONS, CHAIN_SLOTS, expected=expected
    )
    h1 = step(anchor_hash(), 11, 0)
    h2 = step(h1, 12, 1)
    assert_ring(
        state,
        [
            (KIND, 5, 1, 12, 99, s64(h1), 1, W_TOKEN),
            (KIND, 7, 2, 13, 98, s64(h2), 7, W_TOKEN | W_POSITION),
        ],
    )
    # A failed assert never changes what is stored, so the chain continues from actual values.
    assert_fields(state, 7, 13, 2, s64(h2), 0)


def test_write_entry_can_emit_input_row_then_position_row():
    """One entry breaking both asserts gives the input row first, then the position row."""
    state = written_chain(position_assert=True)  # slot 7: position 2
    h3 = step(step(step(anchor_hash(), 11, 0), 12, 1), 13, 2)
    do_write(state, write_plan([(7, 2)]), [20, 21], [5, 6], [8, 9], expected=([25, 21], [4, 6]))
    assert_ring(
        state,
        [
            (KIND, 8, 5, 20, 25, s64(h3), 4, W_TOKEN | W_POSITION),
            (KIND, 8, 5, 20, 20, s64(h3), 3, W_POSITION),
        ],
    )
    # prev_pos follows the actual position (5), so position 6 is a clean successor, and the
    # chain continues from the actual token.
    assert_fields(state, 9, 21, 6, s64(step(h3, 20, 5)), 0)


def test_write_position_assert_wraps_at_int64_max():
    """The successor of 2**63 - 1 is -2**63, in the check and in the reported expectation."""
    state = new_state(position_assert=True)
    do_write(state, write_plan([(-1, 1)]), [5], [I64_MAX], [2])  # anchor seed: assert off
    assert_ring(state, [])
    h0 = anchor_hash()
    h1 = step(h0, 5, I64_MAX)

    do_write(state, write_plan([(2, 2)]), [6, 7], [I64_MIN, 5], [4, 6])
    h2 = step(h1, 6, I64_MIN)
    assert_ring(state, [(KIND, 6, 5, 7, 7, s64(h2), I64_MIN + 1, W_POSITION)])

    do_write(state, write_plan([(2, 1)]), [8], [0], [8])
    assert_ring(
        state,
        [
            (KIND, 6, 5, 7, 7, s64(h2), I64_MIN + 1, W_POSITION),
            (KIND, 8, 0, 8, 8, s64(h1), I64_MIN, W_POSITION),
        ],
    )


def test_write_position_assert_needs_flag_and_seed():
    """No position row without enable_chain_position_assert or with an anchor seed."""
    state = written_chain(position_assert=False)
    do_write(state, write_plan([(7, 1)]), [1], [50], [8])
    state.enable_chain_position_assert[0] = 1
    do_write(state, write_plan([(-1, 2)]), [1, 2], [50, 10], [9, 10])
    assert_ring(state, [])


@pytest.mark.parametrize(
    ("enable", "expected", "message"),
    [
        (True, (None, None), "are required when enable_write_input_assert=True"),
        (True, (np.zeros(1, np.int64), None), "are required when enable_write_input_assert=True"),
        (False, (np.zeros(1, np.int64), None), "must be None when enable_write_input_assert=False"),
        (False, (None, np.zeros(1, np.int64)), "must be None when enable_write_input_assert=False"),
    ],
)
def test_write_expected_tensor_rules(enable, expected, message):
    """The expected-input arguments must match enable_write_input_assert (CONTRACT §6)."""
    state = new_state()
    before = copy.deepcopy(state)
    with pytest.raises(ValueError) as excinfo:
        reference.write(
            state,
            write_plan([(-1, 1)]),
            input_ids=np.array([1]),
            positions=np.array([0]),
            out_cache_loc=np.array([2]),
            enable_write_input_assert=enable,
            expected_input_tokens=expected[0],
            expected_input_positions=expected[1],
        )
    prefix = "kv-canary: expected input tensors "
    assert str(excinfo.value) == prefix + message
    assert_counters(state, kernel_runs=0, slot_runs=0)
    np.testing.assert_array_equal(state.canary_buf, before.canary_buf, strict=True)


# ---------------------------------------------------------------------------------------------
# verify


def test_verify_after_write_is_clean():
    """Verifying a freshly written chain reports nothing and changes no canary byte."""
    source, _ = kv_source()
    state = written_chain(sources=(source,), mode=RealKvHashMode.ALL)
    buffer_before = state.canary_buf.copy()
    reference.verify(state, chain_verify_plan(), check_verify_expected_token=True)
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=6)
    np.testing.assert_array_equal(state.canary_buf, buffer_before, strict=True)


@pytest.mark.parametrize("check_token", [True, False])
def test_corrupt_token_gives_token_bit_and_next_chain_bit(check_token):
    """A corrupted token is a TOKEN mismatch for its slot and a CHAIN mismatch for the next."""
    state = written_chain()
    state.canary_buf[5, 0:8] = np.frombuffer((99).to_bytes(8, "little"), np.uint8)
    reference.verify(state, chain_verify_plan(), check_verify_expected_token=check_token)
    h1 = step(anchor_hash(), 11, 0)
    h2 = step(h1, 12, 1)
    rows = []
    if check_token:
        rows.append((KIND, 5, 1, 99, 12, s64(h1), s64(h1), TOKEN))
    rows.append((KIND, 7, 2, 13, 13 if check_token else -1, s64(h2), s64(step(h1, 99, 1)), CHAIN))
    assert_ring(state, rows)
    assert_counters(state, kernel_runs=2, slot_runs=6)


def test_verify_unchecked_expected_token():
    """An expected token of -1 is not compared, and the row reports -1."""
    state = written_chain()
    plan = verify_plan([(5, -1, 4, 3)])
    reference.verify(state, plan, check_verify_expected_token=True)
    assert_ring(
        state,
        [
            (
                KIND,
                5,
                1,
                12,
                -1,
                s64(step(anchor_hash(), 11, 0)),
                s64(step(anchor_hash(), 11, 0)),
                POSITION,
            )
        ],
    )


def test_verify_reports_real_kv_change():
    """Changing one read KV byte of a slot gives a REAL_KV row for that slot only."""
    source, backing = kv_source()
    state = written_chain(sources=(source,), mode=RealKvHashMode.ALL)
    backing[1, 16 + 3] ^= 0x01  # slot 5 = row 1, column 1
    reference.verify(state, chain_verify_plan(), check_verify_expected_token=True)
    h1 = step(anchor_hash(), 11, 0)
    assert_ring(state, [(KIND, 5, 1, 12, 12, s64(h1), s64(h1), REAL_KV)])


def test_verify_head_of_chain_expects_anchor():
    """prev < 0 expects splitmix64(ANCHOR) as the stored chain value."""
    state = written_chain()
    reference.verify(state, verify_plan([(5, 12, 1, -1)]), check_verify_expected_token=True)
    h1 = step(anchor_hash(), 11, 0)
    assert_ring(state, [(KIND, 5, 1, 12, 12, s64(h1), s64(anchor_hash()), CHAIN)])


def test_verify_prev_zero_skips_chain_check():
    """prev == 0 does not check the chain and reports the stored value as expected."""
    state = written_chain()
    state.canary_buf[5, 16:24] = 0x77
    corrupt = int.from_bytes(bytes([0x77] * 8), "little", signed=True)
    reference.verify(state, verify_plan([(5, 12, 1, 0)]), check_verify_expected_token=True)
    assert_ring(state, [])
    reference.verify(state, verify_plan([(5, 12, 9, 0)]), check_verify_expected_token=True)
    assert_ring(state, [(KIND, 5, 1, 12, 12, corrupt, corrupt, POSITION)])


def test_verify_skips_slot_zero_but_counts_it():
    """Entries naming slot 0 are never checked but count in slot_run_counter."""
    state = written_chain()
    state.canary_buf[0, :32] = 0xEE
    plan = verify_plan([(0, 1, 1, -1), (3, 11, 0, -1), (0, 2, 2, 5)])
    reference.verify(state, plan, check_verify_expected_token=True)
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=6)


def test_verify_slot_zero_is_not_hashed():
    """Slot 0 is skipped before any fingerprint, so a source too small for it does not matter."""
    empty = Source(np.zeros((0, 16), dtype=np.uint8), 1, 16, 16)
    state = new_state(sources=(empty,), mode=RealKvHashMode.ALL)
    reference.verify(state, verify_plan([(0, 1, 1, -1)]), check_verify_expected_token=True)
    assert_counters(state, kernel_runs=1, slot_runs=1)


def test_verify_disabled_only_counts_the_launch():
    """enable == 0 bumps kernel_run_counter and nothing else, even with bad entries."""
    state = written_chain()
    before = copy.deepcopy(state)
    plan = verify_plan([(99, 1, 1, 77), (-4, 0, 0, 500)], enable=0, num_valid=2)
    reference.verify(state, plan, check_verify_expected_token=True)
    assert_counters(state, kernel_runs=2, slot_runs=3)
    assert_ring(state, [])
    np.testing.assert_array_equal(state.canary_buf, before.canary_buf, strict=True)
    np.testing.assert_array_equal(state.violation_ring, before.violation_ring, strict=True)


@pytest.mark.parametrize("enable", [2, -1])
def test_verify_any_nonzero_enable_runs(enable):
    """Any enable value other than 0 runs the verify."""
    state = written_chain()
    reference.verify(
        state, verify_plan([(5, 12, 8, 3)], enable=enable), check_verify_expected_token=True
    )
    assert_ring(
        state,
        [
            (
                KIND,
                5,
                1,
                12,
                12,
                s64(step(anchor_hash(), 11, 0)),
                s64(step(anchor_hash(), 11, 0)),
                POSITION,
            )
        ],
    )


def test_verify_num_valid_is_clamped():
    """verify_num_valid above the capacity checks every entry; below 0 checks none."""
    state = written_chain()
    plan = verify_plan([(3, 11, 9, -1), (5, 12, 9, 3)], num_valid=100)
    reference.verify(state, plan, check_verify_expected_token=True)
    assert_counters(state, kernel_runs=2, slot_runs=5)
    h0 = anchor_hash()
    h1 = step(h0, 11, 0)
    rows = [
        (KIND, 3, 0, 11, 11, s64(h0), s64(h0), POSITION),
        (KIND, 5, 1, 12, 12, s64(h1), s64(h1), POSITION),
    ]
    assert_ring(state, rows)

    plan.verify_num_valid[0] = -5
    reference.verify(state, plan, check_verify_expected_token=True)
    assert_counters(state, kernel_runs=3, slot_runs=5)
    assert_ring(state, rows)


def test_verify_entries_past_num_valid_are_ignored():
    """Entries at or beyond num_valid are not checked, even if they would fail."""
    state = written_chain()
    plan = verify_plan([(3, 11, 0, -1), (5, 12, 99, 3)], num_valid=1)
    reference.verify(state, plan, check_verify_expected_token=True)
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=4)


def test_ring_is_fill_once_and_counts_past_capacity():
    """Violations past the ring capacity are counted but never overwrite a stored row."""
    state = written_chain(ring_capacity=2)
    plan = verify_plan([(3, 11, 10, -1), (5, 12, 11, 3), (7, 13, 12, 5)])
    reference.verify(state, plan, check_verify_expected_token=True)
    h0 = anchor_hash()
    h1 = step(h0, 11, 0)
    first_rows = [
        (KIND, 3, 0, 11, 11, s64(h0), s64(h0), POSITION),
        (KIND, 5, 1, 12, 12, s64(h1), s64(h1), POSITION),
    ]
    assert_ring(state, first_rows, write_index=3)

    reference.verify(state, plan, check_verify_expected_token=True)
    assert_ring(state, first_rows, write_index=6)


def test_ring_already_full_keeps_its_rows():
    """A launch starting with write_index at the capacity stores nothing and still counts."""
    state = written_chain(ring_capacity=2)
    state.violation_ring[:] = 7
    state.violation_write_index[0] = 2
    reference.verify(state, verify_plan([(5, 12, 9, 3)]), check_verify_expected_token=True)
    np.testing.assert_array_equal(state.violation_ring, np.full((2, 8), 7, np.int64), strict=True)
    np.testing.assert_array_equal(state.violation_write_index, np.array([3], np.int32), strict=True)


# ---------------------------------------------------------------------------------------------
# Launch validation kept by the oracle: nothing is read or written outside the buffers.


def out_of_range_write(state, which):
    if which == "slot":
        do_write(state, write_plan([(-1, 2)]), [1, 2], [0, 1], [3, NUM_SLOTS])
    else:
        do_write(state, write_plan([(NUM_SLOTS + 2, 1)]), [1], [0], [3])


@pytest.mark.parametrize(
    ("launch", "fragment"),
    [
        (lambda s: out_of_range_write(s, "slot"), "out_cache_loc[1] = 16"),
        (lambda s: out_of_range_write(s, "seed"), "plan.write_seed_slot_indices[0] = 18"),
        (
            lambda s: reference.verify(
                s, verify_plan([(3, 1, 0, -1), (16, 1, 0, -1)]), check_verify_expected_token=True
            ),
            "plan.verify_slot_indices[1] = 16",
        ),
        (
            lambda s: reference.verify(
                s, verify_plan([(-2, 1, 0, -1)]), check_verify_expected_token=True
            ),
            "plan.verify_slot_indices[0] = -2",
        ),
        (
            lambda s: reference.verify(
                s, verify_plan([(3, 1, 0, 40)]), check_verify_expected_token=True
            ),
            "plan.verify_prev_slot_indices[0] = 40",
        ),
    ],
    ids=["write-slot", "write-seed", "verify-slot", "verify-negative-slot", "verify-prev"],
)
def test_out_of_range_slots_raise_before_any_change(launch, fragment):
    """A slot, seed or prev index outside the canary buffer raises IndexError and changes nothing."""
    state = written_chain()
    before = copy.deepcopy(state)
    with pytest.raises(IndexError) as excinfo:
        launch(state)
    assert fragment in str(excinfo.value)
    assert "16 slots" in str(excinfo.value)
    assert_counters(state, kernel_runs=1, slot_runs=3)
    np.testing.assert_array_equal(state.canary_buf, before.canary_buf, strict=True)
    np.testing.assert_array_equal(
        state.violation_write_index, before.violation_write_index, strict=True
    )


def test_source_count_cap_applies_to_both_launches():
    """Five real-KV sources are refused by write and by a disabled verify alike."""
    source, _ = kv_source()
    state = new_state(sources=(source,) * 5, mode=RealKvHashMode.NONE)
    message = "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"
    with pytest.raises(ValueError, match="^" + message + "$"):
        do_write(state, write_plan([(-1, 1)]), [1], [0], [3])
    with pytest.raises(ValueError, match="^" + message + "$"):
        reference.verify(state, verify_plan([], enable=0), check_verify_expected_token=False)
    assert_counters(state, kernel_runs=0, slot_runs=0)


def test_write_slot_outside_a_source_raises():
    """A written slot beyond a source's capacity raises IndexError in PARTIAL and ALL."""
    small = Source(np.ones((2, 16), dtype=np.uint8), 1, 16, 16)  # capacity 2
    state = new_state(sources=(small,), mode=RealKvHashMode.PARTIAL)
    with pytest.raises(IndexError, match=r"slot 5 is out of range for real_kv_sources\[0\]"):
        do_write(state, write_plan([(-1, 1)]), [1], [0], [5])
    assert_counters(state, kernel_runs=0, slot_runs=0)


# ---------------------------------------------------------------------------------------------
# allocate: defaults, keywords only, the contract's shapes and dtypes (CONTRACT §5)


def test_state_allocate_defaults():
    """Unnamed options give a 32-byte stride, kernel_kind 0, no sources, mode NONE, assert off."""
    state = CanaryState.allocate(num_slots=3, ring_capacity=2)
    np.testing.assert_array_equal(state.canary_buf, np.zeros((3, 32), np.uint8), strict=True)
    assert type(state.kernel_kind) is int and state.kernel_kind == 0
    np.testing.assert_array_equal(state.violation_ring, np.zeros((2, 8), np.int64), strict=True)
    np.testing.assert_array_equal(state.violation_write_index, np.zeros(1, np.int32), strict=True)
    np.testing.assert_array_equal(state.slot_run_counter, np.zeros(1, np.int64), strict=True)
    np.testing.assert_array_equal(state.kernel_run_counter, np.zeros(1, np.int64), strict=True)
    assert state.real_kv_sources == ()
    assert state.real_kv_hash_mode == RealKvHashMode.NONE
    np.testing.assert_array_equal(
        state.enable_chain_position_assert, np.zeros(1, np.int32), strict=True
    )


def test_allocate_takes_keywords_only():
    """The state's and both plans' allocate refuse positional arguments."""
    with pytest.raises(TypeError, match="positional argument"):
        CanaryState.allocate(4, 8)
    with pytest.raises(TypeError, match="positional argument"):
        VerifyPlan.allocate(3)
    with pytest.raises(TypeError, match="positional argument"):
        WritePlan.allocate(3)


@pytest.mark.parametrize("capacity", [0, -1, -300])
def test_allocate_refuses_a_capacity_below_one(capacity):
    """A capacity <= 0 is a ValueError naming the capacity and its value (CONTRACT §5)."""
    with pytest.raises(ValueError) as excinfo:
        VerifyPlan.allocate(verify_capacity=capacity)
    assert str(excinfo.value) == f"kv-canary: verify_capacity must be > 0, got {capacity}"
    with pytest.raises(ValueError) as excinfo:
        WritePlan.allocate(write_req_capacity=capacity)
    assert str(excinfo.value) == f"kv-canary: write_req_capacity must be > 0, got {capacity}"


@pytest.mark.parametrize("capacity", [1, 3, 300])
def test_fresh_plans_have_the_contract_shapes(capacity):
    """int64 [cap] entry arrays, int64 [cap + 1] offsets, int32 [1] counters, enable = [1]."""
    plan = VerifyPlan.allocate(verify_capacity=capacity)
    for name in (
        "verify_slot_indices",
        "verify_expected_tokens",
        "verify_expected_positions",
        "verify_prev_slot_indices",
    ):
        array = getattr(plan, name)
        assert (array.dtype, array.shape) == (np.dtype(np.int64), (capacity,)), name
    assert (plan.verify_num_valid.dtype, plan.verify_num_valid.shape) == (np.dtype(np.int32), (1,))
    np.testing.assert_array_equal(plan.enable, np.ones(1, np.int32), strict=True)

    wplan = WritePlan.allocate(write_req_capacity=capacity)
    assert (wplan.write_offsets.dtype, wplan.write_offsets.shape) == (
        np.dtype(np.int64),
        (capacity + 1,),
    )
    assert (wplan.write_seed_slot_indices.dtype, wplan.write_seed_slot_indices.shape) == (
        np.dtype(np.int64),
        (capacity,),
    )
    assert (wplan.write_num_valid_reqs.dtype, wplan.write_num_valid_reqs.shape) == (
        np.dtype(np.int32),
        (1,),
    )


# ---------------------------------------------------------------------------------------------
# The oracle's own argument checks


def raw_write(state, plan, **arrays):
    """``reference.write`` with int64 arrays for any token array not given."""
    arguments = {
        "input_ids": np.array([21, 22], np.int64),
        "positions": np.array([0, 1], np.int64),
        "out_cache_loc": np.array([3, 5], np.int64),
        "enable_write_input_assert": False,
        "expected_input_tokens": None,
        "expected_input_positions": None,
    }
    arguments.update(arrays)
    reference.write(state, plan, **arguments)


def assert_refused(launch, state, exception, message):
    """``launch(state)`` raises ``exception`` with exactly ``message`` and changes nothing."""
    before = copy.deepcopy(state)
    with pytest.raises(exception) as excinfo:
        launch(state)
    assert str(excinfo.value) == message
    for name in (
        "canary_buf",
        "violation_ring",
        "violation_write_index",
        "slot_run_counter",
        "kernel_run_counter",
    ):
        np.testing.assert_array_equal(
            getattr(state, name), getattr(before, name), strict=True, err_msg=name
        )


@pytest.mark.parametrize("name", ["input_ids", "positions"])
@pytest.mark.parametrize("length", [1, 3])
def test_write_refuses_token_arrays_of_another_length(name, length):
    """input_ids and positions must have as many entries as out_cache_loc."""
    state = written_chain()
    array = np.arange(31, 31 + length, dtype=np.int64)
    assert_refused(
        lambda s: raw_write(s, write_plan([(-1, 2)]), **{name: array}),
        state,
        ValueError,
        f"kv-canary: {name} has {length} entries but out_cache_loc has 2",
    )


@pytest.mark.parametrize("name", ["expected_input_tokens", "expected_input_positions"])
@pytest.mark.parametrize("length", [1, 3])
def test_write_refuses_expected_arrays_of_another_length(name, length):
    """With the input assert on, the expected arrays must match out_cache_loc too."""
    state = written_chain()
    arrays = {
        "enable_write_input_assert": True,
        "expected_input_tokens": np.array([21, 22], np.int64),
        "expected_input_positions": np.array([0, 1], np.int64),
    }
    arrays[name] = np.arange(41, 41 + length, dtype=np.int64)
    assert_refused(
        lambda s: raw_write(s, write_plan([(-1, 2)]), **arrays),
        state,
        ValueError,
        f"kv-canary: {name} has {length} entries but out_cache_loc has 2",
    )


@pytest.mark.parametrize("length", [3, 5])
def test_write_refuses_offsets_of_another_length(length):
    """write_offsets must have capacity + 1 entries; the message gives both counts."""
    state = written_chain()
    plan = write_plan([(-1, 1), (-1, 1), (-1, 0)])  # capacity 3: 4 offsets
    plan.write_offsets = np.array([0, 1, 2, 2, 2][:length], np.int64)
    assert_refused(
        lambda s: raw_write(s, plan),
        state,
        ValueError,
        f"kv-canary: plan.write_offsets must have 4 entries, got {length}",
    )


def test_write_refuses_offsets_starting_below_zero():
    """A request range starting at -1 is refused, not read from the end of the arrays."""
    state = written_chain()
    plan = write_plan([(-1, 2)])
    plan.write_offsets[:] = [-1, 1]
    assert_refused(
        lambda s: raw_write(s, plan),
        state,
        ValueError,
        "kv-canary: plan.write_offsets must be non-decreasing within the 2 token entries, "
        "got [-1, 1) for request 0",
    )


@pytest.mark.parametrize(
    ("name", "array", "message"),
    [
        ("input_ids", np.array(21, np.int64), "must be 1-D, got shape ()"),
        ("positions", np.array([[0, 1]], np.int64), "must be 1-D, got shape (1, 2)"),
        ("out_cache_loc", np.array([[3], [5]], np.int64), "must be 1-D, got shape (2, 1)"),
        ("input_ids", np.array([21.0, 22.0]), "must hold integers, got dtype float64"),
        ("positions", np.array([0.0, 1.0], np.float32), "must hold integers, got dtype float32"),
        ("out_cache_loc", np.array([True, False]), "must hold integers, got dtype bool"),
    ],
)
def test_write_refuses_token_arrays_of_the_wrong_kind(name, array, message):
    """Token arrays must be 1-D integers; the message names the array."""
    assert_refused(
        lambda s: raw_write(s, write_plan([(-1, 2)]), **{name: array}),
        written_chain(),
        ValueError,
        f"kv-canary: {name} {message}",
    )


def test_write_accepts_empty_token_arrays_of_any_dtype():
    """An empty token array holds no value, so its dtype is not checked."""
    state = written_chain()
    empty = np.array([], dtype=np.float64)
    raw_write(state, write_plan([(-1, 0)]), input_ids=empty, positions=empty, out_cache_loc=empty)
    assert_counters(state, kernel_runs=2, slot_runs=3)


@pytest.mark.parametrize(
    ("name", "array", "message"),
    [
        ("verify_slot_indices", np.array([[3]], np.int64), "must be 1-D, got shape (1, 1)"),
        ("verify_prev_slot_indices", np.array(-1, np.int64), "must be 1-D, got shape ()"),
        ("verify_expected_positions", np.array([0.0]), "must hold integers, got dtype float64"),
        ("verify_expected_tokens", np.array([[11]], np.int64), "must be 1-D, got shape (1, 1)"),
    ],
)
def test_verify_refuses_plan_arrays_of_the_wrong_kind(name, array, message):
    """Plan entry arrays must be 1-D integers; the message names the field."""
    plan = verify_plan([(3, 11, 0, -1)])
    setattr(plan, name, array)
    assert_refused(
        lambda s: reference.verify(s, plan, check_verify_expected_token=True),
        written_chain(),
        ValueError,
        f"kv-canary: plan.{name} {message}",
    )


@pytest.mark.parametrize(
    "name", ["verify_prev_slot_indices", "verify_expected_positions", "verify_expected_tokens"]
)
@pytest.mark.parametrize("length", [1, 3])
def test_verify_refuses_entry_arrays_of_another_length(name, length):
    """Every entry array must have as many entries as verify_slot_indices."""
    plan = verify_plan([(3, 11, 0, -1), (5, 12, 1, 3)])
    setattr(plan, name, np.array([3, 5, 7][:length], np.int64))
    assert_refused(
        lambda s: reference.verify(s, plan, check_verify_expected_token=True),
        written_chain(),
        ValueError,
        f"kv-canary: plan.{name} must have 2 entries, got {length}",
    )


def test_verify_reads_no_expected_tokens_with_the_flag_false():
    """With check_verify_expected_token false the expected tokens are not even read."""
    state = written_chain()
    plan = chain_verify_plan()
    plan.verify_expected_tokens = np.array([[1.5]])
    reference.verify(state, plan, check_verify_expected_token=False)
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=6)


def assert_both_launches_refuse(state, message: str) -> None:
    """A write and a verify of ``state`` each raise ValueError ``message`` and change nothing."""
    assert_refused(lambda s: raw_write(s, write_plan([(-1, 2)])), state, ValueError, message)
    assert_refused(
        lambda s: reference.verify(
            s, verify_plan([(3, 11, 0, -1)]), check_verify_expected_token=True
        ),
        state,
        ValueError,
        message,
    )


@pytest.mark.parametrize(
    "canary_buf",
    [
        np.zeros((16, 32), np.int8),
        np.zeros((16, 32), np.int64),
        np.zeros((16, 32), np.uint16),
        np.zeros((16, 32), np.bool_),
        np.zeros(16 * 32, np.uint8),
        np.zeros((16, 4, 32), np.uint8),
    ],
    ids=["int8", "int64", "uint16", "bool", "1-D", "3-D"],
)
def test_launches_refuse_a_canary_buf_that_is_not_2d_uint8(canary_buf):
    """Write and verify refuse a canary buffer of another dtype or ndim, naming it."""
    state = new_state()
    state.canary_buf = canary_buf
    message = (
        "kv-canary: context.canary_buf must be uint8 [num_slots, slot_stride_bytes], "
        f"got {canary_buf.dtype} {canary_buf.shape}"
    )
    assert_both_launches_refuse(state, message)


@pytest.mark.parametrize("stride", [24, 36, 31, 0])
def test_launches_refuse_a_bad_slot_stride(stride):
    """A stride under 32 bytes or not a multiple of 8 is refused by both launches."""
    state = new_state()
    state.canary_buf = np.zeros((NUM_SLOTS, stride), np.uint8)
    message = (
        "kv-canary: context.canary_buf slot stride must be >= 32 bytes and a multiple of 8, "
        f"got {stride}"
    )
    assert_both_launches_refuse(state, message)


@pytest.mark.parametrize("stride", [40, 264])
def test_launches_accept_wide_slot_strides(stride):
    """Any multiple of 8 from 32 up is a valid stride; only the first 32 bytes are used."""
    state = new_state(slot_stride_bytes=stride)
    state.canary_buf[:, 32:] = 0x5A
    do_write(state, write_plan([(-1, 3)]), CHAIN_TOKENS, CHAIN_POSITIONS, CHAIN_SLOTS)
    reference.verify(state, chain_verify_plan(), check_verify_expected_token=True)
    h1 = step(anchor_hash(), 11, 0)
    assert_fields(state, 7, 13, 2, s64(step(h1, 12, 1)), 0)
    assert (state.canary_buf[:, 32:] == 0x5A).all()
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=6)


# ---------------------------------------------------------------------------------------------
# Slot ranges at the edges: slot 0, -1 and a canary buffer of no slots


def empty_buffer_state() -> CanaryState:
    return CanaryState.allocate(num_slots=0, ring_capacity=4, kernel_kind=KIND)


@pytest.mark.parametrize("requests", [[(0, 1)], [(0, 0)]], ids=["one-entry", "empty-request"])
def test_write_seed_slot_zero_is_range_checked(requests):
    """Seed slot 0 is a real slot: with no slots in the buffer it is out of range."""
    assert_refused(
        lambda s: do_write(
            s,
            write_plan(requests),
            [21] * requests[0][1],
            [0] * requests[0][1],
            [-1] * requests[0][1],
        ),
        empty_buffer_state(),
        IndexError,
        "kv-canary: plan.write_seed_slot_indices[0] = 0 is out of range for canary_buf "
        "with 0 slots",
    )


def test_write_slot_zero_is_range_checked():
    """Written slot 0 is a real slot: with no slots in the buffer it is out of range."""
    assert_refused(
        lambda s: do_write(s, write_plan([(-1, 2)]), [21, 22], [0, 1], [-1, 0]),
        empty_buffer_state(),
        IndexError,
        "kv-canary: out_cache_loc[1] = 0 is out of range for canary_buf with 0 slots",
    )


def test_write_anchor_seeds_and_skipped_slots_read_no_slot():
    """Seeds -1 and -5 and slots -1 need no slot at all: a buffer of no slots is fine."""
    state = empty_buffer_state()
    state.enable_chain_position_assert[0] = 1
    do_write(state, write_plan([(-1, 2), (-5, 1)]), [21, 22, 23], [4, 9, 2], [-1, -1, -3])
    assert_counters(state, kernel_runs=1, slot_runs=0)
    assert_ring(state, [])


def test_verify_slot_minus_one_is_refused():
    """A verify slot of -1 is an IndexError naming it, not a read of the last slot."""
    state = written_chain()
    state.canary_buf[NUM_SLOTS - 1, :32] = 0x3C
    assert_refused(
        lambda s: reference.verify(
            s, verify_plan([(3, 11, 0, -1), (-1, 1, 0, -1)]), check_verify_expected_token=True
        ),
        state,
        IndexError,
        "kv-canary: plan.verify_slot_indices[1] = -1 is out of range for canary_buf with 16 slots",
    )


def write_slot_zero(state, token=31, pos=40):
    """Store (token, pos) in slot 0 from the anchor; return the chain value that follows it."""
    do_write(state, write_plan([(-1, 1)]), [token], [pos], [0])
    return step(anchor_hash(), token, pos)


def test_write_seeded_from_slot_zero_continues_its_chain():
    """Seed 0 is a real slot: the chain continues from slot 0's stored record, not the anchor."""
    state = new_state()
    h0 = write_slot_zero(state)
    do_write(state, write_plan([(0, 2)]), [32, 33], [41, 42], [6, 9])
    assert_fields(state, 6, 32, 41, s64(h0), 0)
    assert_fields(state, 9, 33, 42, s64(step(h0, 32, 41)), 0)
    assert_counters(state, kernel_runs=2, slot_runs=3)
    reference.verify(
        state, verify_plan([(6, 32, 41, 0), (9, 33, 42, 6)]), check_verify_expected_token=True
    )
    assert_ring(state, [])


def test_position_assert_from_seed_slot_zero():
    """Seed 0 activates the position assert, and prev_pos starts at slot 0's position."""
    state = new_state(position_assert=True)
    h0 = write_slot_zero(state, pos=40)
    do_write(state, write_plan([(0, 1)]), [32], [41], [6])  # 41 follows 40: no row
    assert_ring(state, [])
    do_write(state, write_plan([(0, 2)]), [34, 35], [50, 51], [7, 8])
    assert_ring(state, [(KIND, 7, 50, 34, 34, s64(h0), 41, W_POSITION)])


@pytest.mark.parametrize("flag", [-1, 2])
def test_position_assert_runs_for_any_nonzero_flag(flag):
    """enable_chain_position_assert != 0 turns the assert on, negative values included."""
    state = written_chain()
    state.enable_chain_position_assert[0] = flag
    h3 = step(step(step(anchor_hash(), 11, 0), 12, 1), 13, 2)
    do_write(state, write_plan([(7, 1)]), [14], [9], [8])
    assert_ring(state, [(KIND, 8, 9, 14, 14, s64(h3), 3, W_POSITION)])


def test_verify_checks_expected_tokens_below_minus_one():
    """Only -1 means "do not check": an expected token of -2 is compared and reported."""
    state = written_chain()
    reference.verify(state, verify_plan([(5, -2, 1, 3)]), check_verify_expected_token=True)
    h1 = s64(step(anchor_hash(), 11, 0))
    assert_ring(state, [(KIND, 5, 1, 12, -2, h1, h1, TOKEN)])


def test_ring_negative_write_index_stores_nothing():
    """A negative write index is outside the ring: the index advances, no row is stored."""
    state = written_chain(ring_capacity=3)
    state.violation_ring[:] = np.arange(1, 25, dtype=np.int64).reshape(3, 8)
    state.violation_write_index[0] = -1
    reference.verify(state, verify_plan([(5, 12, 9, 3)]), check_verify_expected_token=True)
    np.testing.assert_array_equal(state.violation_write_index, np.array([0], np.int32), strict=True)
    np.testing.assert_array_equal(
        state.violation_ring, np.arange(1, 25, dtype=np.int64).reshape(3, 8), strict=True
    )


# ---------------------------------------------------------------------------------------------
# Sizes past 256, where two equal ints are distinct objects


def test_write_and_verify_of_300_entries():
    """300 requests of one entry each, positions past 256 matching their expectations."""
    count = 300
    state = CanaryState.allocate(num_slots=count + 1, ring_capacity=4, kernel_kind=KIND)
    plan = write_plan([(-1, 1)] * count)
    tokens = np.arange(1000, 1000 + count, dtype=np.int64)
    positions = np.arange(500, 500 + count, dtype=np.int64)
    slots = np.arange(1, count + 1, dtype=np.int64)
    reference.write(
        state,
        plan,
        input_ids=tokens,
        positions=positions,
        out_cache_loc=slots,
        enable_write_input_assert=True,
        expected_input_tokens=tokens.copy(),
        expected_input_positions=positions.copy(),
    )
    assert_ring(state, [])
    assert_counters(state, kernel_runs=1, slot_runs=count)
    assert_fields(state, 1, 1000, 500, s64(anchor_hash()), 0)
    assert_fields(state, count, 1000 + count - 1, 500 + count - 1, s64(anchor_hash()), 0)

    vplan = VerifyPlan.allocate(verify_capacity=count)
    vplan.verify_slot_indices[:] = slots
    vplan.verify_expected_tokens[:] = tokens
    vplan.verify_expected_positions[:] = positions
    vplan.verify_prev_slot_indices[:] = -1
    vplan.verify_num_valid[0] = count
    reference.verify(state, vplan, check_verify_expected_token=True)
    assert_ring(state, [])
    assert_counters(state, kernel_runs=2, slot_runs=2 * count)


def test_write_of_300_entries_in_one_request():
    """One request of 300 entries: the chain runs through all of them."""
    count = 300
    state = CanaryState.allocate(num_slots=count + 1, ring_capacity=4, kernel_kind=KIND)
    tokens = list(range(2000, 2000 + count))
    positions = list(range(count))
    do_write(state, write_plan([(-1, count)]), tokens, positions, list(range(1, count + 1)))
    running = anchor_hash()
    for token, pos in zip(tokens[:-1], positions[:-1], strict=True):
        running = step(running, token, pos)
    assert_fields(state, count, tokens[-1], positions[-1], s64(running), 0)
    assert_counters(state, kernel_runs=1, slot_runs=count)


def test_verify_prev_slot_one_is_checked():
    """Only prev 0 skips the chain check: prev 1 is a slot like any other."""
    state = written_chain()
    do_write(state, write_plan([(-1, 1)]), [17], [6], [1])
    h_after_1 = s64(step(anchor_hash(), 17, 6))
    reference.verify(state, verify_plan([(5, 12, 1, 1)]), check_verify_expected_token=True)
    h1 = s64(step(anchor_hash(), 11, 0))
    assert_ring(state, [(KIND, 5, 1, 12, 12, h1, h_after_1, CHAIN)])
    # slot 1 continued from the anchor is a clean predecessor of a slot seeded from it
    do_write(state, write_plan([(1, 1)]), [18], [7], [2])
    reference.verify(state, verify_plan([(2, 18, 7, 1)]), check_verify_expected_token=True)
    assert_ring(state, [(KIND, 5, 1, 12, 12, h1, h_after_1, CHAIN)])
    assert_counters(state, kernel_runs=5, slot_runs=3 + 1 + 1 + 1 + 1)


@pytest.mark.parametrize(
    ("launch", "field"),
    [
        ("write", "kernel_kind"),
        ("write", "enable_chain_position_assert"),
        ("verify", "kernel_kind"),  # verify reads no position-assert flag
    ],
)
def test_a_state_field_that_cannot_be_read_raises_before_the_counters_move(launch, field):
    """The launch reads every field of the state before it changes any: a kernel kind that is
    no int, or a position-assert flag with no element, raises with both counters still at 0."""
    state = new_state()
    setattr(state, field, "no kind" if field == "kernel_kind" else np.zeros(0, np.int32))
    with pytest.raises((ValueError, IndexError)):
        if launch == "write":
            do_write(state, write_plan([(-1, 1)]), [7], [0], [1])
        else:
            plan = verify_plan([(1, -1, 0, -1)])
            reference.verify(state, plan, check_verify_expected_token=False)
    assert_counters(state, kernel_runs=0, slot_runs=0)
