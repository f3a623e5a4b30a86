"""write and verify check their slots against the canary buffer on a 32-bit copy: seed slot
2^32 + 1 passes as slot 1 and the launch then reads that record far outside the buffer, and
verify slot 2^63 - 1 is refused as slot -1. Breaks CONTRACT §8 (every active, previous and
seed slot below ``num_slots``, named as given) and "no launch reads outside its buffers".

Only the slots past 32 bits show it, and the reads outside are seen by the CPU's watch
(``conformance.bounds``), which masks them off; the gate runs this entry on the CPU only.
"""

from canary import launch
from strength.known_bad._mutate import export, patch_function

patch_function(
    launch,
    "_check_slots_below",
    ("    bad = slots[", "    slots = slots.to(torch.int32)\n    bad = slots["),
)

export(globals())
