"""Tensor operations behind ``canary_torch``: hashing, byte windows, the violation ring.

Everything here is plain torch on whatever device the tensors live on. Hash state is kept in
int64 tensors holding u64 bit patterns: multiplication and xor wrap mod 2**64 exactly as in
u64, but ``>>`` on int64 is arithmetic, so every right shift is masked to make it logical.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from ._contract import (
    CANARY_CHAIN_ANCHOR,
    PARTIAL_WINDOW_BYTES,
    RealKvHashMode,
    RealKvSource,
)

_WORD_BYTES = 8


def as_int64_bits(value: int) -> int:
    """The signed int64 with the same bit pattern as the u64 ``value`` (torch has no u64 math)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_MULTIPLIER_1 = as_int64_bits(0xBF58476D1CE4E5B9)
_MULTIPLIER_2 = as_int64_bits(0x94D049BB133111EB)


def _xor_logical_shift(x: torch.Tensor, shift: int) -> torch.Tensor:
    """``x ^ (x >>> shift)`` with a logical shift; ``x`` is left untouched."""
    shifted = x >> shift
    # The arithmetic shift copies the sign bit into the top `shift` bits; clear them.
    shifted &= (1 << (64 - shift)) - 1
    shifted ^= x
    return shifted


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finalizer of every element of an int64 tensor (u64 bit patterns)."""
    x = _xor_logical_shift(x, 30)
    x *= _MULTIPLIER_1
    x = _xor_logical_shift(x, 27)
    x *= _MULTIPLIER_2
    return _xor_logical_shift(x, 31)


def splitmix64_mix3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)``, element-wise on int64 tensors."""
    h = splitmix64(a)
    h ^= b
    h = splitmix64(h)
    h ^= c
    return splitmix64(h)


_U64 = (1 << 64) - 1


def splitmix64_int(x: int) -> int:
    """splitmix64 of a Python int taken mod 2**64, as an unsigned Python int.

    For chains too narrow to vectorise: one Python step costs far less than a tensor op.
    """
    x &= _U64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _U64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def splitmix64_mix3_int(a: int, b: int, c: int) -> int:
    return splitmix64_int(splitmix64_int(splitmix64_int(a) ^ (b & _U64)) ^ (c & _U64))


ANCHOR_HASH = as_int64_bits(
    int(splitmix64(torch.tensor([as_int64_bits(CANARY_CHAIN_ANCHOR)], dtype=torch.int64)))
)


def _flat_storage(source: RealKvSource, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` over the whole storage behind the source, sharing its memory."""
    tensor = source.tensor
    storage = tensor.untyped_storage()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    # Exactly the storage's own extent, so that as_strided below refuses (rather than set_
    # silently growing the storage) any window that would run past it.
    flat = torch.empty(0, dtype=dtype, device=tensor.device)
    return flat.set_(storage, 0, (storage.nbytes() // itemsize,), (1,))


def _use_word_gather(source: RealKvSource) -> bool:
    # int64 loads need 8-byte aligned addresses on GPUs, and an int64 load is a
    # little-endian word only on a little-endian host.
    storage_address = source.tensor.untyped_storage().data_ptr()
    return sys.byteorder == "little" and storage_address % _WORD_BYTES == 0


def read_words(
    source: RealKvSource, slots: torch.Tensor, read_bytes: int, *, bytewise: bool | None = None
) -> torch.Tensor:
    """The read window of every slot as little-endian u64 words: int64 ``[read_bytes // 8, n]``.

    Only the window's bytes are gathered: a strided view over the source's storage exposes
    ``[word, row, slot in page]`` through the tensor's own storage offset and row stride, and
    advanced indexing picks the slots out of it. The source is never copied or made
    contiguous, so the hash always follows the live memory.
    """
    tensor = source.tensor
    page_size = int(source.page_size)
    num_bytes_per_token = int(source.num_bytes_per_token)
    row_stride_bytes = tensor.stride(0) * tensor.element_size()
    base_bytes = tensor.storage_offset() * tensor.element_size()
    rows = torch.div(slots, page_size, rounding_mode="floor")
    slots_in_page = slots - rows * page_size
    if bytewise is None:
        bytewise = not _use_word_gather(source)
    if not bytewise:
        # Every term is a multiple of 8: the row stride, the slot size and the view's own
        # offset are multiples of 16 (RealKvSource rules 4, 7 and 10).
        view = torch.as_strided(
            _flat_storage(source, torch.int64),
            (read_bytes // _WORD_BYTES, tensor.shape[0], page_size),
            (1, row_stride_bytes // _WORD_BYTES, num_bytes_per_token // _WORD_BYTES),
            base_bytes // _WORD_BYTES,
        )
        return view[:, rows, slots_in_page]
    view = torch.as_strided(
        _flat_storage(source, torch.uint8),
        (read_bytes // _WORD_BYTES, _WORD_BYTES, tensor.shape[0], page_size),
        (_WORD_BYTES, 1, row_stride_bytes, num_bytes_per_token),
        base_bytes,
    )
    window = view[:, :, rows, slots_in_page].to(torch.int64)  # [word, byte, n]
    shifts = torch.arange(0, 64, 8, dtype=torch.int64, device=window.device).view(1, -1, 1)
    # The bytes of a word occupy disjoint bits, so their sum is their bitwise or.
    return (window << shifts).sum(dim=1)


def fold_words(words: torch.Tensor) -> torch.Tensor:
    """``acc = 0; for w: acc = splitmix64(acc ^ w)`` over dim 0 of ``[num_words, n]``."""
    acc = torch.zeros(words.shape[1], dtype=torch.int64, device=words.device)
    for word in words:
        acc ^= word
        acc = splitmix64(acc)
    return acc


def fingerprint_slots(
    sources: Sequence[RealKvSource], slots: torch.Tensor, mode: RealKvHashMode
) -> torch.Tensor:
    """CONTRACT §4's hash of every slot in the int64 tensor ``slots``, already bounds-checked."""
    result = torch.zeros(slots.numel(), dtype=torch.int64, device=slots.device)
    if mode == RealKvHashMode.NONE or not sources or slots.numel() == 0:
        return result
    for source in sources:
        read_bytes = PARTIAL_WINDOW_BYTES if mode == RealKvHashMode.PARTIAL else source.read_bytes
        result ^= fold_words(read_words(source, slots, int(read_bytes)))
        result = splitmix64(result)
    return result


def append_violations(ring: torch.Tensor, write_index: torch.Tensor, rows: torch.Tensor) -> None:
    """Append ``rows`` (int64 ``[n, 8]``, in order) to the fill-once ring.

    Row ``k`` takes index ``write_index + k`` and is stored only if that index is inside the
    ring; the int32 index advances by ``n`` regardless, so the host can see how many rows
    were lost, and a stored row is never overwritten.
    """
    count = rows.shape[0]
    if count == 0:
        return
    # int32 arithmetic, so that an index that wraps does so as the device's atomic add would.
    indices = write_index + torch.arange(count, dtype=torch.int32, device=write_index.device)
    fits = (indices >= 0) & (indices < ring.shape[0])
    ring[indices[fits].to(torch.int64)] = rows[fits]
    write_index += count
