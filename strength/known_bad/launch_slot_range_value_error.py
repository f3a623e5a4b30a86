"""A slot outside a source's capacity raises ValueError instead of IndexError: breaks CONTRACT §4's
slot-range launch check.
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(real_kv_hash, "check_slots_in_sources", ("raise IndexError(", "raise ValueError("))

export(globals())
