"""The fault classes of the engine model, one object each (CONTRACT §15).

A fault class says, in one place, everything the suite knows of it: its one-line
:attr:`~FaultClass.description` (the detection table's first column), how it is made in an
:class:`strategies.engine.Engine` (:meth:`~FaultClass.make`: at the place ``pick`` chooses
among those the next step can see, changing the engine's state, and returning a :class:`Fault`),
and which reports it predicts in each hash mode: :meth:`~FaultClass.due`, judged when it is
made, from the records the reference holds then, and :meth:`~FaultClass.due_after_settle`, what
only the steps after it can tell (the slots a swapped token is written to), or that nothing is
promised (the fault left the sliding window unseen).

:data:`FAULTS` is the registry: SGLang's five self-test perturbations
(``sglang/srt/kv_canary/perturb/``), then two allocator bugs and two of the forward's KV store. The engine histories of the suite
(``conformance/test_engine.py``), the settle (``conformance.engine_support.inject_and_settle``)
and the detection table (``tools/detection_table.py``) read it; a new class is one more object
here (CONTRIBUTING.md says what else to touch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import reference
from reference import CanaryField, FailReason, RealKvHashMode
from strategies.engine import KV_BYTES, Engine, pick_from

__all__ = [
    "FAULTS",
    "FAULT_KINDS",
    "KV_BYTE_FAULTS",
    "KV_FAULTS",
    "READ_BYTES",
    "REQ_TO_TOKEN",
    "UNSEEABLE",
    "Due",
    "Fault",
    "FaultClass",
    "make",
]

#: Bytes of a slot's KV each real_kv_hash_mode reads.
READ_BYTES = {
    RealKvHashMode.NONE: 0,
    RealKvHashMode.PARTIAL: reference.PARTIAL_READ_BYTES,
    RealKvHashMode.ALL: KV_BYTES,
}
CHAIN = FailReason.VERIFY_CHAIN_HASH_MISMATCH
POSITION = FailReason.VERIFY_POSITION_MISMATCH
TOKEN = FailReason.VERIFY_TOKEN_MISMATCH


@dataclass(frozen=True)
class Fault:
    """A fault the engine model made: its class (``kind``), the KV byte to flip (``flip``:
    canary slot and byte, or None), the canary ``slots`` a report may name, the ``entries``
    ``(request, position)`` whose next verify or write reads what it changed, and ``what``, the
    fault in words."""

    kind: str
    flip: tuple[int, int] | None
    slots: frozenset
    entries: tuple
    what: str


@dataclass(frozen=True)
class Due:
    """A report a fault must cause: a ring row naming ``slot`` (-1: any of the fault's
    ``slots``) whose bits hold ``bits`` (-1 slot: any of them; ``exact``: are exactly ``bits``)."""

    slot: int
    bits: int
    exact: bool = False


#: What a fault must cause, judged when it is made: ``(reports, silent)``: every :class:`Due`
#: must be among the rows stored by the end of the settle, and with ``silent`` no row at all may
#: be; None: nothing is promised.
Prediction = tuple[list[Due], bool]


class FaultClass:
    """One fault class: its name, its one-line description, how it is made and what it
    predicts. Subclasses fill in :meth:`make` and :meth:`due`."""

    name: str
    description: str
    changes_kv = False  # whether it changes KV bytes and nothing else
    flips_byte = False  # whether it flips the drawn KV byte of one slot (``Fault.flip``)
    #: why no hash mode can see the class, for a class the canary cannot see at all ("": it
    #: is seen in some mode)
    unseeable = ""

    def make(self, engine: Engine, pick: int, byte: int) -> Fault | None:
        """Make the fault at the place ``pick`` chooses (``byte``: the KV byte, for a class that
        changes one); None when the engine has no place the next step can see."""
        raise NotImplementedError

    def due(self, engine: Engine, fault: Fault, canary_buf: np.ndarray) -> Prediction | None:
        """The reports ``fault`` must cause in the engine's hash mode, judged right after it was
        made, with ``canary_buf`` the reference's canary buffer then."""
        raise NotImplementedError

    def due_after_settle(self, engine: Engine, fault: Fault) -> list[Due] | None:
        """Reports known only once the settle ran, added to :meth:`due`'s; None: nothing is
        promised after all."""
        return []

    def __repr__(self) -> str:
        return f"<fault class {self.name}>"


