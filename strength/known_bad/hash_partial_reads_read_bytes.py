"""PARTIAL mode reads ``read_bytes`` of each slot instead of 16, i.e. it hashes like ALL:
breaks CONTRACT §3/§4 (``effective_read_bytes`` is 16 in PARTIAL).
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "source_args",
    (
        "read = PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(source.read_bytes)",
        "read = int(source.read_bytes)",
    ),
)

export(globals())
