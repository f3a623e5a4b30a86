"""The allocators of an engine: pages of the full pool (each page with an SWA page under a
window, taken from the cached positions no request uses when the SWA pool runs short),
pool rows, and their release. Which free page or row comes next is the choice of the free lists
the configuration names (:mod:`engine_model.free_lists`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine_model.state import EngineState, Request

__all__ = ["Allocators"]


class Allocators(EngineState):
    """Page, row and SWA-slot allocation and release (a mixin of
    :class:`engine_model.engine.Engine`)."""

    #: evict the prefix cache's least-recently-used leaves for ``tokens`` slots
    #: (:meth:`engine_model.eviction.Eviction.evict_for`)
    evict_for: Callable[[int], list[tuple[int, ...]]]

    def _swa_room(self, pages: list[int]) -> bool:
        """Whether the SWA pool has a page for every page of ``pages`` that has none (a page
        freed while in use keeps its SWA page), after taking the SWA pages of cached
        positions no request uses, oldest first, as SGLang's SWA cache evicts under
        pressure."""
        if self.lut is None:
            return True
        need = sum(1 for page in pages if not self.lut[page * self.config.page_size])
        for entry in list(self.cache):
            if len(self.swa_allocator.order()) >= need:
                break
            for full in self.cached_full_slots(entry):
                if self.lut[full] and not self.req_refs[full // self.config.page_size]:
                    self._evict_slots([full])  # its whole SWA page
                    self.events["swa slot of a cached position evicted under pressure"] += 1
        return len(self.swa_allocator.order()) >= need

    def spare_swa_slots(self) -> int:
        """SWA slots an allocation can have now: the free ones and those of cached positions
        no request uses (the whole full pool's when there is no window)."""
        if self.lut is None:
            return self.config.num_slots
        p = self.config.page_size
        cached = {
            full // p
            for entry in self.cache
            for full in self.cached_full_slots(entry)
            if self.lut[full] and not self.req_refs[full // p]
        }
        return (len(self.swa_allocator.order()) + len(cached)) * p

    def _alloc_pages(self, n: int, exclude=()) -> list[int] | None:
        """``n`` pages, each with its SWA slots, or None (nothing taken) when the pools lack
        them; never one of ``exclude`` (the pages a request names already: a page freed while
        its request names it goes to another, as a launch in which one request writes a slot
        twice has no defined result). Short of free pages, the prefix cache first evicts
        least-recently-used leaves for the shortfall, as SGLang's ``alloc_token_slots`` does
        before every allocation."""
        free = [page for page in self.free_pages if page not in exclude]
        if n > len(free):
            self.evict_for((n - len(free)) * self.config.page_size)
            free = [page for page in self.free_pages if page not in exclude]
        if n > len(free) or not self._swa_room(free[:n]):
            return None
        # the excluded free pages (a fault's) stay out of the allocation, first in line after it
        skipped = [page for page in self.free_pages[: n + len(exclude)] if page in exclude]
        self._take_out(skipped)
        pages = self.page_allocator.alloc(n)
        assert pages == free[:n], (pages, free[:n])
        if skipped:
            self.page_allocator.first_in_line(skipped)
        for page in pages:
            if self._freed_at.get(page) == self.steps:
                self.events["a page freed and handed out again within one step"] += 1
        for page in pages:
            self.req_refs[page] += 1
        if self.lut is not None:  # an SWA page for each page without one, in one call
            p = self.config.page_size
            unmapped = [page for page in pages if not self.lut[page * p]]
            swa = self.swa_allocator.alloc(len(unmapped))
            assert swa is not None and len(swa) == len(unmapped), (swa, unmapped)
            for page, swa_page in zip(unmapped, swa, strict=True):
                self.lut[self.page_slots(page)] = np.arange(swa_page * p, (swa_page + 1) * p)
        return pages

    def _release(self, page: int, *, cache: bool) -> None:
        """Drop one hold of ``page``, a request's or (``cache``) the prefix cache's: the page
        goes back to the allocator, its SWA slots freed, once no one holds it."""
        self._release_pages([page], cache=cache)

    def _release_pages(self, pages, *, cache: bool) -> None:
        """Drop one hold of each of ``pages``: those no one holds any more go back to the
        allocator in one free call, as SGLang frees a request's pages
        (:meth:`_return_pages`), their SWA slots freed."""
        refs = self.cache_refs if cache else self.req_refs
        freed = []
        for page in pages:
            refs[page] = max(0, refs[page] - 1)
            if (
                self.req_refs[page] == 0
                and self.cache_refs[page] == 0
                and page not in self.free_pages
                and page not in freed
            ):
                freed.append(page)
        self._return_pages(freed)
        for page in freed:
            self._freed_at[page] = self.steps
            self._evict_slots(self.page_slots(page))

    def _return_pages(self, pages: list[int]) -> None:
        """One free call of ``pages`` to the page allocator, which orders them."""
        if pages:
            self.page_allocator.free(pages)

    def _take_out(self, pages: list[int]) -> None:
        """Take the free ``pages`` out of the allocator's free list (``first_in_line`` puts
        them back)."""
        if pages:
            self.page_allocator.first_in_line(pages)
            assert self.page_allocator.alloc(len(pages)) == pages

    def put_first(self, pages: list[int]) -> None:
        """Make ``pages`` the next the allocator hands out, in their order, free or not (a
        fault frees a page in use for the next allocation to take)."""
        self.page_allocator.first_in_line(list(pages))

    def freed_since(self, page: int, step: int) -> bool:
        """Whether ``page`` went back to the allocator at step ``step`` or later (the step count
        when it was freed: a forward's allocation frees, evicting, before its step is
        counted)."""
        return self._freed_at.get(page, -1) >= step

    def _take_row(self) -> int:
        """A free pool row, the request pool's choice."""
        return self.row_allocator.take()

    def _give_row(self, row: int) -> None:
        """A pool row back to the request pool."""
        self.row_allocator.give(row)

    def _evict_slots(self, slots) -> None:
        """Free the SWA pages of the full slots ``slots``, in one call: every slot of their
        pages loses its SWA slot (its table entry set to 0), as SGLang's ``free_swa`` widens
        a free to whole pages (``_expand_to_full_pages``)."""
        if self.lut is None:
            return
        p = self.config.page_size
        freed = []
        for page in dict.fromkeys(int(s) // p for s in slots):
            if self.lut[page * p]:
                freed.append(int(self.lut[page * p]) // p)
                self.lut[self.page_slots(page)] = 0
        if freed:
            self.swa_allocator.free(freed)

    def _cache_pages(self, n: int) -> list[int] | None:
        """``n`` pages for the prefix cache (held by it, not by a request), or None."""
        pages = self._alloc_pages(n)
        for page in pages or ():
            self.req_refs[page] -= 1
            self.cache_refs[page] += 1
        return pages

    def _release_request(self, req: Request) -> None:
        """Release the pages ``req`` holds and give its pool row back, remembering its owner
        and the tokens it knew (a recycled row keeps the old owner's tail)."""
        self._release_pages(req.pages, cache=False)
        self._give_row(req.row)
        self._row_last_len[req.row] = (req.rid, len(req.tokens))
