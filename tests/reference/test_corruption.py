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


# what a flipped or stale field of slot 4 reports: its bit, and the successor's chain unless it
# is the real-KV hash
FIELD_REPORTS = [
    (0, {4: TOKEN, 5: CHAIN}),
    (1, {4: POSITION, 5: CHAIN}),
    (2, {4: CHAIN, 5: CHAIN}),
    (3, {4: REAL_KV}),
]


@pytest.mark.parametrize(
    ("field", "expected"),
    FIELD_REPORTS,
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


def fresh(*values: int) -> tuple[int, ...]:
    """Ints equal to ``values`` but never the same objects (no cached small ints, no shared
    constants): an identity test cannot pass for an equality one."""
    return tuple(int(str(value)) for value in values)


# a record (token, position, prev hash, real-KV hash) of values no other field holds
MINE = (70001, 70002, 70003, 70004)


@pytest.mark.parametrize("delta", [-1, 1])
@pytest.mark.parametrize(
    ("field", "expected"),
    FIELD_REPORTS,
)
def test_a_stale_record_reports_exactly_the_field_that_differs(field, expected, delta):
    """One field of the stale record differs, above or below the slot's own: that field's bit,
    and the successor's chain unless it is the real-KV hash."""
    stale = list(MINE)
    stale[field] += delta
    records = {4: fresh(*MINE), 9: fresh(*stale)}
    assert reports(Hit("stale", slot=4, other=9), stored=records.__getitem__) == expected


def test_a_stale_record_equal_to_the_slot_s_own_reports_nothing():
    records = {4: fresh(*MINE), 9: fresh(*MINE)}
    assert reports(Hit("stale", slot=4, other=9), stored=records.__getitem__) == {}


# expected tokens -5, 0 and 1 are checked like any other; only -1 means "do not check"
TOKENS_PLAN = [(3, -5, 0, -1), (4, 0, 1, 3), (5, 1, 2, 4), (6, -1, 3, 5)]


@pytest.mark.parametrize(("slot", "checked"), [(3, True), (4, True), (5, True), (6, False)])
def test_every_expected_token_but_minus_1_is_checked(slot, checked):
    """A token flip and a stale record with another token: the token bit where the expected
    token is not -1 and the token check is on, and the successor's chain either way."""
    after = {slot + 1: CHAIN} if slot < 6 else {}
    token = {slot: TOKEN} if checked else {}
    flip = Hit("field", slot=slot, field=0)
    assert reference.corruption_reports(TOKENS_PLAN, flip, check_token=True) == token | after
    assert reference.corruption_reports(TOKENS_PLAN, flip, check_token=False) == after
    stale = list(MINE)
    stale[0] += 1
    records = {slot: fresh(*MINE), 9: fresh(*stale)}
    for check_token, want in ((True, token | after), (False, after)):
        got = reference.corruption_reports(
            TOKENS_PLAN,
            Hit("stale", slot=slot, other=9),
            check_token=check_token,
            stored=records.__getitem__,
        )
        assert got == want


def test_a_page_swap_either_way_round_and_with_pages_of_one_slot_by_default():
    assert reports(Hit("page_swap", slot=5, other=1), page_size=2) == {3: REAL_KV, 10: REAL_KV}
    assert reports(Hit("page_swap", slot=3, other=9)) == {3: REAL_KV, 9: REAL_KV}
    # a page swapped with itself, named by equal ints that are not one object
    page, same = fresh(1000, 1000)
    plan = [(2000, 1, 0, -1), (2001, 2, 1, 2000)]
    swap = Hit("page_swap", slot=page, other=same)
    assert reference.corruption_reports(plan, swap, check_token=True, page_size=2) == {}


def test_a_slot_planned_twice_reports_its_bits_once():
    """Two entries verify slot 4 after slot 3: a broken link reports CHAIN at slot 4, once."""
    plan = [(3, 30, 0, -1), (4, 40, 1, 3), (4, 40, 1, 3)]
    flip = Hit("field", slot=3, field=2)
    assert reference.corruption_reports(plan, flip, check_token=True) == {3: CHAIN, 4: CHAIN}


def test_kinds_are_compared_by_value_and_options_by_keyword():
    """A kind built at run time is the kind it spells; check_token and the rest are
    keyword-only."""
    records = {4: fresh(*MINE), 9: fresh(70000, *MINE[1:])}
    for kind, more, expected in (
        ("field", {}, {4: TOKEN, 5: CHAIN}),
        ("kv_inside", {}, {4: REAL_KV}),
        ("page_swap", {"page_size": 2}, {4: REAL_KV, 5: REAL_KV}),
        ("stale", {"stored": records.__getitem__}, {4: TOKEN, 5: CHAIN}),
    ):
        built = "".join(list(kind))
        assert reports(Hit(built, slot=4 if kind != "page_swap" else 2, other=9), **more) == (
            expected
        ), kind
    with pytest.raises(TypeError):
        reference.corruption_reports(PLAN, Hit("kv_inside", slot=9), True)  # type: ignore[misc]
