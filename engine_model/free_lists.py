"""An engine's free lists: which pages and pool rows come next.

That is an allocator's choice, made by the allocators the engine's configuration names
(:attr:`engine_model.config.EngineConfig.allocators`, :data:`BACKENDS`): ``"model"``, this
module's own lists in SGLang's orders (:class:`PageList`, :class:`RowList`), or others
registered with :func:`register` (the suite registers ``"sglang"``: SGLang's own allocators and
request pool, and its radix cache's eviction walk, which then chooses the cached nodes an
eviction takes, :data:`EVICTIONS`, and its radix tree's insert and match, which then hold the
engine's, :data:`TREES`; run from the installed release's source,
``conformance/sglang/memory.py``, ``conformance/sglang/radix_tree.py``).
Whatever they choose, the engine keeps the bookkeeping around it
(:mod:`engine_model.allocators`: who holds a page, the SWA slots, the prefix cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from engine_model.config import EngineConfig

__all__ = [
    "BACKENDS",
    "EVICTIONS",
    "PageAllocator",
    "PageList",
    "RowAllocator",
    "RowList",
    "TREES",
    "TreeCode",
    "make_allocators",
    "register",
]


class PageAllocator(Protocol):
    """What an engine asks of its page allocator (pages are numbered from 1; page 0 is the
    padding page)."""

    def order(self) -> list[int]:
        """The free pages, first in line first (a list the caller does not change)."""

    def alloc(self, n: int) -> list[int] | None:
        """``n`` pages, or None (nothing taken) when fewer are free."""

    def free(self, pages: list[int]) -> None:
        """One free call of ``pages`` (a request's release frees its pages in one)."""

    def first_in_line(self, pages: list[int]) -> None:
        """Make ``pages`` the first in line, in their order, whether they were free or not (a
        fault frees a page in use so; the engine puts back pages it left out of an
        allocation)."""


class RowAllocator(Protocol):
    """What an engine asks of its request pool (rows numbered from 1; row 0 is padding)."""

    def order(self) -> list[int]:
        """The free rows, last in line first."""

    def take(self) -> int:
        """A free row (there is one)."""

    def give(self, row: int) -> None:
        """``row`` back."""


class PageList:
    """The model's page allocator: a list of free pages in SGLang's order. With pages of one
    slot, ``TokenToKVPoolAllocator.free`` appends a free call's pages (the next allocations
    take the longest free first); with larger pages, ``PagedTokenToKVPoolAllocator.free`` puts
    them, sorted, before every free page (the next allocations take them first). A PD decode
    server sorts its free pages instead (``need_sort``), which the engine does not model: its
    one allocator runs the order of a server without PD. ``conformance/sglang/memory.py`` holds
    it to SGLang's own (``departures``)."""

    def __init__(self, page_size: int, pages: list[int]):
        self.page_size, self._free = page_size, list(pages)

    def order(self) -> list[int]:
        return self._free

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        taken = self._free[:n]
        del self._free[:n]
        return taken

    def free(self, pages: list[int]) -> None:
        if self.page_size == 1:
            self._free.extend(pages)
        else:
            self._free[:0] = sorted(pages)

    def first_in_line(self, pages: list[int]) -> None:
        self._free[:] = pages + [page for page in self._free if page not in pages]


class RowList:
    """The model's request pool: ``ReqToTokenPool.alloc_rows`` takes the tail of its free list
    (the row freed last), ``free_rows`` appends."""

    def __init__(self, rows: list[int]):
        self._free = list(rows)

    def order(self) -> list[int]:
        return self._free

    def take(self) -> int:
        return self._free.pop()

    def give(self, row: int) -> None:
        self._free.append(row)


#: makes an engine's allocators: its configuration, its free pages (first in line first) and
#: its free rows, in their first order
Backend = Callable[[EngineConfig, list[int], list[int]], tuple[PageAllocator, RowAllocator]]

#: the allocators an engine can run on, by the name its configuration gives
BACKENDS: dict[str, Backend] = {
    "model": lambda config, pages, rows: (PageList(config.page_size, pages), RowList(rows)),
}


#: which cached nodes an eviction for ``tokens`` slots takes, in order (each its pages), given
#: the engine; by the name of the allocators that choose so (none: the engine's own walk,
#: :meth:`engine_model.eviction.Eviction.evict_for`)
EvictionWalk = Callable[[Any, int], list[tuple[int, ...]]]
EVICTIONS: dict[str, EvictionWalk] = {}


class TreeCode(Protocol):
    """A radix tree's own code that holds an engine's insert and match: each runs the engine's
    own step (``step``) beside its code's over the same tree, and raises ``AssertionError``
    where they differ."""

    def applies(self, engine: Any) -> bool:
        """Whether it holds this engine's steps now."""

    def insert(self, engine: Any, req: Any, step: Callable[[Any], int]) -> int:
        """The engine's insert of ``req`` (``step(req)``), held; its positions inserted."""

    def match(self, engine: Any, entry: Any, pages: int, step: Callable[[Any, int], None]) -> None:
        """The engine's match of ``pages`` pages of a cached path ``entry``, held."""


#: the radix tree code that holds the inserts and matches of the engines whose allocators are
#: registered by that name (none: the engine's own, unheld)
TREES: dict[str, TreeCode] = {}


def register(
    name: str,
    backend: Backend,
    eviction: EvictionWalk | None = None,
    tree: TreeCode | None = None,
) -> None:
    """Make ``backend`` the allocators of the engines whose configuration names ``name``,
    ``eviction`` (if given) the walk that chooses what their prefix caches evict, and ``tree``
    (if given) the code that holds their prefix caches' inserts and matches."""
    BACKENDS[name] = backend
    if eviction is not None:
        EVICTIONS[name] = eviction
    if tree is not None:
        TREES[name] = tree


def make_allocators(
    config: EngineConfig, pages: list[int], rows: list[int]
) -> tuple[PageAllocator, RowAllocator]:
    """The allocators ``config`` names, over free ``pages`` and ``rows``."""
    try:
        backend = BACKENDS[config.allocators]
    except KeyError:
        raise ValueError(
            f"allocators={config.allocators!r}: none registered by that name "
            f"(registered: {sorted(BACKENDS)}; conformance.sglang.memory registers 'sglang')"
        ) from None
    return backend(config, pages, rows)
