"""The reference's plan (CONTRACT §12) and scatter (§13) on hand-computed batches: every item
of the contract's description, each refusal, and that a refusal writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import reference

# A page table of 3 pool rows (row 0 is the padding row) and 6 positions.
TABLE = np.array(
    [[0, 0, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 25, 26]], dtype=np.int32
)
POOL = np.array([[0] * 6, [101, 102, 103, 104, 105, 106], [201, 202, 203, 204, 205, 206]], np.int32)


def run(rows, prefix, extend, *, capacity=16, write_capacity=4, window=0, lut=None, pool=None,
        valid=None, offset=0):  # fmt: skip
    verify = reference.VerifyPlan.allocate(verify_capacity=capacity)
    verify.verify_slot_indices[:] = -7
    write = reference.WritePlan.allocate(write_req_capacity=write_capacity)
    write.write_offsets[:] = -9
    write.write_seed_slot_indices[:] = -8
    reference.plan(
        verify, write, req_pool_indices=np.array(rows), prefix_lens=np.array(prefix),
        extend_seq_lens=np.array(extend), req_to_token=TABLE, swa_window_size=window,
        full_to_swa_index_mapping=lut, verify_capacity=capacity,
        req_to_verify_expected_tokens=pool, req_to_verify_expected_tokens_valid_lens=valid,
        kv_token_id_vs_position_offset=offset,
    )  # fmt: skip
    return verify, write


def test_entries_run_from_the_window_start_through_the_prefix_with_the_real_predecessor():
    verify, write = run([2, 1], [3, 5], [1, 2], window=2, lut=np.arange(30, dtype=np.int64))
    n = int(verify.verify_num_valid[0])
    assert n == 4 and verify.enable[0] == 1
    assert verify.verify_slot_indices[:n].tolist() == [22, 23, 14, 15]
    assert verify.verify_expected_positions[:n].tolist() == [1, 2, 3, 4]
    # the window's head names its real predecessor: the chain is not restarted
    assert verify.verify_prev_slot_indices[:n].tolist() == [21, 22, 13, 14]
    assert verify.verify_slot_indices[n:].tolist() == [-7] * 12  # never written


def test_the_chain_head_has_previous_slot_minus_one_and_padding_rows_count_nothing():
    verify, write = run([0, 1, 0], [9, 2, -4], [7, 3, 5], write_capacity=5)
    n = int(verify.verify_num_valid[0])
    assert verify.verify_slot_indices[:n].tolist() == [11, 12]
    assert verify.verify_prev_slot_indices[:n].tolist() == [-1, 11]
    assert write.write_offsets.tolist() == [0, 0, 3, 3, 0, 0]
    assert write.write_seed_slot_indices.tolist() == [-1, 12, -1, -8, -8]
    assert int(write.write_num_valid_reqs[0]) == 3


def test_seeds_need_a_prefix_and_a_write_and_negative_lengths_give_nothing():
    verify, write = run([1, 2], [0, -2], [3, -1])
    assert int(verify.verify_num_valid[0]) == 0 and verify.enable[0] == 1
    assert write.write_offsets[:3].tolist() == [0, 3, 3]
    assert write.write_seed_slot_indices[:2].tolist() == [-1, -1]


def test_slots_seeds_and_previous_slots_are_translated_and_negatives_kept():
    lut = np.arange(30, dtype=np.int64) * 2
    lut[12] = 0  # evicted
    verify, write = run([1], [3], [1], lut=lut, window=2)
    n = int(verify.verify_num_valid[0])
    assert verify.verify_slot_indices[:n].tolist() == [0, 26]
    assert verify.verify_prev_slot_indices[:n].tolist() == [22, 0]
    assert write.write_seed_slot_indices[0] == 26


def test_expected_tokens_are_read_below_the_valid_length_at_the_offset():
    verify, _ = run([1, 2], [4, 3], [1, 1], pool=POOL, valid=np.array([3, 6]), offset=1)
    n = int(verify.verify_num_valid[0])
    # row 1: positions 0..3 read 1..4, valid below 3; row 2: positions 0..2 read 1..3
    assert verify.verify_expected_tokens[:n].tolist() == [102, 103, -1, -1, 202, 203, 204]


def test_overflow_clamps_disables_and_writes_no_entry_but_the_write_plan():
    verify, write = run([1, 2], [4, 3], [2, 1], capacity=6)
    assert int(verify.verify_num_valid[0]) == 6 and verify.enable[0] == 0
    assert verify.verify_slot_indices.tolist() == [-7] * 6
    assert write.write_offsets[:3].tolist() == [0, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(window=2), ValueError, "requires full_to_swa_index_mapping"),
        (dict(pool=POOL), ValueError, "requires req_to_verify_expected_tokens_valid_lens"),
        (dict(capacity=16, write_capacity=1), ValueError, "bs=2 exceeds write_req_capacity=1"),
        (dict(window=-1, lut=np.arange(30)), ValueError, "swa_window_size must be >= 0, got -1"),
        (dict(lut=np.arange(14), window=9), ValueError, "SWA slot 14 is outside full_to_swa_index_mapping length 14"),
        (dict(pool=POOL, valid=np.array([7, 0])), ValueError, "valid_lens[0]=7 exceeds"),
    ],
)  # fmt: skip
def test_refusals_name_the_rule_and_write_nothing(kwargs, error, words):
    with pytest.raises(error, match=None) as caught:
        run([1, 2], [5, 2], [1, 1], **kwargs)
    assert words in str(caught.value)


def test_a_refusal_leaves_both_plans_as_they_were():
    verify = reference.VerifyPlan.allocate(verify_capacity=4)
    write = reference.WritePlan.allocate(write_req_capacity=2)
    write.write_offsets[:] = 5
    with pytest.raises(IndexError, match=r"req_pool_indices\[1\]=3 is outside req_to_token's 3"):
        reference.plan(
            verify, write, req_pool_indices=np.array([1, 3]), prefix_lens=np.array([1, 1]),
            extend_seq_lens=np.array([1, 1]), req_to_token=TABLE, swa_window_size=0,
            full_to_swa_index_mapping=None, verify_capacity=4,
            req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )  # fmt: skip
    assert write.write_offsets.tolist() == [5, 5, 5] and int(verify.verify_num_valid[0]) == 0


def test_scatter_cuts_to_32_bits_and_drops_tokens_past_the_row():
    pool = np.full((3, 4), 9, dtype=np.int32)
    flat = np.array([1, 2**32 + 5, -3, 7, 8, 9, 10, 11], dtype=np.int64)
    reference.scatter(
        flat_in=flat, offsets=np.array([0, 3, 3, 8]), req_pool_indices=np.array([2, 0, 1]),
        pool_out=pool,
    )  # fmt: skip
    assert pool.tolist() == [[9, 9, 9, 9], [7, 8, 9, 10], [1, 5, -3, 9]]


@pytest.mark.parametrize(
    ("offsets", "rows", "error", "words"),
    [
        ([1, 3, 8], [1, 2], ValueError, "offsets must start at 0"),
        ([-1, 3, 8], [1, 2], ValueError, "offsets must start at 0"),
        ([0, 9, 8], [1, 2], ValueError, "never decrease"),
        ([0, 3, 7], [1, 2], ValueError, "end at flat_in's length 8"),
        ([0, 3, 9], [1, 2], ValueError, "end at flat_in's length 8"),
        ([0, 3, 8], [1, 3], IndexError, "req_pool_indices[1]=3 is outside pool_out's 3 rows"),
        ([0, 7, 8], [1, -1], IndexError, "req_pool_indices[1]=-1 is outside pool_out's 3 rows"),
        ([0, 3, 8], [1, 5], IndexError, "req_pool_indices[1]=5 is outside pool_out's 3 rows"),
        ([0, 3], [1, 2], ValueError, "offsets length 2 != bs+1 (3)"),
    ],
)
def test_scatter_refusals_write_nothing(offsets, rows, error, words):
    pool = np.full((3, 4), 9, dtype=np.int32)
    with pytest.raises(error) as caught:
        reference.scatter(
            flat_in=np.arange(1, 9, dtype=np.int64), offsets=np.array(offsets),
            req_pool_indices=np.array(rows), pool_out=pool,
        )  # fmt: skip
    assert words in str(caught.value)
    assert (pool == 9).all()


def test_scatter_a_request_without_tokens_names_any_row():
    """S11 holds for requests that own a token: one without names no row it must fit."""
    pool = np.full((3, 4), 9, dtype=np.int32)
    reference.scatter(
        flat_in=np.array([5, 6], dtype=np.int64), offsets=np.array([0, 0, 2, 2]),
        req_pool_indices=np.array([7, 1, -1]), pool_out=pool,
    )  # fmt: skip
    assert pool.tolist() == [[9, 9, 9, 9], [5, 6, 9, 9], [9, 9, 9, 9]]
