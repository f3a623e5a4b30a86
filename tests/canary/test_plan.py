"""canary's plan launcher (CONTRACT §12): hand-computed plans, one scenario per rule (the
refusals P1 to P13 are in ``test_plan_refusals.py``).

The page table of these tests names each slot by its place: ``req_to_token[r, c]`` is
``100 * r + c + 1`` unless a test says otherwise, so a planned slot shows the row and position
it was read from.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import canary
from canary import plan as plan_module
from tests.canary.plan_cases import ROW_LEN, arguments, entries, i64, page_table, plans, run

# ----------------------------------------------------------------------------- semantics


def test_padding_rows_anywhere_contribute_nothing():
    """Rows with pool row 0, first, in the middle and last, with stale lengths past the row (no
    refusal), plan nothing; the real rows' entries follow one another from index 0."""
    verify, write = run(
        req_pool_indices=i64([0, 2, 0, 3, 0]),
        prefix_lens=i64([7, 3, 99, 0, -4]),
        extend_seq_lens=i64([5, 2, 9, 4, 1]),
    )
    assert entries(verify, 4) == {
        "slots": [201, 202, 203, 91],
        "tokens": [-1, -1, -1, 92],
        "positions": [0, 1, 2, 93],
        "prev": [-1, 201, 202, 94],
        "num_valid": 3,
        "enable": 1,
    }
    # offsets over bs + 1 = 6 rows, then 0 to the end; a seed only for the row that writes
    # after a prefix; seeds past bs untouched
    assert write.write_offsets.tolist() == [0, 0, 2, 2, 6, 6, 0]
    assert write.write_seed_slot_indices.tolist() == [-1, 203, -1, -1, -1, 55]
    assert int(write.write_num_valid_reqs) == 5


def test_a_sliding_window_starts_late_and_its_head_names_its_real_predecessor():
    """Window 3 over a prefix of 6 plans positions 3..5; the head's previous slot is position
    2's, not the anchor; a prefix shorter than the window plans from position 0."""
    verify, write = run(
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([6, 2]),
        extend_seq_lens=i64([1, 0]),
        swa_window_size=3,
        full_to_swa_index_mapping=torch.arange(300, dtype=torch.int64),
    )
    assert entries(verify, 5) == {
        "slots": [104, 105, 106, 201, 202],
        "tokens": [-1] * 5,
        "positions": [3, 4, 5, 0, 1],
        "prev": [103, 104, 105, -1, 201],
        "num_valid": 5,
        "enable": 1,
    }
    assert write.write_offsets.tolist()[:3] == [0, 1, 1]
    assert write.write_seed_slot_indices.tolist()[:2] == [106, -1]


def test_slots_are_translated_evicted_ones_to_0_negative_ones_kept():
    """With a table every slot >= 0 (entry, previous slot, seed) is looked up; an evicted slot
    becomes 0, a negative slot stays itself."""
    table = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17], [20, -1, 22, 23, 0, 0, 0, 0]])
    lut = torch.arange(30, dtype=torch.int64) + 1000
    lut[13] = 0  # evicted
    verify, write = run(
        req_pool_indices=i64([1, 0, 2]),
        prefix_lens=i64([1, 0, 3]),
        extend_seq_lens=i64([0, 0, 2]),
        req_to_token=torch.cat([torch.zeros(1, 8, dtype=torch.int32), table.int()]),
        swa_window_size=2,
        full_to_swa_index_mapping=lut,
    )
    # row 0 (pool row 1): position 0 -> slot 10; row 2 (pool row 2): positions 1, 2
    assert entries(verify, 3) == {
        "slots": [1010, -1, 1022],
        "tokens": [-1] * 3,
        "positions": [0, 1, 2],
        "prev": [-1, 1020, -1],
        "num_valid": 3,
        "enable": 1,
    }
    assert write.write_seed_slot_indices.tolist()[:3] == [-1, -1, 1022]
    # the evicted slot 13, at position 3 of pool row 1
    verify, write = run(
        req_pool_indices=i64([1]),
        prefix_lens=i64([5]),
        extend_seq_lens=i64([3]),
        req_to_token=torch.cat([torch.zeros(1, 8, dtype=torch.int32), table.int()]),
        swa_window_size=2,
        full_to_swa_index_mapping=lut,
    )
    assert entries(verify, 2)["slots"] == [0, 1014]
    assert entries(verify, 2)["prev"] == [1012, 0]
    assert write.write_seed_slot_indices.tolist()[0] == 1014


def test_a_table_without_a_window_translates_every_position():
    """swa_window_size 0 with a table: a full window, every slot translated."""
    verify, write = run(
        prefix_lens=i64([3]),
        full_to_swa_index_mapping=torch.arange(200, dtype=torch.int64) * 2,
    )
    assert entries(verify, 3)["slots"] == [202, 204, 206]
    assert entries(verify, 3)["prev"] == [-1, 202, 204]
    assert write.write_seed_slot_indices.tolist()[0] == 206


