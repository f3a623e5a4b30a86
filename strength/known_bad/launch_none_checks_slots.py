"""fingerprint checks slot ranges in mode NONE too, so a NONE call with slots that no source has
raises IndexError: breaks CONTRACT §4 ("mode NONE reads no source, so it checks no slot").
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "check_fingerprint_args",
    ("if mode != RealKvHashMode.NONE and sources:", "if sources:"),
)

export(globals())
