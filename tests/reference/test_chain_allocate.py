"""The oracle's allocate: defaults, keywords only, the shapes and dtypes of CONTRACT §5."""

from __future__ import annotations

import numpy as np
import pytest

from reference import CanaryState, RealKvHashMode, VerifyPlan, WritePlan


def test_state_allocate_defaults():
    """Unnamed options give a 32-byte stride, kernel_kind 0, no sources, mode NONE, assert off."""
    state = CanaryState.allocate(num_slots=3, ring_capacity=2)
    np.testing.assert_array_equal(state.canary_buf, np.zeros((3, 32), np.uint8), strict=True)
    assert type(state.kernel_kind) is int and state.kernel_kind == 0  # a plain int 0
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
