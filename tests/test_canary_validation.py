"""canary.RealKvSource raises SPEC §3's exception and message for each rule, first rule first."""

import numpy as np
import pytest
import torch

import canary


def aligned(nbytes: int, offset: int = 0) -> torch.Tensor:
    """A uint8 buffer whose element ``offset`` sits at a 16-byte-aligned address plus ``offset``."""
    raw = torch.zeros(nbytes + 32, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 16
    return raw[start + offset : start + offset + nbytes]


GOOD = dict(page_size=2, num_bytes_per_token=32, read_bytes=16)
P = "kv-canary: RealKvSource"

CASES = [
    # (id, tensor factory, overrides, exception, message)
    (
        "tensor=ndarray",
        lambda: np.zeros((2, 64), np.uint8),
        {},
        TypeError,
        f"{P}.tensor must be a torch.Tensor, got ndarray",
    ),
    (
        "tensor=None",
        lambda: None,
        {},
        TypeError,
        f"{P}.tensor must be a torch.Tensor, got NoneType",
    ),
    (
        "page_size=2.0",
        lambda: aligned(128).view(2, 64),
        {"page_size": 2.0},
        TypeError,
        f"{P}.page_size must be an int, got float",
    ),
    (
        "page_size=True",
        lambda: aligned(128).view(2, 64),
        {"page_size": True},
        TypeError,
        f"{P}.page_size must be an int, got bool",
    ),
    (
        "num_bytes_per_token='32'",
        lambda: aligned(128).view(2, 64),
        {"num_bytes_per_token": "32"},
        TypeError,
        f"{P}.num_bytes_per_token must be an int, got str",
    ),
    (
        "read_bytes=None",
        lambda: aligned(128).view(2, 64),
        {"read_bytes": None},
        TypeError,
        f"{P}.read_bytes must be an int, got NoneType",
    ),
    (
        "page_size=0",
        lambda: aligned(128).view(2, 64),
        {"page_size": 0},
        ValueError,
        f"{P}.page_size must be >= 1, got 0",
    ),
    (
        "page_size=-3",
        lambda: aligned(128).view(2, 64),
        {"page_size": -3},
        ValueError,
        f"{P}.page_size must be >= 1, got -3",
    ),
    (
        "num_bytes_per_token=24",
        lambda: aligned(128).view(2, 64),
        {"num_bytes_per_token": 24},
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got 24",
    ),
    (
        "num_bytes_per_token=0",
        lambda: aligned(128).view(2, 64),
        {"num_bytes_per_token": 0},
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got 0",
    ),
    (
        "read_bytes=48",
        lambda: aligned(128).view(2, 64),
        {"read_bytes": 48},
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=32], got 48",
    ),
    (
        "read_bytes=8",
        lambda: aligned(128).view(2, 64),
        {"read_bytes": 8},
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=32], got 8",
    ),
    (
        "tensor 1-D",
        lambda: aligned(128),
        {},
        ValueError,
        f"{P}.tensor must be at least 2-D, got shape (128,)",
    ),
    (
        "tensor 0-D",
        lambda: torch.tensor(3),
        {},
        ValueError,
        f"{P}.tensor must be at least 2-D, got shape ()",
    ),
    (
        "row stride 72 bytes",
        lambda: aligned(144).view(2, 72),
        {},
        ValueError,
        f"{P}.tensor row stride must be a multiple of 16 bytes, got 72 bytes "
        "(shape=(2, 72), strides=(72, 1), dtype=torch.uint8)",
    ),
    (
        "rows not contiguous",
        lambda: aligned(256).view(2, 64, 2)[:, :, 0],
        {},
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 64) with strides (128, 2)",
    ),
    (
        "row too narrow",
        lambda: aligned(96).view(2, 48),
        {},
        ValueError,
        f"{P} row is too narrow for its slot layout: dim-1 is 48 bytes but "
        "page_size=2 x num_bytes_per_token=32 needs 64",
    ),
    (
        "data_ptr % 16 == 4",
        lambda: aligned(128, offset=4).view(torch.int32).view(2, 16),
        {},
        ValueError,
        f"{P}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == 4",
    ),
    # several rules broken at once: the first in SPEC order wins
    (
        "page_size=0 and read_bytes=8",
        lambda: aligned(128).view(2, 64),
        {"page_size": 0, "read_bytes": 8},
        ValueError,
        f"{P}.page_size must be >= 1, got 0",
    ),
    (
        "1-D tensor and page_size=0.5",
        lambda: aligned(128),
        {"page_size": 0.5},
        TypeError,
        f"{P}.page_size must be an int, got float",
    ),
    (
        "narrow row and misaligned",
        lambda: aligned(64, offset=1).view(2, 32),
        {},
        ValueError,
        f"{P} row is too narrow for its slot layout: dim-1 is 32 bytes but "
        "page_size=2 x num_bytes_per_token=32 needs 64",
    ),
]


@pytest.mark.parametrize(
    ("make", "overrides", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_invalid_source_raises_spec_error(make, overrides, error, message):
    """Each broken rule raises exactly SPEC §3's exception type and message."""
    with pytest.raises(Exception) as caught:
        canary.RealKvSource(tensor=make(), **{**GOOD, **overrides})
    assert type(caught.value) is error
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "make",
    [
        lambda: aligned(128).view(2, 64),
        lambda: aligned(256).view(torch.float16).view(2, 4, 16),  # N-D rows
        lambda: aligned(512).view(2, 256)[:, :64],  # row gap: stride(0) > row
        lambda: aligned(256, offset=16).view(2, 128),  # storage offset
        lambda: aligned(0).view(0, 64),  # no rows
    ],
    ids=["plain", "N-D rows", "row gap", "storage offset", "zero rows"],
)
def test_valid_source_is_accepted(make):
    """Valid layouts (N-D rows, row gaps, offsets, no rows, numpy ints) construct and keep their fields."""
    tensor = make()
    source = canary.RealKvSource(
        tensor=tensor, page_size=np.int64(2), num_bytes_per_token=32, read_bytes=16
    )
    assert source.tensor is tensor
    assert source.page_size == 2


def test_source_is_frozen_and_keyword_only():
    """RealKvSource is frozen and keyword-only."""
    source = canary.RealKvSource(tensor=aligned(128).view(2, 64), **GOOD)
    with pytest.raises(AttributeError):
        source.page_size = 4
    with pytest.raises(TypeError):
        canary.RealKvSource(aligned(128).view(2, 64), 2, 32, 16)
