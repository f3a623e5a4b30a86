"""canary's expected-token scatter (CONTRACT §13): hand-computed pools, and every refusal S1 to
S11 in order, each leaving the pool as it was."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import canary
from canary import scatter as scatter_module

STALE = 7  # what every pool entry holds before a launch


def i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def fresh_pool(rows: int = 4, row_len: int = 4) -> torch.Tensor:
    return torch.full((rows, row_len), STALE, dtype=torch.int32)


def scatter(flat_in, offsets, req_pool_indices, pool_out) -> torch.Tensor:
    canary.launch_scatter_req_token_ids_kernel(
        flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out
    )
    return pool_out


def test_each_request_fills_the_head_of_its_row():
    """Tokens land at their position in the request's pool row, cut to their low 32 bits; the
    stale tail of a written row and the rows no request names stay; pool row 0 is written
    when named; an empty request writes nothing."""
    pool = scatter(
        i64([2**32 + 5, -1, 2**31, 11, 12, -(2**31) - 1]),
        i64([0, 3, 3, 5, 6]),
        i64([2, 3, 3, 0]),
        fresh_pool(),
    )
    assert pool.tolist() == [
        [2**31 - 1, STALE, STALE, STALE],  # request 3: -(2**31) - 1 cut to 32 bits
        [STALE] * 4,  # named by no request
        [5, -1, -(2**31), STALE],  # request 0
        [11, 12, STALE, STALE],  # request 2; request 1 (also row 3) owns no token
    ]


def test_a_token_past_the_row_end_is_dropped():
    """A request longer than the row writes the row's positions only, never the next row."""
    pool = scatter(i64(list(range(1, 8))), i64([0, 6, 7]), i64([1, 2]), fresh_pool())
    assert pool.tolist() == [[STALE] * 4, [1, 2, 3, 4], [7, STALE, STALE, STALE], [STALE] * 4]


def test_no_token_writes_nothing():
    """An empty stream, with no request or with empty ones, leaves the pool as it was."""
    for offsets, rows in ((i64([0]), i64([])), (i64([0, 0, 0]), i64([1, 9]))):
        pool = scatter(i64([]), offsets, rows, fresh_pool())
        assert pool.eq(STALE).all()


