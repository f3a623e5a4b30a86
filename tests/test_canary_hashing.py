"""The Triton hash primitives and the fingerprint reproduce every pinned value of SPEC §2."""

import pytest
import torch

import canary
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
    """splitmix64 on int64 bit patterns gives SPEC §2's pinned outputs."""
    inputs = torch.tensor([signed(x) for x, _ in SPLITMIX64_PINNED], dtype=torch.int64)
    got = [v & MASK64 for v in hashing.splitmix64(inputs).tolist()]
    assert got == [y for _, y in SPLITMIX64_PINNED]


def test_splitmix64_mix3_pinned_and_ordered():
    """mix3(1, 2, 3) and mix3(1, 3, 2) are SPEC §2's values, so argument order matters."""
    a = torch.tensor([1, 1, 7], dtype=torch.int64)
    b = torch.tensor([2, 3, 7], dtype=torch.int64)
    c = torch.tensor([3, 2, 7], dtype=torch.int64)
    got = [v & MASK64 for v in hashing.splitmix64_mix3(a, b, c).tolist()]
    assert got[:2] == [0xA55BDF37C08724B5, 0xE2771370E2E9D965]
    assert got[2] != 0, "equal inputs must not cancel"


def one_source(data: bytes, *, nbpt: int) -> canary.RealKvSource:
    row = torch.tensor(list(data), dtype=torch.uint8).reshape(1, -1)
    return canary.RealKvSource(tensor=row, page_size=1, num_bytes_per_token=nbpt, read_bytes=nbpt)


@pytest.mark.parametrize(
    ("data", "mode", "expected"),
    [
        (bytes.fromhex("01020408102040808182848890A0C0FF"), "PARTIAL", 0x6041580849E6407D),
        (bytes.fromhex("01020408102040808182848890A0C0FF"), "ALL", 0x6041580849E6407D),
        (bytes(range(32)), "ALL", 0xB44181DFE9420039),
        (bytes(range(32)), "PARTIAL", 0xD6D75024DFD6C30C),
    ],
    ids=["16-bytes-PARTIAL", "16-bytes-ALL", "32-bytes-ALL", "32-bytes-PARTIAL"],
)
def test_fingerprint_one_source_pinned(data, mode, expected):
    """fingerprint of one source reproduces SPEC §2's one-source vectors."""
    source = one_source(data, nbpt=len(data))
    got = canary.fingerprint([source], torch.tensor([0]), mode=canary.RealKvHashMode[mode])
    assert got.dtype == torch.int64
    assert got.item() & MASK64 == expected


def test_fingerprint_two_sources_pinned():
    """Two sources of bytes 00..0F and 10..1F combine to SPEC §2's value, in tuple order."""
    first, second = one_source(bytes(range(16)), nbpt=16), one_source(bytes(range(16, 32)), nbpt=16)
    got = canary.fingerprint([first, second], torch.tensor([0]))
    assert got.item() & MASK64 == 0xB6209A488C3F52B0
    swapped = canary.fingerprint([second, first], torch.tensor([0]))
    assert swapped.item() != got.item()
