"""The first time a source is hashed its bytes are copied (as ``.contiguous()`` would) and the
copy, cached per source object, is hashed from then on, so later KV writes go unseen: breaks
CONTRACT §3 ("the canary must read the live memory, never a copy").
"""

import torch

from canary import real_kv_hash
from strength.known_bad._mutate import export, install, patch_function

# Keyed by id(); the source is kept alive next to its copy so that the id is never reused.
_snapshots: dict[int, tuple] = {}


def _snapshot_address(source) -> int:
    """data_ptr() of a copy of the source's view, taken at the first call for this source."""
    key = id(source)
    if key not in _snapshots:
        tensor = source.tensor
        rows = tensor.shape[0]
        row_bytes = tensor.shape[1:].numel() * tensor.element_size()
        row_stride_bytes = tensor.stride(0) * tensor.element_size()
        span = (rows - 1) * row_stride_bytes + row_bytes if rows else 0
        # The copy keeps the view's geometry (row stride, gaps), so the kernel's addresses
        # into it are exactly its addresses into the view: nothing is read past the copy.
        storage = torch.empty(0, dtype=torch.uint8, device=tensor.device)
        storage.set_(tensor.untyped_storage())
        start = tensor.storage_offset() * tensor.element_size()
        _snapshots[key] = (source, storage[start : start + span].clone())
    return _snapshots[key][1].data_ptr()


install(real_kv_hash, "_snapshot_address", _snapshot_address)
patch_function(
    real_kv_hash, "source_args", ("source.tensor.data_ptr(),", "_snapshot_address(source),")
)

export(globals())
