"""The in-page index of a slot is kept in 6 bits: ``fold_source`` reads slot ``s`` at column
``((s % page_size) & 63) * bytes_per_token``, so a slot whose index in its page is 64 or
more (pages of 96, 128 or 256 tokens) hashes the bytes of slot ``s - 64`` (or less) of its
row. Breaks CONTRACT §3/§4 (slot ``s`` is read at ``(s % page_size) * num_bytes_per_token``
of its row; CONTRACT §3).

Passes on small worlds: the small-world properties draw pages of at most 8 tokens on the
CPU and 32 on a GPU (``conformance.profiles.layout_sizes``), and the pinned vectors use at most
16, so every in-page index is below 64, where the mask changes nothing.

Safe: the masked index is at most the true one, so each read stays inside the slot's own
row, within the bytes its page declares.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    cols = (slots % page_size) * bytes_per_token\n",
        "    cols = ((slots % page_size) & 63) * bytes_per_token\n",
    ),
)

export(globals())
