"""The violation ring wraps around (``idx % capacity``) instead of being fill-once: breaks
CONTRACT §5 ("no stored row is overwritten").

Kept safe: the wrapped index is always a row of the ring, and nothing is stored in an
empty ring or at a negative index.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    keep = emit & (idx < ring_capacity) & (idx >= 0)\n    row = ring_ptr + idx.to(tl.int64) * 8\n",
        "    keep = emit & ((idx * 0 + ring_capacity) > 0) & (idx >= 0)\n"
        "    row = ring_ptr + (idx % tl.maximum(ring_capacity, 1)).to(tl.int64) * 8\n",
    )
)

export(globals())
