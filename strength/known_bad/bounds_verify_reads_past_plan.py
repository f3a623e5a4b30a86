"""verify reads the plan's entry ``capacity``, one past its arrays (``offs <= capacity``).
Breaks CONTRACT §8 ("no launch reads or writes outside its buffers").

Entries at or past ``verify_num_valid`` are never checked, so every result stays right: only a
launch that is watched for accesses outside its buffers (``conformance.bounds``, on the CPU)
sees the bug. The gate runs this entry on the CPU only, where the watch masks those reads off.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(("    in_plan = offs < capacity\n", "    in_plan = offs <= capacity\n"))

export(globals())