def test_a_large_batch_matches_the_rule_token_by_token():
    """4,096 requests (the cap) and ~20,000 tokens over several programs, rows shorter than
    some requests: every entry of the pool as the contract's loop gives it."""
    gen = torch.Generator().manual_seed(3)
    bs, rows, row_len = 4096, 5000, 6
    lengths = torch.randint(0, 9, (bs,), generator=gen)
    offsets = torch.zeros(bs + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    flat = torch.randint(-(2**40), 2**40, (int(offsets[-1]),), generator=gen)
    pool_rows = torch.randperm(rows, generator=gen)[:bs]  # distinct rows
    pool = scatter(flat, offsets, pool_rows, fresh_pool(rows, row_len))
    want = fresh_pool(rows, row_len).numpy()
    bounds, values = offsets.tolist(), flat.numpy()
    for r, row in enumerate(pool_rows.tolist()):
        for t in range(bounds[r], bounds[r + 1]):
            if t - bounds[r] < row_len:
                want[row, t - bounds[r]] = values[t].astype(np.int32)
    assert len(flat) > 4 * scatter_module.SCATTER_TOKEN_BLOCK
    np.testing.assert_array_equal(pool.numpy(), want)


# ----------------------------------------------------------------------------- refusals


def refused(error: type, match: str, **given) -> str:
    """Scatter with ``given`` changed from a valid launch; it raises ``error`` with a message
    matching ``match`` from its start, and the pool keeps every value."""
    args = dict(
        flat_in=i64([1, 2, 3]),
        offsets=i64([0, 2, 3]),
        req_pool_indices=i64([1, 2]),
        pool_out=fresh_pool(),
    )
    args.update(given)
    pool = args["pool_out"]
    before = pool.clone() if isinstance(pool, torch.Tensor) else None
    with pytest.raises(error, match="^" + match) as raised:
        canary.launch_scatter_req_token_ids_kernel(**args)
    if before is not None:
        assert torch.equal(pool, before), "a refused launch changed the pool"
    return str(raised.value)


def exactly(message: str) -> str:
    return re.escape(message) + "$"


@pytest.mark.parametrize("name", ["flat_in", "offsets", "req_pool_indices", "pool_out"])
@pytest.mark.parametrize("value", [None, [0], np.zeros(2, dtype=np.int64)])
def test_s1_every_argument_is_a_tensor(name, value):
    message = refused(TypeError, "kv-canary: scatter_req_token_ids ", **{name: value})
    assert name in message


def test_s2_to_s5_the_dimensions():
    prefix = "kv-canary: scatter_req_token_ids"
    refused(
        ValueError,
        exactly(f"{prefix} flat_in must be 1-D, got shape (3, 1)"),
        flat_in=i64([[1], [2], [3]]),
        pool_out=fresh_pool()[0],  # S5 is broken too: S2 comes first
    )
    refused(
        ValueError,
        exactly(f"{prefix} offsets must be 1-D, got shape ()"),
        offsets=i64(0),
    )
    refused(
        ValueError,
        exactly(f"{prefix} req_pool_indices must be 1-D, got shape (1, 2)"),
        req_pool_indices=i64([[1, 2]]),
    )
    refused(
        ValueError,
        exactly(f"{prefix} pool_out must be 2-D, got shape (2, 4, 4)"),
        pool_out=torch.zeros(2, 4, 4, dtype=torch.int32),
    )


def test_s6_the_dtypes_in_order():
    prefix = "kv-canary: scatter_req_token_ids"
    refused(
        TypeError,
        exactly(f"{prefix} flat_in must be int64, got torch.int32"),
        flat_in=i64([1, 2, 3]).int(),
        pool_out=fresh_pool().long(),
    )
    refused(
        TypeError,
        exactly(f"{prefix} offsets must be int64, got torch.float32"),
        offsets=torch.tensor([0.0, 2.0, 3.0]),
    )
    refused(
        TypeError,
        exactly(f"{prefix} req_pool_indices must be int64, got torch.int32"),
        req_pool_indices=i64([1, 2]).int(),
    )
    refused(
        TypeError,
        exactly(f"{prefix} pool_out must be int32, got torch.int64"),
        pool_out=fresh_pool().long(),
    )


def test_s7_s8_the_offsets_length_and_the_cap():
    prefix = "kv-canary: scatter_req_token_ids"
    refused(
        ValueError,
        exactly(f"{prefix} offsets length 3 != bs+1 (4)"),
        req_pool_indices=i64([1, 2, 3]),
    )
    rows = torch.ones(4097, dtype=torch.int64)
    refused(
        ValueError,
        exactly(
            f"{prefix} bs+1=4098 exceeds BATCH_BLOCK=4097; bump _SCATTER_BATCH_BLOCK if real "
            "workloads need this"
        ),
        offsets=torch.zeros(4098, dtype=torch.int64),
        req_pool_indices=rows,
        flat_in=i64([]),
    )


def test_s9_contiguous_and_on_the_pool_s_device():
    message = refused(
        ValueError, "kv-canary: scatter_req_token_ids flat_in ", flat_in=i64([1, 0, 2, 0, 3])[::2]
    )
    assert "contiguous" in message
    message = refused(
        ValueError,
        "kv-canary: scatter_req_token_ids pool_out ",
        pool_out=torch.zeros(4, 8, dtype=torch.int32)[:, ::2],
    )
    assert "contiguous" in message
    message = refused(
        ValueError,
        "kv-canary: scatter_req_token_ids req_pool_indices ",
        req_pool_indices=torch.ones(2, dtype=torch.int64, device="meta"),
    )
    assert "meta" in message


@pytest.mark.parametrize(
    "offsets, flat_len",
    [([1, 2, 3], 3), ([0, 2, 1], 3), ([0, 2, 2], 3), ([0, 2, 4], 3), ([0, -1, 3], 3)],
)
def test_s10_offsets_start_at_0_never_decrease_and_end_at_the_stream(offsets, flat_len):
    message = refused(
        ValueError,
        "kv-canary: scatter_req_token_ids offsets ",
        offsets=i64(offsets),
        flat_in=torch.arange(flat_len, dtype=torch.int64),
    )
    assert str(offsets) in message


def test_s11_a_request_with_tokens_names_a_row_of_the_pool():
    message = refused(
        IndexError,
        exactly(
            "kv-canary: scatter_req_token_ids req_pool_indices[1] = 4 is not a row of "
            "pool_out (4 rows)"
        ),
        req_pool_indices=i64([1, 4]),
    )
    assert message
    refused(
        IndexError,
        "kv-canary: scatter_req_token_ids req_pool_indices\\[0\\] = -1",
        req_pool_indices=i64([-1, 2]),
    )
    # a request without tokens may name anything
    pool = scatter(i64([5]), i64([0, 0, 1]), i64([99, 3]), fresh_pool())
    assert pool[3].tolist() == [5, STALE, STALE, STALE]


def test_s10_s11_at_their_edges():
    """S10 refuses offsets starting below 0; S11 names the pool's rows (not its row length),
    refuses a row past the pool's end, not only at it, and lets a request without tokens that
    follows one with tokens name anything."""
    refused(
        ValueError,
        "kv-canary: scatter_req_token_ids offsets ",
        offsets=i64([-1, 2, 4]),
        flat_in=torch.arange(4, dtype=torch.int64),
    )
    refused(
        IndexError,
        exactly(
            "kv-canary: scatter_req_token_ids req_pool_indices[1] = 6 is not a row of "
            "pool_out (5 rows)"
        ),
        req_pool_indices=i64([1, 6]),
        pool_out=fresh_pool(rows=5, row_len=3),
    )
    pool = scatter(i64([5, 6]), i64([0, 2, 2]), i64([2, 99]), fresh_pool())
    assert pool[2].tolist() == [5, 6, STALE, STALE]
