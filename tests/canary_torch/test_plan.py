"""canary_torch's plan kernel (CONTRACT §12, §14): exact hand-computed cases per rule, every
refusal leaving its outputs unchanged, and random batches against a per-entry loop written
here from the contract. The expected-token scatter (§13) is in ``test_scatter.py``."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

import canary_torch as tb
import reference

SENTINEL = 777  # what a plan holds before a launch: any entry still 777 was not written
ROWS, COLUMNS = 6, 10


def page_table() -> torch.Tensor:
    """int32 [6, 10]: row r, position c holds slot 100 * r + c (row 0 is the padding row)."""
    rows = torch.arange(ROWS).view(-1, 1) * 100 + torch.arange(COLUMNS)
    return rows.to(torch.int32)


def plans(capacity: int = 8, write_capacity: int = 6) -> tuple[tb.VerifyPlan, tb.WritePlan]:
    verify = tb.VerifyPlan.allocate(verify_capacity=capacity, device="cpu")
    write = tb.WritePlan.allocate(write_req_capacity=write_capacity, device="cpu")
    for tensor in (*vars(verify).values(), *vars(write).values()):
        tensor.fill_(SENTINEL)
    return verify, write


def plan(
    rows,
    *,
    capacity: int = 8,
    write_capacity: int = 6,
    window: int = 0,
    table=None,
    pool=None,
    valid=None,
    offset: int = 0,
    req_to_token=None,
):
    """Run the plan kernel on ``rows`` (rp, prefix, extend) and return both plans."""
    verify, write = plans(capacity, write_capacity)
    rp, prefix, extend = (torch.tensor(list(column), dtype=torch.int64) for column in zip(*rows))
    tb.launch_canary_plan_kernels(
        verify_plan_out=verify,
        write_plan_out=write,
        req_pool_indices=rp.view(-1),
        prefix_lens=prefix.view(-1),
        extend_seq_lens=extend.view(-1),
        req_to_token=page_table() if req_to_token is None else req_to_token,
        swa_window_size=window,
        full_to_swa_index_mapping=table,
        verify_capacity=capacity,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=None if valid is None else torch.tensor(valid),
        kv_token_id_vs_position_offset=offset,
    )
    return verify, write


def entries(verify: tb.VerifyPlan) -> list[tuple[int, int, int, int]]:
    """(slot, expected token, position, previous slot) of each valid entry."""
    n = int(verify.verify_num_valid)
    columns = (
        verify.verify_slot_indices,
        verify.verify_expected_tokens,
        verify.verify_expected_positions,
        verify.verify_prev_slot_indices,
    )
    return list(zip(*(column[:n].tolist() for column in columns)))


def untouched_past(verify: tb.VerifyPlan, n: int) -> bool:
    return all(
        bool((column[n:] == SENTINEL).all())
        for column in (
            verify.verify_slot_indices,
            verify.verify_expected_tokens,
            verify.verify_expected_positions,
            verify.verify_prev_slot_indices,
        )
    )


def test_the_plan_group_is_exported():
    """CONTRACT §14: the two launchers and REQ_POOL_IDX_PADDING = 0, with the other names."""
    assert tb.REQ_POOL_IDX_PADDING == 0
    for name in ("launch_canary_plan_kernels", "launch_scatter_req_token_ids_kernel"):
        assert name in tb.__all__ and callable(getattr(tb, name))
    assert "REQ_POOL_IDX_PADDING" in tb.__all__


# ---------------------------------------------------------------------------------------------
# CONTRACT §12: the plan


@pytest.mark.parametrize("where", [0, 1, 2])
def test_a_padding_row_contributes_nothing_wherever_it_stands(where):
    """A row with rp == 0 makes no entry, no write and seed -1, whatever its lengths hold;
    the other rows' entries come one after another in row order."""
    real = [(2, 3, 2), (1, 2, 1)]
    rows = list(real)
    rows.insert(where, (0, 9, 7))  # stale lengths of a CUDA-graph padding row
    verify, write = plan(rows)
    assert entries(verify) == [
        (200, -1, 0, -1),
        (201, -1, 1, 200),
        (202, -1, 2, 201),
        (100, -1, 0, -1),
        (101, -1, 1, 100),
    ]
    assert int(verify.verify_num_valid) == 5 and int(verify.enable) == 1
    assert untouched_past(verify, 5)
    writes = [2, 1]
    writes.insert(where, 0)
    seeds = [202, 101]
    seeds.insert(where, -1)
    assert write.write_offsets.tolist() == [0, *np.cumsum(writes).tolist(), 0, 0, 0]
    assert write.write_seed_slot_indices.tolist() == [*seeds, SENTINEL, SENTINEL, SENTINEL]
    assert int(write.write_num_valid_reqs) == 3


