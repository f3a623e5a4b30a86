"""Every program of the write grid bumps kernel_run_counter, so it counts requests, not
launches: breaks CONTRACT §6 ("kernel_run_counter += 1 always", once per launch)."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        '    if req == 0:\n        tl.atomic_add(kernel_run_counter_ptr, 1, sem="relaxed")\n',
        '    tl.atomic_add(kernel_run_counter_ptr, 1, sem="relaxed")\n',
    )
)

export(globals())
