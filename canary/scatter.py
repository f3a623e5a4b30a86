"""The expected-token scatter (CONTRACT §13): each request's token ids into its row of the pool
that the plan (§12) reads.

Every rule S1 to S11 is checked on the host, in the contract's order, before any kernel runs
(S10 and S11 read the offsets and the pool rows); then one program per block of tokens finds
each token's request by a binary search over the offsets and stores it.
"""

from __future__ import annotations

import torch
import triton

from ._runtime import launch_kernel
from .plan import PLAN_BS_BLOCK_SIZE

# SGLang's _SCATTER_BATCH_BLOCK: the most offsets (bs + 1) one launch takes; here the plan's
# cap plus one (S8)
SCATTER_BATCH_BLOCK = PLAN_BS_BLOCK_SIZE + 1
SCATTER_TOKEN_BLOCK = 2048  # tokens per program, 8 lanes a thread (as the plan's entries)
SCATTER_NUM_WARPS = 8

_PREFIX = "kv-canary: scatter_req_token_ids"
_ARGUMENTS = ("flat_in", "offsets", "req_pool_indices", "pool_out")


def check_scatter_launch(
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
) -> None:
    """Every rule of CONTRACT §13, S1 to S11 in order; raises the first that is broken."""
    given = dict(zip(_ARGUMENTS, (flat_in, offsets, req_pool_indices, pool_out)))
    for name, value in given.items():  # S1
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{_PREFIX} {name} must be a torch.Tensor, got {type(value).__name__}")
    for name, ndim in (("flat_in", 1), ("offsets", 1), ("req_pool_indices", 1)):  # S2 to S4
        if given[name].dim() != ndim:
            raise ValueError(f"{_PREFIX} {name} must be 1-D, got shape {tuple(given[name].shape)}")
    if pool_out.dim() != 2:  # S5
        raise ValueError(f"{_PREFIX} pool_out must be 2-D, got shape {tuple(pool_out.shape)}")
    for name in _ARGUMENTS:  # S6
        want = torch.int32 if name == "pool_out" else torch.int64
        if given[name].dtype != want:
            wanted = str(want).removeprefix("torch.")
            raise TypeError(f"{_PREFIX} {name} must be {wanted}, got {given[name].dtype}")
    bs = int(req_pool_indices.shape[0])
    if int(offsets.shape[0]) != bs + 1:  # S7
        raise ValueError(f"{_PREFIX} offsets length {offsets.shape[0]} != bs+1 ({bs + 1})")
    if bs + 1 > SCATTER_BATCH_BLOCK:  # S8
        raise ValueError(
            f"{_PREFIX} bs+1={bs + 1} exceeds BATCH_BLOCK={SCATTER_BATCH_BLOCK}; "
            "bump _SCATTER_BATCH_BLOCK if real workloads need this"
        )
    device = pool_out.device
    for name, value in given.items():  # S9
        if not value.is_contiguous():
            raise ValueError(f"{_PREFIX} {name} must be contiguous")
        if value.device != device:
            raise ValueError(
                f"{_PREFIX} {name} must be on pool_out's device {device}, got {value.device}"
            )
    bounds = offsets.cpu()  # S10
    total = flat_in.shape[0]
    if int(bounds[0]) != 0 or int(bounds[-1]) != total or bool((bounds[1:] < bounds[:-1]).any()):
        raise ValueError(
            f"{_PREFIX} offsets must start at 0, never decrease and end at the {total} tokens "
            f"of flat_in, got {bounds.tolist()}"
        )
    rows = req_pool_indices.cpu()  # S11
    owners = bounds[1:] > bounds[:-1]
    outside = owners & ((rows < 0) | (rows >= pool_out.shape[0]))
    found = torch.nonzero(outside)
    if found.numel():
        r = int(found[0, 0])
        raise IndexError(
            f"{_PREFIX} req_pool_indices[{r}] = {int(rows[r])} is not a row of pool_out "
            f"({pool_out.shape[0]} rows)"
        )


def launch_scatter_req_token_ids_kernel(
    *,
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
) -> None:
    """Copy each request's tokens of ``flat_in`` into its row of ``pool_out`` (CONTRACT §13)."""
    check_scatter_launch(flat_in, offsets, req_pool_indices, pool_out)
    num_tokens = flat_in.shape[0]
    if num_tokens == 0:
        return
    bs = req_pool_indices.shape[0]
    launch_kernel(
        pool_out.device,
        "scatter_req_token_ids_kernel",
        (triton.cdiv(num_tokens, SCATTER_TOKEN_BLOCK),),
        flat_in,
        offsets,
        req_pool_indices,
        pool_out,
        num_tokens,
        bs,
        bs.bit_length(),
        pool_out.shape[1],
        BLOCK=SCATTER_TOKEN_BLOCK,
        num_warps=SCATTER_NUM_WARPS,
    )
