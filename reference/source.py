"""Where a slot's real KV bytes are (CONTRACT §3) and their fingerprint (CONTRACT §4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reference.constants import MAX_REAL_KV_SOURCES, PARTIAL_READ_BYTES, RealKvHashMode
from reference.hashing import splitmix64_inplace


@dataclass(frozen=True)
class Source:
    """The bytes of one real-KV source, as numpy sees them.

    ``data[r]`` is the bytes of row ``r``. It may be a strided view over a larger backing
    buffer (e.g. ``np.lib.stride_tricks.as_strided``) so that the gap between rows is never
    part of the view and the fingerprint follows the live memory. Slot ``s`` lives in row
    ``s // page_size`` at byte ``(s % page_size) * num_bytes_per_token``.

    The CONTRACT §3 torch-level rules (and their messages) live in ``validate_source``; the checks
    here only keep the oracle from producing a meaningless hash.
    """

    data: np.ndarray
    page_size: int
    num_bytes_per_token: int
    read_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.data, np.ndarray) or self.data.dtype != np.uint8:
            raise TypeError("reference.Source.data must be a numpy uint8 array")
        if self.data.ndim != 2:
            raise ValueError(f"reference.Source.data must be 2-D, got shape {self.data.shape}")
        for name in ("page_size", "num_bytes_per_token", "read_bytes"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"reference.Source.{name} must be an int, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.page_size < 1:
            raise ValueError(f"reference.Source.page_size must be >= 1, got {self.page_size}")
        if self.num_bytes_per_token < 1 or self.num_bytes_per_token % 16:
            raise ValueError(
                "reference.Source.num_bytes_per_token must be a positive multiple of 16, "
                f"got {self.num_bytes_per_token}"
            )
        if not 0 < self.read_bytes <= self.num_bytes_per_token or self.read_bytes % 16:
            raise ValueError(
                "reference.Source.read_bytes must be a positive multiple of 16 <= "
                f"num_bytes_per_token, got {self.read_bytes}"
            )
        layout_bytes = self.page_size * self.num_bytes_per_token
        if self.data.shape[1] < layout_bytes:
            raise ValueError(
                f"reference.Source row is {self.data.shape[1]} bytes but page_size="
                f"{self.page_size} x num_bytes_per_token={self.num_bytes_per_token} "
                f"needs {layout_bytes}"
            )

    @property
    def capacity(self) -> int:
        """Number of addressable slots: ``rows * page_size``."""
        rows: int = self.data.shape[0]
        return rows * self.page_size


def fingerprint(
    sources: Sequence[Source],
    slot_indices,
    mode: RealKvHashMode | int = RealKvHashMode.ALL,
) -> np.ndarray:
    """The real-KV hash of each slot, as int64 (CONTRACT §4).

    Per source, the slot's read window is folded as little-endian u64 words
    (``acc = splitmix64(acc ^ word)`` from ``acc = 0``); the per-source folds are combined in
    order with the same step. Mode NONE or no sources gives zeros and reads no byte.
    """
    sources = tuple(sources)
    if len(sources) > MAX_REAL_KV_SOURCES:
        raise ValueError(
            f"kv-canary: at most {MAX_REAL_KV_SOURCES} RealKvSource entries supported by the "
            f"CUDA ABI, got {len(sources)}"
        )
    mode = RealKvHashMode(int(mode))
    slots = _as_slot_array(slot_indices)
    if mode is RealKvHashMode.NONE or not sources:
        return np.zeros(slots.shape[0], dtype=np.int64)

    read_bytes_by_source = [
        PARTIAL_READ_BYTES if mode is RealKvHashMode.PARTIAL else src.read_bytes for src in sources
    ]
    # Every slot is checked against every source before any byte is read.
    for source_index, src in enumerate(sources):
        _check_slots_in_range(slots, src, source_index)
    # Only now is the cast safe: a uint64 slot above 2**63 would have wrapped negative.
    slots = slots.astype(np.int64, copy=False)

    combined = np.zeros(slots.shape[0], dtype=np.uint64)
    scratch = np.empty_like(combined)
    for src, read_bytes in zip(sources, read_bytes_by_source, strict=True):
        combined ^= _fold_source(src, slots, read_bytes)
        splitmix64_inplace(combined, scratch)
    return combined.view(np.int64)


def _as_slot_array(slot_indices) -> np.ndarray:
    """The slots as a 1-D integer array of their original dtype (range-checked later)."""
    slots = np.asarray(slot_indices)
    if slots.ndim != 1:
        raise ValueError(f"kv-canary: slot_indices must be 1-D, got shape {slots.shape}")
    if slots.size == 0:
        # An empty list arrives as float64; there is nothing to misread.
        return slots.astype(np.int64)
    if slots.dtype.kind not in "iu":
        raise TypeError(f"kv-canary: slot_indices must be integers, got dtype {slots.dtype}")
    return slots


def _check_slots_in_range(slots: np.ndarray, src: Source, source_index: int) -> None:
    if slots.size == 0 or (slots.min() >= 0 and slots.max() < src.capacity):
        return  # two reductions; the mask below only to name the first bad slot
    out_of_range = (slots < 0) | (slots >= src.capacity)
    if out_of_range.any():
        bad = int(slots[np.argmax(out_of_range)])
        raise IndexError(
            f"kv-canary: slot {bad} is out of range for real_kv_sources[{source_index}] "
            f"with capacity {src.capacity} slots"
        )


def _fold_source(src: Source, slots: np.ndarray, read_bytes: int) -> np.ndarray:
    """Fold each slot's ``read_bytes`` window of ``src`` into one uint64 per slot."""
    data = src.data
    row_stride, byte_stride = data.strides
    # The read windows of every slot, as a view: [row, slot in page, byte of the window].
    # Holes, row gaps and bytes past read_bytes are not part of it, so they are never read.
    windows = np.lib.stride_tricks.as_strided(
        data,
        shape=(data.shape[0], src.page_size, read_bytes),
        strides=(row_stride, src.num_bytes_per_token * byte_stride, byte_stride),
        writeable=False,
    )
    rows, tokens = np.divmod(slots, src.page_size)
    if byte_stride == 1:
        # Little-endian u64 words on any host, gathered straight into [word, slot]: one copy
        # of the windows, each word of every slot contiguous for the fold below.
        words = windows.view("<u8").transpose(2, 0, 1)[:, rows, tokens]
    else:
        gathered = windows[rows, tokens]  # [num_slots, read_bytes]: a copy of the windows only
        words = np.ascontiguousarray(gathered).view("<u8").T
    words = words.astype(np.uint64, copy=False)
    acc = np.zeros(slots.shape[0], dtype=np.uint64)
    scratch = np.empty_like(acc)
    for word in words:
        acc ^= word
        splitmix64_inplace(acc, scratch)
    return acc
