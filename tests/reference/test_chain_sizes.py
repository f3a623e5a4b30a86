"""Sizes past 256, where two equal ints are distinct objects."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from reference import CanaryState, VerifyPlan
from tests.reference.chain_support import (
    CHAIN,
    KIND,
    anchor_hash,
    assert_counters,
    assert_fields,
    assert_ring,
    do_write,
    new_state,
    s64,
    step,
    verify_plan,
    write_plan,
    written_chain,
)


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
