"""Self-tests of the write/verify strategies: each option's guarantee holds in every draw."""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis.errors import InvalidArgument

import reference
import strategies as st_kv
from tests.strategies.draws import collect

DRAWS = 100
NONE = reference.RealKvHashMode.NONE
PARTIAL = reference.RealKvHashMode.PARTIAL
ALL = reference.RealKvHashMode.ALL


def test_reads_kv_worlds_all_read_kv_bytes():
    """``reads_kv=True``: every world has a source and a mode that reads (PARTIAL or ALL)."""
    worlds = collect(st_kv.canary_worlds(reads_kv=True), DRAWS)
    assert all(world.reads_kv for world in worlds)
    assert {world.mode for world in worlds} == {PARTIAL, ALL}
    assert {len(world.sources) for world in worlds} == {1, 2}


def test_reads_kv_keeps_only_the_reading_modes_asked_for():
    """``reads_kv=True`` with ``modes=(NONE, ALL)`` draws ALL only."""
    worlds = collect(st_kv.canary_worlds(reads_kv=True, modes=(NONE, ALL)), DRAWS)
    assert {world.mode for world in worlds} == {ALL} and all(world.sources for world in worlds)


def test_min_sources_is_a_floor():
    """``min_sources``: no world has fewer sources; every count up to the maximum is drawn."""
    counts = collect(st_kv.canary_worlds(min_sources=2, max_sources=3), DRAWS, lambda w: w.sources)
    assert {len(sources) for sources in counts} == {2, 3}


@pytest.mark.parametrize(
    ("modes", "allowed"),
    [
        ((PARTIAL,), {PARTIAL}),
        ((NONE, ALL), {NONE, ALL}),
        (st.just(ALL), {ALL}),
        (st.sampled_from([PARTIAL, ALL]), {PARTIAL, ALL}),
    ],
)
def test_modes_are_drawn_from_what_is_given(modes, allowed):
    """``modes`` as a tuple or a strategy: every world's mode is one of them, each drawn."""
    drawn = set(collect(st_kv.canary_worlds(modes=modes), DRAWS, lambda w: w.mode))
    assert drawn == allowed


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(modes=()),
        dict(modes=(3,)),
        dict(modes=(True,)),
        dict(modes=5),
        dict(reads_kv=False),
        dict(reads_kv=1),
        dict(reads_kv=True, modes=(NONE,)),
        dict(reads_kv=True, max_sources=0),
        dict(min_sources=3, max_sources=2),
        dict(min_sources=-1),
        dict(max_sources=7),
        dict(min_slots=1),
        dict(max_ring=-1),
        dict(max_slots=100),
    ],
    ids=repr,
)
def test_bad_world_arguments_raise_invalid_argument(kwargs):
    """Arguments are checked when the strategy is made, with InvalidArgument."""
    with pytest.raises(InvalidArgument):
        st_kv.canary_worlds(**kwargs)


def test_a_modes_strategy_that_draws_none_under_reads_kv_is_refused():
    """A ``modes`` strategy is drawn as given; NONE under ``reads_kv=True`` is a usage error."""
    with pytest.raises(InvalidArgument, match="reads no KV"):
        collect(st_kv.canary_worlds(reads_kv=True, modes=st.just(NONE)), 1)


# The reference launches count what a correct implementation does with a batch, so the
# guarantees below are checked against CONTRACT §6-§7, not against the strategies' own
# reading of them (chains_written, VerifyBatch.active).


def _int64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _state(world: st_kv.CanaryWorld, ring_capacity: int = 0) -> reference.CanaryState:
    state = reference.CanaryState.allocate(num_slots=world.num_slots, ring_capacity=ring_capacity)
    # random non-zero records: with mode NONE every checked entry's real-KV hash (0) differs
    state.canary_buf[:] = np.random.default_rng(world.seed).integers(
        1, 256, state.canary_buf.shape, dtype=np.uint8
    )
    return state


def entries_written(world: st_kv.CanaryWorld, batch: st_kv.WriteBatch) -> int:
    """How many entries ``reference.write`` writes for ``batch`` (its slot run counter)."""
    ids, positions, slots = batch.token_arrays()
    state = _state(world)
    reference.write(
        state,
        reference.WritePlan(
            write_offsets=_int64(batch.offsets()),
            write_seed_slot_indices=_int64([r.seed for r in batch.requests]),
            write_num_valid_reqs=np.asarray([batch.num_valid], dtype=np.int32),
        ),
        input_ids=_int64(ids),
        positions=_int64(positions),
        out_cache_loc=_int64(slots),
        enable_write_input_assert=batch.input_assert,
        expected_input_tokens=_int64(batch.expected_tokens) if batch.input_assert else None,
        expected_input_positions=_int64(batch.expected_positions) if batch.input_assert else None,
    )
    return int(state.slot_run_counter[0])


def entries_checked(world: st_kv.CanaryWorld, batch: st_kv.VerifyBatch) -> int:
    """How many entries ``reference.verify`` checks for ``batch``: over random records and
    mode NONE, each checked entry reports its real-KV hash, one ring row per entry."""
    state = _state(world, ring_capacity=batch.capacity)
    reference.verify(
        state,
        reference.VerifyPlan(
            verify_slot_indices=_int64(batch.slots),
            verify_expected_tokens=_int64(batch.expected_tokens),
            verify_expected_positions=_int64(batch.expected_positions),
            verify_prev_slot_indices=_int64(batch.prev_slots),
            verify_num_valid=np.asarray([batch.num_valid], dtype=np.int32),
            enable=np.asarray([batch.enable], dtype=np.int32),
        ),
        check_verify_expected_token=batch.check_token,
    )
    return int(state.violation_write_index[0])


