"""``num_valid`` is used without clamping to ``[0, capacity]``, so slot_run_counter counts
entries the plan does not have: breaks CONTRACT §7 (``active = clamp(verify_num_valid, 0, cap)``).

Kept safe: lanes still stop at the plan's capacity, so no entry past it is read.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    active = tl.minimum(tl.maximum(num_valid, 0), capacity)\n    if pid == 0:",
        "    active = num_valid\n    if pid == 0:",
    )
)

export(globals())