def test_expected_tokens_come_from_the_pool_with_the_offset_below_the_valid_length():
    """Offset +1 reads position + 1, only below the row's valid length (shorter than the
    prefix here); a negative pool value is sign-extended; offset 0 and -1 alike."""
    pool = (torch.arange(ROW_LEN, dtype=torch.int32) + 1000 * torch.arange(5)[:, None]).int()
    pool[1, 1] = -7
    for offset, want in (
        (1, [-7, 1002, -1, -1, 3001, 3002]),
        (0, [1000, -7, 1002, -1, 3000, 3001]),
        (-1, [-1, 1000, -7, 1002, -1, 3000]),
    ):
        verify, _ = run(
            req_pool_indices=i64([1, 0, 3]),
            prefix_lens=i64([4, 50, 2]),
            extend_seq_lens=i64([1, 1, 1]),
            req_to_verify_expected_tokens=pool,
            req_to_verify_expected_tokens_valid_lens=i64([3, 99, 8]),  # 99: padding, stale
            kv_token_id_vs_position_offset=offset,
        )
        assert entries(verify, 6)["tokens"] == want, offset
        assert entries(verify, 6)["positions"] == [0, 1, 2, 3, 0, 1]


def test_a_negative_offset_past_the_tables_row_count_is_kept():
    """A table with fewer rows (2) than its row length (8): offset -3 reads position - 3, not
    an offset clamped at the number of rows."""
    pool = (torch.arange(ROW_LEN, dtype=torch.int32) + 1000 * torch.arange(2)[:, None]).int()
    verify, _ = run(
        req_to_token=page_table(rows=2),
        prefix_lens=i64([8]),
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=i64([8]),
        kv_token_id_vs_position_offset=-3,
    )
    assert entries(verify, 8)["tokens"] == [-1, -1, -1, 1000, 1001, 1002, 1003, 1004]


def test_an_offset_far_outside_the_row_reads_nothing():
    """Offsets of any size are valid; past every row they check no token."""
    pool = torch.ones(5, ROW_LEN, dtype=torch.int32)
    for offset in (2**40, -(2**62), np.int64(-9), np.uint64(2**63)):
        verify, _ = run(
            req_to_verify_expected_tokens=pool,
            req_to_verify_expected_tokens_valid_lens=i64([8]),
            kv_token_id_vs_position_offset=offset,
        )
        assert entries(verify, 2)["tokens"] == [-1, -1], offset


def test_overflow_disables_the_plan_and_writes_no_entry():
    """More entries than the capacity: num_valid is the capacity, enable 0, the entries keep
    what they held; the write plan is made all the same."""
    verify, write = run(
        capacity=4,
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([3, 2]),
        extend_seq_lens=i64([2, 1]),
    )
    assert entries(verify, 4) == {
        "slots": [91] * 4,
        "tokens": [92] * 4,
        "positions": [93] * 4,
        "prev": [94] * 4,
        "num_valid": 4,
        "enable": 0,
    }
    assert write.write_offsets.tolist()[:4] == [0, 2, 3, 0]
    assert write.write_seed_slot_indices.tolist()[:2] == [103, 202]


def test_exactly_the_capacity_fits_and_enables_a_disabled_plan():
    """Total == capacity is no overflow; a plan disabled before is enabled again."""
    verify, write = plans(capacity=5)
    verify.enable.zero_()
    canary.launch_canary_plan_kernels(
        **arguments(
            verify,
            write,
            req_pool_indices=i64([1, 2]),
            prefix_lens=i64([3, 2]),
            extend_seq_lens=i64([1, 1]),
        )
    )
    assert entries(verify, 5)["slots"] == [101, 102, 103, 201, 202]
    assert (int(verify.verify_num_valid), int(verify.enable)) == (5, 1)


def test_negative_lengths_plan_nothing():
    """A negative prefix or extend length of a real row: no entry, no write, seed -1."""
    verify, write = run(
        req_pool_indices=i64([1, 2, 3]),
        prefix_lens=i64([-3, 2, -(2**63)]),
        extend_seq_lens=i64([4, -2, -1]),
    )
    assert entries(verify, 2)["slots"] == [201, 202]
    assert entries(verify, 2)["num_valid"] == 2
    assert write.write_offsets.tolist() == [0, 4, 4, 4, 0, 0, 0]
    assert write.write_seed_slot_indices.tolist() == [-1, -1, -1, 55, 55, 55]


def test_an_empty_batch_plans_nothing():
    """bs 0: no entry, enabled; every offset 0, no seed written, no valid request."""
    verify, write = run(req_pool_indices=i64([]), prefix_lens=i64([]), extend_seq_lens=i64([]))
    assert entries(verify, 1) == {
        "slots": [91],
        "tokens": [92],
        "positions": [93],
        "prev": [94],
        "num_valid": 0,
        "enable": 1,
    }
    assert write.write_offsets.tolist() == [0] * 7
    assert write.write_seed_slot_indices.tolist() == [55] * 6
    assert int(write.write_num_valid_reqs) == 0


