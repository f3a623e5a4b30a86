"""The oracle's verify follows CONTRACT §7 on small hand-worked scenarios, its ring included."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import reference
from reference import RealKvHashMode, Source
from tests.reference.chain_support import (
    CHAIN,
    KIND,
    POSITION,
    REAL_KV,
    TOKEN,
    anchor_hash,
    assert_counters,
    assert_ring,
    chain_verify_plan,
    kv_source,
    new_state,
    s64,
    step,
    verify_plan,
    written_chain,
)


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
