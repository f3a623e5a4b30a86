"""The radix nodes of the prefix cache and their eviction, as SGLang's unified radix cache keeps
them: a node per run of pages, each with its last access time, and whole least-recently-used
leaf nodes evicted on demand, just before an allocation that finds the allocator short.

The cached prefixes (:class:`engine_model.state.CacheEntry`) are the paths of a radix tree; a
page of the cache belongs to one node of it. Per page the engine keeps whether a node starts
there (``node_head``) and the node's last access time (``node_time``), which every page of the
node shares. The times follow SGLang's ``mem_cache/unified_cache/unified_tree_core.py`` (the
order they give, after each insert and each match, is held to SGLang's insert and match, run,
and the walk over them to SGLang's walk, run, by the SGLang legs' self-tests):

- an insert touches every node its key walks, root first, each with a fresh time
  (``_touch_node``); a key that ends or leaves the tree inside a node splits it there, the upper
  node taking a fresh time and then the lower one another (``_split_node``); what the tree did
  not hold becomes a new leaf, with a fresh time;
- a match that ends inside a node splits it as an insert does, then its post-processor stamps
  the matched path from its deepest node up, one fresh time less a hundred-thousandth a level
  (``_match_post_processor``);
- an eviction (``evict_for_alloc``, reached from ``alloc_token_slots`` and
  ``alloc_paged_token_slots_extend`` through ``evict_to_free_tokens``, ``mem_cache/``) asks for
  the allocation's shortfall in tokens; the full component's walk (``components/full.py``:
  ``_evict_device_start``, ``_evict_device_next_node``) takes the evictable leaves (no child,
  no request's lock) oldest first, frees each node whole in one free call, and pushes a parent
  that became an evictable leaf, until the tokens freed reach the request.

The walk's choices are held to SGLang's own methods, run from source over the same tree, by
``conformance/sglang/memory.py`` (:func:`conformance.sglang.memory.eviction_departures`); on an
engine whose allocators are SGLang's (``EngineConfig.allocators``), those methods choose the
nodes (:data:`engine_model.free_lists.EVICTIONS`) and the engine evicts them. The
node boundaries and times an insert or a match leaves are held to SGLang's insert and match,
run from source (``conformance/sglang/radix_tree.py``). The amount asked for is this module's
reading: the engine allocates row by row and
asks for what the row lacks, where SGLang asks once a batch (for an extend batch on pages
larger than one slot, a conservative count: the extend tokens plus a page a request), a named
difference of the model.
"""

from __future__ import annotations

import heapq

from engine_model.allocators import Allocators
from engine_model.free_lists import EVICTIONS, TREES
from engine_model.state import CacheEntry

__all__ = ["Eviction"]

#: what a match's stamp takes off each level above its deepest node (``_match_post_processor``)
LEVEL_STEP = 0.00001


