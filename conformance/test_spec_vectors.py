"""The fingerprint vectors pinned in CONTRACT §2, through the implementation under test."""

import pytest
import torch

import reference
from conformance.assertions import hexu

VECTORS = [
    # (id, one bytes string per source, mode, expected u64)
    (
        "one source, 16 bytes, PARTIAL",
        [bytes.fromhex("01020408102040808182848890A0C0FF")],
        1,
        0x6041580849E6407D,
    ),
    (
        "one source, 16 bytes, ALL",
        [bytes.fromhex("01020408102040808182848890A0C0FF")],
        2,
        0x6041580849E6407D,
    ),
    ("one source, 00..1F, ALL", [bytes(range(32))], 2, 0xB44181DFE9420039),
    ("one source, 00..1F, PARTIAL", [bytes(range(32))], 1, 0xD6D75024DFD6C30C),
    (
        "two sources, 00..0F then 10..1F, ALL",
        [bytes(range(16)), bytes(range(16, 32))],
        2,
        0xB6209A488C3F52B0,
    ),
]


def aligned_row(data: bytes, device) -> torch.Tensor:
    """``data`` as a ``[1, len]`` uint8 tensor at a 16-byte-aligned address."""
    raw = torch.zeros(len(data) + 16, dtype=torch.uint8, device=device)
    start = (-raw.data_ptr()) % 16
    row = raw[start : start + len(data)].view(1, len(data))
    row.copy_(torch.tensor(list(data), dtype=torch.uint8).view(1, -1))
    return row


@pytest.mark.parametrize(
    ("sources", "mode", "expected"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS]
)
def test_spec_fingerprint_vectors(impl, device, sources, mode, expected):
    """fingerprint reproduces every fingerprint vector pinned in CONTRACT §2."""
    built = [
        impl.RealKvSource(
            tensor=aligned_row(data, device),
            page_size=1,
            num_bytes_per_token=len(data),
            read_bytes=len(data),
        )
        for data in sources
    ]
    got = impl.fingerprint(built, torch.zeros(1, dtype=torch.int64, device=device), mode=mode)
    assert got.dtype == torch.int64
    assert hexu(got.item()) == hexu(expected), f"CONTRACT §2 gives {hexu(expected)}"


@pytest.mark.parametrize("name", ["RealKvHashMode", "CanaryLaunchTag"])
def test_enums_are_the_contracts(impl, name):
    """The protocol's enums have exactly CONTRACT §1's members, by name and value."""
    # __members__, not iteration: iteration skips a member whose value repeats another's
    got = {key: int(member) for key, member in getattr(impl, name).__members__.items()}
    want = {key: int(member) for key, member in getattr(reference, name).__members__.items()}
    assert got == want


@pytest.mark.plan
def test_plan_constant_is_the_contracts(impl):
    """REQ_POOL_IDX_PADDING is CONTRACT §14's constant: the int 0, the pool row of a padding row."""
    got, want = impl.REQ_POOL_IDX_PADDING, reference.REQ_POOL_IDX_PADDING
    # an int by type: a bool or None compares or hashes like one in places, and is no row index
    assert type(got) is int and got == want, (
        f"REQ_POOL_IDX_PADDING is {got!r} ({type(got).__name__}); CONTRACT §14 gives the int {want}"
    )
