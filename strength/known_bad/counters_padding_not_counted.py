"""Verify counts only the entries it checks, leaving padding (slot 0) out of slot_run_counter:
breaks CONTRACT §7 (``slot_run_counter += active``, padding entries included)."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        '            tl.atomic_add(slot_run_counter_ptr, active, sem="relaxed")\n',
        "            pass\n",
    ),
    (
        "    fields = buf_ptr + slots * slot_stride_words\n",
        "    tl.atomic_add(slot_run_counter_ptr + slots * 0, 1, mask=live)\n"
        "    fields = buf_ptr + slots * slot_stride_words\n",
    ),
)

export(globals())