class Eviction(Allocators):
    """The radix nodes of the prefix cache and their eviction on demand (a mixin of
    :class:`engine_model.engine.Engine`)."""

    def _tick(self) -> float:
        """A fresh access time (``get_and_increase_time_counter``)."""
        self.clock += 1.0
        return self.clock

    def nodes(self, entry: CacheEntry) -> list[tuple[int, int]]:
        """The radix nodes on the path of a cached prefix, root first: ``(first, end)`` page
        indices of each."""
        heads = [i for i, page in enumerate(entry.pages) if i == 0 or self.node_head[page]]
        return list(zip(heads, heads[1:] + [len(entry.pages)]))

    def _stamp(self, entry: CacheEntry, first: int, end: int, time: float) -> None:
        for page in entry.pages[first:end]:
            self.node_time[page] = time

    def _split(self, entry: CacheEntry, at: int) -> None:
        """Split the node of ``entry``'s path that holds page index ``at`` inside it: the upper
        part takes a fresh time, then the lower part another (``_split_node``)."""
        for first, end in self.nodes(entry):
            if first < at < end:
                self._stamp(entry, first, at, self._tick())
                self.node_head[entry.pages[at]] = True
                self._stamp(entry, at, end, self._tick())
                return

    def touch_insert(
        self, entry: CacheEntry, walked: int, new: int = 0, left: CacheEntry | None = None
    ) -> None:
        """An insert whose key walked the first ``walked`` page indices of ``entry``'s path and
        added its last ``new`` pages: each node walked is touched, the node the key left at
        ``walked`` is split there (on ``left``'s path, the one the tree held: default
        ``entry``'s), and the pages added become a new leaf."""
        added = entry.pages[len(entry.pages) - new :] if new else ()
        for i, page in enumerate(added):  # a page's flag is stale from its last owner
            self.node_head[page] = i == 0
        for first, end in self.nodes(entry):
            if first >= walked:
                break
            self._stamp(entry, first, min(end, walked), self._tick())
        self._split(entry if left is None else left, walked)
        if added:
            time = self._tick()
            for page in added:
                self.node_time[page] = time

    def touch_match(self, entry: CacheEntry, matched: int) -> None:
        """A match of the first ``matched`` page indices of ``entry``'s path: the node it ends
        inside is split, then the matched path is stamped from its deepest node up. On an
        engine whose allocators' radix tree code is registered (:data:`engine_model.free_lists.
        TREES`), that code holds it."""
        tree = TREES.get(self.config.allocators)
        if tree is not None and tree.applies(self):
            tree.match(self, entry, matched, self._touch_match)
        else:
            self._touch_match(entry, matched)

    def _touch_match(self, entry: CacheEntry, matched: int) -> None:
        """:meth:`touch_match`, the engine's own."""
        self._split(entry, matched)
        time = self._tick()
        for first, end in reversed([n for n in self.nodes(entry) if n[0] < matched]):
            self._stamp(entry, first, end, time)
            time -= LEVEL_STEP

    def _has_child(self, entry: CacheEntry) -> bool:
        """Whether another cached path goes on past the end of ``entry``'s."""
        n = len(entry.pages)
        return any(len(e.pages) > n and e.pages[:n] == entry.pages for e in self.cache)

    def evictable_leaves(self) -> list[tuple[float, int, CacheEntry, int]]:
        """``(time, index, entry, first page index)`` of each evictable leaf node: the last node
        of a path that no other path goes on from and that no running request holds a page
        of (a request locks the nodes on its path), nor a path being moved (:attr:`moving`,
        the engine's lock of a cached prefix it reloads); held to SGLang's locks, run from
        source, by ``conformance/sglang/radix_tree.py``."""
        out = []
        for i, entry in enumerate(self.cache):
            if not entry.pages or self._has_child(entry) or entry is self.moving:
                continue
            first, _ = self.nodes(entry)[-1]
            if any(self.req_refs[page] for page in entry.pages[first:]):
                continue
            out.append((float(self.node_time[entry.pages[first]]), i, entry, first))
        return out

    def evictable_pages(self) -> int:
        """The cached pages no running request holds: what evictions can free (SGLang's
        ``evictable_size``, in pages)."""
        cached = {page for entry in self.cache for page in entry.pages}
        return sum(1 for page in cached if not self.req_refs[page])

    def evict_for(self, tokens: int) -> list[tuple[int, ...]]:
        """Evict whole leaf nodes, least recently used first, until ``tokens`` slots are freed or
        none is evictable: each node's pages go back to the allocator in one free call, and a
        path left as the prefix of another is dropped (its pages are the other's). The pages of
        each node evicted, in order."""
        p = self.config.page_size
        leaves = self.evictable_leaves()
        heap = [(t, i, first) for t, i, _, first in leaves]
        entries = {i: e for _, i, e, _ in leaves}
        heapq.heapify(heap)
        walk = EVICTIONS.get(self.config.allocators)
        chosen = walk(self, tokens) if walk is not None and heap else None
        freed, evicted = 0, []
        while freed < tokens and heap and chosen != []:
            _, i, first = self._next_leaf(heap, entries, chosen)
            entry = entries[i]
            cut = self.truncate(entry, first)
            evicted.append(tuple(cut))
            freed += len(cut) * p
            self.events["a cached page evicted"] += len(cut)
            if entry in self.cache and self._has_child(entry):
                self.truncate(entry, 0)  # now an inner node of another path
            elif entry in self.cache:  # its last node is a leaf now: evictable unless locked
                parent, _ = self.nodes(entry)[-1]
                if not any(self.req_refs[q] for q in entry.pages[parent:]):
                    time = float(self.node_time[entry.pages[parent]])
                    heapq.heappush(heap, (time, i, parent))
        if evicted:
            self.events["an allocation that evicted cached leaves"] += 1
            self.log.append(f"evict: {len(evicted)} cached nodes, {freed} slots, for {tokens}")
        self.last_evicted = evicted
        return evicted

    def _next_leaf(self, heap: list, entries: dict, chosen: list | None) -> tuple:
        """The next leaf an eviction takes, out of ``heap``: the least recently used, or
        (``chosen``: the nodes a registered walk chose, :data:`engine_model.free_lists.
        EVICTIONS`) the leaf whose pages are the walk's next node; an ``AssertionError`` where
        the engine has no such evictable leaf (the walk and the engine's tree differ)."""
        if chosen is None:
            leaf: tuple = heapq.heappop(heap)
            return leaf
        node = chosen.pop(0)
        for k, (_, i, first) in enumerate(heap):
            if tuple(entries[i].pages[first:]) == node:
                leaf = heap.pop(k)
                heapq.heapify(heap)
                return leaf
        raise AssertionError(
            f"the eviction walk takes the cached node of pages {list(node)}, which is no "
            f"evictable leaf of the engine's prefix cache:\n{self.describe()}"
        )

    def truncate(self, entry: CacheEntry, keep: int) -> list[int]:
        """Cut a cached prefix to its first ``keep`` pages, releasing the others in one free
        call (a page another path holds stays); the pages cut."""
        c = self.config
        cut = list(entry.pages[keep:])
        entry.pages = tuple(entry.pages[:keep])
        entry.length = keep * c.page_size
        entry.tokens = entry.tokens[: entry.length + c.offset]
        self._release_pages(cut, cache=True)
        if not entry.pages:
            self.cache.remove(entry)
        return cut
