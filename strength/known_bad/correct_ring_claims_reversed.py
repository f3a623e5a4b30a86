"""Not a bug: canary whose violations take their ring indices in another order, which CONTRACT
§5 allows ("the order of the rows one launch stores is not specified"). The suite must pass it.

A GPU runs a launch's programs at once and its lanes' atomics in any order, so the rows of a
launch land in an order of the hardware's choosing and, where the ring fills up, so does the
choice of which violations keep a row. The CPU interpreter runs programs one after another and
lanes in order, so canary there always claims in entry order. Here the verify kernel handles
its programs last to first and each program's entries last to first, and the write kernel its
requests last to first: every launch claims in an order canary never uses on the CPU, and a
suite that compares rows by position, or expects the first violations to keep the ring, fails.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    pid = tl.program_id(0)\n    enabled = tl.load(enable_ptr) != 0\n",
        "    pid = tl.num_programs(0) - 1 - tl.program_id(0)\n"
        "    enabled = tl.load(enable_ptr) != 0\n",
    ),
    (
        "    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)\n    in_plan = offs < capacity\n",
        "    offs = pid.to(tl.int64) * BLOCK + (BLOCK - 1 - tl.arange(0, BLOCK))\n"
        "    in_plan = offs < capacity\n",
    ),
    (
        "    req = tl.program_id(0).to(tl.int64)\n",
        "    req = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int64)\n",
    ),
)

export(globals())
