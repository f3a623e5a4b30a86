"""fingerprint names a refused slot by its int64 cast, not as the caller gave it: a uint64 slot
tensor holding 2^63 is refused as slot -9223372036854775808, and 2^64 - 1 as slot -1. Breaks
CONTRACT §4 (a refusal names the slot as given, in any integer dtype).
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "check_fingerprint_args",
    (
        "check_slots_in_sources(sources, slots.cpu(), given=slot_indices)",
        "check_slots_in_sources(sources, slots.cpu())",
    ),
)

export(globals())
