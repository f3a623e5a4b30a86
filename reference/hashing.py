"""Hash primitives (CONTRACT §2): the splitmix64 finalizer and its three-input mix.

Every function has two paths that give the same bits: plain Python ints (any sign, taken
modulo 2**64, result in [0, 2**64)) and numpy integer arrays (result uint64). The array path
stays on uint64 *arrays* throughout: numpy uint64 scalars warn on overflow and mixing uint64
with int64 promotes to float64, either of which would silently corrupt a hash.
"""

from __future__ import annotations

from typing import Final, overload

import numpy as np

U64_MASK: Final[int] = (1 << 64) - 1
_I64_SIGN_BIT: Final[int] = 1 << 63

_MUL_1: Final[int] = 0xBF58476D1CE4E5B9
_MUL_2: Final[int] = 0x94D049BB133111EB

_MUL_1_U64: Final = np.uint64(_MUL_1)
_MUL_2_U64: Final = np.uint64(_MUL_2)
_SHIFT_30: Final = np.uint64(30)
_SHIFT_27: Final = np.uint64(27)
_SHIFT_31: Final = np.uint64(31)


def to_unsigned64(value):
    """Reinterpret a signed 64-bit value as unsigned: -1 -> 2**64 - 1.

    Python ints (and numpy integer scalars) give a Python int in [0, 2**64); integer arrays
    give a uint64 array.
    """
    if isinstance(value, np.ndarray):
        return _as_u64_array(value)
    return _as_int(value) & U64_MASK


def to_signed64(value):
    """Reinterpret an unsigned 64-bit value as signed int64: 2**64 - 1 -> -1.

    Python ints (and numpy integer scalars) give a Python int in [-2**63, 2**63); integer
    arrays give an int64 array.
    """
    if isinstance(value, np.ndarray):
        return _as_u64_array(value).view(np.int64)
    unsigned = (value if type(value) is int else _as_int(value)) & U64_MASK
    return unsigned - (1 << 64) if unsigned & _I64_SIGN_BIT else unsigned


@overload
def splitmix64(x: int) -> int: ...
@overload
def splitmix64(x: np.ndarray) -> np.ndarray: ...
def splitmix64(x):
    """The splitmix64 finalizer (no golden-gamma increment); ``splitmix64(0) == 0``."""
    if isinstance(x, np.ndarray):
        return _splitmix64_array(_as_u64_array(x))
    return _splitmix64_int(_as_int(x) & U64_MASK)


@overload
def splitmix64_mix3(a: int, b: int, c: int) -> int: ...
# any array argument gives an array: one overload per position of the first array
@overload
def splitmix64_mix3(a: np.ndarray, b: int | np.ndarray, c: int | np.ndarray) -> np.ndarray: ...
@overload
def splitmix64_mix3(a: int, b: np.ndarray, c: int | np.ndarray) -> np.ndarray: ...
@overload
def splitmix64_mix3(a: int, b: int, c: np.ndarray) -> np.ndarray: ...
def splitmix64_mix3(a, b, c):
    """``sm(sm(sm(a) ^ b) ^ c)``: order-sensitive, and equal inputs do not cancel.

    Any array argument selects the array path (the others broadcast against it).
    """
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) or isinstance(c, np.ndarray):
        a_u64, b_u64, c_u64 = (_as_u64_array(v) for v in (a, b, c))
        return _splitmix64_array(_splitmix64_array(_splitmix64_array(a_u64) ^ b_u64) ^ c_u64)
    # the chain runs this once per slot: plain ints skip the checks of _as_int
    if type(a) is int and type(b) is int and type(c) is int:
        a_int, b_int, c_int = a & U64_MASK, b & U64_MASK, c & U64_MASK
    else:
        a_int, b_int, c_int = (_as_int(v) & U64_MASK for v in (a, b, c))
    return _splitmix64_int(_splitmix64_int(_splitmix64_int(a_int) ^ b_int) ^ c_int)


def _splitmix64_int(x: int) -> int:
    x ^= x >> 30
    x = (x * _MUL_1) & U64_MASK
    x ^= x >> 27
    x = (x * _MUL_2) & U64_MASK
    return x ^ (x >> 31)


def splitmix64_inplace(x: np.ndarray, scratch: np.ndarray) -> None:
    """``x[:] = splitmix64(x)`` for a uint64 array, using ``scratch`` (same shape) for the shifts.

    The same steps as :func:`splitmix64`, without temporaries: the fingerprint's fold runs it
    once per word of every slot.
    """
    np.right_shift(x, _SHIFT_30, out=scratch)
    x ^= scratch
    x *= _MUL_1_U64  # uint64 arrays wrap silently, as the hash needs
    np.right_shift(x, _SHIFT_27, out=scratch)
    x ^= scratch
    x *= _MUL_2_U64
    np.right_shift(x, _SHIFT_31, out=scratch)
    x ^= scratch


def _splitmix64_array(x: np.ndarray) -> np.ndarray:
    # Shifts on uint64 are logical, which is what the finalizer needs; a signed dtype here
    # would shift arithmetically and give a different hash for every negative input.
    with np.errstate(over="ignore"):
        x = x ^ (x >> _SHIFT_30)
        x = x * _MUL_1_U64
        x = x ^ (x >> _SHIFT_27)
        x = x * _MUL_2_U64
        x = x ^ (x >> _SHIFT_31)
    # A 0-d input comes back from numpy arithmetic as a scalar.
    return np.asarray(x, dtype=np.uint64)


def _as_int(value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return int(value)


def _as_u64_array(value) -> np.ndarray:
    """A fresh uint64 array holding ``value`` modulo 2**64 (two's complement for signed)."""
    if not isinstance(value, np.ndarray):
        return np.asarray(_as_int(value) & U64_MASK, dtype=np.uint64)
    if value.dtype.kind == "u":
        return value.astype(np.uint64, copy=True)
    if value.dtype.kind == "i":
        # Widening to int64 sign-extends, so the uint64 view is the two's complement.
        return value.astype(np.int64, copy=True).view(np.uint64)
    raise TypeError(f"expected an integer array, got dtype {value.dtype}")
