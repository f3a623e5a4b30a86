"""Verify's grid is capped at 65,536 entries (512 programs of VERIFY_BLOCK = 128): the
entries past the first 65,536 of a launch are never checked. Breaks CONTRACT §7 (every entry
``k < active`` is checked). ``slot_run_counter`` is still right: program 0 adds the whole
active count.

Passes where no launch past 65,536 entries carries a fault: the scale tier's sweeps hold
33,280 entries and more, and the engine-scale plan's verify of 86,798 entries was clean until
its faults were spread to its last entry (conformance/test_plan.py).

Safe: fewer programs run, each exactly as in canary; nothing is read or written that canary
would not read or write.
"""

import canary.launch
from strength.known_bad._mutate import export, patch_function

patch_function(
    canary.launch,
    "launch_canary_verify_kernel",
    (
        "grid = (max(1, triton.cdiv(checked.capacity, VERIFY_BLOCK)),)",
        "grid = (min(max(1, triton.cdiv(checked.capacity, VERIFY_BLOCK)), 65536 // VERIFY_BLOCK),)",
    ),
)

export(globals())
