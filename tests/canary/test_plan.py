"""canary's plan launcher (CONTRACT §12): hand-computed plans, one scenario per rule, and every
refusal P1 to P13 in order, each leaving both plans as they were.

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

ROW_LEN = 8


def page_table(rows: int = 5, row_len: int = ROW_LEN) -> torch.Tensor:
    table = torch.arange(row_len, dtype=torch.int32) + 1
    return (table + 100 * torch.arange(rows, dtype=torch.int32)[:, None]).contiguous()


def plans(capacity: int = 16, write_capacity: int = 6):
    """Both plans, filled with sentinels that show what a launch wrote."""
    verify = canary.VerifyPlan.allocate(verify_capacity=capacity, device="cpu")
    for name, value in (
        ("verify_slot_indices", 91),
        ("verify_expected_tokens", 92),
        ("verify_expected_positions", 93),
        ("verify_prev_slot_indices", 94),
        ("verify_num_valid", 95),
        ("enable", 96),
    ):
        getattr(verify, name).fill_(value)
    write = canary.WritePlan.allocate(write_req_capacity=write_capacity, device="cpu")
    write.write_offsets.fill_(77)
    write.write_seed_slot_indices.fill_(55)
    write.write_num_valid_reqs.fill_(66)
    return verify, write


def i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def arguments(verify, write, **given) -> dict:
    """The launch's keywords: a batch of one real row unless told otherwise."""
    args = dict(
        verify_plan_out=verify,
        write_plan_out=write,
        req_pool_indices=i64([1]),
        prefix_lens=i64([2]),
        extend_seq_lens=i64([1]),
        req_to_token=page_table(),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=verify.verify_slot_indices.shape[0] if verify is not None else 16,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    args.update(given)
    return args


def run(capacity: int = 16, write_capacity: int = 6, **given):
    verify, write = plans(capacity, write_capacity)
    canary.launch_canary_plan_kernels(**arguments(verify, write, **given))
    return verify, write


def entries(verify, n: int) -> dict:
    """The first ``n`` entries of each entry tensor, and the two scalars."""
    return {
        "slots": verify.verify_slot_indices[:n].tolist(),
        "tokens": verify.verify_expected_tokens[:n].tolist(),
        "positions": verify.verify_expected_positions[:n].tolist(),
        "prev": verify.verify_prev_slot_indices[:n].tolist(),
        "num_valid": int(verify.verify_num_valid),
        "enable": int(verify.enable),
    }


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
