"""PARTIAL mode reads 8 bytes (one word) of each slot instead of 16: breaks CONTRACT §3/§4."""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "source_args",
    ("read = PARTIAL_READ_BYTES if mode", "read = 8 if mode"),
)

export(globals())
