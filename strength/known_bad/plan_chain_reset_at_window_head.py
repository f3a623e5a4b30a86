"""The entry at an SWA window's head gets previous slot -1, as if the chain started there:
breaks CONTRACT §12 item 2 (the window's head names its real predecessor; the writer chains
across the whole prefix), so verify expects the anchor and reports every window head."""

from strength.known_bad._mutate import export, patch_plan_kernels

patch_plan_kernels(
    (
        "    prev = tl.where(position > 0, prev, -1)  # position 0 is the chain head",
        "    prev = tl.where(position > window_first(prefix_len, swa_window), prev, -1)",
    )
)

export(globals())
