"""The suite's ring comparisons leave open what CONTRACT §5 leaves open: the order of a
launch's rows and, where its violations run past the ring, which of them the ring keeps."""

from __future__ import annotations

import numpy as np

import reference
from conformance.assertions import chosen_row_differences
from conformance.write_verify_support import (
    Snapshot,
    assert_same_state,
    reported_slots,
    state_differences,
)


def _row(slot: int, bits: int = 4) -> tuple[int, ...]:
    return (3, slot, 10 + slot, 100 + slot, 100 + slot, 7 * slot, 9 * slot, bits)


def _state(capacity: int, start: int) -> reference.CanaryState:
    state = reference.CanaryState.allocate(num_slots=4, ring_capacity=capacity)
    state.violation_write_index[0] = start
    return state


def _report(state: reference.CanaryState, *slots: int) -> None:
    for slot in slots:
        reference.chain._emit_violation(state, _row(slot))


def _snapshot(ring, index: int, past=()) -> Snapshot:
    return Snapshot(
        canary_buf=np.zeros((4, 32), np.uint8),
        ring=np.asarray(ring, np.int64).reshape(-1, 8),
        write_index=index,
        slot_run_counter=0,
        kernel_run_counter=0,
        past_capacity=tuple(past),
    )


def test_the_reference_keeps_what_a_full_ring_could_not_store():
    state = _state(capacity=2, start=1)
    _report(state, 5, 6, 7)
    assert state.violation_ring[1].tolist() == list(_row(5))
    assert state.past_capacity == [(2, _row(6)), (3, _row(7))]
    assert reported_slots(state, 1) == {5, 6, 7}
    full = _state(capacity=2, start=2)  # full before the launch: nothing stored
    _report(full, 8)
    assert reported_slots(full, 2) == {8}


def test_any_choice_of_a_launchs_violations_is_accepted_and_no_other():
    kept, past = [_row(1), _row(2)], [_row(3)]
    assert chosen_row_differences([_row(3), _row(1)], kept, past) == []
    assert chosen_row_differences([_row(2), _row(1)], kept, past) == []
    extra = chosen_row_differences([_row(1), _row(4)], kept, past)
    assert extra[0].startswith("ring row extra (none of the 3 violations")
    twice = chosen_row_differences([_row(3), _row(3)], kept, past)
    assert any("ring row extra" in line for line in twice), "one violation kept twice"
    short = chosen_row_differences([_row(1)], kept, past)
    assert short == ["1 ring rows stored, want 2"]


def test_a_launch_past_the_ring_is_compared_as_a_choice_and_the_reference_takes_the_ring():
    state = _state(capacity=3, start=1)
    _report(state, 1, 2, 3)  # the reference keeps 1 and 2; 3 falls past the ring
    want = Snapshot.of_state(state)
    ring = state.violation_ring.copy()
    ring[1], ring[2] = _row(3), _row(1)  # an implementation that kept 3 and 1
    got = _snapshot(ring, 4)
    got.canary_buf = want.canary_buf
    assert state_differences(got, want, since=1) == []
    assert_same_state(got, want, index_before=1, what="verify", config="", state=state)
    assert state.violation_ring[2].tolist() == list(_row(1)), "the reference took the ring"
    ring[2] = _row(9)
    assert state_differences(_snapshot(ring, 4), want, since=1)
