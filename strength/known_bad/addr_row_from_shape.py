"""Rows are addressed by their byte size from the shape, not by ``stride(0)``, so a per-layer
view with a row stride larger than its row reads the wrong bytes: breaks CONTRACT §3 ("rows are
addressed by stride(0), never by the shape").
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash,
    "source_args",
    # the row's own size is at most its stride, so every read stays inside the view
    ("source.row_stride_bytes,", "source.tensor.shape[1:].numel() * source.tensor.element_size(),"),
)

export(globals())
