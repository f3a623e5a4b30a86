"""The oracle's own argument checks: plans, token arrays and canary buffers of the wrong kind."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from tests.reference.chain_support import (
    CHAIN_POSITIONS,
    CHAIN_SLOTS,
    CHAIN_TOKENS,
    NUM_SLOTS,
    anchor_hash,
    assert_counters,
    assert_fields,
    assert_refused,
    assert_ring,
    chain_verify_plan,
    do_write,
    new_state,
    raw_write,
    s64,
    step,
    verify_plan,
    write_plan,
    written_chain,
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
