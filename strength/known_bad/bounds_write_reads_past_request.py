"""write reads one entry past each request (``i + 1 <= end``): for the last request, one entry
past the token arrays. Breaks CONTRACT §8 ("no launch reads or writes outside its buffers").

The entry read ahead is never used, so every result stays right: only a launch that is watched
for accesses outside its buffers (``conformance.bounds``, on the CPU) sees the bug. The gate
runs this entry on the CPU only, where the watch masks those reads off.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(("            has_next = i + 1 < end\n", "            has_next = i + 1 <= end\n"))

export(globals())
