"""Fault classes of the page table and of what hands pages out: an entry naming another
request's slot (``req_to_token``, ``page_swap``), a page freed while in use
(``freed_while_referenced``, ``locked_node_evicted``) and a radix insert that rebinds a row
wrongly (``rebind_off_by_one_page``, ``duplicate_freed_while_named``).
"""

from __future__ import annotations

import numpy as np

from engine_model.config import pick_from
from engine_model.engine import Engine
from engine_model.faults.base import (
    CHAIN,
    POSITION,
    TOKEN,
    Due,
    Fault,
    FaultClass,
    page_heads,
    ran_after_another_wrote,
    record,
    tags,
    verified_next,
)
from engine_model.vocabulary import FULL, STAGES
from reference import CanaryField

__all__ = [
    "DuplicateFreedWhileNamed",
    "FreedWhileReferenced",
    "LockedNodeEvicted",
    "PageSwap",
    "RebindOffByOnePage",
    "ReqToToken",
]


class _TableFault(FaultClass):
    """An entry of the page table names a slot another position wrote: reported at that slot
    by the ``FULL`` group's next ``HEAD`` and ``TAIL`` verifies of its request (once it runs
    again), each with ``CHAIN``,
    ``POSITION`` and ``TOKEN`` for the fields in which its buffer's record differs from the one
    it replaced, and not at all when the records are equal (harmless). The ``SWA`` group reads
    the entry only while it is in the window, and through the full-to-SWA table: nothing is
    promised of it (and under a window nothing at all when the ``FULL`` records are equal)."""

    def due(self, engine, fault, buffers):
        dues = []
        for rid, pos in fault.entries:  # the first changed entry of each row
            req = engine.running[rid]
            new = int(engine.req_to_token[req.row, pos])
            for stage in STAGES:
                (tag,) = tags(FULL, stage)
                buf = buffers[tag]
                old, now = record(buf, engine.full_slot(req, pos)), record(buf, new)
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

    def due_after_settle(self, engine, fault):
        """Nothing is promised where a request whose entry changed did not run after the fault
        (an admission of the settle took the SWA pages its next forward waits for): its own
        verify is what reads the entry."""
        ran = all(engine.last_run.get(rid, -1) > fault.made_at for rid, _ in fault.entries)
        return [] if ran else None

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
# The allocator and the prefix cache free a page in use


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
        engine.put_first([page])  # the next allocation takes it
        what = f"page {page} (request {req.rid} positions {pos}..{pos + p - 1}) freed while in use"
        return self._made(engine, range(page * p, (page + 1) * p), ((req.rid, pos),), what)

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        ((owner, _),) = fault.entries
        if engine.last_run.get(owner, -1) <= fault.made_at:
            return None  # its first owner never ran again (a mixed batch held it back)
        bits = CHAIN | POSITION | TOKEN
        return [Due(-1, bits, tags=tags(FULL, stage)) for stage in STAGES]


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
        engine.put_first([page])  # the next allocation takes it
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
        return [Due(-1, bits, tags=tags(FULL, stage)) for stage in STAGES]


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
        step = engine.prefill(n * p + 1, insert=False)  # its insert is the fault's, below
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

    def due_after_settle(self, engine, fault):
        """Nothing is promised where the rebound request did not run after the insert (its
        next forward waiting for SWA pages the running requests hold)."""
        if not fault.entries:
            return []
        ((rid, _),) = fault.entries
        return [] if engine.last_run.get(rid, -1) > fault.made_at else None


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
        assert set(own) <= set(engine.free_pages), engine.describe()
        engine.put_first(list(own))  # the next allocations take them
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
        return [Due(-1, bits, tags=tags(FULL, stage)) for stage in STAGES]
