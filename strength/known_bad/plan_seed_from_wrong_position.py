"""A row's write seed is read two positions before its prefix ends, ``req_to_token[rp, p - 2]``,
instead of at ``p - 1``: breaks CONTRACT §12 item 5. Kept safe: the position is clamped at 0,
inside the row."""

from strength.known_bad._mutate import export, patch_plan_kernels

patch_plan_kernels(
    (
        "seed_at = req_to_token_ptr + pool_row * row_len + prefix_len - 1",
        "seed_at = req_to_token_ptr + pool_row * row_len + tl.maximum(prefix_len - 2, 0)",
    )
)

export(globals())
