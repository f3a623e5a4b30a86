"""The ring's write index stops at the capacity, so violations past it are not counted:
breaks CONTRACT §5 ("the index keeps counting past the capacity")."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    keep = emit & (idx < ring_capacity) & (idx >= 0)\n",
        "    keep = emit & (idx < ring_capacity) & (idx >= 0)\n"
        "    tl.atomic_add(write_index_ptr + (slot * 0).to(tl.int32), -1, mask=emit & (idx >= ring_capacity))\n",
    )
)

export(globals())
