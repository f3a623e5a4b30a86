"""Verify runs as a persistent grid of 32,768 entries (256 programs of VERIFY_BLOCK = 128
entries) whose second lap is missing: the grid is capped at 256 programs and no program
goes on to the entries past the first 32,768, so they are never checked. Breaks CONTRACT §7
(every entry ``k < active`` is checked; CONTRACT §7). ``slot_run_counter`` is still right:
program 0 adds the whole active count.

Passes on small worlds: today's verify plans hold at most a few hundred entries (the launch
test's grown plan has 300), three programs, far below 256.

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
        "grid = (min(max(1, triton.cdiv(checked.capacity, VERIFY_BLOCK)), 32768 // VERIFY_BLOCK),)",
    ),
)

export(globals())
