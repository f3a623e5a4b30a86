"""Write treats slot 0 as padding and skips it: breaks CONTRACT §6 ("Slot 0 is written like any
other"); only negative slots are skipped."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(("            writing = slot >= 0", "            writing = slot > 0"))

export(globals())
