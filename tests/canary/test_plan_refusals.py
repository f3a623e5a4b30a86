"""canary's plan launcher (CONTRACT §12): every refusal P1 to P13 in order, each leaving both
plans as they were."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import canary
from tests.canary.plan_cases import ROW_LEN, arguments, entries, i64, page_table, plans, run

# ----------------------------------------------------------------------------- refusals


def tensors_of(*given) -> list[torch.Tensor]:
    """Every tensor of the plans among ``given``."""
    return [
        getattr(plan, name)
        for plan in given
        if isinstance(plan, (canary.VerifyPlan, canary.WritePlan))
        for name in plan.__dataclass_fields__
        if isinstance(getattr(plan, name), torch.Tensor)
    ]


def refused(error: type, match: str, **given) -> str:
    """Launch with ``given`` changed; the launch raises ``error`` matching ``match`` (a regex
    from the start of the message) and both plans keep every value they held."""
    verify, write = given.pop("plans", None) or plans()
    args = arguments(verify, write, **given)
    launched = (verify, write, args["verify_plan_out"], args["write_plan_out"])
    before = [t.clone() for t in tensors_of(*launched)]
    with pytest.raises(error, match="^" + match) as raised:
        canary.launch_canary_plan_kernels(**args)
    after = tensors_of(*launched)
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new), "a refused launch changed a plan"
    return str(raised.value)


def exactly(message: str) -> str:
    import re

    return re.escape(message) + "$"


@pytest.mark.parametrize(
    "given, name",
    [
        ({"verify_plan_out": None}, "verify_plan_out"),
        ({"write_plan_out": "plan"}, "write_plan_out"),
        ({"prefix_lens": [1]}, "prefix_lens"),
        ({"req_to_token": page_table().numpy()}, "req_to_token"),
        ({"swa_window_size": 1.0}, "swa_window_size"),
        ({"swa_window_size": True}, "swa_window_size"),
        ({"full_to_swa_index_mapping": [0, 1]}, "full_to_swa_index_mapping"),
        ({"verify_capacity": None}, "verify_capacity"),
        ({"req_to_verify_expected_tokens": 3}, "req_to_verify_expected_tokens"),
        (
            {"req_to_verify_expected_tokens_valid_lens": np.zeros(1)},
            "req_to_verify_expected_tokens_valid_lens",
        ),
        ({"kv_token_id_vs_position_offset": None}, "kv_token_id_vs_position_offset"),
    ],
)
def test_p1_an_argument_of_the_wrong_kind_is_a_type_error_naming_it(given, name):
    message = refused(TypeError, "kv-canary: ", **given)
    assert name in message


def test_p1_a_plan_field_that_is_no_tensor_is_named():
    verify, write = plans()
    broken = canary.VerifyPlan(
        **{**{f: getattr(verify, f) for f in verify.__dataclass_fields__}, "enable": None}
    )
    message = refused(TypeError, "kv-canary: ", plans=(broken, write), verify_plan_out=broken)
    assert "verify_plan_out.enable" in message
    broken_write = canary.WritePlan(
        write_offsets=write.write_offsets,
        write_seed_slot_indices=write.write_seed_slot_indices,
        write_num_valid_reqs=[0],
    )
    message = refused(TypeError, "kv-canary: ", plans=(verify, broken_write))
    assert "write_plan_out.write_num_valid_reqs" in message


def test_p2_a_window_needs_its_table():
    refused(
        ValueError,
        exactly(
            "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when "
            "swa_window_size > 0"
        ),
        swa_window_size=4,
        req_to_verify_expected_tokens=page_table(),  # P3 is broken too: P2 comes first
    )
    refused(ValueError, "kv-canary: launch_canary_plan_kernels requires ", swa_window_size=1)


def test_p3_a_pool_needs_its_valid_lengths():
    refused(
        ValueError,
        exactly(
            "kv-canary: launch_canary_plan_kernels requires "
            "req_to_verify_expected_tokens_valid_lens when req_to_verify_expected_tokens is set"
        ),
        req_to_verify_expected_tokens=page_table(),
        verify_capacity=3,  # P5 is broken too: P3 comes first
    )


def test_p4_at_most_4096_rows():
    rows = torch.ones(4097, dtype=torch.int64)
    refused(
        ValueError,
        exactly(
            "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch, "
            "got bs=4097. Bump _PLAN_BS_BLOCK_SIZE if real workloads need this."
        ),
        req_pool_indices=rows,
        prefix_lens=rows,
        extend_seq_lens=rows,
    )


def test_p5_the_capacity_is_the_plan_s_length():
    refused(
        ValueError,
        exactly(
            "kv-canary: launch_canary_plan_kernels verify_capacity=15 does not match "
            "verify_plan_out.verify_slot_indices.shape[0]=16"
        ),
        verify_capacity=15,
    )


def test_p6_the_write_plan_holds_every_row():
    rows = i64([1, 2, 3])
    refused(
        ValueError,
        exactly("kv-canary: bs=3 exceeds write_req_capacity=2"),
        plans=plans(write_capacity=2),
        req_pool_indices=rows,
        prefix_lens=rows,
        extend_seq_lens=rows,
    )


def test_p5_reads_the_first_dimension_also_of_a_tensor_p9_refuses():
    """P5 compares the capacity with verify_slot_indices.shape[0] and names it, before P9
    refuses a 2-D tensor."""
    verify, write = plans()
    fields = {f: getattr(verify, f) for f in verify.__dataclass_fields__}
    wide = canary.VerifyPlan(**{**fields, "verify_slot_indices": torch.zeros(16, 3).long()})
    refused(
        ValueError,
        exactly(
            "kv-canary: launch_canary_plan_kernels verify_capacity=15 does not match "
            "verify_plan_out.verify_slot_indices.shape[0]=16"
        ),
        plans=(wide, write),
        verify_capacity=15,
    )
    refused(
        ValueError,
        "kv-canary: verify_plan_out.verify_slot_indices must have shape ",
        plans=(wide, write),
        verify_capacity=16,
    )


def test_p6_names_the_seeds_length_also_of_a_tensor_p9_refuses():
    """write_req_capacity is the seeds' length, their first dimension: P6 comes before P9, so a
    2-D seed tensor too short for the batch is refused by P6, naming that length."""
    verify, write = plans()
    wide = canary.WritePlan(
        write_offsets=write.write_offsets,
        write_seed_slot_indices=torch.zeros(2, 7, dtype=torch.int64),
        write_num_valid_reqs=write.write_num_valid_reqs,
    )
    rows = i64([1, 2, 3])
    refused(
        ValueError,
        exactly("kv-canary: bs=3 exceeds write_req_capacity=2"),
        plans=(verify, wide),
        req_pool_indices=rows,
        prefix_lens=rows,
        extend_seq_lens=rows,
    )


def test_p4_p6_count_the_first_dimension_also_of_a_tensor_p9_refuses():
    """bs is req_pool_indices.shape[0]: P4 and P6 come before P9 and count it for a 2-D
    tensor too."""
    rows = torch.ones(4097, 1, dtype=torch.int64)
    refused(
        ValueError,
        "kv-canary: launch_canary_plan_kernels supports at most bs=4096 reqs per launch, "
        "got bs=4097",
        req_pool_indices=rows,
    )
    refused(
        ValueError,
        exactly("kv-canary: bs=3 exceeds write_req_capacity=2"),
        plans=plans(write_capacity=2),
        req_pool_indices=torch.ones(3, 1, dtype=torch.int64),
    )


def test_p7_every_tensor_is_contiguous():
    refused(
        ValueError,
        exactly("kv-canary: prefix_lens must be contiguous"),
        prefix_lens=i64([2, 0, 2, 0])[::2],
    )
    refused(
        ValueError,
        exactly("kv-canary: req_to_token must be contiguous"),
        req_to_token=page_table().t(),
    )
    verify, write = plans()
    strided = canary.WritePlan(
        write_offsets=torch.zeros(14, dtype=torch.int64)[::2],
        write_seed_slot_indices=write.write_seed_slot_indices,
        write_num_valid_reqs=write.write_num_valid_reqs,
    )
    refused(
        ValueError,
        exactly("kv-canary: write_plan_out.write_offsets must be contiguous"),
        plans=(verify, strided),
    )


def test_p8_the_window_is_not_negative():
    message = refused(ValueError, "kv-canary: swa_window_size", swa_window_size=-1)
    assert "-1" in message


@pytest.mark.parametrize(
    "given, name",
    [
        ({"req_to_token": page_table().long()}, "req_to_token"),
        ({"req_to_token": page_table()[0]}, "req_to_token"),
        ({"prefix_lens": i64([2, 3])}, "prefix_lens"),
        ({"extend_seq_lens": i64([2]).int()}, "extend_seq_lens"),
        ({"req_pool_indices": i64([[1]])}, "req_pool_indices"),
        ({"full_to_swa_index_mapping": torch.arange(9).int()}, "full_to_swa_index_mapping"),
        (
            {
                "req_to_verify_expected_tokens": page_table().long(),
                "req_to_verify_expected_tokens_valid_lens": i64([1]),
            },
            "req_to_verify_expected_tokens",
        ),
        (
            {
                "req_to_verify_expected_tokens": page_table(),
                "req_to_verify_expected_tokens_valid_lens": i64([1, 1]),
            },
            "req_to_verify_expected_tokens_valid_lens",
        ),
        (
            {"full_to_swa_index_mapping": torch.arange(9, device="meta")},
            "full_to_swa_index_mapping",
        ),
    ],
)
def test_p9_each_tensor_has_its_dtype_shape_and_device(given, name):
    message = refused(ValueError, f"kv-canary: {name} ", **given)
    assert "got" in message


def test_p9_plan_fields_have_their_dtype_and_shape():
    verify, write = plans()
    fields = {f: getattr(verify, f) for f in verify.__dataclass_fields__}
    wrong = canary.VerifyPlan(**{**fields, "enable": torch.ones(2, dtype=torch.int32)})
    message = refused(ValueError, "kv-canary: verify_plan_out.enable ", plans=(wrong, write))
    assert "[1]" in message and "[2]" in message
    wrong = canary.VerifyPlan(**{**fields, "verify_expected_tokens": torch.zeros(15).long()})
    refused(ValueError, "kv-canary: verify_plan_out.verify_expected_tokens ", plans=(wrong, write))
    wrong = canary.VerifyPlan(**{**fields, "verify_num_valid": torch.ones(1, dtype=torch.int64)})
    refused(ValueError, "kv-canary: verify_plan_out.verify_num_valid ", plans=(wrong, write))
    wrong = canary.VerifyPlan(**{**fields, "verify_prev_slot_indices": torch.zeros(16).int()})
    refused(
        ValueError, "kv-canary: verify_plan_out.verify_prev_slot_indices ", plans=(wrong, write)
    )
    short = canary.WritePlan(
        write_offsets=torch.zeros(6, dtype=torch.int64),
        write_seed_slot_indices=write.write_seed_slot_indices,
        write_num_valid_reqs=write.write_num_valid_reqs,
    )
    refused(ValueError, "kv-canary: write_plan_out.write_offsets ", plans=(verify, short))
    # write_offsets holds seeds.shape[0] + 1 entries: with 2-D seeds, only the seeds are wrong
    wide = canary.WritePlan(
        write_offsets=torch.zeros(7, dtype=torch.int64),
        write_seed_slot_indices=torch.zeros(6, 2, dtype=torch.int64),
        write_num_valid_reqs=write.write_num_valid_reqs,
    )
    refused(ValueError, "kv-canary: write_plan_out.write_seed_slot_indices ", plans=(verify, wide))


def test_p10_a_real_row_is_a_row_of_the_table_and_of_the_pool():
    message = refused(
        IndexError,
        "kv-canary: req_pool_indices\\[2\\]",
        req_pool_indices=i64([0, 1, 5]),
        prefix_lens=i64([0, 1, 99]),  # P11 is broken too: P10 comes first
        extend_seq_lens=i64([0, 1, 1]),
    )
    assert "5" in message and "req_to_token" in message
    refused(IndexError, "kv-canary: req_pool_indices\\[0\\] = 7", req_pool_indices=i64([7]))
    refused(
        IndexError,
        "kv-canary: req_pool_indices\\[0\\] = -1",
        req_pool_indices=i64([-1]),
    )
    for row in (3, 4):  # the pool's end and past it, both rows of the table
        message = refused(
            IndexError,
            f"kv-canary: req_pool_indices\\[0\\] = {row}",
            req_pool_indices=i64([row]),
            req_to_verify_expected_tokens=page_table(rows=3),
            req_to_verify_expected_tokens_valid_lens=i64([1]),
        )
        assert "req_to_verify_expected_tokens (3 rows)" in message


def test_p11_a_real_row_s_prefix_fits_its_row():
    message = refused(
        ValueError,
        "kv-canary: prefix_lens\\[1\\] = 9",
        req_pool_indices=i64([0, 2]),
        prefix_lens=i64([50, 9]),
        extend_seq_lens=i64([0, 0]),
    )
    assert "(8)" in message


def test_p12_a_real_row_s_valid_length_fits_the_pool_row():
    message = refused(
        ValueError,
        "kv-canary: req_to_verify_expected_tokens_valid_lens\\[0\\] = 7",
        req_to_verify_expected_tokens=page_table(row_len=6),
        req_to_verify_expected_tokens_valid_lens=i64([7]),
    )
    assert "(6)" in message


def test_p13_every_translated_slot_is_in_the_table():
    """The window's entries, its head's previous slot and the seed are translated and
    checked, also when the plan then overflows; slots the plan never translates (before the
    window's previous slot, past the prefix, of padding rows, negative ones) are not."""
    table = torch.zeros(3, ROW_LEN, dtype=torch.int32)
    table[1] = torch.tensor([900, 901, -5, 3, 4, 950, 960, 970])
    table[2] = torch.tensor([999, 998, 1, 2, 3, 4, 5, 6])
    lut = torch.arange(10, dtype=torch.int64)
    # row 1: window 2 over prefix 5 -> positions 3, 4, previous slot of position 2 (-5): fine
    verify, write = run(
        req_to_token=table,
        req_pool_indices=i64([1, 0]),
        prefix_lens=i64([5, 8]),
        swa_window_size=2,
        full_to_swa_index_mapping=lut,
        extend_seq_lens=i64([1, 1]),
    )
    assert entries(verify, 2)["slots"] == [3, 4]
    assert entries(verify, 2)["prev"] == [-5, 3]
    # row 2: window 5 over prefix 7 -> positions 2..6, previous slot of position 1: 998
    refused(
        ValueError,
        exactly("kv-canary: SWA slot 998 is outside full_to_swa_index_mapping length 10"),
        req_to_token=table,
        req_pool_indices=i64([2]),
        prefix_lens=i64([7]),
        swa_window_size=5,
        full_to_swa_index_mapping=lut,
        plans=plans(capacity=2),  # it would overflow: checked all the same
        verify_capacity=2,
    )
    # the last position, also the seed
    refused(
        ValueError,
        exactly("kv-canary: SWA slot 950 is outside full_to_swa_index_mapping length 10"),
        req_to_token=table,
        req_pool_indices=i64([1]),
        prefix_lens=i64([6]),
        swa_window_size=2,
        full_to_swa_index_mapping=lut,
    )


def test_p13_checks_each_row_s_own_positions():
    """Two windowed rows: the second row's window head has its previous slot past the table,
    which is found where the second row's positions start, after the first row's."""
    table = torch.zeros(3, ROW_LEN, dtype=torch.int32)
    table[1] = torch.arange(1, ROW_LEN + 1, dtype=torch.int32)
    table[2] = torch.tensor([1, 2, 3, 950, 4, 5, 6, 7], dtype=torch.int32)
    refused(
        ValueError,
        exactly("kv-canary: SWA slot 950 is outside full_to_swa_index_mapping length 10"),
        req_to_token=table,
        req_pool_indices=i64([1, 2]),
        prefix_lens=i64([5, 7]),
        extend_seq_lens=i64([1, 1]),
        swa_window_size=3,
        full_to_swa_index_mapping=torch.arange(10, dtype=torch.int64),
    )


def test_p13_reads_a_one_position_prefix_and_nothing_of_rows_without_one():
    """A row with prefix 1 translates the slot of position 0 (its one entry and its seed); a
    real row with prefix 0 and a padding row translate nothing, whatever their position 0
    holds."""
    table = torch.zeros(4, ROW_LEN, dtype=torch.int32)
    table[0, 0] = 500  # the padding row's position 0
    table[1, 0] = 600
    table[2, 0] = 700
    table[2, ROW_LEN - 1] = 800  # the word before row 3
    table[3, 0] = 7
    lut = torch.arange(10, dtype=torch.int64) + 20
    refused(
        ValueError,
        exactly("kv-canary: SWA slot 600 is outside full_to_swa_index_mapping length 10"),
        req_to_token=table,
        req_pool_indices=i64([1]),
        prefix_lens=i64([1]),
        swa_window_size=3,
        full_to_swa_index_mapping=lut,
    )
    # a window of 1 over prefix 5 translates positions 3 and 4 only, not position 0's 600
    verify, write = run(
        req_to_token=table,
        req_pool_indices=i64([1]),
        prefix_lens=i64([5]),
        swa_window_size=1,
        full_to_swa_index_mapping=lut,
    )
    assert entries(verify, 1)["slots"] == [20]
    # prefill from scratch (prefix 0) and padding: nothing to translate, so nothing refused
    verify, write = run(
        req_to_token=table,
        req_pool_indices=i64([2, 0, 3]),
        prefix_lens=i64([0, 0, 1]),
        extend_seq_lens=i64([4, 1, 1]),
        swa_window_size=3,
        full_to_swa_index_mapping=lut,
    )
    assert entries(verify, 1)["slots"] == [27]
    assert entries(verify, 2)["num_valid"] == 1
    assert write.write_seed_slot_indices[:3].tolist() == [-1, -1, 27]


def test_valid_lengths_without_a_pool_are_never_read():
    """P3 asks for the valid lengths with the pool, not the other way round: lengths given
    without a pool (past any row, so P12 would refuse them with one) change nothing."""
    verify, write = run(req_to_verify_expected_tokens_valid_lens=i64([99]))
    assert entries(verify, 2) == {
        "slots": [101, 102],
        "tokens": [-1, -1],
        "positions": [0, 1],
        "prev": [-1, 101],
        "num_valid": 2,
        "enable": 1,
    }


def test_numpy_integers_are_ints():
    """swa_window_size, verify_capacity and the offset may be numpy integers of any width."""
    verify, write = run(
        prefix_lens=i64([4]),
        swa_window_size=np.uint8(2),
        full_to_swa_index_mapping=torch.arange(200, dtype=torch.int64),
        verify_capacity=np.int32(16),
        kv_token_id_vs_position_offset=np.int16(0),
    )
    assert entries(verify, 2)["slots"] == [103, 104]