def test_an_swa_window_starts_late_and_its_head_names_its_real_predecessor():
    """With a window of 2, a prefix of 5 verifies positions 3 and 4; the entry at 3 names the
    slot of position 2, not -1. A prefix below the window starts at 0, with -1 before it."""
    table = torch.arange(1000, dtype=torch.int64) + 5000  # T(s) = s + 5000
    verify, write = plan([(3, 5, 1), (4, 1, 1)], window=2, table=table)
    assert entries(verify) == [
        (5303, -1, 3, 5302),
        (5304, -1, 4, 5303),
        (5400, -1, 0, -1),
    ]
    assert write.write_seed_slot_indices[:2].tolist() == [5304, 5400]
    assert write.write_offsets[:3].tolist() == [0, 1, 2]


def test_translation_keeps_negative_slots_and_maps_an_evicted_slot_to_zero():
    """Entries, previous slots and seeds go through the table; a negative slot stays itself;
    an evicted slot becomes slot 0. The table applies with a window of 0 too."""
    req_to_token = page_table()
    req_to_token[1, :4] = torch.tensor([11, -3, 12, 13], dtype=torch.int32)
    table = torch.full((20,), 0, dtype=torch.int64)
    table[11], table[13] = 61, 63  # slot 12 was evicted: it maps to 0
    verify, write = plan([(1, 4, 2)], table=table, req_to_token=req_to_token)
    assert entries(verify) == [
        (61, -1, 0, -1),
        (-3, -1, 1, 61),
        (0, -1, 2, -3),
        (63, -1, 3, 0),
    ]
    assert write.write_seed_slot_indices[0].item() == 63
    req_to_token[1, 3] = -8
    verify, write = plan([(1, 4, 2)], table=table, req_to_token=req_to_token)
    assert write.write_seed_slot_indices[0].item() == -8
    assert entries(verify)[3] == (-8, -1, 3, 0)
    req_to_token[1, 3] = -1  # -1 too: not the table's slot 0
    verify, write = plan([(1, 4, 2)], table=table, req_to_token=req_to_token)
    assert write.write_seed_slot_indices[0].item() == -1
    assert entries(verify)[3] == (-1, -1, 3, 0)


def test_expected_tokens_come_from_the_pool_with_offset_below_the_valid_length():
    """Offset +1: position p reads pool[rp, p + 1], only while p + 1 < valid length;
    offset -1 makes position 0 read nothing; no pool, no valid length: every token -1."""
    pool = (torch.arange(ROWS * COLUMNS, dtype=torch.int32).view(ROWS, COLUMNS) + 9000).contiguous()
    verify, _ = plan([(2, 4, 1), (3, 2, 1)], pool=pool, valid=[3, 9], offset=1)
    assert [entry[1] for entry in entries(verify)] == [9021, 9022, -1, -1, 9031, 9032]
    verify, _ = plan([(2, 4, 1)], pool=pool, valid=[10], offset=-1)
    assert [entry[1] for entry in entries(verify)] == [-1, 9020, 9021, 9022]
    verify, _ = plan([(2, 4, 1)], pool=pool, valid=[-2], offset=0)
    assert [entry[1] for entry in entries(verify)] == [-1, -1, -1, -1]