# ---------------------------------------------------------------------------------------------
# A KV byte changes


class _KvByte(FaultClass):
    """A byte of one slot's KV changes: reported at that slot with ``REAL_KV`` when the mode
    reads the byte, by the next verify that reads the slot; nothing at all where it does not."""

    changes_kv = True
    flips_byte = True

    def places(self, engine: Engine) -> list[tuple[int, str]]:
        """``(canary slot, where it is in words)`` of every place the fault may take."""
        raise NotImplementedError

    def make(self, engine, pick, byte):
        place = pick_from(self.places(engine), pick)
        if place is None:
            return None
        slot, where = place
        what = f"{self.name}: byte {byte} of slot {slot} ({where})"
        return Fault(self.name, (slot, byte), frozenset({slot}), (), what)

    def due(self, engine, fault, canary_buf):
        assert fault.flip is not None
        slot, byte = fault.flip
        if byte >= READ_BYTES[RealKvHashMode(engine.config.mode)]:
            return [], True
        return [Due(slot, FailReason.VERIFY_REAL_KV_HASH_MISMATCH)], False

    def due_after_settle(self, engine, fault):
        assert fault.flip is not None
        if engine.lut is not None and fault.flip[0] not in engine.lut:
            return None  # the slot left the window before a verify could see it
        return []


class KvUsed(_KvByte):
    """``perturb/real_kv_used.py``: a KV byte of a slot a running request reads changes."""

    name = "kv_used"
    description = "a KV byte of a slot in use changes"

    def places(self, engine):
        return [
            (engine.canary_slot(engine.full_slot(r, p)), f"request {r.rid}, position {p}")
            for r, p in verified_next(engine)
        ]


class KvPostForward(_KvByte):
    """``perturb/real_kv_post_forward.py``: a KV byte of a slot the last forward wrote changes
    after its write."""

    name = "kv_post_forward"
    description = "a KV byte changes after the write that fingerprinted it"

    def places(self, engine):
        just = set(engine.last_written)
        return [
            (
                engine.canary_slot(engine.full_slot(r, p)),
                f"request {r.rid}, position {p}, just written",
            )
            for r, p in verified_next(engine)
            if (r.rid, p) in just
        ]


