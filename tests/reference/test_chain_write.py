"""The oracle's write follows CONTRACT §6 on small hand-worked scenarios."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import reference
from reference import RealKvHashMode
from tests.reference.chain_support import (
    CHAIN_POSITIONS,
    CHAIN_SLOTS,
    CHAIN_TOKENS,
    I64_MAX,
    I64_MIN,
    KIND,
    NUM_SLOTS,
    W_POSITION,
    W_TOKEN,
    anchor_hash,
    assert_counters,
    assert_fields,
    assert_ring,
    do_write,
    fields,
    fp,
    kv_source,
    new_state,
    s64,
    step,
    write_plan,
    written_chain,
)


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