def test_a_padding_rows_valid_length_is_never_read():
    """A padding row's valid length may be past the pool's row: it is never checked."""
    pool = torch.zeros(ROWS, COLUMNS, dtype=torch.int32)
    verify, _ = plan([(0, 99, 5), (1, 1, 1)], pool=pool, valid=[10_000, 1])
    assert entries(verify) == [(100, 0, 0, -1)]


def test_overflow_writes_no_entry_but_still_makes_the_write_plan():
    """More entries than the capacity: num_valid = capacity, enable = 0, the entry tensors keep
    what they held; the write plan is made as always. Exactly the capacity fits."""
    verify, write = plan([(2, 3, 1), (1, 2, 3)], capacity=4)
    assert int(verify.verify_num_valid) == 4 and int(verify.enable) == 0
    assert untouched_past(verify, 0)
    assert write.write_offsets.tolist() == [0, 1, 4, 0, 0, 0, 0]
    assert write.write_seed_slot_indices[:2].tolist() == [202, 101]
    verify, _ = plan([(2, 3, 1), (1, 2, 3)], capacity=5)
    assert int(verify.verify_num_valid) == 5 and int(verify.enable) == 1


def test_negative_lengths_plan_nothing():
    """A negative prefix verifies nothing and seeds at the anchor; a negative extend writes
    nothing; a prefix of 0 writes from the anchor."""
    verify, write = plan([(1, -3, 2), (2, 2, -4), (3, 0, 2)])
    assert entries(verify) == [(200, -1, 0, -1), (201, -1, 1, 200)]
    assert write.write_offsets[:4].tolist() == [0, 2, 2, 4]
    assert write.write_seed_slot_indices[:3].tolist() == [-1, -1, -1]


