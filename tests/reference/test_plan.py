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
        valid=None, offset=0, verify_capacity=None, table=TABLE):  # fmt: skip
    verify = reference.VerifyPlan.allocate(verify_capacity=capacity)
    verify.verify_slot_indices[:] = -7
    write = reference.WritePlan.allocate(write_req_capacity=write_capacity)
    write.write_offsets[:] = -9
    write.write_seed_slot_indices[:] = -8
    reference.plan(
        verify, write, req_pool_indices=np.array(rows), prefix_lens=np.array(prefix),
        extend_seq_lens=np.array(extend), req_to_token=table, swa_window_size=window,
        full_to_swa_index_mapping=lut,
        verify_capacity=capacity if verify_capacity is None else verify_capacity,
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


# Each rule's edges, with the contract's exact messages (CONTRACT §12).
P2 = "requires full_to_swa_index_mapping when swa_window_size > 0"
POOL_3x6 = np.arange(1, 19, dtype=np.int32).reshape(3, 6)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        # P2 from a window of 1; a negative window without a table is P8, not P2
        (dict(window=1), ValueError, "kv-canary: launch_canary_plan_kernels " + P2),
        (dict(window=-1), ValueError, "kv-canary: launch_canary_plan_kernels swa_window_size must be >= 0, got -1"),
        # P5 both ways
        (dict(verify_capacity=15), ValueError, "kv-canary: launch_canary_plan_kernels verify_capacity=15 does not match verify_plan_out.verify_slot_indices.shape[0]=16"),
        (dict(verify_capacity=17), ValueError, "kv-canary: launch_canary_plan_kernels verify_capacity=17 does not match verify_plan_out.verify_slot_indices.shape[0]=16"),
    ],
)  # fmt: skip
def test_window_and_capacity_refusals_at_their_edges(kwargs, error, message):
    with pytest.raises(error) as caught:
        run([1, 2], [5, 2], [1, 1], **kwargs)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("rows", "prefix", "valid", "error", "message"),
    [
        ([1, 5], [1, 1], None, IndexError, "kv-canary: req_pool_indices[1]=5 is outside req_to_token's 3 rows"),
        ([-1, 2], [1, 1], None, IndexError, "kv-canary: req_pool_indices[0]=-1 is outside req_to_token's 3 rows"),
        # the first broken row is named, and P11 is checked, from one past the row
        ([1, 2], [7, 9], None, ValueError, "kv-canary: prefix_lens[0]=7 exceeds req_to_token's row of 6 entries"),
        # a prefix of the whole row is taken; its pool's valid length past the row is P12
        ([1, 2], [6, 1], [7, 0], ValueError, "kv-canary: req_to_verify_expected_tokens_valid_lens[0]=7 exceeds req_to_verify_expected_tokens's row of 6 entries"),
    ],
)  # fmt: skip
def test_row_refusals_name_the_first_broken_row_exactly(rows, prefix, valid, error, message):
    pool = None if valid is None else POOL_3x6
    with pytest.raises(error) as caught:
        run(rows, prefix, [1, 1], pool=pool, valid=None if valid is None else np.array(valid))
    assert str(caught.value) == message


def test_a_prefix_of_the_whole_row_is_taken():
    verify, _ = run([1], [6], [0])
    assert int(verify.verify_num_valid[0]) == 6


def test_a_slot_far_past_the_swa_table_is_refused():
    """A slot two past the table's end (none at its end) is refused as P13 says."""
    table = TABLE.copy()
    table[1, :3] = [11, 13, 9]
    with pytest.raises(ValueError) as caught:
        run([1], [2], [1], table=table, window=4, lut=np.arange(12, dtype=np.int64))
    assert str(caught.value) == (
        "kv-canary: SWA slot 13 is outside full_to_swa_index_mapping length 12"
    )


def test_slot_0_is_translated_like_any_slot():
    """T(s) = lut[s] for every s >= 0: the padding slot too."""
    table = TABLE.copy()
    table[1, :3] = [11, 0, 13]
    lut = np.arange(30, dtype=np.int64) * 2
    lut[0] = 7
    verify, write = run([1], [3], [1], table=table, window=5, lut=lut)
    assert verify.verify_slot_indices[:3].tolist() == [22, 7, 26]
    assert verify.verify_prev_slot_indices[:3].tolist() == [-1, 22, 7]
    assert write.write_seed_slot_indices[0] == 26


def test_a_negative_offset_reads_no_token_before_the_row():
    verify, _ = run([1], [3], [1], pool=POOL, valid=np.array([6]), offset=-1)
    assert verify.verify_expected_tokens[:3].tolist() == [-1, 101, 102]


def test_a_negative_prefix_that_writes_starts_at_the_anchor():
    _, write = run([1], [-2], [3])
    assert write.write_offsets[:2].tolist() == [0, 3]
    assert write.write_seed_slot_indices[0] == -1


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("req_pool_indices", np.array(1), "kv-canary: req_pool_indices must be 1-D, got shape ()"),
        ("req_pool_indices", np.array([[1, 2]]), "kv-canary: req_pool_indices must be 1-D, got shape (1, 2)"),
        ("prefix_lens", np.array([1, 2, 3]), "kv-canary: prefix_lens must be [2], got shape (3,)"),
        ("prefix_lens", np.array([1]), "kv-canary: prefix_lens must be [2], got shape (1,)"),
        ("extend_seq_lens", np.array(1), "kv-canary: extend_seq_lens must be [2], got shape ()"),
    ],
)  # fmt: skip
def test_per_row_arrays_of_the_wrong_shape_are_refused(name, value, message):
    arrays = dict(req_pool_indices=np.array([1, 2]), prefix_lens=np.array([1, 2]),
                  extend_seq_lens=np.array([1, 1]))  # fmt: skip
    arrays[name] = value
    with pytest.raises(ValueError) as caught:
        reference.plan(
            reference.VerifyPlan.allocate(verify_capacity=4),
            reference.WritePlan.allocate(write_req_capacity=2), **arrays, req_to_token=TABLE,
            swa_window_size=0, full_to_swa_index_mapping=None, verify_capacity=4,
            req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )  # fmt: skip
    assert str(caught.value) == message
