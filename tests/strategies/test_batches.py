"""strategies.batches: engine batches and scatters that are what they claim (row kinds, page
tables, windows, pools, capacities below, at and above the need, distinct live slots), and
fault tables that break every check of CONTRACT §12 and §13."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.errors import InvalidArgument

import reference
from strategies.batches import (
    FAULT_BATCH,
    ROW_KINDS,
    SWA_TABLES,
    TABLE_KINDS,
    distinct_values,
    engine_batches,
    plan_faults,
    scatter_batches,
    scatter_faults,
)
from tests.strategies.draws import collect


def live_slots(batch) -> np.ndarray:
    """The slots of every position a live row's request occupies."""
    a = batch.arrays()
    parts = [
        a.req_to_token[spec.pool_row, : max(spec.prefix, 0) + max(spec.extend, 0)]
        for spec in batch.rows
        if spec.kind != "padding"
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


@settings(max_examples=200, deadline=None)
@given(batch=engine_batches())
def test_a_batch_is_a_valid_engine_step(batch):
    """Live rows own distinct pool rows and fit in them; their slots are distinct, non-zero and
    below num_slots; the write plan holds the batch; the reference plans it without refusal."""
    live = [s for s in batch.rows if s.kind != "padding"]
    assert len({s.pool_row for s in live}) == len(live) and all(s.pool_row > 0 for s in live)
    assert all(s.prefix + max(s.extend, 0) <= batch.context_len for s in live)
    slots = live_slots(batch)
    assert len(set(slots.tolist())) == slots.size and (slots > 0).all()
    assert (slots < batch.num_slots).all()
    assert batch.write_req_capacity >= batch.bs and batch.verify_capacity >= 1
    a = batch.arrays()
    if a.full_to_swa_index_mapping is not None:
        assert a.full_to_swa_index_mapping.shape[0] == batch.num_slots
    verify = reference.VerifyPlan.allocate(verify_capacity=batch.verify_capacity)
    write = reference.WritePlan.allocate(write_req_capacity=batch.write_req_capacity)
    reference.plan(
        verify, write, req_pool_indices=a.req_pool_indices, prefix_lens=a.prefix_lens,
        extend_seq_lens=a.extend_seq_lens, req_to_token=a.req_to_token,
        swa_window_size=batch.swa_window, full_to_swa_index_mapping=a.full_to_swa_index_mapping,
        verify_capacity=batch.verify_capacity,
        req_to_verify_expected_tokens=a.req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=a.req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=batch.offset,
    )  # fmt: skip


def test_every_kind_of_row_table_window_and_capacity_is_drawn():
    """Over 300 draws: every row kind, page table and SWA table, both offsets, and capacities
    below, at and above the need."""
    seen = collect(engine_batches(), 300, key=lambda b: b)
    assert {s.kind for b in seen for s in b.rows} == set(ROW_KINDS)
    assert {b.table for b in seen} == set(TABLE_KINDS)
    assert {b.swa_table for b in seen} == set(SWA_TABLES) | {None}
    assert {b.offset for b in seen if b.pool} == {0, 1}
    needs = [(b.verify_capacity, b.total_verify()) for b in seen]
    assert any(c < n for c, n in needs) and any(c == n for c, n in needs)
    assert any(c > n for c, n in needs)
    # a pool whose valid length is shorter than the prefix, and padding rows with stale
    # lengths out of every range
    assert any(s.valid_len < s.prefix for b in seen if b.pool for s in b.rows)
    assert any(s.prefix > b.context_len or s.prefix < 0 for b in seen for s in b.rows)


def test_overflow_and_no_overflow_are_held_to():
    """overflow=True always needs more than the capacity, overflow=False never does."""
    for b in collect(engine_batches(overflow=True), 100, key=lambda b: b):
        assert b.total_verify() > b.verify_capacity
    for b in collect(engine_batches(overflow=False), 100, key=lambda b: b):
        assert b.total_verify() <= b.verify_capacity


def test_evicted_tables_evict_and_recycled_rows_keep_a_stale_tail():
    """An evicted SWA table maps some slots to 0; a recycled row's tail holds live slots."""
    seen = collect(engine_batches(swa=True), 200, key=lambda b: b)
    evicted = [b for b in seen if b.swa_table == "evicted"]
    assert any((b.arrays().full_to_swa_index_mapping[1:] == 0).any() for b in evicted)
    recycled = [b for b in collect(engine_batches(), 200, key=lambda b: b) if b.table == "recycled"]
    assert any(
        (b.arrays().req_to_token[s.pool_row, s.prefix + max(s.extend, 0) + 1 :] > 0).any()
        for b in recycled
        for s in b.rows
        if s.kind != "padding"
    )


def test_the_table_does_not_depend_on_the_order_of_the_batch():
    """The same rows in another order make the same page table and pool."""
    batch = FAULT_BATCH
    moved = dataclasses.replace(batch, rows=batch.rows[::-1], table="recycled")
    same = dataclasses.replace(batch, table="recycled")
    assert np.array_equal(moved.arrays().req_to_token, same.arrays().req_to_token)


def test_an_engine_scale_batch_is_drawn_quickly():
    """4096 rows over 8192+ positions: the description is small and its arrays compact."""
    batch = collect(engine_batches(max_reqs=4096, max_context_len=9000), 1, key=lambda b: b)[0]
    assert batch.num_slots < 4 * batch.pool_rows * batch.context_len + 2


def test_distinct_values_are_distinct_non_zero_and_fit_in_int32():
    values = distinct_values(np.random.default_rng(3), 100_000)
    assert np.unique(values).size == values.size
    assert values.min() >= 1 and values.max() < 2**31 - 1


def test_scatters_have_distinct_rows_and_rows_that_overflow():
    """Requests own distinct pool rows; some are empty and some longer than a row."""
    seen = collect(scatter_batches(), 200, key=lambda b: b)
    assert all(len(set(b.pool_rows)) == len(b.pool_rows) for b in seen)
    assert any(0 in b.lengths for b in seen)
    assert any(n > b.context_len for b in seen for n in b.lengths)
    assert any(0 in b.pool_rows for b in seen)


def test_every_check_has_a_fault():
    """The fault tables break every rule of CONTRACT §12 (P1-P13) and §13 (S1-S11)."""
    assert {f.rule for f in plan_faults()} == {f"P{i}" for i in range(1, 14)}
    assert {f.rule for f in scatter_faults()} == {f"S{i}" for i in range(1, 12)}
    ids = [f.id for f in plan_faults() + scatter_faults()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("kwargs", [dict(max_reqs=0), dict(max_reqs=5000), dict(max_context_len=1)])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(InvalidArgument):
        engine_batches(**kwargs).example()
