"""The previous slot of a verify entry is not translated through the SWA table: it names a
full-pool slot in a plan of SWA slots. Breaks CONTRACT §12 item 3 (entries, previous slots and
seeds are all translated)."""

from strength.known_bad._mutate import export, patch_plan_kernels

patch_plan_kernels(("        prev = to_swa(prev, has_prev, swa_lut_ptr)\n", ""))

export(globals())
