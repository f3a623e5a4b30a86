"""The expected-token scatter of ``canary_torch`` (CONTRACT §13), written from the contract
alone: each request's token ids, from one flat stream, into its row of the expected-token
pool that the plan kernel (CONTRACT §12) reads.

``scatter_launch`` makes every check, S1 to S11 in the contract's order, before anything is
written; ``scatter`` then writes all tokens with one indexed store. All index arithmetic is
int64.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

SCATTER_MAX_REQS = 4096  # CONTRACT §13 S8: the per-launch cap of §12

_NAME = "kv-canary: scatter_req_token_ids"
_LOW_32 = (1 << 32) - 1
_SIGN_32 = 1 << 31


class ScatterLaunch(NamedTuple):
    flat_in: torch.Tensor
    offsets: torch.Tensor
    req_pool_indices: torch.Tensor
    pool_out: torch.Tensor


def scatter_launch(*, flat_in, offsets, req_pool_indices, pool_out) -> ScatterLaunch:
    """Every check of CONTRACT §13 in its order (S1 to S11); reads the arguments, writes nothing."""
    arguments = {
        "flat_in": flat_in,
        "offsets": offsets,
        "req_pool_indices": req_pool_indices,
        "pool_out": pool_out,
    }
    for name, value in arguments.items():  # S1
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{_NAME} {name} must be a torch.Tensor, got {type(value).__name__}")
    dims = {"flat_in": 1, "offsets": 1, "req_pool_indices": 1, "pool_out": 2}
    for name, dim in dims.items():  # S2 to S5
        tensor = arguments[name]
        if tensor.dim() != dim:
            raise ValueError(f"{_NAME} {name} must be {dim}-D, got shape {tuple(tensor.shape)}")
    dtypes = {"flat_in": "int64", "offsets": "int64", "req_pool_indices": "int64"}
    dtypes["pool_out"] = "int32"
    for name, dtype in dtypes.items():  # S6
        tensor = arguments[name]
        if tensor.dtype != getattr(torch, dtype):
            raise TypeError(f"{_NAME} {name} must be {dtype}, got {tensor.dtype}")
    bs = int(req_pool_indices.shape[0])
    if offsets.shape[0] != bs + 1:  # S7
        raise ValueError(f"{_NAME} offsets length {offsets.shape[0]} != bs+1 ({bs + 1})")
    if bs > SCATTER_MAX_REQS:  # S8
        raise ValueError(
            f"{_NAME} bs+1={bs + 1} exceeds BATCH_BLOCK={SCATTER_MAX_REQS + 1}; bump "
            f"_SCATTER_BATCH_BLOCK if real workloads need this"
        )
    device = pool_out.device
    for name, tensor in arguments.items():  # S9
        if not tensor.is_contiguous():
            raise ValueError(f"{_NAME} {name} must be contiguous")
        if tensor.device != device:
            raise ValueError(f"{_NAME} {name} is on {tensor.device}, but pool_out is on {device}")
    total = int(flat_in.shape[0])
    steps = offsets[1:] - offsets[:-1]
    if int(offsets[0]) != 0 or int(offsets[-1]) != total or bool((steps < 0).any()):  # S10
        raise ValueError(
            f"{_NAME} offsets must start at 0, never decrease and end at flat_in's length "
            f"{total}, got {offsets.tolist()}"
        )
    rows = int(pool_out.shape[0])
    outside = (steps > 0) & ((req_pool_indices < 0) | (req_pool_indices >= rows))
    found = torch.nonzero(outside)
    if found.numel():  # S11
        r = int(found[0, 0])
        raise IndexError(
            f"{_NAME} req_pool_indices[{r}]={int(req_pool_indices[r])} is not a row of "
            f"pool_out, which has {rows} rows"
        )
    return ScatterLaunch(flat_in, offsets, req_pool_indices, pool_out)


def low_32_bits(values: torch.Tensor) -> torch.Tensor:
    """int64 values cut to their low 32 bits, two's complement, as int32."""
    low = values & _LOW_32
    return torch.where(low >= _SIGN_32, low - (1 << 32), low).to(torch.int32)


def scatter(launch: ScatterLaunch) -> None:
    """Token ``t`` of request ``r`` goes to ``pool_out[req_pool_indices[r], t - offsets[r]]``
    when that column exists; tokens past a row's end are dropped. Nothing else is written."""
    flat_in, offsets, pool_rows, pool = launch
    total = flat_in.shape[0]
    row_length = pool.shape[1]
    if total == 0 or row_length == 0:
        return
    device = flat_in.device
    counts = offsets[1:] - offsets[:-1]
    request = torch.repeat_interleave(
        torch.arange(counts.shape[0], device=device), counts, output_size=total
    )
    column = torch.arange(total, device=device) - offsets[request]
    kept = column < row_length
    target = pool_rows[request] * row_length + column
    pool.view(-1)[target[kept]] = low_32_bits(flat_in[kept])
