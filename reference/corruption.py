"""The second oracle: which reports a corruption between a write and a verify must cause,
worked out from CONTRACT §7 alone (not by running :func:`reference.verify`).

A verify plan that checks written chains verifies clean; after one thing goes wrong (a flipped
bit of a record, a changed KV byte, two pages swapped, a stale record) it must report exactly
the slots and bits :func:`corruption_reports` gives. The suite checks an implementation's
verify against both oracles: this one, and the reference's verify on the same state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from reference.constants import FailReason

__all__ = ["Corrupting", "corruption_reports"]

_CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
_POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
_REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
_TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)


class Corrupting(Protocol):
    """What a corruption must say of itself (``strategies.Corruption`` does): its ``kind``
    (``"field"``, ``"kv_inside"``, ``"kv_outside"``, ``"page_swap"`` or ``"stale"``), the
    ``slot`` it hits, the ``other`` slot (or row) of a swap or a stale record, and the canary
    ``field`` (0 token, 1 position, 2 prev hash, 3 real-KV hash) whose bit flips."""

    kind: str
    slot: int
    other: int
    field: int


def corruption_reports(
    plan: Sequence[tuple[int, int, int, int]],
    corruption: Corrupting,
    *,
    check_token: bool,
    page_size: int = 1,
    stored: Callable[[int], tuple[int, int, int, int]] | None = None,
) -> dict[int, int]:
    """The ``{slot: FailReason bits}`` that verifying ``plan`` (token check ``check_token``)
    must report after ``corruption``.

    ``plan`` is ``(slot, expected token, expected position, prev slot)`` per entry, over
    chains written just before, so that it verifies clean: each chain's first entry links to
    its seed (or -1), every later one to the entry before it. The chains must avoid slot 0
    (verify skips it, and prev slot 0 means "unchecked"). ``page_size`` is that of the
    swapped source for a page swap; ``stored(slot)`` gives a slot's record ``(token,
    position, prev_hash, real_kv_hash)`` before the corruption (a stale record is compared
    field by field). Sources are densely filled, so two different windows never hold the same
    bytes.
    """
    successors: dict[int, list[int]] = {}
    for slot, _, _, prev in plan:
        if prev >= 0:
            successors.setdefault(prev, []).append(slot)  # chains may fork from one seed
    expected_token = {slot: token for slot, token, _, _ in plan}
    reports: dict[int, int] = {}

    def add(slot: int, bits: int) -> None:
        if bits:
            reports[slot] = reports.get(slot, 0) | bits

    kind = corruption.kind
    if kind == "field":
        slot, field = corruption.slot, corruption.field
        token_checked = check_token and expected_token[slot] != -1
        add(slot, {0: _TOKEN if token_checked else 0, 1: _POSITION, 2: _CHAIN, 3: _REAL_KV}[field])
        if field != 3:
            for after in successors.get(slot, ()):
                add(after, _CHAIN)  # mix3 is a bijection in each argument
    elif kind == "kv_inside":
        add(corruption.slot, _REAL_KV)
    elif kind == "page_swap" and corruption.slot != corruption.other:
        for slot in expected_token:
            if slot // page_size in (corruption.slot, corruption.other):
                add(slot, _REAL_KV)
    elif kind == "stale":
        if stored is None:
            raise ValueError("a stale record's reports need stored(slot)")
        slot = corruption.slot
        mine, stale = stored(slot), stored(corruption.other)
        token_checked = check_token and expected_token[slot] != -1
        add(slot, _TOKEN if token_checked and stale[0] != mine[0] else 0)
        add(slot, _POSITION if stale[1] != mine[1] else 0)
        add(slot, _CHAIN if stale[2] != mine[2] else 0)
        add(slot, _REAL_KV if stale[3] != mine[3] else 0)
        if stale[:3] != mine[:3]:
            for after in successors.get(slot, ()):
                add(after, _CHAIN)
    return reports