@st.composite
def written_batches(draw, min_written: int, **kwargs):
    world = draw(st_kv.canary_worlds(**kwargs), label="world")
    tails = ((1, 7),) if world.num_slots > 3 else ()
    batch = draw(st_kv.write_batches(world, seeds=tails, min_written=min_written), label="batch")
    return world, batch


@pytest.mark.parametrize("min_written", [1, 4])
def test_min_written_batches_write_at_least_that_many_entries(min_written):
    """``write_batches(min_written=n)``: a correct write launch writes at least n entries, in
    every draw, with skipped entries, short num_valid and padding still drawn."""
    draws = collect(written_batches(min_written, min_slots=min_written + 2), DRAWS)
    written = [entries_written(world, batch) for world, batch in draws]
    assert min(written) >= min_written
    assert all(len(st_kv.chains_written(b)) >= 1 for _, b in draws)
    batches = [batch for _, batch in draws]
    assert any(-1 in r.slots for b in batches for r in b.requests)  # skips still drawn
    assert any(b.active < b.capacity for b in batches)  # requests past num_valid too
    assert any(b.padding for b in batches)


def test_write_batches_without_min_written_can_write_nothing():
    """The default keeps the batches that write nothing (the reason for the option)."""
    written = [entries_written(w, b) for w, b in collect(written_batches(0), DRAWS)]
    assert 0 in written and max(written) > 0


@st.composite
def checked_plans(draw, min_checked: int):
    world, batch = draw(written_batches(max(min_checked, 1)), label="write")
    chains = st_kv.chains_written(batch)
    if sum(slot != 0 for chain in chains for slot in chain.slots) < min_checked:
        chains = (st_kv.Chain(seed=-1, slots=(1,), tokens=(5,), positions=(0,)), *chains)
    plan = draw(st_kv.verify_batches(chains, min_checked=min_checked), label="verify")
    return world, plan


@pytest.mark.parametrize("min_checked", [1, 2])
def test_min_checked_plans_check_at_least_that_many_entries(min_checked):
    """``verify_batches(min_checked=n)``: a correct verify launch checks at least n entries
    (enabled, below num_valid, a slot other than 0) in every draw."""
    draws = collect(checked_plans(min_checked), DRAWS)
    assert min(entries_checked(world, plan) for world, plan in draws) >= min_checked
    plans = [plan for _, plan in draws]
    assert any(0 in plan.slots for plan in plans)  # padding still drawn
    assert {plan.enable for plan in plans} == {1, 2}


def test_verify_batches_without_min_checked_can_check_nothing():
    """The default keeps the plans that check nothing (disabled, num_valid 0, padding only)."""
    checked = [entries_checked(w, p) for w, p in collect(checked_plans(0), DRAWS)]
    assert 0 in checked and max(checked) > 0


def test_bad_batch_arguments_raise_invalid_argument():
    """min_written and min_checked beyond what the world or the chains allow are refused."""
    world = collect(st_kv.canary_worlds(min_slots=4, max_slots=4), 1)[0]
    chain = st_kv.Chain(seed=-1, slots=(0, 2), tokens=(1, 2), positions=(0, 1))
    for call in (
        lambda: st_kv.write_batches(world, min_written=-1),
        lambda: st_kv.write_batches(world, min_written=True),
        lambda: st_kv.write_batches(world, min_written=5),  # 4 slots
        lambda: st_kv.write_batches(world, avoid=frozenset({0, 1, 2}), min_written=2),
        lambda: st_kv.write_batches(world, max_requests=1, max_entries=2, min_written=3),
        lambda: st_kv.write_batches(world, max_requests=0),
        lambda: st_kv.verify_batches((chain,), min_checked=2),  # slot 0 is never checked
        lambda: st_kv.verify_batches((), min_checked=1),
        lambda: st_kv.verify_batches((chain,), max_padding=-1),
    ):
        with pytest.raises(InvalidArgument):
            call()


def test_leading_entries_come_first_and_no_request_covers_them():
    """``WriteBatch.leading``: the token arrays start with them, the offsets start past them,
    and the reference writes only the requests' entries."""
    request = st_kv.WriteRequest(-1, (3, 4), (13, 14), (0, 1))
    batch = st_kv.WriteBatch((request,), 1, ((9, 90, 5),), False, (), (), ((7, 70, 0), (8, 80, 1)))
    assert batch.token_arrays() == ([70, 80, 13, 14, 90], [0, 1, 0, 1, 5], [7, 8, 3, 4, 9])
    assert batch.offsets() == [2, 4]
    world = st_kv.CanaryWorld(  # a CanaryWorld holds plain ints
        sources=(), mode=int(NONE), num_slots=12, slot_stride_bytes=32, ring_capacity=4,
        ring_start=0, kernel_kind=int(reference.CanaryLaunchTag.HEAD_K_FULL), chain_assert=0,
        seed=5,
    )  # fmt: skip
    assert entries_written(world, batch) == 2
    assert dataclasses.replace(batch, leading=()).offsets() == [0, 2]
