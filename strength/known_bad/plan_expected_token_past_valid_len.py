"""Expected tokens are read up to the pool row's end instead of below the row's valid length,
so an EAGLE draft position or a recycled row's stale tail is checked as if it were committed:
breaks CONTRACT §12 item 2 (``0 <= pos + offset < valid_lens[r]``, else -1)."""

from strength.known_bad._mutate import export, patch_plan_kernels

patch_plan_kernels(
    (
        "known = live & (at >= 0) & (at < valid_len)",
        "known = live & (at >= 0) & (at < pool_len)",
    )
)

export(globals())
