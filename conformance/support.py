"""Glue between drawn descriptions, the implementation under test and the reference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

import reference
import strategies as st_kv


def materialize_all(layouts: Sequence, device, *, shared: bool = False):
    """Materialize ``layouts`` on ``device``: separate buffers, or one shared per-layer pool."""
    if shared and layouts:
        return st_kv.materialize_shared(layouts, device)
    return tuple(st_kv.materialize(layout, device) for layout in layouts)


def reference_sources(materialized) -> tuple:
    """numpy twins of materialized sources, from their bytes as they are now."""
    return tuple(m.reference_source() for m in materialized)


def slots_tensor(slots: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(slots), dtype=torch.int64, device=device)


def describe_layouts(layouts: Sequence) -> str:
    """A short configuration line for failure messages."""
    if not layouts:
        return "no sources"
    parts = []
    for i, layout in enumerate(layouts):
        parts.append(
            f"src{i}: {layout.dtype}{list(layout.shape)} page_size={layout.page_size} "
            f"bytes/token={layout.num_bytes_per_token} read={layout.read_bytes} "
            f"row stride {layout.row_stride_bytes} B, row {layout.row_bytes} B, "
            f"offset {layout.offset_bytes} B, fill={layout.fill}"
        )
    return "; ".join(parts)


def fingerprint_repro(
    impl_name: str, device, layouts, slots, mode, *, shared: bool = False, sources_expr=None
) -> str:
    """A snippet that rebuilds the failing call from its description."""
    make = (
        "materialize_shared(layouts, device)"
        if shared
        else ("[materialize(layout, device) for layout in layouts]")
    )
    return "\n".join(
        [
            "    import torch, importlib",
            "    from strategies import SourceLayout, materialize, materialize_shared",
            f"    impl = importlib.import_module({impl_name!r}); device = {str(device)!r}",
            f"    layouts = {tuple(layouts)!r}",
            f"    sources = [m.build(impl) for m in {make}]",
            f"    impl.fingerprint({sources_expr or 'sources'}, torch.tensor({list(slots)!r}, "
            f"device=device), mode={int(mode)})",
        ]
    )


def reference_fingerprint(ref_sources, slots, mode) -> np.ndarray:
    return reference.fingerprint(
        list(ref_sources), np.asarray(list(slots), dtype=np.int64), int(mode)
    )