def plan_by_hand(args: dict):
    """CONTRACT §12 step by step, in Python, for the larger comparison below."""
    rows = args["req_pool_indices"].tolist()
    prefix = args["prefix_lens"].tolist()
    extend = args["extend_seq_lens"].tolist()
    table = args["req_to_token"]
    lut = args["full_to_swa_index_mapping"]
    pool = args["req_to_verify_expected_tokens"]
    lens = args["req_to_verify_expected_tokens_valid_lens"]
    window, offset = args["swa_window_size"], args["kv_token_id_vs_position_offset"]

    def t(slot: int) -> int:
        return int(lut[slot]) if lut is not None and slot >= 0 else slot

    planned: list[tuple] = []
    offsets, seeds, running = [], [], 0
    for r, rp in enumerate(rows):
        offsets.append(running)
        if rp == 0:
            seeds.append(-1)
            continue
        p, w = prefix[r], max(0, extend[r])
        first = max(0, p - window) if window > 0 else 0
        for pos in range(first, p):
            token = -1
            if pool is not None and 0 <= pos + offset < int(lens[r]):
                token = int(pool[rp, pos + offset])
            prev = t(int(table[rp, pos - 1])) if pos > 0 else -1
            planned.append((t(int(table[rp, pos])), token, pos, prev))
        seeds.append(t(int(table[rp, p - 1])) if w > 0 and p > 0 else -1)
        running += w
    offsets.append(running)
    return planned, offsets, seeds


def test_one_entry_past_a_program_is_planned_beside_rows_without_entries():
    """2,049 entries, one past the first entry program, with a padding row and rows of prefix
    0 and -3 around them: rows without entries count 0 entries, so the last entry is planned."""
    row_len = plan_module.PLAN_ENTRIES_BLOCK + 1
    table = page_table(rows=3, row_len=row_len)
    verify, write = run(
        capacity=row_len,
        req_to_token=table,
        req_pool_indices=i64([0, 2, 1, 0, 1]),
        prefix_lens=i64([0, 0, row_len, 5, -3]),
        extend_seq_lens=i64([1, 4, 1, 1, 1]),
    )
    assert verify.verify_slot_indices.tolist() == table[1].tolist()
    assert verify.verify_expected_positions.tolist() == list(range(row_len))
    assert (int(verify.verify_num_valid), int(verify.enable)) == (row_len, 1)


@pytest.mark.parametrize("with_swa", [False, True])
def test_a_large_batch_matches_the_rules_step_by_step(with_swa):
    """1,500 rows (two steps of the offsets kernel), ~6,000 entries (several entry programs),
    padding rows and negative lengths mixed in: every field as the contract's steps give it.
    With a window the plan's capacity is exactly its total, so a host total off by anything
    overflows the grid's sizing and leaves entries past the first program unwritten."""
    gen = torch.Generator().manual_seed(7)
    bs, pool_rows, row_len = 1500, 400, 16
    table = torch.randint(-2, 3000, (pool_rows, row_len), generator=gen, dtype=torch.int32)
    pool = torch.randint(-5, 9000, (pool_rows, row_len), generator=gen, dtype=torch.int32)
    rows = torch.randint(0, pool_rows, (bs,), generator=gen)
    rows[::7] = 0
    prefix = torch.randint(-2, row_len + 1, (bs,), generator=gen)
    extend = torch.randint(-1, 4, (bs,), generator=gen)
    lens = torch.randint(-1, row_len + 1, (bs,), generator=gen)
    args = arguments(
        None,
        None,
        req_pool_indices=rows,
        prefix_lens=prefix,
        extend_seq_lens=extend,
        req_to_token=table,
        swa_window_size=5 if with_swa else 0,
        full_to_swa_index_mapping=torch.randperm(3000, generator=gen) if with_swa else None,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=1,
    )
    planned, offsets, seeds = plan_by_hand(args)
    n = len(planned)
    assert n > plan_module.PLAN_ENTRIES_BLOCK
    capacity = n if with_swa else 12000
    verify, write = plans(capacity=capacity, write_capacity=bs + 3)
    args.update(verify_plan_out=verify, write_plan_out=write, verify_capacity=capacity)
    canary.launch_canary_plan_kernels(**args)
    got = list(
        zip(
            verify.verify_slot_indices[:n].tolist(),
            verify.verify_expected_tokens[:n].tolist(),
            verify.verify_expected_positions[:n].tolist(),
            verify.verify_prev_slot_indices[:n].tolist(),
        )
    )
    assert got == planned
    assert verify.verify_slot_indices[n:].eq(91).all()
    assert (int(verify.verify_num_valid), int(verify.enable)) == (n, 1)
    assert write.write_offsets.tolist() == offsets + [0, 0, 0]
    assert write.write_seed_slot_indices.tolist() == seeds + [55, 55, 55]
    assert int(write.write_num_valid_reqs) == bs
