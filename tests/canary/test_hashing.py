"""The Triton hash primitives reproduce the pinned values of CONTRACT §2 (the fingerprint vectors
are checked by conformance/test_spec_vectors.py against any implementation)."""

import numpy as np
import pytest
import torch

import canary
import reference
from canary import hashing

MASK64 = (1 << 64) - 1


def signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


SPLITMIX64_PINNED = [
    (0x1, 0x5692161D100B05E5),
    (0x9E3779B97F4A7C15, 0xE220A8397B1DCDAF),
    (0xFFFFFFFFFFFFFFFF, 0xB4D055FCF2CBBD7B),
    (0x8000000000000000, 0x25C26EA579CEA98A),
    (canary.CANARY_CHAIN_ANCHOR, 0xDE7FAE23A9A1B716),
    (0x0, 0x0),
]


def test_splitmix64_pinned_values():
    """splitmix64 on int64 bit patterns gives CONTRACT §2's pinned outputs."""
    inputs = torch.tensor([signed(x) for x, _ in SPLITMIX64_PINNED], dtype=torch.int64)
    got = [v & MASK64 for v in hashing.splitmix64(inputs).tolist()]
    assert got == [y for _, y in SPLITMIX64_PINNED]


def test_splitmix64_mix3_pinned_and_ordered():
    """mix3(1, 2, 3) and mix3(1, 3, 2) are CONTRACT §2's values, so argument order matters."""
    a = torch.tensor([1, 1, 7], dtype=torch.int64)
    b = torch.tensor([2, 3, 7], dtype=torch.int64)
    c = torch.tensor([3, 2, 7], dtype=torch.int64)
    got = [v & MASK64 for v in hashing.splitmix64_mix3(a, b, c).tolist()]
    assert got[:2] == [0xA55BDF37C08724B5, 0xE2771370E2E9D965]
    assert got[2] != 0, "equal inputs must not cancel"


def test_many_values_match_the_reference_across_programs():
    """300 distinct non-zero values, three kernel programs of 128 with the last one masked,
    hash exactly as the reference hashes them, each in its own place."""
    rng = np.random.default_rng(7)
    a, b, c = (rng.integers(1, 2**63 - 1, size=300, dtype=np.int64) for _ in range(3))
    got = hashing.splitmix64(torch.from_numpy(a)).numpy()
    np.testing.assert_array_equal(got, reference.to_signed64(reference.splitmix64(a)), strict=True)
    tensors = (torch.from_numpy(v) for v in (a, b, c))
    got = hashing.splitmix64_mix3(*tensors).numpy()
    want = reference.to_signed64(reference.splitmix64_mix3(a, b, c))
    np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.parametrize(
    "value",
    [[1, 2], np.array([1, 2]), torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1.0])],
    ids=["list", "numpy", "int32", "float"],
)
def test_inputs_must_be_int64_or_uint64_tensors(value):
    """Anything but an int64 or uint64 tensor is a TypeError naming the argument."""
    with pytest.raises(TypeError, match=r"^kv-canary: x must be an int64 or uint64 tensor"):
        hashing.splitmix64(value)
    good = torch.tensor([1, 2], dtype=torch.int64)
    with pytest.raises(TypeError, match=r"^kv-canary: c must be an int64 or uint64 tensor"):
        hashing.splitmix64_mix3(good, good, value)


@pytest.mark.parametrize(
    "sizes", [(4, 3, 3), (3, 4, 3), (3, 3, 4), (2, 3, 3), (3, 2, 3), (3, 3, 2)]
)
def test_mix3_needs_one_shape(sizes):
    """mix3 of a, b and c of different lengths, whichever differs, is a ValueError."""
    a, b, c = (torch.arange(1, n + 1, dtype=torch.int64) for n in sizes)
    with pytest.raises(
        ValueError, match=r"^kv-canary: splitmix64_mix3 needs a, b and c of one shape"
    ):
        hashing.splitmix64_mix3(a, b, c)
