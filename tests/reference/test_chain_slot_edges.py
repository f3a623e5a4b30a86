"""Slot ranges at the edges: slot 0, -1 and a canary buffer of no slots."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from reference import CanaryState
from tests.reference.chain_support import (
    KIND,
    NUM_SLOTS,
    TOKEN,
    W_POSITION,
    anchor_hash,
    assert_counters,
    assert_fields,
    assert_refused,
    assert_ring,
    do_write,
    new_state,
    s64,
    step,
    verify_plan,
    write_plan,
    written_chain,
)


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
