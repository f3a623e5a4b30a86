"""The RealKvSource construction rules of CONTRACT §3, on a torch-free description of a source."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import SupportsInt, cast

import numpy as np

_PREFIX = "kv-canary: RealKvSource"


@dataclass(frozen=True)
class SourceDescription:
    """What ``RealKvSource(tensor=..., ...)`` would be given, described without torch.

    ``shape`` and ``strides`` are in elements (as ``torch.Tensor.stride()``), ``element_size``
    in bytes, ``dtype_str`` is ``str(tensor.dtype)``. The three layout values are the raw
    objects passed, so a wrong type (bool, float, None) can be described.
    """

    is_tensor: bool
    type_name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    element_size: int
    dtype_str: str
    data_ptr_mod16: int
    page_size: object
    num_bytes_per_token: object
    read_bytes: object


def validate_source(desc: SourceDescription) -> tuple[type[Exception], str] | None:
    """The exception type and exact message of the first broken CONTRACT §3 rule, or None."""
    # Rule 1.
    if not desc.is_tensor:
        return TypeError, f"{_PREFIX}.tensor must be a torch.Tensor, got {desc.type_name}"

    # Rule 2, fields in the order the contract lists them.
    for field in ("page_size", "num_bytes_per_token", "read_bytes"):
        value = getattr(desc, field)
        if not _is_integer(value):
            return TypeError, f"{_PREFIX}.{field} must be an int, got {type(value).__name__}"

    # From here on the values are known integers; Python ints print exactly like numpy
    # integers in f-strings and cannot overflow in the products below.
    page_size = int(cast(SupportsInt, desc.page_size))
    num_bytes_per_token = int(cast(SupportsInt, desc.num_bytes_per_token))
    read_bytes = int(cast(SupportsInt, desc.read_bytes))
    shape = tuple(int(n) for n in desc.shape)
    strides = tuple(int(n) for n in desc.strides)

    # Rule 3.
    if page_size < 1:
        return ValueError, f"{_PREFIX}.page_size must be >= 1, got {page_size}"

    # Rule 4.
    if num_bytes_per_token <= 0 or num_bytes_per_token % 16 != 0:
        return ValueError, (
            f"{_PREFIX}.num_bytes_per_token must be a positive multiple of 16, "
            f"got {num_bytes_per_token}"
        )

    # Rule 5.
    if read_bytes <= 0 or read_bytes % 16 != 0 or read_bytes > num_bytes_per_token:
        return ValueError, (
            f"{_PREFIX}.read_bytes must be a positive multiple of 16 in "
            f"(0, num_bytes_per_token={num_bytes_per_token}], got {read_bytes}"
        )

    # Rule 6.
    if len(shape) < 2:
        return ValueError, f"{_PREFIX}.tensor must be at least 2-D, got shape {shape}"

    # Rule 7.
    row_stride_bytes = strides[0] * desc.element_size
    if row_stride_bytes % 16 != 0:
        return ValueError, (
            f"{_PREFIX}.tensor row stride must be a multiple of 16 bytes, got "
            f"{row_stride_bytes} bytes (shape={shape}, strides={strides}, "
            f"dtype={desc.dtype_str})"
        )

    # Rule 8.
    if not _rows_are_dense(shape, strides):
        return ValueError, (
            f"{_PREFIX}.tensor rows must be contiguous, got shape {shape} with strides {strides}"
        )

    # Rule 9.
    row_bytes = math.prod(shape[1:]) * desc.element_size
    layout_bytes = page_size * num_bytes_per_token
    if row_bytes < layout_bytes:
        return ValueError, (
            f"{_PREFIX}.tensor row is {row_bytes} bytes wide but page_size={page_size} x "
            f"num_bytes_per_token={num_bytes_per_token} needs {layout_bytes} "
            f"(shape={shape}, dtype={desc.dtype_str})"
        )

    # Rule 10.
    if desc.data_ptr_mod16 % 16 != 0:
        return ValueError, (
            f"{_PREFIX}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == "
            f"{desc.data_ptr_mod16}"
        )

    return None


def _is_integer(value: object) -> bool:
    # bool is an int subclass in Python but a config flag, never a size.
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, np.integer))


def _rows_are_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Dims 1.. are row-major contiguous; size-1 dims may carry any stride."""
    row_dims = shape[1:]
    if any(n == 0 for n in row_dims):
        # A row with no elements has no layout to get wrong.
        return True
    for dim in range(1, len(shape)):
        if shape[dim] != 1 and strides[dim] != math.prod(shape[dim + 1 :]):
            return False
    return True