def test_an_empty_batch():
    """bs = 0: no entry, enable = 1, offsets all 0, no valid request; seeds untouched."""
    verify, write = plans()
    empty = torch.zeros(0, dtype=torch.int64)
    tb.launch_canary_plan_kernels(
        verify_plan_out=verify,
        write_plan_out=write,
        req_pool_indices=empty,
        prefix_lens=empty,
        extend_seq_lens=empty,
        req_to_token=page_table(),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=8,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    assert int(verify.verify_num_valid) == 0 and int(verify.enable) == 1
    assert write.write_offsets.tolist() == [0] * 7
    assert write.write_seed_slot_indices.tolist() == [SENTINEL] * 6
    assert int(write.write_num_valid_reqs) == 0


# --- refusals ---------------------------------------------------------------------------------


def valid_arguments() -> dict:
    verify, write = plans(capacity=8, write_capacity=3)
    return dict(
        verify_plan_out=verify,
        write_plan_out=write,
        req_pool_indices=torch.tensor([1, 0, 2]),
        prefix_lens=torch.tensor([3, 50, 2]),
        extend_seq_lens=torch.tensor([1, 1, 1]),
        req_to_token=page_table(),
        swa_window_size=2,
        full_to_swa_index_mapping=torch.arange(1000),
        verify_capacity=8,
        req_to_verify_expected_tokens=torch.zeros(ROWS, COLUMNS, dtype=torch.int32),
        req_to_verify_expected_tokens_valid_lens=torch.tensor([1, 99, 2]),
        kv_token_id_vs_position_offset=0,
    )


def _strided(n: int, dtype=torch.int64) -> torch.Tensor:
    return torch.zeros(2 * n, dtype=dtype)[::2]


def _write_plan(**fields) -> tb.WritePlan:
    """The write plan of :func:`valid_arguments` (3 requests) with ``fields`` replaced."""
    return dataclasses.replace(plans(capacity=8, write_capacity=3)[1], **fields)


PLAN_NAME = "launch_canary_plan_kernels"
# (rule, changes to the valid arguments, exception, exact message or the words it names)
PLAN_REFUSALS = [
    ("P1", {"verify_plan_out": None}, TypeError, ("verify_plan_out",)),
    ("P1", {"write_plan_out": "plan"}, TypeError, ("write_plan_out",)),
    ("P1", {"prefix_lens": [3, 50, 2]}, TypeError, ("prefix_lens",)),
    ("P1", {"req_to_token": None}, TypeError, ("req_to_token",)),
    ("P1", {"req_pool_indices": None}, TypeError, ("req_pool_indices",)),
    ("P1", {"prefix_lens": None}, TypeError, ("prefix_lens",)),
    ("P1", {"extend_seq_lens": None}, TypeError, ("extend_seq_lens",)),
    (
        "P1",
        {"write_plan_out": _write_plan(write_offsets=None)},
        TypeError,
        ("write_plan_out.write_offsets",),
    ),
    ("P1", {"full_to_swa_index_mapping": np.arange(9)}, TypeError, ("full_to_swa",)),
    ("P1", {"swa_window_size": 2.0}, TypeError, ("swa_window_size",)),
    ("P1", {"verify_capacity": True}, TypeError, ("verify_capacity",)),
    ("P1", {"kv_token_id_vs_position_offset": None}, TypeError, ("kv_token_id_vs",)),
    (
        "P2",
        {"full_to_swa_index_mapping": None},
        ValueError,
        f"kv-canary: {PLAN_NAME} requires full_to_swa_index_mapping when swa_window_size > 0",
    ),
    (  # from a window of 1
        "P2",
        {"swa_window_size": 1, "full_to_swa_index_mapping": None},
        ValueError,
        f"kv-canary: {PLAN_NAME} requires full_to_swa_index_mapping when swa_window_size > 0",
    ),
    (
        "P3",
        {"req_to_verify_expected_tokens_valid_lens": None},
        ValueError,
        f"kv-canary: {PLAN_NAME} requires req_to_verify_expected_tokens_valid_lens when "
        "req_to_verify_expected_tokens is set",
    ),
    (
        "P4",
        {"req_pool_indices": torch.zeros(4097, dtype=torch.int64)},
        ValueError,
        f"kv-canary: {PLAN_NAME} supports at most bs=4096 reqs per launch, got bs=4097. Bump "
        "_PLAN_BS_BLOCK_SIZE if real workloads need this.",
    ),
    (  # bs is shape[0] of any shape: 4097 here
        "P4",
        {"req_pool_indices": torch.zeros(4097, 1, dtype=torch.int64)},
        ValueError,
        f"kv-canary: {PLAN_NAME} supports at most bs=4096 reqs per launch, got bs=4097. Bump "
        "_PLAN_BS_BLOCK_SIZE if real workloads need this.",
    ),
    (
        "P5",
        {"verify_capacity": np.int64(7)},
        ValueError,
        f"kv-canary: {PLAN_NAME} verify_capacity=7 does not match "
        "verify_plan_out.verify_slot_indices.shape[0]=8",
    ),
    (
        "P6",
        {"req_pool_indices": torch.tensor([1, 0, 2, 0])},
        ValueError,
        "kv-canary: bs=4 exceeds write_req_capacity=3",
    ),
    (
        "P7",
        {"extend_seq_lens": _strided(3)},
        ValueError,
        "kv-canary: extend_seq_lens must be contiguous",
    ),
    (
        "P7",
        {"req_to_token": page_table().t()},
        ValueError,
        "kv-canary: req_to_token must be contiguous",
    ),
    ("P8", {"swa_window_size": -1}, ValueError, ("swa_window_size", "-1")),
    (  # without a table too: P8, not P2
        "P8",
        {"swa_window_size": -1, "full_to_swa_index_mapping": None},
        ValueError,
        ("swa_window_size", "-1"),
    ),
    ("P9", {"req_to_token": page_table().long()}, ValueError, ("req_to_token", "int64")),
    ("P9", {"prefix_lens": torch.tensor([3, 50])}, ValueError, ("prefix_lens", "(2,)", "(3,)")),
    (
        "P9",
        {"req_to_verify_expected_tokens": torch.zeros(COLUMNS, dtype=torch.int32)},
        ValueError,
        ("req_to_verify_expected_tokens", "(10,)"),
    ),
    (
        "P9",
        {"full_to_swa_index_mapping": torch.arange(9, dtype=torch.int32)},
        ValueError,
        ("full_to_swa_index_mapping", "int32"),
    ),
    ("P9", {"req_pool_indices": torch.tensor(1)}, ValueError, ("req_pool_indices", "()")),
    (  # 3 requests: 4 offsets, not 5
        "P9",
        {"write_plan_out": _write_plan(write_offsets=torch.zeros(5, dtype=torch.int64))},
        ValueError,
        ("write_plan_out.write_offsets", "(5,)", "(4,)"),
    ),
    (  # bs is shape[0]: 1 here, so P4 holds and P9 refuses the shape
        "P9",
        {"req_pool_indices": torch.zeros(1, 5000, dtype=torch.int64)},
        ValueError,
        ("req_pool_indices", "(1, 5000)"),
    ),
    (
        "P10",
        {"req_pool_indices": torch.tensor([1, 0, 6])},
        IndexError,
        ("req_pool_indices[2]", "6", "6"),
    ),
    (  # a row past the table's end (7 of 6 rows), not just at it
        "P10",
        {"req_pool_indices": torch.tensor([1, 0, 7])},
        IndexError,
        ("req_pool_indices[2]", "7", "req_to_token", "6"),
    ),
    (
        "P10",
        {"req_pool_indices": torch.tensor([-1, 0, 2])},
        IndexError,
        ("req_pool_indices[0]", "-1"),
    ),
    (
        "P10",
        {"req_to_verify_expected_tokens": torch.zeros(2, COLUMNS, dtype=torch.int32)},
        IndexError,
        ("req_pool_indices[2]", "2", "req_to_verify_expected_tokens", "2"),
    ),
    ("P11", {"prefix_lens": torch.tensor([3, 50, 11])}, ValueError, ("prefix_lens[2]", "11", "10")),
    (
        "P12",
        {"req_to_verify_expected_tokens_valid_lens": torch.tensor([11, 99, 2])},
        ValueError,
        ("req_to_verify_expected_tokens_valid_lens[0]", "11", "10"),
    ),
    (
        "P13",
        {"full_to_swa_index_mapping": torch.arange(201)},
        ValueError,
        "kv-canary: SWA slot 201 is outside full_to_swa_index_mapping length 201",
    ),
]


def _snapshot(arguments: dict) -> list[torch.Tensor]:
    return [
        tensor.clone()
        for value in arguments.values()
        for tensor in (vars(value).values() if hasattr(value, "__dataclass_fields__") else [value])
        if isinstance(tensor, torch.Tensor)
    ]


def named(message: str, words) -> bool:
    return message.startswith("kv-canary: ") and all(word in message for word in words)


@pytest.mark.parametrize(
    ("rule", "changes", "error", "message"),
    PLAN_REFUSALS,
    ids=[f"{case[0]}-{next(iter(case[1]))}" for case in PLAN_REFUSALS],
)
def test_each_plan_refusal_changes_nothing(rule, changes, error, message):
    """Each rule P1..P13 raises its error, with the contract's message where it gives one, else
    one naming the argument and value; neither plan nor any argument changes."""
    arguments = valid_arguments()
    arguments.update(changes)
    before = _snapshot(arguments)
    with pytest.raises(error) as raised:
        tb.launch_canary_plan_kernels(**arguments)
    got = str(raised.value)
    if isinstance(message, str):
        assert got == message
    else:
        assert named(got, message), got
    after = _snapshot(arguments)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_the_valid_arguments_of_the_refusals_pass():
    """The arguments the refusal cases start from are accepted (each case breaks one rule)."""
    arguments = valid_arguments()
    tb.launch_canary_plan_kernels(**arguments)
    assert entries(arguments["verify_plan_out"]) == [
        (101, -1, 1, 100),
        (102, -1, 2, 101),
        (200, 0, 0, -1),
        (201, 0, 1, 200),
    ]


def test_refusal_order_follows_the_table():
    """With P2, P4 and P13 all broken, P2 is reported; with P3 and P5, P3."""
    arguments = valid_arguments()
    arguments.update(
        full_to_swa_index_mapping=None, req_pool_indices=torch.zeros(5000, dtype=torch.int64)
    )
    with pytest.raises(ValueError, match="requires full_to_swa_index_mapping"):
        tb.launch_canary_plan_kernels(**arguments)
    arguments = valid_arguments()
    arguments.update(req_to_verify_expected_tokens_valid_lens=None, verify_capacity=3)
    with pytest.raises(ValueError, match="requires req_to_verify_expected_tokens_valid_lens"):
        tb.launch_canary_plan_kernels(**arguments)


def test_p13_names_the_first_slot_in_plan_order_also_on_overflow():
    """The slot named is the first past the table in plan order (an entry's slot, then its
    previous slot); it is checked when the plan overflows too, and not for padding rows or
    positions outside the window."""
    req_to_token = page_table()
    req_to_token[1, 1] = 5000  # previous slot of row 1's window head (window 2, prefix 4)
    req_to_token[1, 2] = 6000  # the head itself
    req_to_token[2, 0] = 7000  # outside row 2's window (prefix 4): never translated
    table = torch.arange(300)
    arguments = dict(window=2, table=table, req_to_token=req_to_token)
    with pytest.raises(ValueError, match="SWA slot 6000 is outside"):
        plan([(1, 4, 1)], **arguments)
    with pytest.raises(ValueError, match="SWA slot 6000 is outside"):
        plan([(2, 4, 1), (1, 4, 1)], capacity=1, **arguments)  # overflows
    req_to_token[1, 2] = 102
    with pytest.raises(ValueError, match="SWA slot 5000 is outside"):
        plan([(2, 4, 1), (1, 4, 1)], capacity=1, **arguments)
    verify, _ = plan([(2, 4, 1), (0, 4, 1)], **arguments)  # row 1 only as padding
    assert [entry[0] for entry in entries(verify)] == [202, 203]


def test_p13_on_overflow_reads_exactly_the_slots_the_plan_translates():
    """On overflow P13 finds a slot at position 0 (no window) and the previous slot of a row's
    only entry, reads no slot before a row's window or past its prefix, and a batch whose
    every window starts late overflows."""
    req_to_token = page_table()
    req_to_token[1, 0] = 5000
    with pytest.raises(ValueError, match="SWA slot 5000 is outside"):
        plan([(1, 2, 1)], capacity=1, table=torch.arange(300), req_to_token=req_to_token)
    verify, write = plan([(1, 9, 1), (2, 9, 2)], capacity=3, window=2, table=torch.arange(300))
    assert int(verify.verify_num_valid) == 3 and int(verify.enable) == 0
    assert untouched_past(verify, 0)
    assert write.write_offsets.tolist() == [0, 1, 3, 0, 0, 0, 0]
    assert write.write_seed_slot_indices[:2].tolist() == [108, 208]
    req_to_token = page_table()
    req_to_token[2, 4] = req_to_token[2, 6] = 7000  # at and past row 2's prefix (4)
    req_to_token[1, 4] = 7000  # before row 1's window (prefix 8, window 2: positions 6, 7)
    rows = [(2, 4, 1), (1, 8, 1)]
    verify, _ = plan(rows, capacity=1, window=2, table=torch.arange(300), req_to_token=req_to_token)
    assert int(verify.verify_num_valid) == 1 and int(verify.enable) == 0
    req_to_token = page_table()
    req_to_token[1, 1] = 5000  # the previous slot of row 1's one entry (prefix 3, window 1)
    rows = [(1, 3, 1), (2, 3, 1)]
    with pytest.raises(ValueError, match="SWA slot 5000 is outside"):
        plan(rows, capacity=1, window=1, table=torch.arange(300), req_to_token=req_to_token)


def test_p13_on_overflow_reads_every_block_of_rows(monkeypatch):
    """With chunks of 6 entries the overflowing rows are read three at a time: a slot past the
    table in the second row of the second block (no seed reads it) is found."""
    monkeypatch.setattr(tb._plan, "_CHUNK_ENTRIES", 6)
    req_to_token = page_table()
    req_to_token[5, 1] = 5000
    rows = [(1, 2, 1), (2, 2, 1), (3, 2, 1), (4, 2, 1), (5, 2, 0)]  # blocks: rows 0-2, 3-4
    with pytest.raises(ValueError, match="SWA slot 5000 is outside"):
        plan(rows, capacity=1, table=torch.arange(1000), req_to_token=req_to_token)


@pytest.mark.parametrize("seed", range(6))
def test_entries_made_in_chunks_of_a_few_rows_are_the_same(seed, monkeypatch):
    """With chunks of 7 entries (not 2**20), the random batches are made a few whole rows at a
    time, rows longer than a chunk alone, and give the same plans."""
    monkeypatch.setattr(tb._plan, "_CHUNK_ENTRIES", 7)
    test_random_batches_match_a_per_entry_loop_and_the_reference(seed)


# --- random batches against a per-entry loop ----------------------------------------------------


def loop_plan(rp, prefix, extend, req_to_token, window, table, pool, valid, offset):
    """CONTRACT §12 entry by entry, in plain Python: (entries, write offsets, seeds)."""

    def translate(slot):
        return slot if table is None or slot < 0 else table[slot]

    made, offsets, seeds, running = [], [], [], 0
    for r, row in enumerate(rp):
        offsets.append(running)
        if row == 0:
            seeds.append(-1)
            continue
        p = prefix[r]
        start = max(0, p - window) if window > 0 else 0
        for pos in range(start, p):
            token = -1
            if pool is not None and 0 <= pos + offset < valid[r]:
                token = pool[row][pos + offset]
            prev = translate(req_to_token[row][pos - 1]) if pos > 0 else -1
            made.append((translate(req_to_token[row][pos]), token, pos, prev))
        w = max(0, extend[r])
        running += w
        seeds.append(translate(req_to_token[row][p - 1]) if w > 0 and p > 0 else -1)
    offsets.append(running)
    return made, offsets, seeds


def reference_plans(verify: tb.VerifyPlan, write: tb.WritePlan, **inputs) -> list[np.ndarray]:
    """The oracle's plans (from copies of ``verify`` and ``write`` as they are now), field by
    field in the order of :func:`plan_fields`."""
    ref_verify = reference.VerifyPlan(**{k: v.numpy().copy() for k, v in vars(verify).items()})
    ref_write = reference.WritePlan(**{k: v.numpy().copy() for k, v in vars(write).items()})
    reference.plan(ref_verify, ref_write, **inputs)
    return [np.asarray(getattr(ref_verify, k)) for k in vars(verify)] + [
        np.asarray(getattr(ref_write, k)) for k in vars(write)
    ]


def plan_fields(verify: tb.VerifyPlan, write: tb.WritePlan) -> list[np.ndarray]:
    return [v.numpy() for v in vars(verify).values()] + [v.numpy() for v in vars(write).values()]


@pytest.mark.parametrize("seed", range(12))
def test_random_batches_match_a_per_entry_loop_and_the_reference(seed):
    """Random batches (padding, windows, tables with evictions and negative slots, pools with
    offsets) give the entries, offsets and seeds of a plain per-entry loop, and every field
    of both plans equals the oracle's."""
    rng = np.random.default_rng(seed)
    bs = int(rng.integers(0, 40))
    max_reqs, length = 12, 40
    req_to_token = rng.integers(-2, 500, (max_reqs, length)).astype(np.int32)
    rp = rng.integers(0, max_reqs, bs)
    prefix = rng.integers(-3, length + 1, bs)
    extend = rng.integers(-2, 5, bs)
    prefix[rp == 0] = rng.integers(-(2**40), 2**40, int((rp == 0).sum()))  # stale padding
    window = int(rng.choice([0, 1, 3, 17, 2**62]))
    table = None
    if window or seed % 3 == 0:
        table = rng.integers(0, 10_000, 500)
        table[rng.integers(0, 500, 50)] = 0
    pool = valid = None
    offset = int(rng.choice([-1, 0, 1]))
    if seed % 2:
        pool = rng.integers(-(2**31), 2**31, (max_reqs, length - 5)).astype(np.int32)
        valid = rng.integers(-2, length - 4, bs)
    want, want_offsets, want_seeds = loop_plan(
        rp.tolist(),
        prefix.tolist(),
        extend.tolist(),
        req_to_token.tolist(),
        window,
        None if table is None else table.tolist(),
        None if pool is None else pool.tolist(),
        None if valid is None else valid.tolist(),
        offset,
    )
    capacity = max(1, len(want) + int(rng.integers(-2, 3)))
    verify, write = plans(capacity, max(bs, 1) + 2)
    inputs = dict(
        req_pool_indices=rp,
        prefix_lens=prefix,
        extend_seq_lens=extend,
        req_to_token=req_to_token,
        swa_window_size=window,
        full_to_swa_index_mapping=table,
        verify_capacity=capacity,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=valid,
        kv_token_id_vs_position_offset=offset,
    )
    want_fields = reference_plans(verify, write, **inputs)
    tb.launch_canary_plan_kernels(
        verify_plan_out=verify,
        write_plan_out=write,
        **{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in inputs.items()},
    )
    for got_field, want_field in zip(plan_fields(verify, write), want_fields):
        np.testing.assert_array_equal(got_field, want_field, strict=True)
    if len(want) <= capacity:
        assert entries(verify) == want and int(verify.enable) == 1
        assert untouched_past(verify, len(want))
    else:
        assert int(verify.verify_num_valid) == capacity and int(verify.enable) == 0
        assert untouched_past(verify, 0)
    assert write.write_offsets.tolist() == want_offsets + [0] * (
        write.write_offsets.numel() - bs - 1
    )
    assert write.write_seed_slot_indices[:bs].tolist() == want_seeds
    assert bool((write.write_seed_slot_indices[bs:] == SENTINEL).all())
    assert int(write.write_num_valid_reqs) == bs


def test_an_engine_scale_batch_is_fast():
    """4096 requests, 70,000+ entries through an SWA table, prefixes of 8k+ tokens: well under
    a second on the CPU, and exact on the longest rows."""
    generator = torch.Generator().manual_seed(1)
    bs, rows, length = 4096, 64, 8448
    # Requests share pool rows here: the plan only reads them, and the table stays small.
    req_to_token = torch.randint(1, 1 << 20, (rows, length), generator=generator)
    req_to_token = req_to_token.to(torch.int32)
    rp = torch.randint(1, rows, (bs,), generator=generator)
    rp[::9] = 0  # rows 0, 9, 18, ... are padding
    prefix = torch.randint(1, 34, (bs,), generator=generator)
    prefix[1:4] = torch.tensor([8192, 8300, 8448])
    table = torch.randint(0, 1 << 18, (1 << 20,), generator=generator)
    verify, write = plans(80_000, bs)
    arguments = dict(
        verify_plan_out=verify,
        write_plan_out=write,
        req_pool_indices=rp,
        prefix_lens=prefix,
        extend_seq_lens=torch.ones(bs, dtype=torch.int64),
        req_to_token=req_to_token,
        swa_window_size=4096,
        full_to_swa_index_mapping=table,
        verify_capacity=80_000,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    started = time.perf_counter()
    tb.launch_canary_plan_kernels(**arguments)
    elapsed = time.perf_counter() - started
    total = int(verify.verify_num_valid)
    assert total > 70_000 and int(verify.enable) == 1
    assert elapsed < 2.0, elapsed  # a loose bound: CI machines are shared
    # Row 3 (prefix 8448) verifies its last 4096 positions, right after rows 1 and 2's.
    head = 4096 + 4096
    slots = table[req_to_token[int(rp[3]), 8448 - 4096 :].long()]
    assert torch.equal(verify.verify_slot_indices[head : head + 4096], slots)
    assert int(verify.verify_prev_slot_indices[head]) == int(
        table[int(req_to_token[int(rp[3]), 8448 - 4097])]
    )
