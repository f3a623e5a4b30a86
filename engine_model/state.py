"""The state an engine keeps (:class:`EngineState`), its requests (:class:`Request`) and
its cached prefixes (:class:`CacheEntry`), with the reads every part of the engine shares; the
parts that change it are the mixins of :class:`engine_model.engine.Engine`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from engine_model.config import KV_BYTES, EngineConfig
from engine_model.free_lists import PageAllocator, RowAllocator, make_allocators
from engine_model.hooks import EngineHooks
from engine_model.vocabulary import FULL, SWA

__all__ = ["CacheEntry", "EngineState", "Request"]


@dataclass
class Request:
    """A request as the engine keeps it: its id, its pool row, the tokens it knows and the
    token oracle's, the positions whose KV it wrote, the page of each page index, whether it
    has sampled a token (it decodes), and how many of its tokens are its prompt."""

    rid: int
    row: int
    tokens: list  # what the engine knows: the prompt and the tokens sampled so far
    truth: list  # the token oracle's tokens, one per known position
    written: int = 0  # positions whose KV is written
    pages: list = field(default_factory=list)  # page of each page index
    decoding: bool = False
    prompt: int = 0  # the tokens it was admitted with (SGLang's ``origin_input_ids``)


@dataclass
class CacheEntry:
    """A cached prefix: a path of pages of the prefix cache (a radix tree's, one entry a leaf's
    path), with its tokens and the number of positions it holds."""

    tokens: tuple  # the tokens of the cached positions (plus ``offset`` more)
    pages: tuple
    length: int  # cached positions, a multiple of page_size


class EngineState:
    """The state of an engine (see :mod:`engine_model.engine`) and what every part of it reads:
    the slot of a request's position in each buffer group, its window, what it has left to
    write. :class:`engine_model.engine.Engine` adds the steps."""

    def __init__(self, config: EngineConfig):
        #: the engine's sizes and options
        self.config = c = config
        self.rng = np.random.default_rng(c.seed)
        self.next_token = int(self.rng.integers(1000, 2**20))
        self.next_rid = 1
        n_slots = c.num_slots
        # the page table and the expected-token pool start with stale values, as reused memory
        self.req_to_token = self.rng.integers(1, n_slots, (c.pool_rows, c.context_len)).astype(
            np.int32
        )
        self.pool = self.rng.integers(1, 2**30, (c.pool_rows, c.context_len + c.offset)).astype(
            np.int32
        )
        pages = list(range(1, c.num_pages))
        self.rng.shuffle(pages)
        #: the page allocator and the request pool the configuration names
        #: (:data:`engine_model.free_lists.BACKENDS`): their first free pages shuffled, as a
        #: pool that has served before leaves them (SGLang's allocators start in ascending
        #: order; from then on the order is theirs), their free rows in ascending order
        allocators = make_allocators(c, pages, list(range(1, c.pool_rows)))
        self.page_allocator: PageAllocator = allocators[0]
        self.row_allocator: RowAllocator = allocators[1]
        #: per page, the requests that hold it, and the cached prefixes that do
        self.req_refs = np.zeros(c.num_pages, dtype=np.int64)
        self.cache_refs = np.zeros(c.num_pages, dtype=np.int64)
        #: the full-to-SWA table under a window (0: the full slot has no SWA slot), else None
        self.lut: np.ndarray | None = None
        if c.swa_window:
            self.lut = np.zeros(n_slots, dtype=np.int64)
            # the SWA pool's pages (0: padding), handed out and freed whole by an allocator of
            # the full pool's kind, as SGLang's SWATokenToKVPoolAllocator pages both pools in
            # step (``allocator/swa.py``): a full page's slot k has its SWA page's slot k
            swa = list(range(1, c.group_slots(SWA) // c.page_size))
            self.rng.shuffle(swa)
            self.swa_allocator: PageAllocator = make_allocators(c, swa, [])[0]
        #: the running requests by id, the retracted ones waiting, and the prefix cache
        self.running: dict[int, Request] = {}
        self.waiting: list[Request] = []
        self.cache: list[CacheEntry] = []
        #: per page of the cache, whether a radix node starts there and the node's last access
        #: time, and the clock of those times (:mod:`engine_model.eviction`); the pages of each
        #: node the last eviction freed
        self.node_head = np.zeros(c.num_pages, dtype=bool)
        self.node_time = np.zeros(c.num_pages, dtype=np.float64)
        self.clock = 0.0
        self.last_evicted: list[tuple[int, ...]] = []
        #: a cached prefix being moved, locked against eviction (``Moves.relocate``)
        self.moving: CacheEntry | None = None
        self.last_written: list[tuple[int, int]] = []  # (request, position) of the last forward
        #: the faults armed in the next steps, and what they did (:mod:`engine_model.faults`)
        self.hooks = EngineHooks()
        #: how often each situation the suite counts came about (named where it comes about)
        self.events: Counter[str] = Counter()
        self.steps = 0
        self.log: list[str] = []
        #: the step of each request's last forward
        self.last_run: dict[int, int] = {}
        #: the forward mode that wrote each ``(request, position)`` last (the name of
        #: :data:`~engine_model.vocabulary.DRAFT_DECODE` for a decode of the draft model, whose
        #: input assert is off), and the step
        self.written_by: dict[tuple[int, int], str] = {}
        self.written_at: dict[tuple[int, int], int] = {}
        self._drafting: dict[int, tuple[list, list, int]] = {}  # a target verify's drafts
        self._reserve = 0  # a target verify's positions to allocate past the committed ones
        self._draft: dict[int, int] = {}  # a draft decode's token per request
        self._extending: dict[int, tuple[list, int]] = {}  # a draft extend's tokens, kept
        self._overflow = False  # whether this step's verify plans overflow
        self._captured: set[tuple[int, int]] = set()  # graphs replayed: batch size, tokens a row
        #: per pool row, ``(request, tokens it knew)`` of its last owner when it left the row
        self._row_last_len: dict[int, tuple[int, int]] = {}
        #: per page, the step at which it was last freed (a page handed out again in that step)
        self._freed_at: dict[int, int] = {}
        #: per full slot, the step that last wrote its KV (a forward, or a load of KV)
        self._slot_written: dict[int, int] = {}
        self._keys = 0  # the last host copy's key
        #: a retracted request's backup: ``(host copy, positions written, SWA-resident mask)``
        self.backups: dict[int, tuple[int, int, list[bool]]] = {}
        #: the full slots of the last move's source and destination, position by position
        self.last_move: tuple[list[int], list[int]] | None = None

    # -- helpers ---------------------------------------------------------------------------

    def _fresh(self, n: int) -> list:
        """``n`` fresh tokens, distinct from every token made before."""
        out = [self.next_token + 7 * i for i in range(n)]
        self.next_token += 7 * n
        return out

    def full_slot(self, req: Request, pos: int) -> int:
        """The full-pool slot of ``req``'s position ``pos``, through its pages."""
        page: int = req.pages[pos // self.config.page_size]
        return page * self.config.page_size + pos % self.config.page_size

    def group_slot(self, group: str, full: int) -> int:
        """A full-pool slot's canary slot in ``group``: itself in ``FULL``, its SWA slot in
        ``SWA`` (0: evicted)."""
        if group == SWA:
            assert self.lut is not None
            return int(self.lut[full])
        return int(full)

    def window_start(self, prefix: int, group: str = SWA) -> int:
        """The first position a group's verify reads of a row with ``prefix`` written."""
        w = self.config.swa_window if group == SWA else 0
        return max(0, prefix - w) if w else 0

    def swa_freed_to(self, prefix: int) -> int:
        """The positions of a row with ``prefix`` written whose SWA pages are freed after a
        forward: those of the pages wholly behind its window."""
        p = self.config.page_size
        return self.window_start(prefix) // p * p

    def will_run(self, req: Request) -> bool:
        """Whether the request has a position left to write (a full one only waits to finish)."""
        if req.written >= self.config.context_len:
            return False
        return self.pending(req) == 1 if req.decoding else self.pending(req) > 0

    def pending(self, req: Request) -> int:
        """The positions ``req`` knows the tokens of and has not written."""
        return len(req.tokens) - self.config.offset - req.written

    def page_slots(self, page: int) -> range:
        """The full-pool slots of ``page``."""
        p = self.config.page_size
        return range(page * p, (page + 1) * p)

    def _kv(self, n: int) -> np.ndarray:
        """The KV bytes of ``n`` slots a forward writes: random, and never zero."""
        return self.rng.integers(1, 256, (n, KV_BYTES)).astype(np.uint8)

    def cached_full_slots(self, entry: CacheEntry) -> list[int]:
        """The full-pool slot of each position a cached prefix holds."""
        holder = Request(0, 0, [], [], pages=list(entry.pages))
        return [self.full_slot(holder, p) for p in range(entry.length)]

    # -- what the suite asks -----------------------------------------------------------------

    def slots_of(self, entries, group: str = FULL) -> frozenset:
        """The canary slots of ``group`` the given ``(request, position)`` pairs are written in
        now (an evicted SWA slot is left out)."""
        out = set()
        for rid, pos in entries:
            req = self.running.get(rid)
            if req is not None and pos < req.written:
                out.add(self.group_slot(group, self.full_slot(req, pos)))
        return frozenset(out - {0})

    def rewritten_since(self, full_slot: int, step: int) -> bool:
        """Whether a forward or a load of KV wrote full slot ``full_slot`` at step ``step`` or
        later (a forward writes at the step it counts; a load, at the step after the one
        before it)."""
        return self._slot_written.get(full_slot, -1) >= step

    @property
    def free_pages(self) -> list[int]:
        """The free pages, first in line first (the page allocator's list: read it, never change
        it; :meth:`engine_model.allocators.Allocators.put_first` reorders)."""
        return self.page_allocator.order()

    @property
    def free_rows(self) -> list[int]:
        """The pool rows free for a new request, last in line first (the request pool's list:
        read it, never change it)."""
        return self.row_allocator.order()

    def describe(self) -> str:
        """The configuration and the last steps of the history, for a failure message."""
        c = self.config
        return (
            f"{c!r}\n       history: "
            + "; ".join(self.log[-16:])
            + (f" (last 16 of {len(self.log)})" if len(self.log) > 16 else "")
        )
