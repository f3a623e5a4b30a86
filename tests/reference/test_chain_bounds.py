"""Launch validation kept by the oracle: nothing is read or written outside the buffers."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import reference
from reference import RealKvHashMode, Source
from tests.reference.chain_support import (
    NUM_SLOTS,
    assert_counters,
    do_write,
    kv_source,
    new_state,
    verify_plan,
    write_plan,
    written_chain,
)


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
