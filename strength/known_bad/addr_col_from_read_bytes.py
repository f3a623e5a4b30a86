"""A slot's column is ``(s % page_size) * read_bytes`` instead of ``* num_bytes_per_token``, so
slots overlap when only part of each is read: breaks CONTRACT §3's slot mapping.
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "source_args",
    # read_bytes <= num_bytes_per_token, so the columns shrink and stay inside the row
    ("int(source.num_bytes_per_token),", "int(source.read_bytes),"),
)

export(globals())
