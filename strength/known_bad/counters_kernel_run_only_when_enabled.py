"""A disabled verify (enable == 0) does not count its launch: breaks CONTRACT §7
("kernel_run_counter += 1 always")."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    if pid == 0:\n"
        '        tl.atomic_add(kernel_run_counter_ptr, 1, sem="relaxed")\n'
        "        if enabled:\n"
        '            tl.atomic_add(slot_run_counter_ptr, active, sem="relaxed")\n',
        "    if pid == 0:\n"
        "        if enabled:\n"
        '            tl.atomic_add(kernel_run_counter_ptr, 1, sem="relaxed")\n'
        '            tl.atomic_add(slot_run_counter_ptr, active, sem="relaxed")\n',
    )
)

export(globals())
