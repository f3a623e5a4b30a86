"""The one place where descriptions become torch tensors (on any device) and numpy rows.

This is the only module of :mod:`strategies` that imports torch: :mod:`strategies.layouts`,
:mod:`strategies.chains` and :mod:`strategies.invalid` describe, as plain data, and import
neither torch nor this module at their top (``tests/test_imports.py`` holds them to it).
:func:`available_dtypes` asks torch itself which dtypes it has, the truth that
:func:`strategies.layouts.default_dtypes` (torch-free) is checked against.

It makes objects and runs nothing: no launch, no fingerprint, no expectation. Asked to,
it wraps what it made in an implementation's own types (:meth:`MaterializedSource.build`,
:meth:`MaterializedWorld.context`); calling the implementation, and the reports a
corruption must cause, are the suite's (``conformance.support``,
``conformance.write_verify_support``).

Every buffer made here is 16-byte aligned, and every view is made with
``torch.as_strided`` over that buffer, never a copy, so that tests can write to the
buffer and see an implementation follow the live memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

import reference
from strategies.chains import CanaryWorld
from strategies.layouts import ELEMENT_SIZES, SourceLayout, _align16, slot_window_starts
from strategies.verify import Corruption

__all__ = [
    "MaterializedSource",
    "MaterializedWorld",
    "apply_corruption",
    "materialize_world",
    "available_dtypes",
    "describe",
    "layout_bytes",
    "materialize",
    "materialize_object",
    "materialize_shared",
]

# numpy twins of torch dtypes, for the non-tensor objects of invalid cases.
_NUMPY_DTYPES = {
    "uint8": np.uint8,
    "int8": np.int8,
    "float16": np.float16,
    "float32": np.float32,
    "int32": np.int32,
    "int64": np.int64,
}

# Slot numbers are stamped in base 255 with digits 1..255 so the stamp itself has no zero byte.
_STAMP_DIGITS = 4


def available_dtypes() -> tuple[str, ...]:
    """Names from :data:`strategies.layouts.ELEMENT_SIZES` that the installed torch has."""
    return tuple(
        name for name in ELEMENT_SIZES if isinstance(getattr(torch, name, None), torch.dtype)
    )


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"this torch ({torch.__version__}) has no dtype {name!r}")
    return dtype


def layout_bytes(layout: SourceLayout, *, layer: int = 0) -> np.ndarray:
    """The bytes of ``layout``'s backing buffer, uint8 ``[backing_bytes]``, as its ``fill`` says.

    ``layer`` is stamped into dense windows and mixed into the seed, so equal layouts placed
    in one shared buffer still hold different bytes.

    Example: a dense layout's slot 5 window in layer 0 starts ``06 01 01 01 01`` (slot 5 + 1,
    then zero digits + 1, then layer 0 + 1) followed by random non-zero bytes.
    """
    if not 0 <= layer < 255:
        raise ValueError(f"layer must be in [0, 255), got {layer}")
    rng = np.random.default_rng([layout.seed, layer])
    data = rng.integers(1, 256, size=layout.backing_bytes, dtype=np.uint8)
    starts = slot_window_starts(layout)
    if layout.capacity == 0:
        return data
    if layout.fill == "dense":
        if layout.capacity >= 255**_STAMP_DIGITS:
            raise ValueError(f"capacity {layout.capacity} is too large to stamp")
        slots = np.arange(layout.capacity, dtype=np.int64)
        digits = [(slots // 255**k) % 255 + 1 for k in range(_STAMP_DIGITS)]
        digits.append(np.full_like(slots, layer + 1))
        stamp = np.stack(digits, axis=1).astype(np.uint8)
        data[starts[:, None] + np.arange(stamp.shape[1])] = stamp
        return data
    window = starts[:, None] + np.arange(layout.read_bytes, dtype=np.int64)
    data[window] = 0
    marked = {"first": 0, "middle": layout.read_bytes // 2, "last": layout.read_bytes - 1}
    data[starts + marked[layout.fill]] = rng.integers(1, 256, size=layout.capacity, dtype=np.uint8)
    return data


def _aligned_buffer(nbytes: int, device) -> tuple[torch.Tensor, int]:
    """A uint8 buffer with room for ``nbytes`` from a 16-aligned byte ``pad`` of it."""
    # Allocated as int64 so the base is at least 8-aligned: pad is 0 or 8, a multiple of
    # every element size, so typed views of the whole buffer can start anywhere we need.
    words = (_align16(nbytes) + 16) // 8
    raw = torch.empty(words, dtype=torch.int64, device=device).view(torch.uint8)
    pad = (-raw.data_ptr()) % 16
    return raw, pad


def _strided_view(raw, dtype_name, shape, strides, start_bytes) -> torch.Tensor:
    element_size = ELEMENT_SIZES[dtype_name]
    if start_bytes % element_size:
        raise ValueError(f"a {dtype_name} view cannot start at byte {start_bytes}")
    typed = raw.view(_torch_dtype(dtype_name))
    return torch.as_strided(typed, tuple(shape), tuple(strides), start_bytes // element_size)


@dataclass
class MaterializedSource:
    """A :class:`SourceLayout` made real: its backing buffer and the tensor view into it.

    ``backing`` is the whole uint8 buffer of the layout (offset, rows, gaps, tail);
    ``tensor`` shares its memory, so writing to either changes what the other sees.
    """

    layout: SourceLayout
    backing: torch.Tensor
    tensor: torch.Tensor

    def kwargs(self) -> dict:
        """``page_size``, ``num_bytes_per_token`` and ``read_bytes`` for RealKvSource."""
        return {
            "page_size": self.layout.page_size,
            "num_bytes_per_token": self.layout.num_bytes_per_token,
            "read_bytes": self.layout.read_bytes,
        }

    def build(self, impl):
        """``impl.RealKvSource`` over this tensor (``impl`` is the implementation module)."""
        return impl.RealKvSource(tensor=self.tensor, **self.kwargs())

    def reference_source(self) -> reference.Source:
        """A numpy ``reference.Source`` over a host copy of ``backing`` taken now.

        Take it again after writing to the tensor: the copy does not follow later writes.
        """
        layout = self.layout
        host = self.backing.detach().cpu().numpy().copy()
        rows = np.lib.stride_tricks.as_strided(
            host[layout.offset_bytes :],
            shape=(layout.rows, layout.row_bytes),
            strides=(layout.row_stride_bytes, 1),
            writeable=False,
        )
        return reference.Source(
            data=rows,
            page_size=layout.page_size,
            num_bytes_per_token=layout.num_bytes_per_token,
            read_bytes=layout.read_bytes,
        )


def _place(raw, pad, start, layout, layer) -> MaterializedSource:
    begin = pad + start
    backing = raw[begin : begin + layout.backing_bytes]
    backing.copy_(torch.from_numpy(layout_bytes(layout, layer=layer)))
    tensor = _strided_view(
        raw, layout.dtype, layout.shape, layout.strides, begin + layout.offset_bytes
    )
    return MaterializedSource(layout=layout, backing=backing, tensor=tensor)


def materialize(layout: SourceLayout, device) -> MaterializedSource:
    """Allocate ``layout``'s backing buffer on ``device``, fill it, and view it as the layout says.

    The view has the layout's dtype and shape ``(rows, *row_shape)``, ``stride(0) ==
    row_stride_bytes // element_size``, storage offset ``offset_bytes // element_size``
    inside the buffer, and a 16-byte aligned ``data_ptr()``.
    """
    raw, pad = _aligned_buffer(layout.backing_bytes, device)
    return _place(raw, pad, 0, layout, 0)


def materialize_shared(layouts: Sequence[SourceLayout], device) -> tuple[MaterializedSource, ...]:
    """All ``layouts`` as per-layer regions of ONE buffer, like a ``[num_layers, ...]`` KV pool.

    Layer ``i`` starts at its own 16-aligned byte; regions do not overlap, and layer ``i`` is
    filled with ``layout_bytes(layouts[i], layer=i)``, so two equal layouts still differ
    and a source that reads another layer's bytes is caught. Each result's ``backing`` is
    its own region; bytes between regions are random and non-zero.
    """
    layouts = tuple(layouts)
    starts = []
    total = 0
    for layout in layouts:
        starts.append(total)
        total += _align16(layout.backing_bytes)
    raw, pad = _aligned_buffer(total, device)
    filler = np.random.default_rng([len(layouts), total]).integers(
        1, 256, raw.numel(), dtype=np.uint8
    )
    raw.copy_(torch.from_numpy(filler))
    return tuple(
        _place(raw, pad, start, layout, layer)
        for layer, (start, layout) in enumerate(zip(starts, layouts, strict=True))
    )


def materialize_object(spec, device):
    """The object an :class:`strategies.invalid.ObjectSpec` describes, freshly made on ``device``."""
    if spec.kind == "none":
        return None
    if spec.kind in ("ndarray", "list"):
        array = np.ones(spec.shape, dtype=_NUMPY_DTYPES.get(spec.dtype, np.uint8))
        return array if spec.kind == "ndarray" else array.tolist()
    if spec.kind == "tuple":
        # The (k_buffer, v_buffer) pair of one layer, passed where one buffer belongs.
        return tuple(_tensor_from_spec(spec, device) for _ in range(2))
    if spec.kind == "tensor":
        return _tensor_from_spec(spec, device)
    raise ValueError(f"unknown object kind {spec.kind!r}")


def _tensor_from_spec(spec, device) -> torch.Tensor:
    raw, pad = _aligned_buffer(spec.backing_bytes, device)
    filler = np.random.default_rng(spec.seed).integers(1, 256, spec.backing_bytes, dtype=np.uint8)
    raw[pad : pad + spec.backing_bytes].copy_(torch.from_numpy(filler))
    tensor = _strided_view(raw, spec.dtype, spec.shape, spec.strides, pad + spec.offset_bytes)
    for op, *args in spec.ops:
        if op == "transpose":
            tensor = tensor.transpose(*args)
        elif op == "select":
            tensor = tensor.select(*args)
        elif op == "slice":
            dim, start, stop, step = args
            index = [slice(None)] * dim + [slice(start, stop, step)]
            tensor = tensor[tuple(index)]
        else:
            raise ValueError(f"unknown view op {op!r}")
    return tensor


def describe(obj, page_size, num_bytes_per_token, read_bytes) -> reference.SourceDescription:
    """The torch-free :class:`reference.SourceDescription` of ``RealKvSource(tensor=obj, ...)``.

    The three layout values are passed through as given (any type). Example:
    ``describe(torch.zeros(2, 64, dtype=torch.uint8), 4, 16, 16)`` is
    ``SourceDescription(is_tensor=True, type_name='Tensor', shape=(2, 64), strides=(64, 1),
    element_size=1, dtype_str='torch.uint8', data_ptr_mod16=0, page_size=4, ...)``.
    """
    if isinstance(obj, torch.Tensor):
        return reference.SourceDescription(
            is_tensor=True,
            type_name=type(obj).__name__,
            shape=tuple(obj.shape),
            strides=tuple(obj.stride()),
            element_size=obj.element_size(),
            dtype_str=str(obj.dtype),
            data_ptr_mod16=obj.data_ptr() % 16,
            page_size=page_size,
            num_bytes_per_token=num_bytes_per_token,
            read_bytes=read_bytes,
        )
    return reference.SourceDescription(
        is_tensor=False,
        type_name=type(obj).__name__,
        shape=(),
        strides=(),
        element_size=0,
        dtype_str="",
        data_ptr_mod16=0,
        page_size=page_size,
        num_bytes_per_token=num_bytes_per_token,
        read_bytes=read_bytes,
    )


# ---------------------------------------------------------------------------------------
# Write/verify worlds and plans (strategies.chains) made real.


@dataclass
class MaterializedWorld:
    """A :class:`strategies.chains.CanaryWorld` made real on a device.

    Tensors follow CONTRACT §5: ``canary_buf`` uint8 ``[num_slots, slot_stride_bytes]``,
    ``violation_ring`` int64 ``[ring_capacity, 8]``, ``violation_write_index`` int32 ``[1]``,
    the two run counters int64 ``[1]``, ``enable_chain_position_assert`` int32 ``[1]``. Their
    first contents are random and non-zero (the write index is the world's ``ring_start``).
    """

    world: CanaryWorld
    sources: tuple[MaterializedSource, ...]
    canary_buf: torch.Tensor
    violation_ring: torch.Tensor
    violation_write_index: torch.Tensor
    slot_run_counter: torch.Tensor
    kernel_run_counter: torch.Tensor
    enable_chain_position_assert: torch.Tensor
    #: What was done to this world, as lines of code (for failure messages: a reproduction).
    log: list[str] = field(default_factory=list)

    def context(self, impl):
        """``impl.VerifyOrWriteContext`` over these tensors, with sources built by ``impl``."""
        return impl.VerifyOrWriteContext(
            canary_buf=self.canary_buf,
            kernel_kind=impl.CanaryLaunchTag(self.world.kernel_kind),
            violation_ring=self.violation_ring,
            violation_write_index=self.violation_write_index,
            slot_run_counter=self.slot_run_counter,
            kernel_run_counter=self.kernel_run_counter,
            real_kv_sources=tuple(m.build(impl) for m in self.sources),
            real_kv_hash_mode=impl.RealKvHashMode(self.world.mode),
            enable_chain_position_assert=self.enable_chain_position_assert,
        )

    def reference_state(self) -> reference.CanaryState:
        """A numpy ``reference.CanaryState`` holding host copies of everything, taken now."""
        return reference.CanaryState(
            canary_buf=_host(self.canary_buf),
            kernel_kind=self.world.kernel_kind,
            violation_ring=_host(self.violation_ring),
            violation_write_index=_host(self.violation_write_index),
            slot_run_counter=_host(self.slot_run_counter),
            kernel_run_counter=_host(self.kernel_run_counter),
            real_kv_sources=tuple(m.reference_source() for m in self.sources),
            real_kv_hash_mode=self.world.mode,
            enable_chain_position_assert=_host(self.enable_chain_position_assert),
        )

    def records(self) -> np.ndarray:
        """The four int64 fields of every slot, ``[num_slots, 4]``, from the buffer as it is now."""
        return np.ascontiguousarray(_host(self.canary_buf)[:, :32]).view("<i8").reshape(-1, 4)


def _host(tensor: torch.Tensor) -> np.ndarray:
    host: np.ndarray = tensor.detach().cpu().numpy().copy()
    return host


def materialize_world(world: CanaryWorld, device) -> MaterializedWorld:
    """Allocate and fill everything ``world`` describes on ``device``."""
    rng = np.random.default_rng(world.seed)
    sources = tuple(materialize(layout, device) for layout in world.sources)
    buf = rng.integers(1, 256, (world.num_slots, world.slot_stride_bytes), dtype=np.uint8)
    ring = rng.integers(1, 2**62, (world.ring_capacity, 8), dtype=np.int64)

    def tensor(array, dtype):
        return torch.tensor(np.asarray(array), dtype=dtype, device=device)

    made = MaterializedWorld(
        world=world,
        sources=sources,
        canary_buf=tensor(buf, torch.uint8),
        violation_ring=tensor(ring, torch.int64).reshape(world.ring_capacity, 8),
        violation_write_index=tensor([world.ring_start], torch.int32),
        slot_run_counter=tensor([rng.integers(0, 1000)], torch.int64),
        kernel_run_counter=tensor([rng.integers(0, 1000)], torch.int64),
        enable_chain_position_assert=tensor([world.chain_assert], torch.int32),
    )
    made.log.append(f"made = materialize_world({world!r}, device)")
    return made


def apply_corruption(world: MaterializedWorld, corruption: Corruption) -> None:
    """Make ``corruption`` happen to ``world``'s live tensors."""
    world.log.append(f"apply_corruption(made, {corruption!r})")
    kind = corruption.kind
    if kind == "field":
        fields = world.canary_buf[corruption.slot, :32].view(torch.int64)
        mask = torch.tensor(1, dtype=torch.int64).bitwise_left_shift(corruption.bit)
        fields[corruption.field] ^= mask.to(fields.device)
    elif kind in ("kv_inside", "kv_outside"):
        world.sources[corruption.source].backing[corruption.offset] ^= corruption.value
    elif kind == "page_swap":
        tensor = world.sources[corruption.source].tensor
        a, b = tensor[corruption.slot].clone(), tensor[corruption.other].clone()
        tensor[corruption.slot].copy_(b)
        tensor[corruption.other].copy_(a)
    elif kind == "stale":
        world.canary_buf[corruption.slot, :32] = world.canary_buf[corruption.other, :32]
    else:
        raise ValueError(f"unknown corruption {kind!r}")
