"""Assertion helpers of the suite: exact integer comparisons that say what was called,
what came back, what the reference gives, for which configuration, and how to reproduce it.
"""

from __future__ import annotations

import numpy as np
import pytest


def hexu(value: int) -> str:
    """An int64 hash as its unsigned 64-bit hex, the way SPEC.md writes hashes."""
    return f"0x{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def to_numpy(tensor) -> np.ndarray:
    """A device tensor as a host numpy array (one transfer per result, never per element)."""
    return tensor.detach().cpu().numpy()


def fail(message: str, *, config: str = "", repro: str = "") -> None:
    __tracebackhide__ = True
    parts = [message]
    if config:
        parts.append(f"[{config}]")
    if repro:
        parts.append("Reproduce with:\n" + repro)
    pytest.fail("\n".join(parts), pytrace=False)


def assert_int64_equal(
    actual, expected: np.ndarray, *, call: str, config: str = "", repro: str = "", labels=None
) -> None:
    """``actual`` (a tensor) equals the int64 array ``expected`` exactly, dtype and shape included.

    ``labels[i]`` names entry ``i`` in the message (e.g. its slot); hashes print as u64 hex.
    """
    __tracebackhide__ = True
    got = to_numpy(actual)
    if got.dtype != np.int64 or got.shape != expected.shape:
        fail(
            f"{call} returned dtype {got.dtype} shape {got.shape}, "
            f"but the contract is int64 of shape {expected.shape}",
            config=config,
            repro=repro,
        )
    wrong = np.flatnonzero(got != expected)
    if wrong.size:
        i = int(wrong[0])
        name = f"entry {i}" if labels is None else f"entry {i} ({labels[i]})"
        fail(
            f"{call}: {name} = {hexu(got[i])}, but the reference gives {hexu(expected[i])} "
            f"({wrong.size} of {expected.size} entries differ)",
            config=config,
            repro=repro,
        )
    np.testing.assert_array_equal(got, expected, strict=True)
