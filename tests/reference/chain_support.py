"""Helpers shared by the tests of the oracle's write and verify (tests/reference/test_chain_*.py).

The state, plans and launches of CONTRACT §5-§7 on small hand-worked scenarios: a 16-slot canary
buffer, a three-token chain from the anchor, and asserts on fields, ring rows and counters.
"""

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
