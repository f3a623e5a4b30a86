"""RealKvSource: where the real KV bytes of a slot live, validated at construction (CONTRACT §3)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np
import torch

_PREFIX = "kv-canary: RealKvSource"


def is_int(value: object) -> TypeGuard[int | np.integer]:
    """Whether ``value`` is an integer as the contract accepts one (CONTRACT §11): a Python
    ``int`` or a numpy integer, never a ``bool``."""
    # bool is an int subclass, and numpy bools are not np.integer; both are refused.
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _rows_are_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    if any(size == 0 for size in shape[1:]):
        return True  # an empty row has no layout to break
    expected = 1
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class RealKvSource:
    """One tensor whose rows hold the real KV bytes of ``page_size`` slots each.

    Slot ``s`` is read at row ``s // page_size``, byte ``(s % page_size) * num_bytes_per_token``
    of that row, through the tensor's own row stride: the canary reads the live memory.
    """

    tensor: torch.Tensor
    page_size: int
    num_bytes_per_token: int
    read_bytes: int

    def __post_init__(self) -> None:
        tensor = self.tensor
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{_PREFIX}.tensor must be a torch.Tensor, got {type(tensor).__name__}")
        for field in ("page_size", "num_bytes_per_token", "read_bytes"):
            value = getattr(self, field)
            if not is_int(value):
                raise TypeError(f"{_PREFIX}.{field} must be an int, got {type(value).__name__}")
        # numpy integers are valid values, but their arithmetic wraps at their own width
        page_size = int(self.page_size)
        num_bytes_per_token = int(self.num_bytes_per_token)
        read_bytes = int(self.read_bytes)
        if page_size < 1:
            raise ValueError(f"{_PREFIX}.page_size must be >= 1, got {page_size}")
        if num_bytes_per_token <= 0 or num_bytes_per_token % 16 != 0:
            raise ValueError(
                f"{_PREFIX}.num_bytes_per_token must be a positive multiple of 16, "
                f"got {num_bytes_per_token}"
            )
        if read_bytes <= 0 or read_bytes % 16 != 0 or read_bytes > num_bytes_per_token:
            raise ValueError(
                f"{_PREFIX}.read_bytes must be a positive multiple of 16 in "
                f"(0, num_bytes_per_token={num_bytes_per_token}], got {read_bytes}"
            )
        shape = tuple(tensor.shape)
        if tensor.ndim < 2:
            raise ValueError(f"{_PREFIX}.tensor must be at least 2-D, got shape {shape}")
        strides = tuple(tensor.stride())
        element_size = tensor.element_size()
        row_stride_bytes = strides[0] * element_size
        if row_stride_bytes % 16 != 0:
            raise ValueError(
                f"{_PREFIX}.tensor row stride must be a multiple of 16 bytes, got "
                f"{row_stride_bytes} bytes (shape={shape}, strides={strides}, dtype={tensor.dtype})"
            )
        if not _rows_are_dense(shape, strides):
            raise ValueError(
                f"{_PREFIX}.tensor rows must be contiguous, got shape {shape} with strides {strides}"
            )
        row_bytes = math.prod(shape[1:]) * element_size
        needed = page_size * num_bytes_per_token
        if row_bytes < needed:
            raise ValueError(
                f"{_PREFIX}.tensor row is {row_bytes} bytes wide but page_size={page_size} x "
                f"num_bytes_per_token={num_bytes_per_token} needs {needed} "
                f"(shape={shape}, dtype={tensor.dtype})"
            )
        misalignment = tensor.data_ptr() % 16
        if misalignment != 0:
            raise ValueError(
                f"{_PREFIX}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == "
                f"{misalignment}"
            )

    @property
    def row_stride_bytes(self) -> int:
        return self.tensor.stride(0) * self.tensor.element_size()

    @property
    def num_rows(self) -> int:
        return self.tensor.shape[0]

    @property
    def capacity(self) -> int:
        """Number of slots this source can address: ``rows * page_size``."""
        return self.tensor.shape[0] * int(self.page_size)
