"""A skipped entry (slot -1) is folded anyway: its lane reads the row before each source.
Breaks CONTRACT §4 ("no launch ever reads memory outside a source's declared rows").

The hash of a -1 entry is never stored or compared, so every result stays right: only a launch
that is watched for accesses outside its buffers (``conformance.bounds``, on the CPU) sees the
bug. The gate runs this entry on the CPU only, where the watch masks those reads off.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(("    live = mask & (slots >= 0)\n", "    live = mask & (slots >= -1)\n"))

export(globals())
