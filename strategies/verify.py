"""Verify launches as plain data: verify plans over written chains, and corruptions
(CONTRACT §7).

:func:`verify_batches` draws verify plans over the chains a write left behind
(:func:`strategies.chains_written`); :func:`corruptions` draws one thing going wrong between
the write and the verify (the reports it must cause are worked out by the reference:
:func:`reference.corruption_reports`). :mod:`strategies.materialize` turns
them into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np
from hypothesis.errors import InvalidArgument

from strategies.chains import DRAWN_ENTRIES, CanaryWorld, Chain
from strategies.layouts import SourceLayout, slot_window_starts
from strategies.sizes import check_int

__all__ = [
    "CORRUPTION_KINDS",
    "Corruption",
    "VerifyBatch",
    "corruption_kinds",
    "corruptions",
    "plan_for_chains",
    "verify_batches",
]

_FIELD_NAMES = ("token", "position", "prev_hash", "real_kv_hash")


@dataclass(frozen=True)
class VerifyBatch:
    """One verify launch: per-entry arrays of the plan's capacity, and its scalar switches.

    ``enable`` 0 disables the launch (any other value runs it); ``num_valid`` is raw
    (clamped by the launch); entries past the valid ones are padding.
    """

    slots: tuple[int, ...]
    expected_tokens: tuple[int, ...]
    expected_positions: tuple[int, ...]
    prev_slots: tuple[int, ...]
    num_valid: int
    enable: int
    check_token: bool

    @property
    def capacity(self) -> int:
        return len(self.slots)

    @property
    def active(self) -> int:
        if self.enable == 0:
            return 0
        return min(max(self.num_valid, 0), self.capacity)


def plan_for_chains(chains: tuple[Chain, ...]) -> list[tuple[int, int, int, int]]:
    """``(slot, expected token, expected position, prev slot)`` for every entry of ``chains``.

    A chain's first entry links to its seed (or -1, the anchor); every later one to the entry
    before it. Such a plan verifies clean right after the chains are written.
    """
    entries = []
    for chain in chains:
        prev = chain.seed
        for slot, token, position in zip(chain.slots, chain.tokens, chain.positions, strict=True):
            entries.append((slot, token, position, prev))
            prev = slot
    return entries


def verify_batches(
    chains: tuple[Chain, ...],
    *,
    exact: bool = False,
    max_padding: int = 3,
    min_checked: int = 0,
    min_entries: int = 0,
) -> st.SearchStrategy[VerifyBatch]:
    """Verify plans over written ``chains``.

    With ``exact``, the plan is :func:`plan_for_chains` as it is, all valid and enabled,
    with the token check on. Otherwise entries are shuffled and varied: prev slot 0
    (unchecked), -1 or -2 (anchor), expected token -1 (unchecked) or a wrong one, a wrong
    position, padding entries (slot 0), ``num_valid`` from -2 to capacity + 2, ``enable``
    0, 1 or 2, and the token check on or off.

    ``min_checked``: at least that many entries are checked by a correct launch (CONTRACT §7:
    the launch is enabled, and the entry is below the clamped ``num_valid`` and names a slot
    other than 0), built in, not filtered: ``enable`` is then never 0 and ``num_valid``
    reaches that many entries of the chains. The chains must hold that many slots other than
    0. With the default 0, draws are those of the strategy before the option existed.

    ``min_entries``: the plan holds at least that many entries, the chains' entries repeated
    in order as often as it takes (verify only reads, so a sweep may check a slot twice):
    that is how a sweep past 32,768 entries (a persistent grid's second lap) is drawn over
    fewer written slots. Past 64 entries a plan is drawn in bulk: its order, the share of
    changed entries and the padding come from a drawn seed and rate, not one draw per entry.

    Example draw::

        VerifyBatch(slots=(4, 0, 6), expected_tokens=(12, -1, -1), expected_positions=(1, 0, 2),
                    prev_slots=(3, 0, -2), num_valid=5, enable=2, check_token=True)
    """
    check_int("max_padding", max_padding, 0)
    checkable = sum(slot != 0 for chain in chains for slot in chain.slots)
    check_int("min_checked", min_checked)
    if not 0 <= min_checked <= checkable:
        raise InvalidArgument(
            f"min_checked={min_checked} must be in [0, {checkable}]: the chains hold "
            f"{checkable} slots other than 0 (verify skips slot 0)"
        )
    check_int("min_entries", min_entries, 0)
    if min_entries and not checkable:
        raise InvalidArgument("min_entries needs chains with a slot other than 0")
    entries = plan_for_chains(tuple(chains))
    repeated = min_entries > len(entries)
    if repeated:
        entries = (entries * -(-min_entries // len(entries)))[:min_entries]
    if repeated or len(entries) > DRAWN_ENTRIES:
        return _bulk_verify_batches(entries, exact, max_padding, min_checked)
    return _verify_batches(tuple(chains), exact, max_padding, min_checked)


@st.composite
def _verify_batches(draw, chains, exact, max_padding, min_checked) -> VerifyBatch:
    entries = plan_for_chains(chains)
    if exact:
        entries = entries or [(0, -1, 0, 0)]  # a plan has at least one entry: padding
        n = len(entries)
        columns = list(zip(*entries, strict=True)) if entries else [(), (), (), ()]
        slots, tokens, positions, prevs = map(tuple, columns)
        return VerifyBatch(slots, tokens, positions, prevs, num_valid=n, enable=1, check_token=True)
    entries = list(draw(st.permutations(entries), label="entry order"))
    varied = []
    for slot, token, position, prev in entries:
        change = draw(
            st.sampled_from(["", "", "", "prev 0", "prev -2", "token -1", "token", "position"]),
            label="entry change",
        )
        if change == "prev 0":
            prev = 0
        elif change == "prev -2":
            prev = -2
        elif change == "token -1":
            token = -1
        elif change == "token":
            token = token ^ 4
        elif change == "position":
            position = position ^ 8
        varied.append((slot, token, position, prev))
    for _ in range(draw(st.integers(0, max_padding), label="padding entries")):
        varied.insert(draw(st.integers(0, len(varied)), label="padding at"), (0, -1, 0, 0))
    if not varied:
        varied = [(0, -1, 0, 0)]
    slots, tokens, positions, prevs = (tuple(column) for column in zip(*varied, strict=True))
    lowest = -2
    if min_checked:
        # num_valid reaches the min_checked-th entry that names a slot other than 0
        checked_at = [k for k, (slot, *_) in enumerate(varied) if slot != 0]
        lowest = checked_at[min_checked - 1] + 1
    return VerifyBatch(
        slots,
        tokens,
        positions,
        prevs,
        num_valid=draw(st.integers(lowest, len(varied) + 2), label="num_valid"),
        enable=draw(st.sampled_from([1, 1, 2] if min_checked else [1, 1, 2, 0]), label="enable"),
        check_token=draw(st.booleans(), label="check_token"),
    )


_ENTRY_CHANGES = ("prev 0", "prev -2", "token -1", "token", "position")


@st.composite
def _bulk_verify_batches(draw, entries, exact, max_padding, min_checked) -> VerifyBatch:
    columns = np.asarray(entries, dtype=object).T  # slot, token, position, prev
    n = len(entries)
    if exact:
        # tuples here; the shuffled path below edits lists of the same names
        slot_t, token_t, position_t, prev_t = (tuple(int(v) for v in c) for c in columns)
        return VerifyBatch(
            slot_t, token_t, position_t, prev_t, num_valid=n, enable=1, check_token=True
        )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="bulk seed"))
    order = rng.permutation(n)
    slots, tokens, positions, prevs = ([int(v) for v in c[order]] for c in columns)
    rate = draw(st.sampled_from([1 / 32, 1 / 4, 0.0]), label="changed entries")
    for k in np.flatnonzero(rng.random(n) < rate).tolist():
        change = _ENTRY_CHANGES[int(rng.integers(len(_ENTRY_CHANGES)))]
        if change == "prev 0":
            prevs[k] = 0
        elif change == "prev -2":
            prevs[k] = -2
        elif change == "token -1":
            tokens[k] = -1
        elif change == "token":
            tokens[k] ^= 4
        else:
            positions[k] ^= 8
    for _ in range(draw(st.integers(0, max_padding), label="padding entries")):
        at = int(rng.integers(0, len(slots) + 1))
        for column, value in zip((slots, tokens, positions, prevs), (0, -1, 0, 0), strict=True):
            column.insert(at, value)
    total = len(slots)
    # a sweep checks all of its entries (past a lap, past the plan): num_valid is never short
    choices = [total, total + 2] if min_checked else [total, total + 2, -1, 0]
    return VerifyBatch(
        tuple(slots),
        tuple(tokens),
        tuple(positions),
        tuple(prevs),
        num_valid=draw(st.sampled_from(choices), label="num_valid"),
        enable=draw(st.sampled_from([1, 2] if min_checked else [1, 2, 0]), label="enable"),
        check_token=draw(st.booleans(), label="check_token"),
    )


@dataclass(frozen=True)
class Corruption:
    """One thing going wrong between a write and a verify.

    ``kind``:

    - ``"field"``: bit ``bit`` of canary field ``field`` (0 token, 1 position, 2 prev hash,
      3 real-KV hash) of ``slot`` flips;
    - ``"kv_inside"``: byte ``offset`` of source ``source``'s backing buffer, which ``slot``
      reads, is xored with ``value``;
    - ``"kv_outside"``: the same for a byte no slot reads (must cause no report);
    - ``"page_swap"``: rows ``slot`` and ``other`` of source ``source`` swap their bytes (a
      page table pointing at the wrong page);
    - ``"stale"``: ``slot``'s record is overwritten by the record of ``other``, a slot of
      another chain (a freed slot reused without a new write).
    """

    kind: str
    slot: int = 0
    other: int = 0
    field: int = 0
    bit: int = 0
    source: int = 0
    offset: int = 0
    value: int = 0

    def describe(self) -> str:
        if self.kind == "field":
            return f"bit {self.bit} of {_FIELD_NAMES[self.field]} of slot {self.slot} flipped"
        if self.kind in ("kv_inside", "kv_outside"):
            where = (
                "read by slot " + str(self.slot) if self.kind == "kv_inside" else "read by no slot"
            )
            return f"byte {self.offset} of source {self.source} ({where}) ^= {self.value:#x}"
        if self.kind == "page_swap":
            return f"rows {self.slot} and {self.other} of source {self.source} swapped"
        return f"slot {self.slot} holds the stale record of slot {self.other}"


CORRUPTION_KINDS = ("field", "kv_inside", "kv_outside", "page_swap", "stale")


def corruption_kinds(world: CanaryWorld, chains: tuple[Chain, ...]) -> tuple[str, ...]:
    """The corruption kinds ``world`` and ``chains`` allow: KV ones when the world reads KV
    bytes, a stale record with two chains or more, a flipped field always."""
    kinds = ["field"]
    if world.reads_kv:
        kinds += ["kv_inside", "kv_outside", "page_swap"]
    if len(chains) >= 2:
        kinds.append("stale")
    return tuple(kinds)


@st.composite
def corruptions(
    draw, world: CanaryWorld, chains: tuple[Chain, ...], kinds: tuple[str, ...] | None = None
) -> Corruption:
    """One corruption of written ``chains`` in ``world`` (which needs at least one written slot).

    KV corruptions are drawn only when the world reads KV bytes; a stale record needs two
    chains (:func:`corruption_kinds`). ``kinds`` narrows the choice to those of its kinds
    that are allowed (at least one must be); the default draws as before the option existed.
    Example draw: ``Corruption(kind='field', slot=5, field=1, bit=63)``.
    """
    written = [slot for chain in chains for slot in chain.slots]
    if not written:
        raise InvalidArgument("corruptions() needs chains with at least one written slot")
    allowed = corruption_kinds(world, chains)
    if kinds is not None:
        allowed = tuple(k for k in allowed if k in kinds)
        if not allowed:
            raise InvalidArgument(
                f"kinds={kinds!r}: none is allowed here ({corruption_kinds(world, chains)})"
            )
    kind = draw(st.sampled_from(list(allowed)), label="corruption")
    slot = draw(st.sampled_from(written), label="slot")
    if kind == "field":
        return Corruption(
            "field",
            slot=slot,
            field=draw(st.integers(0, 3), label="field"),
            bit=draw(st.integers(0, 63), label="bit"),
        )
    if kind == "stale":
        mine = next(chain for chain in chains if slot in chain.slots)
        others = [s for chain in chains if chain is not mine for s in chain.slots]
        return Corruption(
            "stale", slot=slot, other=draw(st.sampled_from(others), label="stale from")
        )
    source = draw(st.integers(0, len(world.sources) - 1), label="source")
    layout = world.sources[source]
    if kind == "kv_inside":
        read = 16 if world.mode == 1 else layout.read_bytes
        start = int(slot_window_starts(layout)[slot])
        return Corruption(
            "kv_inside",
            slot=slot,
            source=source,
            offset=start + draw(st.integers(0, read - 1), label="byte in window"),
            value=draw(st.integers(1, 255), label="xor"),
        )
    if kind == "kv_outside":
        outside = _unread_offsets(layout, world.mode)
        if outside.size == 0:
            return Corruption("field", slot=slot, field=3, bit=0)
        return Corruption(
            "kv_outside",
            slot=slot,
            source=source,
            offset=int(draw(st.sampled_from(outside.tolist()), label="byte outside")),
            value=draw(st.integers(1, 255), label="xor"),
        )
    row = slot // layout.page_size
    rows = list(range(layout.rows))
    other = draw(st.sampled_from([r for r in rows if r != row] or [row]), label="swap with row")
    return Corruption("page_swap", slot=row, other=other, source=source)


def _unread_offsets(layout: SourceLayout, mode: int) -> np.ndarray:
    read = np.zeros(layout.backing_bytes, dtype=bool)
    length = 16 if mode == 1 else layout.read_bytes
    starts = slot_window_starts(layout)
    read[(starts[:, None] + np.arange(length, dtype=np.int64)).ravel()] = True
    return np.flatnonzero(~read)
