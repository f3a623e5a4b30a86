"""``fingerprint_kernel`` keeps slot indices as int16, so every slot from 2**15 on is hashed
as a different one: a slot in [2**15, 2**16) turns negative and hashes nothing, a larger one
wraps to a smaller slot (or to a negative one). Breaks CONTRACT §4 (the fingerprint of slot
``s`` is the hash of slot ``s``'s bytes; CONTRACT §4); write then stores the wrong
``real_kv_hash`` for such slots, so a verify of them fails too (verify folds its own slots,
uncut).

Passes on small worlds: the small-world sources hold at most a few hundred slots (16 rows
of 32 on a GPU, 4 of 8 on the CPU, by ``conformance.profiles.layout_sizes``; the pinned
vectors fewer), all far below 2**15, where the cut changes nothing.

Safe: a slot that turns negative is not loaded (``fold_source`` masks slots < 0), one that
wraps to a non-negative value becomes a smaller slot, inside every source that holds the
original, and -1 stays -1.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    slots = tl.load(slot_ptr + offs, mask=mask, other=0).to(tl.int64)\n",
        "    slots = tl.load(slot_ptr + offs, mask=mask, other=0).to(tl.int16).to(tl.int64)\n",
    ),
)

export(globals())