class KvUnusedCache(_KvByte):
    """``perturb/real_kv_unused_cache.py``: a KV byte of a slot only the prefix cache holds
    changes."""

    name = "kv_unused_cache"
    description = "a KV byte of a cached slot no request uses changes"

    def places(self, engine):
        places: dict[int, int] = {}  # canary slot -> cached position, slots no request uses
        for entry in engine.cache:
            for pos, full in enumerate(engine.cached_full_slots(entry)):
                slot = engine.canary_slot(full)
                if engine.req_refs[full // engine.config.page_size] == 0 and slot:
                    places.setdefault(slot, pos)
        return [
            (slot, f"cached position {pos}, no request uses it")
            for slot, pos in sorted(places.items())
        ]


# ---------------------------------------------------------------------------------------------
# The page table names another slot


def _record(canary_buf: np.ndarray, slot: int) -> np.ndarray:
    """A slot's record: its int64 fields, indexed by ``CanaryField``."""
    return np.ascontiguousarray(canary_buf[slot, : reference.CANARY_SLOT_BYTES]).view("<i8")


class _TableFault(FaultClass):
    """An entry of the page table names a slot another position wrote: reported at that slot
    with ``CHAIN``, ``POSITION`` and ``TOKEN`` for the fields in which its record differs from
    the one it replaced, and not at all when the records are equal (harmless). Under a sliding
    window nothing is promised: the entry may leave the window before a verify reads it."""

    def due(self, engine, fault, canary_buf):
        if engine.config.swa_window:
            return None
        dues = []
        for rid, pos in fault.entries:  # the first changed entry of each row
            req = engine.running[rid]
            new = int(engine.req_to_token[req.row, pos])
            old, now = _record(canary_buf, engine.full_slot(req, pos)), _record(canary_buf, new)
            bits = 0
            for field, bit in (
                (CanaryField.PREV_HASH, CHAIN),
                (CanaryField.POSITION, POSITION),
                (CanaryField.TOKEN, TOKEN),
            ):
                bits |= int(bit) if old[field] != now[field] else 0
            if bits:
                dues.append(Due(new, bits, exact=True))
        return dues, not dues

    def _made(self, engine: Engine, full_slots, entries: tuple, what: str) -> Fault:
        slots = frozenset(engine.canary_slot(s) for s in full_slots)
        return Fault(self.name, None, slots, entries, f"{self.name}: {what}")


class ReqToToken(_TableFault):
    """``perturb/req_to_token.py``: an entry of a running request's page table names another
    running request's slot."""

    name = "req_to_token"
    description = "a page-table entry names another request's slot"

    @staticmethod
    def change(table: np.ndarray, row: int, position: int, slot: int) -> None:
        """What the class changes: ``table[row, position]`` names ``slot``."""
        table[row, position] = slot

    def make(self, engine, pick, byte):
        places = verified_next(engine)
        place = pick_from(places, pick)
        if place is None:
            return None
        req, pos = place
        old = int(engine.req_to_token[req.row, pos])
        others = sorted(
            {
                engine.full_slot(r, p)
                for r in engine.running.values()
                for p in range(r.written)
                if r.rid != req.rid
                and engine.full_slot(r, p) != old
                and engine.canary_slot(engine.full_slot(r, p))
            }
        )
        new = pick_from(others, pick // max(1, len(places)))
        if new is None:
            return None
        self.change(engine.req_to_token, req.row, pos, new)
        what = f"request {req.rid} (row {req.row}) position {pos} names slot {new}, not {old}"
        return self._made(engine, {new}, ((req.rid, pos),), what)


class PageSwap(_TableFault):
    """The page tables of two running requests name each other's page (at the head of each
    swapped page, like ``req_to_token``)."""

    name = "page_swap"
    description = "two requests' page tables name each other's page"

    def make(self, engine, pick, byte):
        p = engine.config.page_size
        pages = [
            (req, pos)
            for req, pos, _ in page_heads(engine)
            if pos + p <= req.written and pos >= engine.window_start(req.written)
        ]
        pairs = [
            (a, b)
            for i, a in enumerate(pages)
            for b in pages[i + 1 :]
            if a[0].rid != b[0].rid and engine.full_slot(a[0], a[1]) != engine.full_slot(b[0], b[1])
        ]
        pair = pick_from(pairs, pick)
        if pair is None:
            return None
        (ra, fa), (rb, fb) = pair
        table = engine.req_to_token
        a = table[ra.row, fa : fa + p].copy()
        table[ra.row, fa : fa + p] = table[rb.row, fb : fb + p]
        table[rb.row, fb : fb + p] = a
        what = (
            f"request {ra.rid} positions {fa}..{fa + p - 1} and request {rb.rid} positions "
            f"{fb}..{fb + p - 1} swap pages"
        )
        slots = np.concatenate([a, table[ra.row, fa : fa + p]]).tolist()
        return self._made(engine, slots, ((ra.rid, fa), (rb.rid, fb)), what)


# ---------------------------------------------------------------------------------------------
# The allocator and the sampler


class FreedWhileReferenced(_TableFault):
    """A page of a running request goes back to the allocator, which hands it to another
    request that writes it: reported at a slot of that page with ``CHAIN``, ``POSITION`` or
    ``TOKEN`` by the next verify of its first owner (which slot is known only once the settle
    wrote it); under a sliding window nothing is promised."""

    name = "freed_while_referenced"
    description = "a page in use is freed and handed to another request"

    def make(self, engine, pick, byte):
        p = engine.config.page_size
        places = [
            (req, pos, page)
            for req, pos, page in page_heads(engine)
            if engine.req_refs[page] == 1 and engine.cache_refs[page] == 0
        ]
        place = pick_from(places, pick)
        if place is None:
            return None
        req, pos, page = place
        engine.req_refs[page] = 0
        engine.free_pages.insert(0, page)  # the next allocation takes it
        what = f"page {page} (request {req.rid} positions {pos}..{pos + p - 1}) freed while in use"
        return self._made(engine, range(page * p, (page + 1) * p), ((req.rid, pos),), what)

    def due(self, engine, fault, canary_buf):
        return None if engine.config.swa_window else ([], False)

    def due_after_settle(self, engine, fault):
        return [Due(-1, CHAIN | POSITION | TOKEN)]


class NextTokenSwap(FaultClass):
    """``perturb/next_token_swap.py``: two requests' sampled next tokens are swapped, so each
    writes the other's token: reported by the write of each, with ``WRITE_TOKEN``, in every
    mode, at the slots the settle writes them to."""

    name = "next_token_swap"
    description = "two requests' sampled tokens are swapped"

    def make(self, engine, pick, byte):
        ready = [
            r
            for r in sorted(engine.running.values(), key=lambda r: r.rid)
            if r.decoding and engine.pending(r) == 1 and r.written < engine.config.context_len
        ]
        pairs = [
            (a, b)
            for i, a in enumerate(ready)
            for b in ready[i + 1 :]
            if a.tokens[-1] != b.tokens[-1]
        ]
        pair = pick_from(pairs, pick)
        if pair is None:
            return None
        a, b = pair
        a.tokens[-1], b.tokens[-1] = b.tokens[-1], a.tokens[-1]
        return Fault(
            self.name, None, frozenset(), ((a.rid, a.written), (b.rid, b.written)),
            f"{self.name}: requests {a.rid} and {b.rid} swap their sampled tokens",
        )  # fmt: skip

    def due(self, engine, fault, canary_buf):
        return [], False  # the slots are known once written: see due_after_settle

    def due_after_settle(self, engine, fault):
        return [
            Due(slot, FailReason.WRITE_TOKEN_MISMATCH) for slot in engine.slots_of(fault.entries)
        ]


# ---------------------------------------------------------------------------------------------
# The forward stores KV where the plan did not say


class _StoreFault(FaultClass):
    """The forward's KV store goes wrong; what the canary can see of it is the slots whose KV
    changed after their records were written. A store fault the settle's forwards never made
    promises nothing."""

    def due_after_settle(self, engine, fault):
        if engine.store_fault is not None:
            engine.store_fault = None  # the store never came: nothing happened
            return None
        if engine.lut is not None and not set(fault.slots) <= set(engine.lut.tolist()):
            return None  # the slot left the window before a verify could see it
        return []


class MisdirectedStore(_StoreFault):
    """The first KV store of the next forward lands in a slot another position wrote, not in
    the slot the plan names (a forward that scatters to a stale ``out_cache_loc``): reported
    at that slot with ``REAL_KV`` by its next verify, when the mode reads the bytes (a whole
    row of fresh bytes: ``PARTIAL`` and ``ALL``); never in ``NONE``. The slot the store missed
    keeps its old bytes, which its write fingerprints as they are: it stays silent."""

    name = "misdirected_store"
    description = "a forward stores a token's KV in a slot another position wrote"
    changes_kv = True

    def make(self, engine, pick, byte):
        place = pick_from(verified_next(engine), pick)
        if place is None:
            return None
        req, pos = place
        victim = engine.canary_slot(engine.full_slot(req, pos))

        def store(slots: np.ndarray, kv: np.ndarray):
            if not slots.size or slots[0] == victim:
                return None
            slots = slots.copy()
            slots[0] = victim
            return slots, kv

        engine.store_fault = store
        what = (
            f"{self.name}: the next forward's first KV store lands in slot {victim} "
            f"(request {req.rid}, position {pos})"
        )
        return Fault(self.name, None, frozenset({victim}), ((req.rid, pos),), what)

    def due(self, engine, fault, canary_buf):
        if engine.config.mode == RealKvHashMode.NONE:
            return [], True
        (victim,) = fault.slots
        return [Due(victim, FailReason.VERIFY_REAL_KV_HASH_MISMATCH)], False


class DroppedStore(_StoreFault):
    """The forward never stores the KV of a request's next position: the slot keeps the bytes
    it held, and the write after the forward fingerprints those bytes, so the record agrees
    with them. No mode can see it: the canary checks that a slot's KV is what was there when
    its record was written, not that the model stored it."""

    name = "dropped_store"
    description = "a forward drops the KV store of a token it writes"
    unseeable = (
        "a write fingerprints the bytes its slot holds after the forward, so the record agrees "
        "with the stale bytes a dropped store leaves"
    )

    def make(self, engine, pick, byte):
        ready = [
            r for r in sorted(engine.running.values(), key=lambda r: r.rid) if engine.will_run(r)
        ]
        req = pick_from(ready, pick)
        if req is None:
            return None
        pos = req.written

        def store(slots: np.ndarray, kv: np.ndarray):
            if pos >= len(req.pages) * engine.config.page_size:
                return None
            target = engine.canary_slot(engine.full_slot(req, pos))
            hits = np.flatnonzero(slots == target)
            if not hits.size:
                return None
            keep = np.arange(slots.shape[0]) != hits[0]
            return slots[keep], kv[keep]

        engine.store_fault = store
        what = f"{self.name}: request {req.rid} position {pos} is written without its KV"
        return Fault(self.name, None, frozenset(), ((req.rid, pos),), what)

    def due(self, engine, fault, canary_buf):
        return [], True


def verified_next(engine: Engine) -> list:
    """``(request, position)`` of every written position the next forward of its request
    verifies (inside the window the request will have then): where a fault is seen next."""
    out = []
    for req in sorted(engine.running.values(), key=lambda r: r.rid):
        if not engine.will_run(req):
            continue
        for pos in range(engine.window_start(req.written), req.written):
            if engine.canary_slot(engine.full_slot(req, pos)):
                out.append((req, pos))
    return out


def page_heads(engine: Engine) -> list:
    """``(request, position, page)`` of each place of :func:`verified_next` that is the first
    position of its page."""
    p = engine.config.page_size
    return [(req, pos, req.pages[pos // p]) for req, pos in verified_next(engine) if pos % p == 0]


# ---------------------------------------------------------------------------------------------
# The registry

#: The ``req_to_token`` class, which the pipeline property's page-table change uses too.
REQ_TO_TOKEN = ReqToToken()
#: Every fault class by name, in the order of the suite's parameters and the detection table:
#: SGLang's five self-test perturbations, two allocator bugs, then two bugs of the forward's
#: KV store.
FAULTS: dict[str, FaultClass] = {
    c.name: c
    for c in (
        REQ_TO_TOKEN,
        KvUsed(),
        KvUnusedCache(),
        KvPostForward(),
        NextTokenSwap(),
        PageSwap(),
        FreedWhileReferenced(),
        MisdirectedStore(),
        DroppedStore(),
    )
}
#: The names of the fault classes.
FAULT_KINDS = tuple(FAULTS)
#: The fault classes that change KV bytes and nothing else.
KV_FAULTS = tuple(name for name, c in FAULTS.items() if c.changes_kv)
#: The fault classes that flip the drawn byte of one slot's KV.
KV_BYTE_FAULTS = tuple(name for name, c in FAULTS.items() if c.flips_byte)
#: The fault classes no hash mode can see (each says why: ``FaultClass.unseeable``).
UNSEEABLE = tuple(name for name, c in FAULTS.items() if c.unseeable)


def make(engine: Engine, kind: str, pick: int, byte: int = 0) -> Fault | None:
    """Make a fault of class ``kind`` (:data:`FAULT_KINDS`) in ``engine`` at the place ``pick``
    chooses among those where the next step can see it (``byte``: modulo the KV bytes of a
    slot); None when there is none. The engine's log records it."""
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}")
    fault = FAULTS[kind].make(engine, pick, byte % KV_BYTES)
    if fault is not None:
        engine.log.append(f"FAULT {fault.what}")
    return fault
