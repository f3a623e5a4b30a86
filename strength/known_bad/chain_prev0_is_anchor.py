"""A prev slot of 0 is taken as the anchor instead of "chain not checked": breaks CONTRACT §7
(``prev == 0 -> chain not checked``)."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "tl.where(prev < 0, anchor, tl.where(prev == 0, prev_hash, linked))",
        "tl.where(prev <= 0, anchor, linked)",
    )
)

export(globals())
