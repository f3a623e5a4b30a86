"""The page mapping takes the row from ``s % page_size`` instead of ``s // page_size``: breaks
CONTRACT §3's slot mapping.

Kept safe: the row is clamped to ``s // page_size``, which is always one of the source's rows,
so the mutant reads wrong bytes but never outside the view.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    ("rows = slots // page_size", "rows = tl.minimum(slots % page_size, slots // page_size)"),
)

export(globals())
