"""The scatter writes a request's tokens past its pool row's end into the rows after it:
breaks CONTRACT §13 (a token past the row's end is dropped; nothing else of the pool changes).
Kept safe: tokens past the whole pool are still dropped."""

import canary.scatter
from strength.known_bad._mutate import export, patch_function, patch_plan_kernels

patch_plan_kernels(
    (
        "    row_len,  # positions per pool row (pool_out is contiguous: also its row stride)\n"
        "    BLOCK: tl.constexpr,  # tokens per program\n",
        "    row_len,  # positions per pool row (pool_out is contiguous: also its row stride)\n"
        "    num_cells,\n"
        "    BLOCK: tl.constexpr,  # tokens per program\n",
    ),
    (
        "    kept = live & (position < row_len)  # a token past the row's end is dropped\n",
        "    kept = live & (pool_row * row_len + position < num_cells)\n",
    ),
)
patch_function(
    canary.scatter,
    "launch_scatter_req_token_ids_kernel",
    ("        pool_out.shape[1],\n", "        pool_out.shape[1],\n        pool_out.numel(),\n"),
)

export(globals())
