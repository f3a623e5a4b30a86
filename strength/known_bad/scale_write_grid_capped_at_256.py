"""The write launcher's grid is capped at 256 programs (one per request), so the requests past
the 256th of a plan are never walked: their records stay as they were and
``slot_run_counter`` falls short by their entries. Breaks CONTRACT §6 (every request
``r < active`` is written, and the counter grows by every entry written; CONTRACT §6).

Passes on small worlds: today's write plans hold at most a few valid requests (the launch
test that grows a plan to 300 entries makes only the first few valid), so no valid request
is ever past the 256th.

Safe: fewer programs run, each exactly as in canary; nothing is read or written that canary
would not read or write.
"""

import canary.launch
from strength.known_bad._mutate import export, patch_function

patch_function(
    canary.launch,
    "launch_canary_write_kernel",
    ("(max(checked.capacity, 1),)", "(min(max(checked.capacity, 1), 256),)"),
)

export(globals())
