"""Glue between drawn descriptions, the implementation under test and the reference."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance.assertions import launch_tag_name


def materialize_all(layouts: Sequence, device, *, shared: bool = False, backings=None):
    """Materialize ``layouts`` on ``device``: separate buffers, or one shared per-layer pool.

    ``backings[i]``, where given and not None, are the exact bytes of source ``i``'s backing
    (as for the CONTRACT §2 vectors), written over its seeded fill.
    """
    if shared and layouts:
        made = st_kv.materialize_shared(layouts, device)
    else:
        made = tuple(st_kv.materialize(layout, device) for layout in layouts)
    for m, data in zip(made, backings or [None] * len(made), strict=True):
        if data is not None:
            m.backing.copy_(torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy()))
    return made


def missing_dtypes(layouts: Sequence) -> list[str]:
    """The dtypes ``layouts`` name that the installed torch lacks."""
    return sorted({layout.dtype for layout in layouts} - set(st_kv.available_dtypes()))


def reference_sources(materialized) -> tuple:
    """numpy twins of materialized sources, from their bytes as they are now."""
    return tuple(m.reference_source() for m in materialized)


def slots_tensor(slots: Sequence[int], device) -> torch.Tensor:
    return torch.tensor(list(slots), dtype=torch.int64, device=device)


def describe_layouts(layouts: Sequence) -> str:
    """A short configuration text for failure messages, one source per line."""
    if not layouts:
        return "no sources"
    parts = []
    for i, layout in enumerate(layouts):
        parts.append(
            f"src{i}: {layout.dtype}{list(layout.shape)} page_size={layout.page_size} "
            f"bytes/token={layout.num_bytes_per_token} read_bytes={layout.read_bytes}\n"
            f"      row stride {layout.row_stride_bytes} B, row {layout.row_bytes} B, "
            f"offset {layout.offset_bytes} B, fill={layout.fill}"
        )
    return "\n".join(parts)


def describe_world(world) -> str:
    """A ``CanaryWorld`` for failure messages: modes and launch tags by name, one source a line."""
    head = (
        f"world: mode {mode_name(world.mode)}, kernel_kind {launch_tag_name(world.kernel_kind)}, "
        f"{world.num_slots} slots of {world.slot_stride_bytes} B,\n"
        f"       ring of {world.ring_capacity} rows from index {world.ring_start}, "
        f"chain position assert {'on' if world.chain_assert else 'off'}, seed {world.seed}"
    )
    return head + "\n" + describe_layouts(world.sources)


#: The folder ``--canary-impl path/to/mykv.py`` put on ``sys.path`` (set by the plugin), so
#: that snippets import the implementation the same way.
IMPL_FOLDER: str | None = None


def import_impl_lines(impl_name: str, device) -> list[str]:
    """The lines of a snippet that import the implementation and name the device."""
    lines = ["import importlib, sys", "import numpy as np, torch", "import reference"]
    if IMPL_FOLDER:
        lines.append(f"sys.path.insert(0, {IMPL_FOLDER!r})")
    lines.append(f"impl = importlib.import_module({impl_name!r}); device = {str(device)!r}")
    return lines


def source_case_repro(impl_name: str, device, case) -> str:
    """A snippet that builds an invalid-source case, catches what RealKvSource raises and
    asserts it is the reference validator's verdict (kept in ``case.expected``)."""
    error, message = case.expected
    lines = [
        *import_impl_lines(impl_name, device),
        "from strategies import InvalidSourceCase, ObjectSpec",
        f"case = {dataclasses.replace(case, expected=None)!r}",
        f"want = ({error.__name__}, {message!r})  # the reference validator's verdict",
        "try:",
        "    impl.RealKvSource(**case.build(device))",
        "    got = None  # accepted",
        "except Exception as error:",
        "    got = (type(error), str(error))",
        'assert got == want, f"got {got}, want {want}"',
    ]
    return "\n".join("    " + line for line in lines)


def mode_name(mode) -> str:
    """A hash mode by its name, e.g. ``ALL`` for 2."""
    try:
        return reference.RealKvHashMode(int(mode)).name
    except ValueError:
        return str(int(mode))


def fingerprint_repro(impl_name: str, device, layouts, slots, mode, *, shared: bool = False) -> str:
    """A snippet that rebuilds the failing call from its description, computes the reference's
    answer on the same bytes, and asserts that they are equal (so pasting it fails the same way).
    """
    make = (
        "materialize_shared(layouts, device)"
        if shared
        else "[materialize(x, device) for x in layouts]"
    )
    lines = [
        *import_impl_lines(impl_name, device),
        "from strategies import SourceLayout, materialize, materialize_shared",
        f"layouts = {tuple(layouts)!r}",
        f"made = {make}",
        "sources = [m.build(impl) for m in made]",
        f"slots = {list(slots)!r}",
        f"got = impl.fingerprint(sources, torch.tensor(slots, device=device), "
        f"mode=impl.RealKvHashMode.{mode_name(mode)}).cpu().numpy()",
        "want = reference.fingerprint([m.reference_source() for m in made], "
        f"np.array(slots, dtype=np.int64), {int(mode)})",
        "bad = [(s, hex(g & (2**64 - 1)), hex(w & (2**64 - 1))) "
        "for s, g, w in zip(slots, got.tolist(), want.tolist()) if g != w]",
        'assert not bad, f"(slot, implementation, reference): {bad}"',
    ]
    return "\n".join("    " + line for line in lines)


def reference_fingerprint(ref_sources, slots, mode) -> np.ndarray:
    return reference.fingerprint(
        list(ref_sources), np.asarray(list(slots), dtype=np.int64), int(mode)
    )


def normalize_device(device) -> torch.device:
    """``device`` as a ``torch.device`` with an index where torch gives tensors one.

    ``cuda`` (also what ROCm builds of torch call their GPUs) without an index means the
    current CUDA device; tensors made there report ``cuda:<index>``, and
    ``torch.device("cuda") != torch.device("cuda:0")``.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a, b) -> bool:
    """Whether ``a`` and ``b`` (devices or their names) are one device; the suite compares
    devices only through this."""
    return normalize_device(a) == normalize_device(b)
