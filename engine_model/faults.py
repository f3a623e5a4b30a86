"""The fault classes of the engine model, one object each (CONTRACT §15).

A fault class says, in one place, everything the suite knows of it: its one-line
:attr:`~FaultClass.description` (the detection table's first column), how it is made in an
:class:`engine_model.engine.Engine` (:meth:`~FaultClass.make`: at the place ``pick`` chooses
among those the next step can see, changing the engine's state, and returning a :class:`Fault`),
and which reports it predicts in each hash mode: :meth:`~FaultClass.due`, judged when it is
made, from the records the reference's buffers hold then, and
:meth:`~FaultClass.due_after_settle`, what only the steps after it can tell (the slots a swapped
token is written to), or that nothing is promised (the fault left the sliding window unseen).
Each :class:`Due` names the launches that must report it, by launch tag: a forward verifies and
writes each buffer group's ``HEAD`` buffer (no real-KV source) and ``TAIL`` buffer (the group's
KV pool), and a sweep verifies the tail buffer under ``SWEEP`` (:mod:`engine_model.engine`).

:data:`FAULTS` is the registry: SGLang's five self-test perturbations
(``sglang/srt/kv_canary/perturb/``), then two allocator bugs, three of the prefix cache (a
locked page evicted, a rebind one page off, a duplicate freed while named), two of the forward's KV store, one
of the forward's positions and one of speculative decoding's accept. The engine histories of the suite
(``conformance/test_engine.py``), the settle (``conformance.engine_support.inject_and_settle``)
and the detection table (``tools/detection_table.py``) read it; a new class is one more object
here (CONTRIBUTING.md says what else to touch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

import reference
from engine_model.config import KV_BYTES, pick_from
from engine_model.engine import Engine
from engine_model.vocabulary import FULL, PREFILL_ENGINE, SWA
from reference import CanaryField, FailReason, RealKvHashMode

__all__ = [
    "FAULTS",
    "FAULT_KINDS",
    "KV_BYTE_FAULTS",
    "KV_FAULTS",
    "MOVE_FAULTS",
    "READ_BYTES",
    "REQ_TO_TOKEN",
    "UNSEEABLE",
    "tags",
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
REAL_KV = FailReason.VERIFY_REAL_KV_HASH_MISMATCH
POSITION = FailReason.VERIFY_POSITION_MISMATCH
TOKEN = FailReason.VERIFY_TOKEN_MISMATCH


def tags(group: str, *stages: str) -> frozenset:
    """The launch tags of a group's endpoints at ``stages`` (``HEAD``, ``TAIL``, ``SWEEP``;
    the K half, as SGLang runs by default)."""
    return frozenset(int(reference.CanaryLaunchTag[f"{stage}_K_{group}"]) for stage in stages)


@dataclass(frozen=True)
class Fault:
    """A fault the engine model made: its class (``kind``), the KV byte to flip (``flip``:
    group, slot of the group's pool and byte, or None), the canary ``slots`` a report may name
    (in the group the fault's predictions name), the ``entries`` ``(request, position)`` whose
    next verify or write reads what it changed, ``what``, the fault in words, and ``group``,
    the buffer group whose pool or records it changes (``FULL`` for the page table's faults,
    which both groups read)."""

    kind: str
    flip: tuple[str, int, int] | None
    slots: frozenset
    entries: tuple
    what: str
    group: str = FULL
    made_at: int = 0  # the engine's step count when it was made
    #: the steps the fault itself makes, run right after it and before its predictions are
    #: judged (a move of KV without a forward, and the prefill engine's forward before it)
    steps: tuple = ()
    #: a move's ``(source slot, destination slot)`` of each position, in order
    moved: tuple = ()
    #: the full-pool slot whose KV ``flip`` changes (in the ``SWA`` group: the slot that maps
    #: to the flipped SWA slot when the fault is made)
    full_slot: int = -1


@dataclass(frozen=True)
class Due:
    """A report a fault must cause: a ring row stamped with one of ``tags`` (empty: any launch)
    naming ``slot`` (-1: any of the fault's ``slots``) whose bits hold ``bits`` (-1 slot or
    ``any_of``: any of them; ``exact``: are exactly ``bits``)."""

    slot: int
    bits: int
    exact: bool = False
    tags: frozenset = frozenset()
    any_of: bool = False  # whose bits hold any of ``bits``


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
    #: whether it moves KV without a forward, leaving records and KV bytes that may disagree
    #: (``REAL_KV`` is then a reason it may be reported with)
    moves_kv = False
    flips_byte = False  # whether it flips the drawn KV byte of one slot (``Fault.flip``)
    #: why no hash mode can see the class, for a class the canary cannot see at all ("": it
    #: is seen in some mode)
    unseeable = ""
    #: why a forward mode that writes what the fault changed never reports it, by SGLang's
    #: ``ForwardMode`` (the settle's decodes in that mode)
    unseen_in: dict[str, str] = {}
    #: the forward mode of the settle's decodes in which the class is judged by default (the
    #: detection table's first table), and whether only the target model's canary (no EAGLE
    #: offset) has a place for it
    settle_mode = "DECODE"
    target_model_only = False
    #: whether the draft model's canary (the EAGLE offset) can see it at all (False: only a
    #: check it has off reports it)
    seen_by_draft_model = True
    #: whether it hands a page a request still names to another request: under a window the
    #: first request's ``SWA`` verify may then read, through the page's new SWA slots, records
    #: the new owner has not written yet (stale memory, with any reason bits, ``REAL_KV``
    #: among them)
    frees_pages_in_use = False
    #: the share of the detection table's histories with a place for it (at least)
    place_share = 3 / 4

    def why_never(self, hash_mode: int, forward_mode: str = "DECODE") -> str:
        """Why the class is never reported in ``hash_mode`` with the settle's decodes in
        ``forward_mode`` ("" where it is)."""
        if self.unseeable:
            return self.unseeable
        if forward_mode in self.unseen_in:
            return self.unseen_in[forward_mode]
        if self.changes_kv and hash_mode == RealKvHashMode.NONE:
            return "NONE reads no KV byte"
        return ""

    def make(self, engine: Engine, pick: int, byte: int) -> Fault | None:
        """Make the fault at the place ``pick`` chooses (``byte``: the KV byte, for a class that
        changes one); None when the engine has no place the next step can see."""
        raise NotImplementedError

    def due(self, engine: Engine, fault: Fault, buffers: dict) -> Prediction | None:
        """The reports ``fault`` must cause in the engine's hash mode, judged right after it was
        made, with ``buffers`` the reference's canary buffers then, keyed by launch tag."""
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
    """A byte of one slot's KV changes, in the pool of the group ``pick`` chooses (SGLang's
    ``target_group_kind``): reported at that slot with ``REAL_KV`` when the mode reads the byte,
    by the group's next ``TAIL`` verify or sweep that reads the slot (``HEAD`` launches have no
    real-KV source); nothing at all where the mode does not read it."""

    changes_kv = True
    flips_byte = True

    def places(self, engine: Engine, group: str) -> list[tuple[int, str]]:
        """``(slot of the group's pool, where it is in words)`` of every place the fault may
        take in ``group``."""
        raise NotImplementedError

    def make(self, engine, pick, byte):
        places = [(g, *place) for g in engine.config.groups for place in self.places(engine, g)]
        place = pick_from(places, pick)
        if place is None:
            return None
        group, slot, where = place
        what = f"{self.name}: byte {byte} of {group} slot {slot} ({where})"
        full = slot if group == FULL else int(np.flatnonzero(engine.lut == slot)[0])
        return Fault(self.name, (group, slot, byte), frozenset({slot}), (), what, group,
                     full_slot=full)  # fmt: skip

    def due(self, engine, fault, buffers):
        assert fault.flip is not None
        group, slot, byte = fault.flip
        if byte >= READ_BYTES[RealKvHashMode(engine.config.mode)]:
            return [], True
        return [Due(slot, REAL_KV, tags=tags(group, "TAIL", "SWEEP"))], False

    def due_after_settle(self, engine, fault):
        assert fault.flip is not None
        group, slot, _ = fault.flip
        if group == SWA and engine.lut[fault.full_slot] != slot:
            # the slot left the window (or the SWA pool took it under pressure) before a verify
            # could see it, and another position's write may have taken it since
            return None
        return []


class KvUsed(_KvByte):
    """``perturb/real_kv_used.py``: a KV byte of a slot a running request reads changes."""

    name = "kv_used"
    description = "a KV byte of a slot in use changes"

    def places(self, engine, group):
        return [
            (engine.group_slot(group, engine.full_slot(r, p)), f"request {r.rid}, position {p}")
            for r, p in verified_next(engine, group)
        ]


class KvPostForward(_KvByte):
    """``perturb/real_kv_post_forward.py``: a KV byte of a slot the last forward wrote changes
    after its write."""

    name = "kv_post_forward"
    description = "a KV byte changes after the write that fingerprinted it"

    def places(self, engine, group):
        just = set(engine.last_written)
        return [
            (
                engine.group_slot(group, engine.full_slot(r, p)),
                f"request {r.rid}, position {p}, just written",
            )
            for r, p in verified_next(engine, group)
            if (r.rid, p) in just
        ]


class KvUnusedCache(_KvByte):
    """``perturb/real_kv_unused_cache.py``: a KV byte of a slot only the prefix cache holds
    changes."""

    name = "kv_unused_cache"
    description = "a KV byte of a cached slot no request uses changes"

    def places(self, engine, group):
        places: dict[int, int] = {}  # slot -> cached position, slots no request uses
        for entry in engine.cache:
            for pos, full in enumerate(engine.cached_full_slots(entry)):
                slot = engine.group_slot(group, full)
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
    by the ``FULL`` group's next ``HEAD`` and ``TAIL`` verifies, each with ``CHAIN``,
    ``POSITION`` and ``TOKEN`` for the fields in which its buffer's record differs from the one
    it replaced, and not at all when the records are equal (harmless). The ``SWA`` group reads
    the entry only while it is in the window, and through the full-to-SWA table: nothing is
    promised of it (and under a window nothing at all when the ``FULL`` records are equal)."""

    def due(self, engine, fault, buffers):
        dues = []
        for rid, pos in fault.entries:  # the first changed entry of each row
            req = engine.running[rid]
            new = int(engine.req_to_token[req.row, pos])
            for stage in ("HEAD", "TAIL"):
                (tag,) = tags(FULL, stage)
                buf = buffers[tag]
                old, now = _record(buf, engine.full_slot(req, pos)), _record(buf, new)
                bits = 0
                for field, bit in (
                    (CanaryField.PREV_HASH, CHAIN),
                    (CanaryField.POSITION, POSITION),
                    (CanaryField.TOKEN, TOKEN),
                ):
                    bits |= int(bit) if old[field] != now[field] else 0
                if bits:
                    dues.append(Due(new, bits, exact=True, tags=frozenset({tag})))
        if not dues and engine.config.swa_window:
            return None
        return dues, not dues

    def _made(self, engine: Engine, full_slots, entries: tuple, what: str) -> Fault:
        return Fault(self.name, None, frozenset(int(s) for s in full_slots), entries,
                     f"{self.name}: {what}")  # fmt: skip


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
        places = verified_next(engine, FULL)
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
                if r.rid != req.rid and engine.full_slot(r, p) != old
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
        pages = [(req, pos) for req, pos, _ in page_heads(engine) if pos + p <= req.written]
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
    ``TOKEN`` by the ``FULL`` group's next ``HEAD`` and ``TAIL`` verifies of its first owner
    (which slot is known only once the settle wrote it); nothing is promised of the ``SWA``
    group, whose window may have left the page, nor when the first owner never runs again
    in the settle (in a mixed batch the new owner's writes race it, and it waits)."""

    frees_pages_in_use = True
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

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        ((owner, _),) = fault.entries
        if engine.last_run.get(owner, -1) <= fault.made_at:
            return None  # its first owner never ran again (a mixed batch held it back)
        bits = CHAIN | POSITION | TOKEN
        return [Due(-1, bits, tags=tags(FULL, stage)) for stage in ("HEAD", "TAIL")]


class LockedNodeEvicted(FaultClass):
    """The prefix cache evicts a page that running requests hold (SGLang's radix cache locks the
    nodes on a running request's path; this eviction ignores the lock): the cached prefix is cut
    down past that page and the page goes back to the allocator, first in line, while its
    holders go on naming it. The next request to allocate writes it: reported at a slot of that
    page, with ``CHAIN``, ``POSITION`` or ``TOKEN``, by the ``FULL`` group's next ``HEAD`` and
    ``TAIL`` verifies of a holder; nothing is promised when no other request wrote the page or
    no holder ran again."""

    frees_pages_in_use = True
    name = "locked_node_evicted"
    description = "the prefix cache evicts a page running requests hold"

    def make(self, engine, pick, byte):
        p = engine.config.page_size
        places = []
        for entry in engine.cache:
            for j, page in enumerate(entry.pages):
                holders = tuple(
                    r.rid
                    for r in sorted(engine.running.values(), key=lambda r: r.rid)
                    if page in r.pages[: -(-r.written // p)] and engine.will_run(r)
                )
                if holders and engine.cache_refs[page] == 1:
                    places.append((entry, j, page, holders))
        place = pick_from(places, pick)
        if place is None:
            return None
        entry, j, page, holders = place
        length = entry.length
        engine.truncate(entry, j + 1)  # the unlocked leaves past it go first
        engine.cache_refs[page] = 0
        engine.req_refs[page] = 0  # the lock ignored: the page is free
        engine.free_pages.insert(0, page)  # the next allocation takes it
        entry.pages, entry.length = entry.pages[:j], j * p
        entry.tokens = entry.tokens[: entry.length + engine.config.offset]
        if not entry.pages:
            engine.cache.remove(entry)
        what = (
            f"{self.name}: a cached prefix of {length} cut to {j * p}, page {page} freed while "
            f"requests {list(holders)} hold it"
        )
        entries = tuple((rid, 0) for rid in holders)
        return Fault(self.name, None, frozenset(range(page * p, (page + 1) * p)), entries, what)

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        holders = {rid for rid, _ in fault.entries}
        page = min(fault.slots) // engine.config.page_size
        if not ran_after_another_wrote(engine, {page}, holders, fault.made_at):
            return None  # no other request wrote the page before a holder ran again
        bits = CHAIN | POSITION | TOKEN
        return [Due(-1, bits, tags=tags(FULL, stage)) for stage in ("HEAD", "TAIL")]


class _Rebind(_TableFault):
    """A radix insert that rebinds wrongly: a request admitted with the tokens of a cached
    prefix's first ``n`` pages, computed again (:meth:`engine_model.engine.Engine.admit_twin`),
    prefills them and one token more (its own step) and is inserted
    (:meth:`engine_model.engine.Engine.rebind` with :attr:`fault`): its first ``n`` pages are
    duplicates of the cache's. ``n`` is the fewest pages whose positions in the request's window
    then still have their SWA slots (the model rebinds only where they do:
    :meth:`engine_model.engine.Engine.tree_match`)."""

    fault = ""
    spare_pages = 0  # cached pages the fault needs past the ``n`` rebound

    def make(self, engine, pick, byte):
        c = engine.config
        p = c.page_size
        if engine.prompt_rows(1) or not engine.free_rows:
            return None  # the twin's prefill is to run alone, and in full
        places = []
        for entry in engine.cache:
            for n in range(1, len(entry.pages) - self.spare_pages + 1):
                if n * p + 2 > c.context_len:  # the twin writes n pages and a token, and runs on
                    break
                if engine.window_resident(entry, range(engine.window_start(n * p + 1), n * p)):
                    places.append((entry, n))
                    break
        place = pick_from(places, pick)
        if place is None:
            return None
        entry, n = place
        rid = engine.admit_twin(0, 1, pages=n, entry=entry)
        if rid is None:
            return None
        step = engine.prefill(n * p + 1)
        if step is None:  # no room: the twin waits, nothing ran
            return None
        req = engine.running[rid]
        assert req.written == n * p + 1, engine.describe()
        # the prefill's SWA slots may have taken some of the window's from the cache (SWA
        # pressure): the insert then rebinds fewer pages, or none
        own = req.pages[: engine.tree_match(req, entry)[1] // p]
        _, rebound = engine.rebind(req, entry, fault=self.fault)
        assert rebound == list(enumerate(own)), (rebound, own)
        engine.cache_prefix(req)
        if not own:
            what = f"{self.name}: nothing rebound (the SWA pool took the window's slots)"
            return Fault(self.name, None, frozenset(), (), what, steps=(step,))
        return self.made(engine, req, own, entry, step)

    def due(self, engine, fault, buffers):
        if not fault.slots:
            return None  # nothing was rebound
        return super().due(engine, fault, buffers)

    def made(self, engine: Engine, req, own: list, entry, step) -> Fault:
        raise NotImplementedError


class RebindOffByOnePage(_Rebind):
    """The insert rebinds the request's row to the cache's pages one page off: each rebound
    page names the cache's next page (positions a page later), whose records are other
    positions'. Reported at the first position's slot now named, like ``req_to_token``, with
    ``POSITION`` always (the record's position is a page later)."""

    name = "rebind_off_by_one_page"
    description = "a radix insert rebinds a row to the cache's pages one page off"
    fault = "off_by_one"
    spare_pages = 1
    place_share = 1 / 2  # a cached prefix of two pages at least, and room for the twin

    def made(self, engine, req, own, entry, step):
        n = len(own)
        what = (
            f"{self.name}: request {req.rid} (row {req.row}) pages {list(entry.pages[:n])} "
            f"rebound as {list(entry.pages[1 : n + 1])} (its own pages {own} freed)"
        )
        slots = frozenset(s for page in entry.pages[1 : n + 1] for s in engine.page_slots(page))
        return Fault(self.name, None, slots, ((req.rid, 0),), what, steps=(step,))


class DuplicateFreedWhileNamed(_Rebind):
    """The insert frees the request's duplicate pages but leaves its row naming them: the
    pages go back to the allocator, first in line, and the next request to allocate writes
    one. Reported at a slot of such a page, like ``freed_while_referenced``, by the ``FULL``
    group's next ``HEAD`` and ``TAIL`` verifies of the request; nothing is promised when no
    other request wrote one or the request did not run again."""

    frees_pages_in_use = True
    name = "duplicate_freed_while_named"
    description = "a radix insert frees duplicate pages its row still names"
    fault = "unbound"

    def made(self, engine, req, own, entry, step):
        for page in reversed(own):
            assert page in engine.free_pages, engine.describe()
            engine.free_pages.remove(page)
            engine.free_pages.insert(0, page)  # the next allocations take them
        what = (
            f"{self.name}: request {req.rid} (row {req.row}) rebound to pages "
            f"{list(entry.pages[: len(own)])}, its duplicate pages {own} freed while its row "
            "names them"
        )
        slots = frozenset(s for page in own for s in engine.page_slots(page))
        return Fault(self.name, None, slots, ((req.rid, 0),), what, steps=(step,))

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        ((rid, _),) = fault.entries
        pages = {s // engine.config.page_size for s in fault.slots}
        if not ran_after_another_wrote(engine, pages, {rid}, fault.made_at):
            return None  # no other request wrote a page before the request ran again
        bits = CHAIN | POSITION | TOKEN
        return [Due(-1, bits, tags=tags(FULL, stage)) for stage in ("HEAD", "TAIL")]


class NextTokenSwap(FaultClass):
    """``perturb/next_token_swap.py``: two requests' sampled next tokens are swapped, so each
    writes the other's token: reported by the ``HEAD`` and the ``TAIL`` write of each, in every
    group, with ``WRITE_TOKEN``, in every hash mode, at the slots the settle writes them to,
    when a ``DECODE`` forward of the target model writes it (the draft model's canary, with the
    EAGLE offset, has its input assert off in every decode, as SGLang's has: it never sees
    it). An extend mode (``EXTEND``, ``MIXED``,
    ``TARGET_VERIFY``) expects its input ids as they are (SGLang's token oracle manager), and
    the expected-token pool holds the swapped token too: a swapped token such a forward writes
    is never reported."""

    name = "next_token_swap"
    description = "two requests' sampled tokens are swapped"
    seen_by_draft_model = False  # its decodes have the input assert off
    unseen_in = {
        mode: f"a {mode} forward writes the swapped token, and an extend mode's expected input is "
        "its input id; the expected-token pool holds the swapped token too"
        for mode in ("MIXED", "TARGET_VERIFY")
    }

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

    def due(self, engine, fault, buffers):
        return [], False  # the slots are known once written: see due_after_settle

    def due_after_settle(self, engine, fault):
        decoded = [e for e in fault.entries if engine.written_by.get(e) == "DECODE"]
        return [
            Due(slot, FailReason.WRITE_TOKEN_MISMATCH, tags=tags(group, stage))
            for group in engine.config.groups
            for slot in sorted(engine.slots_of(decoded, group))
            for stage in ("HEAD", "TAIL")
        ]


# ---------------------------------------------------------------------------------------------
# The forward stores KV where the plan did not say


class _StoreFault(FaultClass):
    """The forward's KV store into one group's pool (the group ``pick`` chooses) goes wrong;
    what the canary can see of it is the slots whose KV changed after their records were
    written. A store fault the settle's forwards never made promises nothing."""

    def due_after_settle(self, engine, fault):
        if engine.hooks.store_fault is not None:
            engine.hooks.store_fault = None  # the store never came: nothing happened
            return None
        if fault.group == SWA and not set(fault.slots) <= set(engine.lut.tolist()):
            return None  # the slot left the window before a verify could see it
        return []


class MisdirectedStore(_StoreFault):
    """The first KV store of the next forward into a group's pool lands in a slot another
    position wrote, not in the slot the plan names (a forward that scatters to a stale
    ``out_cache_loc``): reported at that slot with ``REAL_KV`` by the group's next ``TAIL``
    verify or sweep that reads it, when the mode reads the bytes (a whole row of fresh bytes:
    ``PARTIAL`` and ``ALL``); never in ``NONE``. The slot the store missed keeps its old bytes,
    which its ``TAIL`` write fingerprints as they are: it stays silent."""

    name = "misdirected_store"
    description = "a forward stores a token's KV in a slot another position wrote"
    changes_kv = True

    def make(self, engine, pick, byte):
        places = [(g, r, p) for g in engine.config.groups for r, p in verified_next(engine, g)]
        place = pick_from(places, pick)
        if place is None:
            return None
        group, req, pos = place
        victim = engine.group_slot(group, engine.full_slot(req, pos))

        def store(name: str, slots: np.ndarray, kv: np.ndarray):
            if name != group or not slots.size or slots[0] == victim:
                return None
            slots = slots.copy()
            slots[0] = victim
            return slots, kv

        engine.hooks.store_fault = store
        what = (
            f"{self.name}: the next forward's first KV store into the {group} pool lands in "
            f"slot {victim} (request {req.rid}, position {pos})"
        )
        return Fault(self.name, None, frozenset({victim}), ((req.rid, pos),), what, group)

    def due(self, engine, fault, buffers):
        if engine.config.mode == RealKvHashMode.NONE:
            return [], True
        (victim,) = fault.slots
        return [Due(victim, REAL_KV, tags=tags(fault.group, "TAIL", "SWEEP"))], False


class DroppedStore(_StoreFault):
    """The forward never stores the KV of a request's next position in a group's pool: the
    slot keeps the bytes it held, and the ``TAIL`` write after the forward fingerprints those
    bytes, so the record agrees with them. No mode can see it: the canary checks that a slot's
    KV is what was there when its record was written, not that the model stored it."""

    name = "dropped_store"
    description = "a forward drops the KV store of a token it writes"
    unseeable = (
        "a write fingerprints the bytes its slot holds after the forward, so the record agrees "
        "with the stale bytes a dropped store leaves"
    )

    def make(self, engine, pick, byte):
        ready = [
            (g, r)
            for g in engine.config.groups
            for r in sorted(engine.running.values(), key=lambda r: r.rid)
            if engine.will_run(r)
        ]
        place = pick_from(ready, pick)
        if place is None:
            return None
        group, req = place
        pos = req.written

        def store(name: str, slots: np.ndarray, kv: np.ndarray):
            if name != group or pos >= len(req.pages) * engine.config.page_size:
                return None
            target = engine.group_slot(group, engine.full_slot(req, pos))
            hits = np.flatnonzero(slots == target)
            if not hits.size:
                return None
            keep = np.arange(slots.shape[0]) != hits[0]
            return slots[keep], kv[keep]

        engine.hooks.store_fault = store
        what = (
            f"{self.name}: request {req.rid} position {pos} is written without its KV in the "
            f"{group} pool"
        )
        return Fault(self.name, None, frozenset(), ((req.rid, pos),), what, group)

    def due(self, engine, fault, buffers):
        return [], True


# ---------------------------------------------------------------------------------------------
# The forward and speculative decoding


class PositionsMoved(FaultClass):
    """The model of the next forward moves its first token's position in place (SGLang has an
    option for a model that mutates ``positions``) after the ``HEAD`` launches: the ``TAIL``
    write of each group stores that token's record with the moved position, and reports it with
    ``WRITE_POSITION`` (the expected input positions were taken before the forward); the
    ``HEAD`` launches saw the positions as planned. Every hash mode and forward mode sees it."""

    name = "positions_moved"
    description = "the forward moves a token's position before the TAIL launches"

    def make(self, engine, pick, byte):
        ready = [r for r in engine.running.values() if engine.will_run(r)]
        if not ready:
            return None
        engine.hooks.positions_fault = 1 + pick % 3
        engine.hooks.positions_fault_made = None
        what = f"{self.name}: the next forward moves its first position by {1 + pick % 3}"
        return Fault(self.name, None, frozenset(), (), what)

    def due(self, engine, fault, buffers):
        return [], False  # the slot is known once the forward ran: see due_after_settle

    def due_after_settle(self, engine, fault):
        made, engine.hooks.positions_fault = engine.hooks.positions_fault_made, None
        if made is None:
            return None  # no forward came
        return [
            Due(slot, FailReason.WRITE_POSITION_MISMATCH, tags=tags(group, "TAIL"))
            for group, slot in made.items()
            if slot
        ]


class AcceptOffByOne(FaultClass):
    """EAGLE's accept keeps one draft too many: at the next target verify that rejects a
    draft, the first rejected draft's position stays written (its record holds the draft
    token) and the target's token for that position is sampled as if it were right: reported
    with ``TOKEN`` at that slot by the ``FULL`` group's next ``HEAD`` and ``TAIL`` verifies of
    the request, in every hash mode. Only a target verify accepts drafts: with the settle's
    decodes in another mode nothing happens."""

    name = "accept_off_by_one"
    description = "a target verify keeps one rejected draft as accepted"
    settle_mode = "TARGET_VERIFY"
    target_model_only = True
    unseen_in = {
        mode: f"no draft is accepted in a {mode} forward: the fault is never made"
        for mode in ("DECODE", "MIXED")
    }

    def make(self, engine, pick, byte):
        if engine.config.offset or not any(
            r.decoding and engine.will_run(r) for r in engine.running.values()
        ):
            return None
        engine.hooks.accept_fault, engine.hooks.accept_fault_made = True, None
        what = f"{self.name}: the next target verify that rejects a draft keeps it"
        return Fault(self.name, None, frozenset(), (), what)

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        made, engine.hooks.accept_fault = engine.hooks.accept_fault_made, False
        if made is None:
            return None  # no target verify rejected a draft
        rid, pos, step = made
        req = engine.running.get(rid)
        if req is None or engine.last_run.get(rid, -1) <= step or pos >= req.written:
            return None  # the request never ran again
        slot = engine.full_slot(req, pos)
        return [Due(slot, TOKEN, tags=tags(FULL, stage)) for stage in ("HEAD", "TAIL")]


class RejectedDraftNamed(FaultClass):
    """EAGLE's rollback frees a page of rejected drafts while the request goes on naming it: a
    target verify (the fault's own step) rejects drafts so that a page holding only drafts is
    freed, and the first such page goes back to the allocator, first in line, but stays the
    request's, whose next positions are written there. The next request to allocate takes the
    page, and the two write its slots in turn: reported at a slot both wrote, by the ``FULL``
    group's next ``HEAD`` and ``TAIL`` verifies of the one that wrote it first, once it runs
    after the other's write, with ``CHAIN``, ``POSITION`` or ``TOKEN``; nothing is promised when
    no slot was written by both in that order. The target model's canary only (the draft
    model's runs no target verify)."""

    frees_pages_in_use = True
    name = "rejected_draft_named"
    description = "a rollback frees a rejected draft's page the request still names"
    target_model_only = True
    drafts = 3

    def make(self, engine, pick, byte):
        c = engine.config
        p = c.page_size
        rows = [r for r, _ in engine.decode_rows()]
        if c.offset or not rows or any(r.written + self.drafts > c.context_len for r in rows):
            return None
        frees = []  # the accepts (``target_verify``'s) after which a row frees a page
        for accept in range(self.drafts):
            for i, r in enumerate(rows):
                kept = r.written + (accept + i) % self.drafts + 1
                held = max(len(r.pages), -(-(r.written + self.drafts) // p))
                if -(-kept // p) < held:
                    frees.append(accept)
                    break
        accept = pick_from(frees, pick)
        if accept is None:
            return None
        engine.hooks.rollback_fault, engine.hooks.rollback_fault_made = True, None
        step = engine.target_verify(self.drafts, accept)
        if step is None:  # no room for the drafts' pages
            engine.hooks.rollback_fault = False
            return None
        assert engine.hooks.rollback_fault_made is not None, engine.describe()
        rid, page = engine.hooks.rollback_fault_made
        what = (
            f"{self.name}: the target verify's rollback frees request {rid}'s page {page} "
            "of rejected drafts, which it still names"
        )
        slots = frozenset(engine.page_slots(page))
        return Fault(self.name, None, slots, ((rid, 0),), what, steps=(step,))

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        rid, page = engine.hooks.rollback_fault_made
        p = engine.config.page_size
        writes: dict[int, list] = {}  # slot: (step, request) of each write of the page
        for (who, pos), step in engine.written_at.items():
            req = engine.running.get(who)
            if req is not None and pos < req.written and req.pages[pos // p] == page:
                writes.setdefault(page * p + pos % p, []).append((step, who))
        dues = []
        for slot, both in writes.items():
            both.sort()
            first = both[0][1]  # the request that wrote the slot first
            others = [step for step, who in both if who != first]
            if rid not in {who for _, who in both} or not others:
                continue
            if engine.last_run.get(first, -1) > min(others):  # it ran after the other's write
                dues += [Due(slot, CHAIN | POSITION | TOKEN, any_of=True, tags=tags(FULL, s))
                         for s in ("HEAD", "TAIL")]  # fmt: skip
                break
        return dues or None


# ---------------------------------------------------------------------------------------------
# KV that moves without a forward


def first_report(
    dst: list[int], bad: list, good: list, *, tag: int, tokens: bool
) -> tuple[str, Due | None]:
    """What the first verify of a moved run of positions reports, in position order: ``dst``
    the slot of each position (the verify reads them as one chain), ``bad[i]`` the record of
    ``dst[i]`` after the move and the fingerprint of its KV then, ``good[i]`` what a correct
    move leaves there (a source's records, whose chain and fingerprints agree). Up to the first
    position where they differ the verify reads a correct chain, so at that position it expects
    the good record: it reports ``TOKEN`` (when ``tokens`` are checked), ``POSITION`` and
    ``CHAIN`` for each field that differs, and ``REAL_KV`` where the record's fingerprint is
    not that of the KV. ``("report", due)``; ``("silent", None)`` where nothing differs;
    ``("unsure", None)`` where the first difference is one the verify does not read (a token
    under a sweep), after which the chain says little."""
    for slot, (rec, fp), (want, want_fp) in zip(dst, bad, good, strict=True):
        if tuple(rec) == tuple(want) and fp == want_fp:
            continue
        bits = 0
        if tokens and rec[CanaryField.TOKEN] != want[CanaryField.TOKEN]:
            bits |= TOKEN
        if rec[CanaryField.POSITION] != want[CanaryField.POSITION]:
            bits |= POSITION
        if rec[CanaryField.PREV_HASH] != want[CanaryField.PREV_HASH]:
            bits |= CHAIN
        if rec[CanaryField.REAL_KV_HASH] != fp:
            bits |= REAL_KV
        if not bits:
            return "unsure", None
        return "report", Due(slot, bits, exact=True, tags=frozenset({tag}))
    return "silent", None


def _fingerprints(kv: np.ndarray, slots: list[int], mode: int) -> list[int]:
    """The real-KV hash of each slot of a group's pool in ``mode``."""
    source = (reference.Source(kv, 1, KV_BYTES, KV_BYTES),)
    return [int(h) for h in reference.fingerprint(source, np.asarray(slots, np.int64), mode=mode)]


def _seen(engine: Engine, buf: np.ndarray, kv: np.ndarray | None, slots: list[int]) -> list:
    """``(record, fingerprint of the KV)`` of each slot (a head buffer: no KV source, 0)."""
    fps = [0] * len(slots) if kv is None else _fingerprints(kv, slots, engine.config.mode)
    return [(tuple(_record(buf, s).tolist()), fp) for s, fp in zip(slots, fps, strict=True)]


class _MoveFault(FaultClass):
    """KV that moves without a forward (:class:`engine_model.engine.Move`) goes wrong in the
    ``FULL`` pool; the move is the fault's own step, and its prediction is judged once the move
    ran: :func:`first_report` of the destination's records and KV against the source's, for
    each launch that verifies the moved positions next (:attr:`stages`)."""

    moves_kv = True
    #: the launches that verify the moved positions next, with whether they check tokens
    stages: tuple[str, ...] = ()

    def moves(self, engine: Engine, pick: int) -> list:
        """The steps of the faulty move (none: no place)."""
        raise NotImplementedError

    def make(self, engine, pick, byte):
        steps = self.moves(engine, pick)
        if not steps:
            return None
        assert engine.last_move is not None
        src, dst = engine.last_move
        what = f"{self.name}: {engine.log[-1]}"
        return Fault(
            self.name, None, frozenset(dst), (), what, steps=tuple(steps),
            moved=tuple(zip(src, dst, strict=True)),
        )  # fmt: skip

    def source(self, buffers: dict) -> dict:
        """The buffers the moved records and KV came from."""
        return buffers

    def due(self, engine, fault, buffers):
        moved = self.positions(engine, fault)
        src, dst = [s for s, _ in moved], [d for _, d in moved]
        origin = self.source(buffers)
        dues = []
        for stage in self.stages:
            (tag,) = tags(FULL, stage)
            tail = stage != "HEAD"
            bad = _seen(engine, buffers[tag], buffers["KV", FULL] if tail else None, dst)
            good = _seen(engine, origin[tag], origin["KV", FULL] if tail else None, src)
            verdict, report = first_report(dst, bad, good, tag=tag, tokens=stage != "SWEEP")
            if verdict == "unsure":
                return None
            if report is not None:
                dues.append(report)
        return dues, not dues

    def positions(self, engine: Engine, fault: Fault) -> tuple:
        """The moved positions the next verify reads, as ``(source, destination)``."""
        return fault.moved


class _Reload(_MoveFault):
    """A cached prefix no request uses is offloaded to the host and reloaded into other pages
    (HiCache, :meth:`engine_model.engine.Engine.relocate`), but one half of what a slot holds
    stays behind: reported by the ``FULL`` group's cache sweep (the settle's last step) at the
    first moved position whose record or KV differs from the source's, with the reasons
    :func:`first_report` gives; nothing where they agree."""

    stages = ("SWEEP",)
    kv, records = True, True

    def moves(self, engine, pick):
        return engine.relocate(pick, kv=self.kv, records=self.records)


class KvMovedWithoutRecords(_Reload):
    """HiCache reloads a cached prefix's KV into other slots without its records: the new
    slots keep the records of whatever they held before, so the sweep reports them, in every
    hash mode (their positions and chain are another's; their fingerprints another KV's)."""

    name = "kv_moved_without_records"
    description = "a cached prefix's KV is reloaded into other slots without its records"
    records = False


class RecordsMovedWithoutKv(_Reload):
    """HiCache moves a cached prefix's records into other slots but not its KV: the records
    agree with one another, the new slots' KV bytes are stale, so the sweep reports
    ``REAL_KV`` where the mode reads the bytes; never in ``NONE``."""

    name = "records_moved_without_kv"
    description = "a cached prefix's records are reloaded into other slots without its KV"
    kv = False

    def why_never(self, hash_mode, forward_mode="DECODE"):
        if hash_mode == RealKvHashMode.NONE:
            return "NONE reads no KV byte, and the records moved intact"
        return super().why_never(hash_mode, forward_mode)


class _Transfer(_MoveFault):
    """A PD transfer (:meth:`engine_model.engine.Engine.receive`: the prefill engine's forward,
    its pages sent page by page with the records spliced in, received into this engine's
    pages) goes wrong for whole pages: reported by the ``FULL`` group's next ``HEAD`` and
    ``TAIL`` verifies of the received request (the first in the settle where it decodes), at
    the first received position whose record or KV differs from the prefill engine's, with the
    reasons :func:`first_report` gives; nothing is promised when the request never ran again."""

    stages = ("HEAD", "TAIL")

    def source(self, buffers):
        return buffers[PREFILL_ENGINE]

    def make(self, engine, pick, byte):
        fault = super().make(engine, pick, byte)
        if fault is None:
            return None
        rid = max(engine.running)  # the received request is the newest
        written = engine.running[rid].written
        return dataclasses.replace(fault, entries=((rid, 0),), moved=fault.moved[:written])

    def due_after_settle(self, engine, fault):
        ((rid, _),) = fault.entries
        if engine.last_run.get(rid, -1) <= fault.made_at:
            return None  # the received request never ran again
        return []

    @staticmethod
    def tokens(engine: Engine) -> int:
        """A prompt of two pages and a bit (one page and a bit where the row is short)."""
        c = engine.config
        return min(2 * c.page_size + 1, c.context_len - 2 * c.offset) + c.offset


class TransferPageLeftOut(_Transfer):
    """A PD transfer leaves one page out: the received page keeps what this engine's slots
    held before (another request's records and KV, or the buffers' first bytes)."""

    name = "transfer_page_left_out"
    description = "a PD transfer leaves one page of a request out"

    def moves(self, engine, pick):
        return engine.receive(self.tokens(engine), left_out=pick)


class TransferPagesSwapped(_Transfer):
    """A PD transfer lands two neighbouring pages in each other's place, records and KV
    together: the records agree with their KV, but sit at another position's slot."""

    name = "transfer_pages_swapped"
    description = "a PD transfer lands two pages of a request in each other's place"

    def moves(self, engine, pick):
        written = self.tokens(engine) - engine.config.offset
        if written <= engine.config.page_size:
            return []  # one page: nothing to swap
        return engine.receive(self.tokens(engine), swapped=pick)


def ran_after_another_wrote(engine: Engine, pages: set, readers: set, since: int) -> bool:
    """Whether a request of ``readers`` ran after a request not among them wrote a slot of
    ``pages`` at a step after ``since`` (its verify then read what that write left)."""
    p = engine.config.page_size
    writes = [
        step
        for (who, pos), step in engine.written_at.items()
        if step > since
        and who not in readers
        and who in engine.running
        and pos < engine.running[who].written
        and engine.running[who].pages[pos // p] in pages
    ]
    return bool(writes) and any(
        rid in engine.running and engine.last_run.get(rid, -1) > min(writes) for rid in readers
    )


def verified_next(engine: Engine, group: str = FULL) -> list:
    """``(request, position)`` of every written position the next forward of its request
    verifies in ``group`` (the whole prefix in ``FULL``, the window it will have then in
    ``SWA``, where the slot is not evicted): where a fault is seen next."""
    out = []
    for req in sorted(engine.running.values(), key=lambda r: r.rid):
        if not engine.will_run(req):
            continue
        for pos in range(engine.window_start(req.written, group), req.written):
            if engine.group_slot(group, engine.full_slot(req, pos)):
                out.append((req, pos))
    return out


def page_heads(engine: Engine) -> list:
    """``(request, position, page)`` of each place of :func:`verified_next` in ``FULL`` that is
    the first position of its page."""
    p = engine.config.page_size
    return [(req, pos, req.pages[pos // p]) for req, pos in verified_next(engine) if pos % p == 0]


# ---------------------------------------------------------------------------------------------
# The registry

#: The ``req_to_token`` class, which the pipeline property's page-table change uses too.
REQ_TO_TOKEN = ReqToToken()
#: Every fault class by name, in the order of the suite's parameters and the detection table:
#: SGLang's five self-test perturbations, two allocator bugs, a cache that evicts a locked
#: page, two radix inserts that rebind wrongly, two bugs of the forward's KV
#: store, a forward that moves positions, an off-by-one accept of speculative decoding, and four
#: of KV that moves without a forward (HiCache's reload, a PD transfer).
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
        LockedNodeEvicted(),
        RebindOffByOnePage(),
        DuplicateFreedWhileNamed(),
        MisdirectedStore(),
        DroppedStore(),
        PositionsMoved(),
        AcceptOffByOne(),
        RejectedDraftNamed(),
        KvMovedWithoutRecords(),
        RecordsMovedWithoutKv(),
        TransferPageLeftOut(),
        TransferPagesSwapped(),
    )
}
#: The names of the fault classes.
FAULT_KINDS = tuple(FAULTS)
#: The fault classes that change KV bytes and nothing else.
KV_FAULTS = tuple(name for name, c in FAULTS.items() if c.changes_kv)
#: The fault classes that flip the drawn byte of one slot's KV.
KV_BYTE_FAULTS = tuple(name for name, c in FAULTS.items() if c.flips_byte)
#: The fault classes that move KV without a forward.
MOVE_FAULTS = tuple(name for name, c in FAULTS.items() if c.moves_kv)
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
        fault = dataclasses.replace(fault, made_at=engine.steps)
        engine.log.append(f"FAULT {fault.what}")
    return fault
