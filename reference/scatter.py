"""The expected-token scatter: each request's tokens into its pool row (CONTRACT §13).

On numpy arrays, checked before any write (S2 to S8, S10, S11), so a scatter that raises leaves
the pool as it was; the rules about kinds, contiguity and devices of tensors (S1, S9) have no
numpy counterpart and are the suite's to check.
"""

from __future__ import annotations

import numpy as np

#: The per-launch cap on the requests of one scatter (S8): the plan's (§12 P4).
MAX_SCATTER_REQS = 4096


def scatter(
    *, flat_in: np.ndarray, offsets: np.ndarray, req_pool_indices: np.ndarray, pool_out: np.ndarray
) -> None:
    """``launch_scatter_req_token_ids_kernel`` on numpy arrays: write ``pool_out`` in place."""
    for name, array, ndim in (
        ("flat_in", flat_in, 1),
        ("offsets", offsets, 1),
        ("req_pool_indices", req_pool_indices, 1),
        ("pool_out", pool_out, 2),
    ):
        if array.ndim != ndim:
            raise ValueError(
                f"kv-canary: scatter_req_token_ids {name} must be {ndim}-D, got shape "
                f"{tuple(array.shape)}"
            )
    for name, array, dtype in (
        ("flat_in", flat_in, np.int64),
        ("offsets", offsets, np.int64),
        ("req_pool_indices", req_pool_indices, np.int64),
        ("pool_out", pool_out, np.int32),
    ):
        if array.dtype != dtype:
            raise TypeError(
                f"kv-canary: scatter_req_token_ids {name} must be {np.dtype(dtype).name}, got "
                f"{_torch_dtype_name(array.dtype)}"
            )
    bs = req_pool_indices.shape[0]
    if offsets.shape[0] != bs + 1:
        raise ValueError(
            f"kv-canary: scatter_req_token_ids offsets length {offsets.shape[0]} != bs+1 ({bs + 1})"
        )
    if bs > MAX_SCATTER_REQS:
        raise ValueError(
            f"kv-canary: scatter_req_token_ids bs+1={bs + 1} exceeds BATCH_BLOCK="
            f"{MAX_SCATTER_REQS + 1}; bump _SCATTER_BATCH_BLOCK if real workloads need this"
        )
    total = flat_in.shape[0]
    if offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] != total:
        raise ValueError(
            f"kv-canary: scatter_req_token_ids offsets must start at 0, never decrease and end at "
            f"flat_in's length {total}, got {offsets.tolist()}"
        )
    lengths = np.diff(offsets)
    n_rows, row_len = pool_out.shape
    for r in np.flatnonzero(lengths > 0):
        rp = int(req_pool_indices[r])
        if not 0 <= rp < n_rows:
            raise IndexError(
                f"kv-canary: scatter_req_token_ids req_pool_indices[{r}]={rp} is outside "
                f"pool_out's {n_rows} rows"
            )

    # the checks are done: from here on the pool changes
    owners = np.repeat(np.arange(bs, dtype=np.int64), lengths)
    positions = np.arange(total, dtype=np.int64) - offsets[:-1][owners]
    kept = positions < row_len
    # the low 32 bits, two's complement
    values = flat_in.astype(np.int64).astype(np.uint64).astype(np.uint32).view(np.int32)
    pool_out[req_pool_indices[owners[kept]], positions[kept]] = values[kept]


def _torch_dtype_name(dtype: np.dtype) -> str:
    """A numpy dtype as torch prints its counterpart (``torch.int32``), for S6's message."""
    return f"torch.{np.dtype(dtype).name}"
