"""canary_torch's expected-token scatter (CONTRACT §13): exact cases, a per-token loop written
here from the contract and the reference, every refusal S1 to S11 leaving the pool unchanged."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import canary_torch as tb
import reference


def named(message: str, words) -> bool:
    return message.startswith("kv-canary: ") and all(word in message for word in words)


def scatter(flat, offsets, rows, pool) -> None:
    tb.launch_scatter_req_token_ids_kernel(
        flat_in=torch.tensor(flat, dtype=torch.int64),
        offsets=torch.tensor(offsets, dtype=torch.int64),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        pool_out=pool,
    )


def stale_pool() -> torch.Tensor:
    return torch.full((4, 3), -7, dtype=torch.int32)


def test_scatter_cuts_to_32_bits_and_drops_tokens_past_the_row():
    """Tokens land at their row and position, cut to the low 32 bits (two's complement);
    those past the row's end are dropped, never spilling into the next row; the stale tail,
    the unnamed rows and an empty request leave the pool as it was; row 0 is a row like any."""
    pool = stale_pool()
    flat = [2**32 + 5, 2**31, -1, -(2**31) - 1, 9, 10, 11, 12, 13]
    scatter(flat, [0, 4, 4, 5, 9], [1, 3, 0, 2], pool)
    assert pool.tolist() == [
        [9, -7, -7],
        [5, -(2**31), -1],
        [10, 11, 12],
        [-7, -7, -7],
    ]


def test_scatter_of_nothing():
    """No token (bs = 0, or requests with empty ranges) writes nothing, whatever they name."""
    pool = stale_pool()
    scatter([], [0], [], pool)
    scatter([], [0, 0, 0], [99, -4], pool)
    assert torch.equal(pool, stale_pool())


def test_scatter_into_rows_of_one_position():
    """A pool row of one position takes its request's first token and drops the rest."""
    pool = torch.full((3, 1), -7, dtype=torch.int32)
    scatter([5, 6, 7], [0, 2, 3], [2, 1], pool)
    assert pool.tolist() == [[-7], [7], [5]]


def test_scatter_matches_a_per_token_loop_and_the_reference():
    """A random batch of 300 requests matches the contract written as a loop over tokens, and
    the oracle."""
    rng = np.random.default_rng(5)
    bs, rows, length = 300, 400, 64
    lengths = rng.integers(0, 90, bs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = rng.integers(-(2**63), 2**63 - 1, int(offsets[-1]), dtype=np.int64)
    pool_rows = rng.permutation(rows)[:bs]
    pool = torch.from_numpy(rng.integers(-100, 100, (rows, length)).astype(np.int32))
    want = pool.clone()
    for r in range(bs):
        for t in range(int(offsets[r]), int(offsets[r + 1])):
            if t - offsets[r] < length:
                want[pool_rows[r], t - offsets[r]] = int(np.int64(flat[t]).astype(np.int32))
    oracle = pool.numpy().copy()
    reference.scatter(flat_in=flat, offsets=offsets, req_pool_indices=pool_rows, pool_out=oracle)
    scatter(flat.tolist(), offsets.tolist(), pool_rows.tolist(), pool)
    assert torch.equal(pool, want)
    np.testing.assert_array_equal(pool.numpy(), oracle, strict=True)


def scatter_arguments() -> dict:
    return dict(
        flat_in=torch.arange(5, dtype=torch.int64),
        offsets=torch.tensor([0, 2, 5]),
        req_pool_indices=torch.tensor([1, 2]),
        pool_out=stale_pool(),
    )


SCATTER = "kv-canary: scatter_req_token_ids"
SCATTER_REFUSALS = [
    ("S1", {"flat_in": [0, 1, 2, 3, 4]}, TypeError, ("flat_in",)),
    ("S1", {"pool_out": None}, TypeError, ("pool_out",)),
    (
        "S2",
        {"flat_in": torch.zeros(5, 1, dtype=torch.int64)},
        ValueError,
        f"{SCATTER} flat_in must be 1-D, got shape (5, 1)",
    ),
    (
        "S3",
        {"offsets": torch.tensor(0)},
        ValueError,
        f"{SCATTER} offsets must be 1-D, got shape ()",
    ),
    (
        "S4",
        {"req_pool_indices": torch.tensor([[1, 2]])},
        ValueError,
        f"{SCATTER} req_pool_indices must be 1-D, got shape (1, 2)",
    ),
    (
        "S5",
        {"pool_out": torch.zeros(12, dtype=torch.int32)},
        ValueError,
        f"{SCATTER} pool_out must be 2-D, got shape (12,)",
    ),
    (
        "S6",
        {"offsets": torch.tensor([0, 2, 5], dtype=torch.int32)},
        TypeError,
        f"{SCATTER} offsets must be int64, got torch.int32",
    ),
    (
        "S6",
        {"pool_out": stale_pool().long()},
        TypeError,
        f"{SCATTER} pool_out must be int32, got torch.int64",
    ),
    (
        "S7",
        {"offsets": torch.tensor([0, 5])},
        ValueError,
        f"{SCATTER} offsets length 2 != bs+1 (3)",
    ),
    (
        "S8",
        {
            "req_pool_indices": torch.zeros(4097, dtype=torch.int64),
            "offsets": torch.tensor([0] * 4097 + [5]),
        },
        ValueError,
        f"{SCATTER} bs+1=4098 exceeds BATCH_BLOCK=4097; bump _SCATTER_BATCH_BLOCK if real "
        "workloads need this",
    ),
    ("S9", {"flat_in": torch.arange(10)[::2]}, ValueError, ("flat_in", "contiguous")),
    ("S10", {"offsets": torch.tensor([1, 2, 5])}, ValueError, ("offsets", "[1, 2, 5]")),
    ("S10", {"offsets": torch.tensor([-1, 2, 5])}, ValueError, ("offsets", "[-1, 2, 5]")),
    ("S10", {"offsets": torch.tensor([0, 3, 2])}, ValueError, ("offsets", "[0, 3, 2]")),
    ("S10", {"offsets": torch.tensor([0, 2, 4])}, ValueError, ("offsets", "[0, 2, 4]")),
    ("S10", {"offsets": torch.tensor([0, 2, 6])}, ValueError, ("offsets", "[0, 2, 6]")),
    ("S11", {"req_pool_indices": torch.tensor([1, 4])}, IndexError, ("req_pool_indices[1]", "4")),
    ("S11", {"req_pool_indices": torch.tensor([-1, 2])}, IndexError, ("req_pool_indices[0]", "-1")),
    # a row past the pool's end (5 of 4 rows), not just at it; a request of one token
    ("S11", {"req_pool_indices": torch.tensor([1, 5])}, IndexError, ("req_pool_indices[1]", "5")),
    (
        "S11",
        {"offsets": torch.tensor([0, 4, 5]), "req_pool_indices": torch.tensor([1, -1])},
        IndexError,
        ("req_pool_indices[1]", "-1"),
    ),
]


@pytest.mark.parametrize(
    ("rule", "changes", "error", "message"),
    SCATTER_REFUSALS,
    ids=[f"{case[0]}-{next(iter(case[1]))}" for case in SCATTER_REFUSALS],
)
def test_each_scatter_refusal_changes_nothing(rule, changes, error, message):
    """Each rule S1..S11 raises its error, with the contract's message where it gives one, else
    one naming the argument; the pool does not change."""
    arguments = scatter_arguments()
    arguments.update(changes)
    pool = arguments["pool_out"]
    before = pool.clone() if isinstance(pool, torch.Tensor) else None
    with pytest.raises(error) as raised:
        tb.launch_scatter_req_token_ids_kernel(**arguments)
    got = str(raised.value)
    if isinstance(message, str):
        assert got == message
    else:
        assert named(got, message), got
    if before is not None:
        assert torch.equal(pool, before)


def test_a_request_without_tokens_may_name_any_row():
    """S11 holds only for requests that own a token."""
    arguments = scatter_arguments()
    arguments.update(offsets=torch.tensor([0, 0, 5]), req_pool_indices=torch.tensor([99, 2]))
    tb.launch_scatter_req_token_ids_kernel(**arguments)
    assert arguments["pool_out"][2].tolist() == [0, 1, 2]


def test_a_100k_token_scatter_is_fast():
    """100,000 tokens over 4096 requests, some past their row: well under a second."""
    generator = torch.Generator().manual_seed(3)
    bs, length = 4096, 32
    lengths = torch.randint(0, 49, (bs,), generator=generator)
    lengths[-1] += 100_000 - int(lengths.sum())
    offsets = torch.zeros(bs + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    flat = torch.randint(-(2**40), 2**40, (100_000,), generator=generator)
    pool = torch.zeros(bs + 1, length, dtype=torch.int32)
    rows = torch.randperm(bs, generator=generator) + 1
    started = time.perf_counter()
    tb.launch_scatter_req_token_ids_kernel(
        flat_in=flat, offsets=offsets, req_pool_indices=rows, pool_out=pool
    )
    assert time.perf_counter() - started < 1.0
    last = int(rows[-1])
    assert (
        pool[last].tolist() == tb._scatter.low_32_bits(flat[int(offsets[-2]) :][:length]).tolist()
    )
