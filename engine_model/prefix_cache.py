"""The prefix cache of an engine: cached prefixes (:class:`engine_model.state.CacheEntry`, a
radix tree's leaf paths), a new or readmitted request's match, a running request's insert and
the rebind of its row to the cache's pages, and the sweep that verifies every slot the cache
holds; its radix nodes and their eviction are :mod:`engine_model.eviction`'s.
"""

from __future__ import annotations

import numpy as np

from engine_model.config import pick_from
from engine_model.eviction import Eviction
from engine_model.free_lists import TREES
from engine_model.state import CacheEntry, Request
from engine_model.steps import Sweep, SweepGroup

__all__ = ["PrefixCache"]


class PrefixCache(Eviction):
    """The prefix cache (a mixin of :class:`engine_model.engine.Engine`)."""

    def cache_prefix(self, req: Request) -> int:
        """Put the page-aligned prefix ``req`` wrote into the prefix cache; its length. The
        radix nodes the insert walks are touched, split or made
        (:meth:`~engine_model.eviction.Eviction.touch_insert`)."""
        c = self.config
        k = req.written // c.page_size * c.page_size
        if not k:
            return k
        pages = tuple(req.pages[: k // c.page_size])
        tokens = tuple(req.tokens[: k + c.offset])
        for entry in self.cache:  # a path the cache holds already: a radix insert extends it
            if entry.pages[: len(pages)] == pages:
                self.touch_insert(entry, len(pages))
                return k
            if pages[: len(entry.pages)] == entry.pages:
                walked = len(entry.pages)
                for page in pages[walked:]:
                    self.cache_refs[page] += 1
                entry.pages, entry.tokens, entry.length = pages, tokens, k
                self.touch_insert(entry, walked, len(pages) - walked)
                return k
        for page in pages:
            self.cache_refs[page] += 1
        left = max(self.cache, key=lambda e: _common(e.pages, pages), default=None)
        walked = 0 if left is None else _common(left.pages, pages)
        entry = CacheEntry(tokens, pages, k)
        self.cache.append(entry)
        self.touch_insert(entry, walked, len(pages) - walked, left)
        return k

    def _match(self, req: Request) -> int:
        """Share with ``req`` (written 0, in its row) the longest cached page-aligned prefix of
        its tokens that leaves it a token to compute and whose window is resident; its length."""
        c = self.config
        best, best_k = self.tree_match(req, limit=len(req.tokens) - c.offset - 1)
        if best is None:
            return 0
        self.touch_match(best, best_k // c.page_size)
        req.pages = list(best.pages[: best_k // c.page_size])
        for page in req.pages:
            self.req_refs[page] += 1
        for pos in range(best_k):
            self.req_to_token[req.row, pos] = self.full_slot(req, pos)
        req.written = best_k
        return best_k

    def _window_present(self, entry: CacheEntry, k: int) -> bool:
        """Whether the window of a row that shares ``k`` positions of ``entry`` is resident."""
        return self.window_resident(entry, range(self.window_start(k), k))

    def insertable(self) -> list:
        """The running requests that have written a page, by request id."""
        p = self.config.page_size
        return [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.written >= p]

    def insert(self, pick: int, rid: int | None = None) -> int | None:
        """A running request's page-aligned written prefix goes into the prefix cache
        (:meth:`checkpoint`, held to SGLang's ``checkpoint_into_tree``; every
        extend forward makes this insert for its prompt rows, :meth:`Engine.prefill`; an event
        that picks a request here may take its decoded positions too, which SGLang inserts only
        when the request finishes, a named choice of the legs' histories): where the cache holds a
        prefix of the same tokens in other pages, the request's row is rebound to the cache's
        pages and its own duplicate pages freed (``rid``: that request, not one ``pick``
        chooses). The positions inserted, or None."""
        able = self.insertable()
        req = (
            pick_from(able, pick) if rid is None else next((r for r in able if r.rid == rid), None)
        )
        if req is None:
            return None
        free = len(self.free_pages)
        k = self.checkpoint(req)
        freed = len(self.free_pages) - free
        self.log.append(f"insert: request {req.rid}, {k} positions, {freed} pages freed")
        return k

    def checkpoint(self, req: Request) -> int:
        """Insert ``req``'s page-aligned written prefix into the prefix cache as SGLang's
        ``checkpoint_into_tree`` does (``mem_cache/unified_radix_cache.py``; the SGLang legs'
        self-tests run it from source and hold this to it, ``conformance/sglang/
        radix_tree.py``): the row is rebound to the cache's pages where the cache holds those
        tokens in others, the request's duplicates freed (:meth:`rebind`), the prefix inserted
        (:meth:`cache_prefix`), and, where it goes past the page-aligned prompt, the node
        holding the prompt's end split there (SGLang's second insert, of the prompt's key, so
        that an eviction can drop the output without the prompt). On an engine whose
        allocators' radix tree code is registered (:data:`engine_model.free_lists.TREES`), that
        code holds it. The positions inserted."""
        tree = TREES.get(self.config.allocators)
        if tree is not None and tree.applies(self):
            return tree.insert(self, req, self._checkpoint)
        return self._checkpoint(req)

    def _checkpoint(self, req: Request) -> int:
        """:meth:`checkpoint`, the engine's own."""
        c = self.config
        self.rebind(req)
        k = self.cache_prefix(req)
        prompt = (req.prompt - c.offset) // c.page_size
        if 0 < prompt * c.page_size < k:
            n = k // c.page_size
            entry = next(e for e in self.cache if e.pages[:n] == tuple(req.pages[:n]))
            self.touch_insert(entry, prompt)
            self.events["an insert split at the prompt's end"] += 1
        return k

    def tree_match(
        self, req: Request, entry: CacheEntry | None = None, limit: int | None = None
    ) -> tuple[CacheEntry | None, int]:
        """The cached prefix (``entry``, or the longest of all) with the longest page-aligned
        run of ``req``'s tokens, up to ``limit`` positions (None: those it wrote), whose slots
        in ``req``'s window (once it has written them) have their SWA slots: ``(entry,
        positions)``, ``(None, 0)`` for none. (The model shares or rebinds no position of the
        window whose SWA slot the cache lost; what SGLang's SWA radix cache does then is not
        modelled.)"""
        c = self.config
        best, best_m = None, 0
        k = (req.written if limit is None else limit) // c.page_size * c.page_size
        for e in self.cache if entry is None else [entry]:
            m = min(e.length, k)
            while m > 0 and (
                tuple(req.tokens[: m + c.offset]) != e.tokens[: m + c.offset]
                or not self.window_resident(e, range(self.window_start(max(req.written, m)), m))
            ):
                m -= c.page_size
            if m > best_m:
                best, best_m = e, m
        return best, best_m

    def window_resident(self, entry: CacheEntry, positions: range) -> bool:
        """Whether each of ``positions`` of a cached prefix still has its SWA slot (always,
        without a window)."""
        if self.lut is None:
            return True
        full = self.cached_full_slots(entry)
        return all(self.lut[full[pos]] for pos in positions)

    def rebind(
        self, req: Request, entry: CacheEntry | None = None, *, fault: str = ""
    ) -> tuple[CacheEntry | None, list[tuple[int, int]]]:
        """Rebind ``req``'s row to the pages of the cached prefix :meth:`tree_match` finds, where
        its own pages hold the same tokens: each such page of the request is replaced by the
        cache's (the row's page table names the cache's slots) and freed, a duplicate.
        ``fault`` makes it wrong (:mod:`engine_model.faults`): ``"off_by_one"`` names, for each
        rebound page, the cache's next page; ``"unbound"`` frees the duplicates but leaves the
        table naming them. ``(entry, [(page index, duplicate freed)])``."""
        c = self.config
        p = c.page_size
        entry, m = self.tree_match(req, entry)
        if entry is None:
            return None, []
        rebound = [(i, req.pages[i]) for i in range(m // p) if req.pages[i] != entry.pages[i]]
        for i, old in rebound:
            self.req_refs[entry.pages[i]] += 1
            req.pages[i] = entry.pages[i]
            self._release(old, cache=False)  # the duplicate
            named = entry.pages[i + 1] if fault == "off_by_one" else entry.pages[i]
            if fault != "unbound":
                self.req_to_token[req.row, i * p : (i + 1) * p] = self.page_slots(named)
        if rebound:
            self.events["an insert rebound a row to the cache's pages"] += 1
            moved = {(req.rid, i * p + j) for i, _ in rebound for j in range(p)}
            self.last_written = [e for e in self.last_written if e not in moved]
        return entry, rebound

    def sweep(self) -> Sweep | None:
        """Every slot the cache holds, as each group's verify plan entries (translated, like
        SGLang's radix sweep; an evicted SWA slot is 0, which verify skips); None where the
        cache is empty or the canary sweeps none (``EngineConfig.cache_swept``)."""
        if not self.config.cache_swept:
            return None
        full, positions = [], []
        for entry in self.cache:
            full.append(self.cached_full_slots(entry))
            positions += list(range(entry.length))
        if not full:
            return None
        self.steps += 1
        self.log.append(f"sweep: {len(positions)} cached slots")
        groups = []
        for group in self.config.groups:
            slots = [self.group_slot(group, s) for run in full for s in run]
            prevs = [
                p for run in full for p in [-1] + [self.group_slot(group, s) for s in run[:-1]]
            ]
            groups.append(
                SweepGroup(
                    group, *(np.asarray(x, dtype=np.int64) for x in (slots, positions, prevs))
                )
            )
        return Sweep(tuple(groups))


def _common(a: tuple, b: tuple) -> int:
    """How many leading pages two cached paths share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
