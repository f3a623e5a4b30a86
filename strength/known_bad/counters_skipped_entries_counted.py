"""Write adds every entry of a request to slot_run_counter, skipped (-1) ones included: breaks
CONTRACT §6 (a negative slot means "no write, no count")."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        '        tl.atomic_add(slot_run_counter_ptr, written, sem="relaxed")',
        '        tl.atomic_add(slot_run_counter_ptr, end - start, sem="relaxed")',
    ),
)

export(globals())
