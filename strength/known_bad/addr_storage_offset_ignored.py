"""The base address is the start of the tensor's storage instead of ``data_ptr()``, so a view
with a storage offset (a layer of a pool) reads the bytes before it: breaks CONTRACT §3.
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "source_args",
    # the storage starts at or before the view, and holds all of it: reads stay inside it
    ("source.tensor.data_ptr(),", "source.tensor.untyped_storage().data_ptr(),"),
)

export(globals())
