"""The hash primitives of CONTRACT §2, run by the same Triton code the kernels use."""

from __future__ import annotations

import torch
import triton

from ._runtime import launch_kernel

_BLOCK = 128


def _as_int64(name: str, values: torch.Tensor) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) or values.dtype not in (torch.int64, torch.uint64):
        raise TypeError(f"kv-canary: {name} must be an int64 or uint64 tensor")
    return values.view(torch.int64).contiguous()


def _launch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, mix3: bool) -> torch.Tensor:
    out = torch.empty_like(a)
    if a.numel():
        grid = (triton.cdiv(a.numel(), _BLOCK),)
        launch_kernel(
            a.device, "hash_kernel", grid, out, a, b, c, a.numel(), MIX3=mix3, BLOCK=_BLOCK
        )
    return out


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer of every element (int64 bit patterns in, int64 bit patterns out)."""
    x = _as_int64("x", x).reshape(-1)
    return _launch(x, x, x, mix3=False)


def splitmix64_mix3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)`` element-wise; inputs of one shape."""
    a, b, c = (_as_int64(n, t).reshape(-1) for n, t in (("a", a), ("b", b), ("c", c)))
    if not (a.shape == b.shape == c.shape):
        raise ValueError("kv-canary: splitmix64_mix3 needs a, b and c of one shape")
    return _launch(a, b, c, mix3=True)
