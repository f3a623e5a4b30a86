"""The corruption oracle (CONTRACT §7): the reports each kind of corruption must cause."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import reference
from reference import FailReason

CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)

# one chain 3 -> 4 -> 5 from the anchor, one chain 9 -> 10 seeded by slot 8
PLAN = [(3, 30, 0, -1), (4, 40, 1, 3), (5, -1, 2, 4), (9, 90, 7, 8), (10, 100, 8, 9)]


@dataclass(frozen=True)
class Hit:
    kind: str
    slot: int = 0
    other: int = 0
    field: int = 0


def reports(corruption: Hit, *, check_token: bool = True, **more) -> dict[int, int]:
    return reference.corruption_reports(PLAN, corruption, check_token=check_token, **more)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        (0, {4: TOKEN, 5: CHAIN}),
        (1, {4: POSITION, 5: CHAIN}),
        (2, {4: CHAIN, 5: CHAIN}),
        (3, {4: REAL_KV}),
    ],
)
def test_a_flipped_field_reports_its_bit_and_breaks_the_next_link(field, expected):
    """A flipped token, position or prev hash reports its own bit and the successor's chain;
    a flipped real-KV hash reports that slot alone."""
    assert reports(Hit("field", slot=4, field=field)) == expected


def test_a_token_flip_is_unseen_where_the_token_is_unchecked():
    """No token bit without the token check, nor for an entry expecting token -1."""
    assert reports(Hit("field", slot=4, field=0), check_token=False) == {5: CHAIN}
    assert reports(Hit("field", slot=5, field=0)) == {}


def test_kv_bytes_and_page_swaps_report_real_kv_only():
    """A changed byte read by a slot reports that slot; a byte no slot reads reports nothing;
    a page swap reports every planned slot of both pages; a page swapped with itself, none."""
    assert reports(Hit("kv_inside", slot=9)) == {9: REAL_KV}
    assert reports(Hit("kv_outside", slot=9)) == {}
    assert reports(Hit("page_swap", slot=1, other=5), page_size=2) == {
        3: REAL_KV,
        10: REAL_KV,
    }
    assert reports(Hit("page_swap", slot=2, other=2), page_size=2) == {}


def test_a_stale_record_reports_each_field_that_differs():
    """A stale record is compared field by field; a changed chain field breaks the next link."""
    records = {4: (40, 1, 111, 222), 9: (90, 1, 333, 222)}
    got = reports(Hit("stale", slot=4, other=9), stored=records.__getitem__)
    assert got == {4: TOKEN | CHAIN, 5: CHAIN}
    with pytest.raises(ValueError, match="stored"):
        reports(Hit("stale", slot=4, other=9))
