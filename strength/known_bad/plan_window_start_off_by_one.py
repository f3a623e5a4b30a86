"""A sliding window starts one position late, ``max(0, prefix - window + 1)``, so every SWA row
verifies one entry too few: breaks CONTRACT §12 item 2 (``window_start = max(0, p - window)``)."""

from strength.known_bad._mutate import export, patch_plan_kernels

patch_plan_kernels(
    (
        "tl.where(swa_window > 0, tl.maximum(prefix_len - swa_window, 0), 0)",
        "tl.where(swa_window > 0, tl.maximum(prefix_len - swa_window + 1, 0), 0)",
    )
)

export(globals())
