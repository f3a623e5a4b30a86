"""An engine model: the canary as an engine runs it, step by step (CONTRACT §12, §13, §6, §7).

:class:`Engine` keeps, as plain numpy data, what an SGLang-style engine keeps around its KV
cache, and turns each step of a history into exactly the launches the engine makes:

- a request-to-token pool (``req_to_token``, row 0 the padding row) and an expected-token pool
  beside it, whose rows keep the stale tail of a longer previous owner when they are reused;
- a slot allocator handing out pages of ``page_size`` slots (page 0, and so slot 0, is the
  padding page and never handed out), with a reference count per page;
- a prefix cache that keeps the page-aligned prefix of every finished, retracted or inserted
  request as a path of pages (a radix tree's, one entry a leaf's path) and lets a new request
  share it;
- an optional sliding window (``swa_window > 0``): every full slot has an SWA slot through the
  full-to-SWA table, in an SWA pool smaller than the full pool (``swa_slots``), and a position
  that leaves its request's window is evicted (its table entry set to 0, its SWA slot freed
  for reuse); when the SWA pool runs short, cached positions no request uses lose their SWA
  slots first, as SGLang's SWA cache evicts under pressure;
- an optional EAGLE offset (``offset = 1``): the KV of position ``pos`` holds token
  ``pos + offset``.

Its steps are those of a serving loop: :meth:`Engine.admit` (a new request, sharing a cached
prefix or not), :meth:`Engine.prefill` (an extend batch: every request with unwritten prompt
tokens writes its next chunk), :meth:`Engine.decode` (a decode batch, with padding rows whose
lengths are stale, or replaying a CUDA graph, and a verify capacity that may overflow),
:meth:`Engine.mixed` (a mixed batch: prompt chunks and decode rows), :meth:`Engine.idle` (an
all-padding graph step), :meth:`Engine.target_verify` (EAGLE's target verify, then accept and
rollback), :meth:`Engine.draft_decode` (the draft model's multi-step draft),
:meth:`Engine.draft_extend` (its draft extend after a target verify, ``DRAFT_EXTEND_V2``),
:meth:`Engine.finish` (the prefix goes to the cache, the row is freed), :meth:`Engine.retract`
and :meth:`Engine.readmit`, :meth:`Engine.admit_twin` (a request with a cached prefix's
tokens that computes them again) and :meth:`Engine.insert` (a running request's prefix goes into
the cache after its extend forward, its row rebound to the cache's pages where the cache holds
the same tokens, its own duplicates freed), :meth:`Engine.evict` (a cached leaf no one uses
loses its last page) and :meth:`Engine.sweep` (a verify of every slot the cache holds). A forward step returns a :class:`Forward`: the scatter of the batch's token snapshots,
the plan kernel's arguments (SGLang's ``PlanInput``, per ``ForwardMode`` as
``srt/kv_canary/plan_input.py`` builds it: decode rows have the position as prefix and write one
token; a target verify's rows have ``seq_lens`` as prefix and write the draft count), the
write's arrays with the expected inputs (the token oracle's in a decode, the input ids in every
extend mode, as ``token_oracle/oracle_manager.py``), and the KV bytes the forward writes into
every written slot (distinct and non-zero). A sweep returns a :class:`Sweep`. ``events``
counts the situations of CONTRACT §12 and §15 the steps meet, for the suite's coverage check.

A forward is bracketed as SGLang brackets it (``srt/kv_canary/single_forward_manager/``): for
each buffer group (:data:`FULL`, and :data:`SWA` under a window) the plan, then a ``HEAD``
verify and write on the group's head buffer without real-KV sources, the forward's KV stores,
then a ``TAIL`` verify and write on its tail buffer with the group's KV pool as source. A
:class:`Forward` holds one :class:`GroupLaunch` per group: the group's window and full-to-SWA
table for its plan, its verify capacity, the write's ``out_cache_loc`` as the group's canary
slots (SGLang's SWA endpoint translates the full slots through the table) and the KV the
forward stores in the group's pool. A sweep verifies each group's tail buffer.

The faults an engine can make, SGLang's self-test perturbations plus two allocator bugs, are
the fault classes of :mod:`engine_model.faults`, each one object that makes its fault in an
:class:`Engine` and says what it must cause.

Torch-free and deterministic: the same calls on the same :class:`EngineConfig` give the same
arrays, so a failing history's steps repeat it exactly.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_model.vocabulary import (
    FULL,
    GROUPS,
    ORACLE_MODES,
    PREFILL_ENGINE,
    STAGES,
    SWA,
)
from reference import REQ_POOL_IDX_PADDING, RealKvHashMode, window_starts

__all__ = [
    "FULL",
    "GROUPS",
    "KV_BYTES",
    "ORACLE_MODES",
    "PREFILL_ENGINE",
    "STAGES",
    "SWA",
    "Engine",
    "EngineConfig",
    "Forward",
    "GroupLaunch",
    "Move",
    "MoveGroup",
    "Sweep",
    "SweepGroup",
    "pick_from",
]

#: Bytes of KV per slot (one flat uint8 source row per slot).
KV_BYTES = 32


def _check_int(name: str, value: object, lo: int) -> None:
    """Refuse a configuration field that is not an int (a bool is not one) of at least ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r} must be an int >= {lo}")


def pick_from(items: list, pick: int) -> Any:
    """The item ``pick`` chooses (modulo their number), or None when there is none."""
    return items[pick % len(items)] if items else None


@dataclass(frozen=True)
class EngineConfig:
    """The fixed sizes and options of an engine.

    ``num_pages`` pages of ``page_size`` slots (page 0 is padding), ``pool_rows`` rows of
    ``req_to_token`` (row 0 is padding) of ``context_len`` positions each, a sliding window of
    ``swa_window`` positions (0: full attention), the EAGLE ``offset`` (0 or 1), the canary's
    ``mode`` (real_kv_hash_mode: 0 NONE, 1 PARTIAL, 2 ALL), the ``seed`` of every token, KV
    byte and stale value, and under a window the ``swa_slots`` of the SWA pool (slot 0 the
    padding slot; 0: as many as the full pool)::

        EngineConfig(page_size=2, num_pages=16, pool_rows=5, context_len=16, swa_window=6,
                     offset=1, mode=1, seed=7, swa_slots=20)
    """

    page_size: int = 1  # slots of a page
    num_pages: int = 24  # pages of the full pool, page 0 the padding page
    pool_rows: int = 5  # rows of req_to_token and of the pool, row 0 the padding row
    context_len: int = 16  # positions of a row
    swa_window: int = 0  # 0: full attention
    offset: int = 0  # the EAGLE offset, 0 or 1
    mode: int = int(RealKvHashMode.ALL)  # real_kv_hash_mode: 0 NONE, 1 PARTIAL, 2 ALL
    seed: int = 1  # of every token, KV byte and stale value
    swa_slots: int = 0  # slots of the SWA pool under a window (0: those of the full pool)

    def __post_init__(self) -> None:
        _check_int("page_size", self.page_size, 1)
        _check_int("num_pages", self.num_pages, 2)
        _check_int("pool_rows", self.pool_rows, 2)
        _check_int("context_len", self.context_len, 2)
        _check_int("swa_window", self.swa_window, 0)
        _check_int("swa_slots", self.swa_slots, 0)
        if self.swa_slots and not 2 <= self.swa_slots <= self.num_slots:
            raise ValueError(f"swa_slots must be 0 or 2 to num_slots: {self!r}")
        if self.offset not in (0, 1) or self.mode not in tuple(RealKvHashMode):
            raise ValueError(f"offset must be 0 or 1 and mode 0, 1 or 2: {self!r}")

    @property
    def num_slots(self) -> int:
        """Slots of the full pool and of the ``FULL`` group's canary buffers."""
        return self.num_pages * self.page_size

    @property
    def groups(self) -> tuple[str, ...]:
        """The buffer groups a forward launches on: ``FULL``, and ``SWA`` under a window."""
        return (FULL, SWA) if self.swa_window else (FULL,)

    def group_slots(self, group: str) -> int:
        """Slots of a group's pool and canary buffers."""
        if group == SWA:
            return self.swa_slots or self.num_slots
        return self.num_slots


@dataclass
class _Request:
    rid: int
    row: int
    tokens: list  # what the engine knows: the prompt and the tokens sampled so far
    truth: list  # the token oracle's tokens, one per known position
    written: int = 0  # positions whose KV is written
    pages: list = field(default_factory=list)  # page of each page index
    decoding: bool = False


@dataclass
class _CacheEntry:
    tokens: tuple  # the tokens of the cached positions (plus ``offset`` more)
    pages: tuple
    length: int  # cached positions, a multiple of page_size


@dataclass(frozen=True)
class GroupLaunch:
    """One buffer group's part of a forward: its ``group`` (:data:`FULL` or :data:`SWA`), the
    window and full-to-SWA table its plan takes (SGLang's ``invoke_plan``: window 0 and no table
    for ``FULL``), its verify plan's capacity, the write's ``out_cache_loc`` as the group's
    canary slots, and the KV the forward stores in the group's pool (``kv_slots``,
    ``kv_bytes``)."""

    group: str
    swa_window_size: int
    full_to_swa_index_mapping: np.ndarray | None
    verify_capacity: int
    out_cache_loc: np.ndarray
    kv_slots: np.ndarray
    kv_bytes: np.ndarray

    def plan_arguments(self) -> dict:
        """The plan kernel's keywords this group decides."""
        return dict(
            swa_window_size=self.swa_window_size,
            full_to_swa_index_mapping=self.full_to_swa_index_mapping,
        )


@dataclass(frozen=True)
class Forward:
    """One forward step's launches, as numpy arrays: ``scatter`` (the keywords of
    ``launch_scatter_req_token_ids_kernel`` but the pool, or None), ``plan`` (the keywords of
    ``launch_canary_plan_kernels`` that every group shares: SGLang's ``PlanInput``, the page
    table and the EAGLE offset), the write plan's capacity, ``write`` (the keywords of
    ``launch_canary_write_kernel`` but the context, the plan and ``out_cache_loc``, the input
    assert's flag included), ``groups`` (one :class:`GroupLaunch` per buffer group, in launch
    order) and ``stages``: the launches each group makes (``("HEAD", "TAIL")`` as an engine
    brackets a forward; ``("TAIL",)`` for a world of one buffer)."""

    kind: str
    scatter: dict | None
    plan: dict
    write_req_capacity: int
    write: dict
    groups: tuple[GroupLaunch, ...]
    stages: tuple[str, ...] = STAGES
    #: SGLang's ``ForwardMode`` of the step: ``EXTEND``, ``DECODE``, ``MIXED``, ``IDLE`` or
    #: ``TARGET_VERIFY``
    mode: str = "EXTEND"
    #: whether the step replays a captured CUDA graph: its plans are the buffers the previous
    #: replay of the same batch size left (``verify_capacity`` fixed by the batch size), its
    #: padding rows stand at the tail with ``req_pool_indices``, ``positions`` and
    #: ``out_cache_loc`` zero and stale ``input_ids``
    graph: bool = False
    #: what the forward changed in the write's arrays before the ``TAIL`` launches (a model
    #: that moves ``positions`` in place): keywords replacing those of ``write`` there
    tail_write: dict = field(default_factory=dict)
    #: whose buffers the step runs on: ``""`` the engine's own, :data:`PREFILL_ENGINE` its prefill
    #: engine's (a PD transfer's prefill)
    engine: str = ""
    #: the batch row (in the plan's row order) of each token the write writes
    token_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def write_for(self, stage: str) -> dict:
        """The write's keywords at ``stage`` (``HEAD`` or ``TAIL``), but ``out_cache_loc``."""
        return {**self.write, **self.tail_write} if stage == "TAIL" else self.write

    def group(self, name: str) -> GroupLaunch:
        return next(g for g in self.groups if g.group == name)


@dataclass(frozen=True)
class SweepGroup:
    """One group's verify of every slot the prefix cache holds: canary slots (0: evicted from
    the SWA pool, which verify skips), positions, previous slots (-1: the anchor)."""

    group: str
    slots: np.ndarray
    positions: np.ndarray
    prev_slots: np.ndarray


@dataclass(frozen=True)
class Sweep:
    """A cache sweep: one :class:`SweepGroup` per buffer group, each verifying its tail
    buffer."""

    groups: tuple[SweepGroup, ...]

    def group(self, name: str) -> SweepGroup:
        return next(g for g in self.groups if g.group == name)


@dataclass(frozen=True)
class MoveGroup:
    """One buffer group's part of a :class:`Move`: the slots of the group's pool it saves or
    loads. A load's slot ``i`` takes the KV of the saved slot ``kv_from[i]`` and the records (in
    the head and the tail canary buffer) of the saved slot ``records_from[i]``; -1: it keeps
    its own (a fault of the move)."""

    group: str
    slots: np.ndarray
    kv_from: np.ndarray | None = None
    records_from: np.ndarray | None = None


@dataclass(frozen=True)
class Move:
    """KV that moves without a forward, no kernel launched: a ``save`` copies each group's
    slots (their KV and their records in both canary buffers) to the host copy ``key``; a load
    copies a host copy into other slots, and consumes it. ``kind`` says what moves the KV:
    ``offload`` and ``reload`` (a cached prefix goes to the host pool and comes back into other
    slots, as HiCache does), ``backup`` and ``restore`` (a retracted request's KV), ``send``
    and ``receive`` (a PD transfer from the prefill engine, page by page, the records spliced
    into it as SGLang's ``pool_patcher/buf_info_splice.py`` splices the canary buffers into
    the pool's transfer buffers); ``engine``: whose buffers (``""`` the engine's own,
    :data:`PREFILL_ENGINE` its prefill engine's)."""

    kind: str
    key: int
    save: bool
    groups: tuple[MoveGroup, ...]
    engine: str = ""


class Engine:
    """The engine model (see the module). Every step method returns None when the step has
    nothing to do in the engine's state (no request to finish, no free page, ...)."""

    def __init__(self, config: EngineConfig):
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
        self.free_pages: list[int] = pages
        self.free_rows: list[int] = list(range(1, c.pool_rows))
        self.req_refs = np.zeros(c.num_pages, dtype=np.int64)
        self.cache_refs = np.zeros(c.num_pages, dtype=np.int64)
        self.lut: np.ndarray | None = None
        if c.swa_window:
            self.lut = np.zeros(n_slots, dtype=np.int64)
            swa = list(range(1, c.group_slots(SWA)))
            self.rng.shuffle(swa)
            self.free_swa: list[int] = swa
        self.running: dict[int, _Request] = {}
        self.waiting: list[_Request] = []
        self.cache: list[_CacheEntry] = []
        self.last_written: list[tuple[int, int]] = []  # (request, position) of the last forward
        #: a fault of how a forward stores its KV (``engine_model.faults``): called with each
        #: group's name, the slots of the group's pool the forward stores and their KV bytes,
        #: it returns them as the forward stores them, or None while the forward does not make
        #: the store it changes; used once
        self.store_fault: Callable[[str, np.ndarray, np.ndarray], tuple | None] | None = None
        #: a fault of the forward itself: the next forward's model moves its first token's
        #: position by this much before the ``TAIL`` launches (None: no fault)
        self.positions_fault: int | None = None
        self.positions_fault_made: dict[str, int] | None = None  # its slot in each group
        #: a fault of the next target verify's accept: it keeps one rejected draft as accepted
        #: (``(request, position kept)`` once made)
        self.accept_fault: bool = False
        self.accept_fault_made: tuple[int, int, int] | None = None  # request, position, step
        #: a fault of the rollback after a target verify: the next one that frees a rejected
        #: draft's page frees it while the request goes on naming it (``(request, page)`` once
        #: made)
        self.rollback_fault: bool = False
        self.rollback_fault_made: tuple[int, int] | None = None
        #: how often each situation the suite counts came about (``engine_model.engine`` names)
        self.events: Counter[str] = Counter()
        self.steps = 0
        self.log: list[str] = []
        #: the step of each request's last forward
        self.last_run: dict[int, int] = {}
        #: the ``ForwardMode`` that wrote each ``(request, position)`` last, and the step
        self.written_by: dict[tuple[int, int], str] = {}
        self.written_at: dict[tuple[int, int], int] = {}
        self._drafting: dict[int, tuple[list, list, int]] = {}  # a target verify's drafts
        self._draft: dict[int, int] = {}  # a draft decode's token per request
        self._overflow = False  # whether this step's verify plans overflow
        self._captured: set[int] = set()  # the batch sizes of the graphs replayed so far
        #: per pool row, ``(request, tokens it knew)`` of its last owner when it left the row
        self._row_last_len: dict[int, tuple[int, int]] = {}
        #: the prefill engine of PD transfers (made by the first :meth:`receive`): the same
        #: sizes, a seed and tokens of its own
        self.peer: Engine | None = None
        self._keys = 0  # the last host copy's key
        #: a retracted request's backup: ``(host copy, positions written, SWA-resident mask)``
        self.backups: dict[int, tuple[int, int, list[bool]]] = {}
        #: the full slots of the last move's source and destination, position by position
        self.last_move: tuple[list[int], list[int]] | None = None

    # -- helpers ---------------------------------------------------------------------------

    def _fresh(self, n: int) -> list:
        out = [self.next_token + 7 * i for i in range(n)]
        self.next_token += 7 * n
        return out

    def full_slot(self, req: _Request, pos: int) -> int:
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

    def will_run(self, req: _Request) -> bool:
        """Whether the request has a position left to write (a full one only waits to finish)."""
        if req.written >= self.config.context_len:
            return False
        return self.pending(req) == 1 if req.decoding else self.pending(req) > 0

    def pending(self, req: _Request) -> int:
        return len(req.tokens) - self.config.offset - req.written

    def _page_slots(self, page: int) -> range:
        p = self.config.page_size
        return range(page * p, (page + 1) * p)

    def _swa_room(self, pages: list[int]) -> bool:
        """Whether the SWA pool has a slot for every slot of ``pages`` that has none (a page
        freed while in use keeps its SWA slots), after taking the SWA slots of cached
        positions no request uses, oldest first, as SGLang's SWA cache evicts under
        pressure."""
        if self.lut is None:
            return True
        need = sum(1 for page in pages for s in self._page_slots(page) if not self.lut[s])
        for entry in list(self.cache):
            if len(self.free_swa) >= need:
                break
            for full in self.cached_full_slots(entry):
                if self.lut[full] and not self.req_refs[full // self.config.page_size]:
                    self._evict_slots([full])
                    self.events["swa slot of a cached position evicted under pressure"] += 1
        return len(self.free_swa) >= need

    def spare_swa_slots(self) -> int:
        """SWA slots an allocation can have now: the free ones and those of cached positions
        no request uses (the whole full pool's when there is no window)."""
        if self.lut is None:
            return self.config.num_slots
        cached = {
            full
            for entry in self.cache
            for full in self.cached_full_slots(entry)
            if self.lut[full] and not self.req_refs[full // self.config.page_size]
        }
        return len(self.free_swa) + len(cached)

    def _alloc_pages(self, n: int, exclude=()) -> list[int] | None:
        """``n`` pages, each with its SWA slots, or None (nothing taken) when the pools lack
        them; never one of ``exclude`` (the pages a request names already: a page freed while
        its request names it goes to another, as a launch in which one request writes a slot
        twice has no defined result)."""
        free = [page for page in self.free_pages if page not in exclude]
        if n > len(free) or not self._swa_room(free[:n]):
            return None
        pages = free[:n]
        for page in pages:
            self.free_pages.remove(page)
        for page in pages:
            self.req_refs[page] += 1
            if self.lut is not None:
                for s in self._page_slots(page):
                    if not self.lut[s]:
                        self.lut[s] = self.free_swa.pop(0)
        return pages

    def _release(self, page: int, *, cache: bool) -> None:
        refs = self.cache_refs if cache else self.req_refs
        refs[page] = max(0, refs[page] - 1)
        if self.req_refs[page] == 0 and self.cache_refs[page] == 0 and page not in self.free_pages:
            self.free_pages.append(page)
            self._evict_slots(self._page_slots(page))

    def _evict_slots(self, slots) -> None:
        if self.lut is None:
            return
        for s in slots:
            if self.lut[s]:
                self.free_swa.append(int(self.lut[s]))
                self.lut[s] = 0

    def _kv(self, n: int) -> np.ndarray:
        return self.rng.integers(1, 256, (n, KV_BYTES)).astype(np.uint8)

    # -- steps ------------------------------------------------------------------------------

    def admit(self, new_tokens: int, share: int = 0) -> int | None:
        """A new request whose prompt ends in ``new_tokens`` fresh tokens; ``share > 0`` picks a
        cached prefix for the prompt to start with (the longest page-aligned part that fits in a
        row and whose window is still resident), shared with the cache, not computed again."""
        c = self.config
        if not self.free_rows or new_tokens < 1 or new_tokens + c.offset > c.context_len:
            return None
        row = self.free_rows.pop(0)
        req = _Request(self.next_rid, row, [], [])
        self.next_rid += 1
        shared, entry = 0, None
        if share and self.cache:
            entry = self.cache[share % len(self.cache)]
            room = c.context_len - new_tokens - c.offset
            k = min(entry.length, room // c.page_size * c.page_size)
            while k > 0 and not self._window_present(entry, k):
                k -= c.page_size
            shared = max(k, 0)
        if shared:
            assert entry is not None
            req.pages = list(entry.pages[: shared // c.page_size])
            for page in req.pages:
                self.req_refs[page] += 1
            req.tokens = list(entry.tokens[: shared + c.offset])
            for pos in range(shared):
                self.req_to_token[row, pos] = self.full_slot(req, pos)
        prompt_len = len(req.tokens) + new_tokens
        req.tokens += self._fresh(prompt_len - len(req.tokens))
        req.truth = list(req.tokens)
        req.written = shared
        self.running[req.rid] = req
        self.log.append(
            f"admit(prompt_len={prompt_len}, share={share}): request {req.rid}, row {row}, {shared} cached"
        )
        rid: int = req.rid
        return rid

    def cached_full_slots(self, entry: _CacheEntry) -> list[int]:
        """The full-pool slot of each position a cached prefix holds."""
        holder = _Request(0, 0, [], [], pages=list(entry.pages))
        return [self.full_slot(holder, p) for p in range(entry.length)]

    def _window_present(self, entry: _CacheEntry, k: int) -> bool:
        return self._window_ok(entry, range(self.window_start(k), k))

    def prefill(self, chunk: int) -> Forward | None:
        """An extend batch (``EXTEND``): each request with unwritten prompt tokens writes up to
        ``chunk``."""
        return self._forward("prefill", self._prompt_rows(chunk), pad=0, mode="EXTEND")

    def _prompt_rows(self, chunk: int) -> list:
        return [
            (r, min(chunk, self.pending(r)))
            for r in self.running.values()
            if not r.decoding and self.pending(r) > 0
        ]

    def _decode_rows(self) -> list:
        return [
            (r, 1)
            for r in self.running.values()
            if r.decoding and self.pending(r) == 1 and r.written < self.config.context_len
        ]

    def decode(self, pad: int = 0, graph: bool = False, overflow: bool = False) -> Forward | None:
        """A decode batch (``DECODE``) of every request that has sampled its next token, and
        ``pad`` padding rows: anywhere in the batch with stale lengths and the extend length 1
        SGLang gives every row of a decode batch, or, replaying a CUDA graph (``graph``), at
        the tail as SGLang's graph runner pads (``cuda_graph_buffer_registry.py``). With
        ``overflow`` the verify plans hold one entry fewer than the batch verifies, as a
        per-forward capacity too small for a batch leaves them: disabled, nothing checked."""
        self._overflow = overflow
        try:
            return self._forward("decode", self._decode_rows(), pad=pad, mode="DECODE", graph=graph)
        finally:
            self._overflow = False

    def draft_decode(self, steps: int) -> list[Forward]:
        """The draft model's multi-step draft (its canary has the EAGLE offset 1; SGLang's
        ``is_eagle_draft_decode``): ``steps`` decode forwards, each writing one draft position
        past the last of every decoding request (the first with the token sampled, the rest
        with draft tokens), the write's input assert off, the snapshot's valid length the
        tokens known before drafting, so a later step's verify of an earlier draft past the
        snapshot expects no token; then the drafts are given up (the target decides), their
        pages freed and the requests back where they were."""
        c = self.config
        if not c.offset or steps < 1:
            return []
        rows = [r for r, _ in self._decode_rows()]
        saved = {r.rid: r.written for r in rows}
        forwards: list[Forward] = []
        self._draft = {}
        try:
            for k in range(steps):
                live = [(r, 1) for r in rows if r.written < c.context_len]
                self._draft = {
                    r.rid: r.tokens[r.written + c.offset] if k == 0 else self._fresh(1)[0]
                    for r, _ in live
                }
                forward = self._forward("draft_decode", live, pad=0, mode="DECODE")
                if forward is None:
                    break
                self.events["a draft decode step"] += 1
                forwards.append(forward)
        finally:
            self._draft = {}
            for r in rows:
                r.written = saved[r.rid]
                self._free_past(r, r.written)
            self.last_written = []
        return forwards

    def draft_extend(self, tokens: int) -> Forward | None:
        """The draft model's draft extend after a target verify (``DRAFT_EXTEND_V2``; its canary
        has the EAGLE offset 1): every decoding request has had ``tokens - 1`` more tokens
        accepted by the target model, and writes the draft model's KV of all ``tokens`` positions
        past what it wrote, one count for the batch (SGLang's ``num_tokens_per_req``); the
        plan's prefix is ``seq_lens - extend``, ``seq_lens`` counting the new positions
        (``plan_input.py``), and the write's expected inputs are the token oracle's
        (:data:`ORACLE_MODES`), its input assert on (the model's choice: SGLang's switch, in
        ``single_forward_manager/manager.py``, is not run). A request without room for the tokens takes
        no part (None: no request has room)."""
        c = self.config
        if not c.offset or tokens < 1:
            return None
        # a request without room for the tokens is at its end: it takes no part
        rows = [
            (r, tokens)
            for r, _ in self._decode_rows()
            if r.written + tokens <= c.context_len
            and len(r.tokens) + tokens - 1 <= c.context_len + c.offset
        ]
        if not rows:
            return None
        for req, _ in rows:  # the target's accepted tokens, known before the draft extend
            more = self._fresh(tokens - 1)
            req.tokens += more
            req.truth += more
        forward = self._forward("draft_extend", rows, pad=0, mode="DRAFT_EXTEND_V2")
        for req, _ in rows:  # a row that waited (no pages): its tokens are a prompt's now
            if self.pending(req) > 1:
                req.decoding = False
        return forward

    def mixed(self, chunk: int) -> Forward | None:
        """A mixed batch (``MIXED``, SGLang's mixed chunked prefill): the prompt rows of
        :meth:`prefill` and the decode rows of :meth:`decode` in one extend batch."""
        rows = self._prompt_rows(chunk) + self._decode_rows()
        if not any(r.decoding for r, _ in rows):
            return None
        return self._forward("mixed", rows, pad=0, mode="MIXED")

    def idle(self, pad: int) -> Forward | None:
        """An idle step (``IDLE``, as DP attention runs one on a rank with no request): a
        replayed graph whose ``pad`` rows are all padding."""
        if pad < 1:
            return None
        return self._forward("idle", [], pad=pad, mode="IDLE", graph=True)

    def target_verify(self, drafts: int, accept: int) -> Forward | None:
        """EAGLE's target verify (``TARGET_VERIFY``), made only when every decoding request has
        room for ``drafts`` more positions (None otherwise: the caller decodes plainly): each
        writes its sampled token and ``drafts - 1`` draft tokens at the positions past what it wrote
        (``prefix`` = ``seq_lens``, ``extend`` = ``draft_token_num``, the drafts past the
        snapshot's valid length); then each accepts the drafts that match the target's tokens,
        ``accept`` picking how many, takes the target's own token after them, and frees the
        pages that hold only rejected drafts."""
        c = self.config
        if drafts < 2 or c.offset:  # the draft model's canary (offset 1) runs other modes
            return None
        # every row writes ``draft_token_num`` tokens (SGLang's plan input takes one count for
        # the batch): while a decoding request has no room for them, the step is a plain decode
        rows = [(r, drafts) for r, _ in self._decode_rows()]
        if not rows or any(r.written + drafts > c.context_len for r, _ in rows):
            return None
        self._drafting = {}
        for i, (req, e) in enumerate(rows):
            truth = self._fresh(e)  # the target's tokens after the sampled one
            kept = (accept + i) % e  # drafts accepted, 0 .. e - 1
            wrong = self._fresh(e)
            draft = truth[:kept] + wrong[kept : e - 1]
            self._drafting[req.rid] = (req.tokens[-1:] + draft, truth, kept)
        forward = self._forward("target_verify", rows, pad=0, mode="TARGET_VERIFY")
        self._drafting = {}
        return forward

    def _forward(
        self, kind: str, rows, pad: int, *, mode: str, graph: bool = False
    ) -> Forward | None:
        """One forward step of ``kind`` (SGLang's ``mode``) over ``rows``, ``(request, tokens
        to write)``, and ``pad`` padding rows: the pages allocated, the batch laid out (padding
        rows anywhere, or at the tail of a replayed graph), the launches' arrays made per buffer
        group, then the engine moved past the forward."""
        batch = self._allocate(rows)
        if not batch and mode != "IDLE":
            return None
        self.steps += 1
        self.events[f"forward {mode}" + (" replaying a graph" if graph else "")] += 1
        lens = self._batch_rows(kind, batch, pad, graph)
        written = self._written_tokens(batch, mode)
        # the write's input assert is off in every decode of the draft model (the EAGLE
        # offset), as SGLang's SingleForwardManager turns it off (is_eagle_draft_decode)
        assert_off = bool(self._draft) or self._draft_model_decode(mode)
        bs = len(batch) + pad
        # padding rows stand anywhere in the batch; a graph's at the tail
        order = np.arange(bs) if graph else self.rng.permutation(bs)
        lens = {name: value[order] for name, value in lens.items()}
        ids, positions, full_slots, expected = self._in_plan_order(batch, order, written)
        sizes = {i: e for i, (_, e) in enumerate(batch)}
        token_rows = np.repeat(np.arange(bs), [sizes.get(int(i), 0) for i in order])
        if graph and pad:  # a padding row's token: position 0, slot 0, a stale input id
            token_rows = np.concatenate([token_rows, np.arange(bs - pad, bs)])
            stale = self.rng.integers(1, 2**20, pad).astype(np.int64)
            zero = np.zeros(pad, dtype=np.int64)
            ids, expected = np.concatenate([ids, stale]), np.concatenate([expected, stale])
            positions = np.concatenate([positions, zero])
            full_slots = np.concatenate([full_slots, zero])
        live = [batch[i][0] for i in order if i < len(batch)]
        self._count_situations(live, lens, graph)
        for req in live:
            self.last_run[req.rid] = self.steps
        groups = []
        for group in self.config.groups:
            slots = np.asarray([self.group_slot(group, s) for s in full_slots], dtype=np.int64)
            kv_slots, kv_bytes = self._stored(group, slots.copy(), self._kv(slots.shape[0]))
            window = self.config.swa_window if group == SWA else 0
            groups.append(
                GroupLaunch(
                    group=group,
                    swa_window_size=window,
                    full_to_swa_index_mapping=(
                        None if group == FULL or self.lut is None else self.lut.copy()
                    ),
                    verify_capacity=self._verify_capacity(lens, group, graph),
                    out_cache_loc=slots,
                    kv_slots=kv_slots,
                    kv_bytes=kv_bytes,
                )
            )
        forward = Forward(
            kind=kind,
            scatter=self._scatter(live) if live else None,
            plan=self._plan_inputs(lens),
            write_req_capacity=len(batch) + pad,
            write=dict(
                input_ids=ids,
                positions=positions,
                expected_input_tokens=None if assert_off else expected,
                expected_input_positions=None if assert_off else positions.copy(),
                enable_write_input_assert=not assert_off,
            ),
            groups=tuple(groups),
            mode=mode,
            graph=graph,
            tail_write=self._tail_write(positions),
            token_rows=token_rows.astype(np.int64),
        )
        if forward.tail_write:
            self.positions_fault_made = {g.group: int(g.out_cache_loc[0]) for g in groups}
        self._after_forward(batch)
        self.log.append(
            f"{kind}: "
            + ", ".join(f"request {r.rid} writes {e}" for r, e in batch)
            + (", " if batch and pad else "")
            + (f"{pad} padding rows" if pad else "")
            + (" (graph replay)" if graph and kind != "idle" else "")
        )
        return forward

    def _tail_write(self, positions: np.ndarray) -> dict:
        """The write's arrays as a positions fault leaves them for the ``TAIL`` launches."""
        if self.positions_fault is None or not positions.size:
            return {}
        moved = positions.copy()
        moved[0] += self.positions_fault
        self.positions_fault = None
        self.events["positions moved between the HEAD and the TAIL launches"] += 1
        return {"positions": moved}

    def _stored(self, group: str, slots: np.ndarray, kv: np.ndarray) -> tuple[np.ndarray, ...]:
        """The slots of ``group``'s pool and the KV bytes the forward stores there: those it
        writes, unless a store fault changes them."""
        if self.store_fault is not None:
            stored = self.store_fault(group, slots, kv)
            if stored is not None:
                self.store_fault = None
                return stored
        return slots, kv

    def _allocate(self, rows) -> list[tuple[_Request, int]]:
        """The rows that run, ``(request, tokens it writes)``, each with the pages it needs
        allocated; a row past its context or without enough free pages (or SWA slots) waits,
        and so does a row that would race a row before it (:meth:`_writes_and_seed`)."""
        c = self.config
        batch = []
        written: dict[str, set[int]] = {g: set() for g in c.groups}
        seeds: dict[str, set[int]] = {g: set() for g in c.groups}
        for req, e in rows:
            e = min(e, c.context_len - req.written)
            need = (req.written + e + c.page_size - 1) // c.page_size - len(req.pages)
            if e <= 0:
                continue
            pages = self._alloc_pages(max(0, need), exclude=self._named_pages(req))
            if pages is None:
                continue
            req.pages += pages
            mine = {g: self._writes_and_seed(req, e, g) for g in c.groups}
            if any(
                slots & (written[g] | seeds[g]) or seed & written[g]
                for g, (slots, seed) in mine.items()
            ):
                self.events["a write that would race another row waits"] += 1
                continue  # keeps its pages; runs in a later forward
            for g, (slots, seed) in mine.items():
                written[g] |= slots
                seeds[g] |= seed
            batch.append((req, e))
        return batch

    def _named_pages(self, req: _Request) -> set[int]:
        """The pages ``req`` holds and those its page table names for the positions it wrote
        (the same unless a fault made them differ)."""
        p = self.config.page_size
        return set(req.pages) | {int(s) // p for s in self.req_to_token[req.row, : req.written]}

    def _writes_and_seed(self, req: _Request, e: int, group: str) -> tuple[set[int], set[int]]:
        """The canary slots of ``group`` a row writes and the slot its write seeds from (none
        from the anchor). A write launch in which two rows write one slot, or one writes
        another's seed, has no defined result (CONTRACT §6; on a GPU the writes race) and the
        suite never makes one; only a fault that hands a page in use to another request
        (``freed_while_referenced``) or names another request's slot brings two rows so close."""
        slots = {
            self.group_slot(group, self.full_slot(req, pos))
            for pos in range(req.written, req.written + e)
        }
        seed = set()
        if req.written > 0:
            seed.add(self.group_slot(group, int(self.req_to_token[req.row, req.written - 1])))
        return slots - {0}, seed - {0}

    def _batch_rows(self, kind: str, batch, pad: int, graph: bool) -> dict[str, np.ndarray]:
        """Each row's pool row and lengths, the batch's rows first and the padding rows after
        them, with stale lengths (a decode batch's extend lengths are all 1, as SGLang's); a
        replayed graph's padding rows have the prefix of their zeroed ``positions``."""
        bs = len(batch) + pad
        rows = np.full(bs, REQ_POOL_IDX_PADDING, dtype=np.int64)
        stale = self.rng.integers(-3, self.config.context_len + 3, (3, bs)).astype(np.int64)
        prefix, extend, valid = stale[0], stale[1], stale[2]
        if kind in ("decode", "idle"):
            extend[:] = 1
        if graph:
            prefix[:] = 0
        for i, (req, e) in enumerate(batch):
            rows[i] = req.row
            prefix[i], extend[i], valid[i] = req.written, e, len(req.tokens)
        return {"rows": rows, "prefix": prefix, "extend": extend, "valid": valid}

    def _written_tokens(self, batch, mode: str) -> list[np.ndarray]:
        """The token, the expected input token, the position and the full-pool slot of every
        position the batch writes, request by request; the page table names each slot now.
        The expected input is the token oracle's in ``DECODE`` and ``IDLE``, and the input
        token itself in every extend mode (``EXTEND``, ``MIXED``, ``TARGET_VERIFY``), as
        SGLang's ``TokenOracleManager.fill_expected_inputs`` makes it; in a decode of the draft
        model, whose input assert is off, the token itself."""
        c = self.config
        ids, positions, slots, expected = [], [], [], []
        for req, e in batch:
            drafted = self._drafting.get(req.rid)
            for i, pos in enumerate(range(req.written, req.written + e)):
                full = self.full_slot(req, pos)
                self.req_to_token[req.row, pos] = full
                if req.rid in self._draft:
                    token = self._draft[req.rid]
                else:
                    token = drafted[0][i] if drafted else req.tokens[pos + c.offset]
                ids.append(token)
                oracle = (
                    mode in ORACLE_MODES
                    and req.rid not in self._draft
                    and not self._draft_model_decode(mode)
                )
                expected.append(req.truth[pos + c.offset] if oracle else token)
                positions.append(pos)
                slots.append(full)
                self.written_by[(req.rid, pos)] = mode if oracle or mode != "DECODE" else "DRAFT"
                self.written_at[(req.rid, pos)] = self.steps
        return [np.asarray(x, dtype=np.int64) for x in (ids, positions, slots, expected)]

    def _draft_model_decode(self, mode: str) -> bool:
        """Whether a forward in ``mode`` is a decode of the draft model's canary (the EAGLE
        offset), whose input assert SGLang turns off."""
        return bool(self.config.offset) and mode == "DECODE"

    @staticmethod
    def _in_plan_order(batch, order: np.ndarray, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The write's arrays in the plan's row order (``order`` of the batch's rows)."""
        starts = np.cumsum([0] + [e for _, e in batch])
        pick = [np.arange(starts[i], starts[i + 1]) for i in order if i < len(batch)]
        idx = np.concatenate(pick) if pick else np.zeros(0, np.int64)
        return [a[idx] for a in arrays]

    @staticmethod
    def _scatter(live: list[_Request]) -> dict:
        """The scatter of each running row's token snapshot into the expected-token pool."""
        lens = np.asarray([len(r.tokens) for r in live], dtype=np.int64)
        return dict(
            flat_in=np.concatenate([np.asarray(r.tokens, np.int64) for r in live]),
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            req_pool_indices=np.asarray([r.row for r in live], dtype=np.int64),
        )

    def _plan_inputs(self, lens: dict[str, np.ndarray]) -> dict:
        """The plan kernel's arguments every group shares: SGLang's ``PlanInput``, over a copy of
        the page table as it is now, and the EAGLE offset."""
        return dict(
            req_pool_indices=lens["rows"],
            prefix_lens=lens["prefix"],
            extend_seq_lens=lens["extend"],
            req_to_token=self.req_to_token.copy(),
            req_to_verify_expected_tokens_valid_lens=lens["valid"],
            kv_token_id_vs_position_offset=self.config.offset,
        )

    def _verify_capacity(self, lens: dict[str, np.ndarray], group: str, graph: bool) -> int:
        """A group's verify plan capacity: every entry of every running row's window (the
        whole prefix in ``FULL``), at least 1; a captured graph's is fixed by its batch size:
        a whole row (a window in ``SWA``) per row; one short of the entries for a step that
        overflows its plans."""
        live = lens["rows"] != REQ_POOL_IDX_PADDING
        prefix = np.where(live, lens["prefix"], 0)
        window = self.config.swa_window if group == SWA else 0
        need = int((prefix - window_starts(prefix, window)).sum())
        if self._overflow and need >= 2:
            self.events["a verify plan that overflows"] += 1
            return need - 1
        if graph:
            per_row = self.config.swa_window if group == SWA else self.config.context_len
            return int(lens["rows"].shape[0]) * per_row
        return max(1, need)

    def _count_situations(self, live: list[_Request], lens: dict, graph: bool) -> None:
        """Count the situations of CONTRACT §12 and §15 this step's plan meets (``events``)."""
        c = self.config
        pages = [set(r.pages[: r.written // c.page_size]) for r in live]
        if any(a & b for i, a in enumerate(pages) for b in pages[i + 1 :]):
            self.events["rows of one batch that share a cached prefix"] += 1
        for req in live:
            if self._row_last_len.get(req.row, (None, -1))[1] == len(req.tokens) and (
                self._row_last_len[req.row][0] != req.rid
            ):
                self.events["a recycled row whose new owner has the old owner's length"] += 1
            verified = range(self.window_start(req.written, FULL), req.written)
            cut = [p for p in verified if p + c.offset >= len(req.tokens)]
            if cut:
                self.events["an expected-token read cut off by the valid length"] += 1
            start = self.window_start(req.written)
            if self.lut is not None and start > 0:
                if not self.lut[self.full_slot(req, start - 1)]:
                    self.events["an SWA window that slid past an evicted slot"] += 1
        if graph:
            key = int(lens["rows"].shape[0])
            if key in self._captured:
                self.events["plans reused by a replayed graph"] += 1
            self._captured.add(key)

    def _after_forward(self, batch) -> None:
        """After the forward: positions written, next tokens sampled (a target verify's
        accepted drafts and the target's token after them), SWA windows slide."""
        c = self.config
        self.last_written = []
        for req, e in batch:
            if req.rid in self._draft:  # a draft position: written, nothing sampled
                req.written += e
                continue
            drafted = self._drafting.get(req.rid)
            if drafted is not None:
                e = self._accept(req, *drafted)
            self.last_written += [(req.rid, pos) for pos in range(req.written, req.written + e)]
            req.written += e
            if drafted is not None:
                self._free_past(req, req.written, rollback=True)
            if self.pending(req) == 0 and len(req.tokens) < c.context_len + c.offset:
                token = self._fresh(1)[0]
                req.tokens.append(token)
                req.truth.append(token)
                req.decoding = True
            if self.lut is not None:
                self._evict_slots(
                    self.full_slot(req, p)
                    for p in range(self.window_start(req.written))
                    if not self._in_another_window(req, p)
                )

    def _in_another_window(self, req: _Request, pos: int) -> bool:
        """Whether another running request that shares the page of ``req``'s position ``pos``
        (a shared prefix: the same position) still has it in its window: its SWA slot stays,
        as SGLang's SWA cache keeps a shared node's slots while a request needs them."""
        page = req.pages[pos // self.config.page_size]
        return any(
            other.rid != req.rid
            and pos < other.written
            and pos // self.config.page_size < len(other.pages)
            and other.pages[pos // self.config.page_size] == page
            and pos >= self.window_start(other.written)
            for other in self.running.values()
        )

    def _accept(self, req: _Request, ids: list, truth: list, kept: int) -> int:
        """A target verify's outcome for ``req``: the sampled token and ``kept`` drafts stay
        written, and the target's own token after them is sampled; the positions it keeps."""
        room = self.config.context_len + self.config.offset - len(req.tokens)
        accepted = (truth[:kept] + [truth[kept]])[:room]  # a full row samples nothing more
        if self.accept_fault and kept < len(ids) - 1 and len(accepted) == kept + 1:
            # the fault: the first rejected draft counts as accepted, its record kept; the
            # target's token after it is sampled as if that draft were right
            self.accept_fault = False
            self.accept_fault_made = (req.rid, req.written + kept + 1, self.steps)
            more = self._fresh(1)
            accepted = (accepted + more)[:room]
            req.tokens += accepted
            req.truth += accepted
            return kept + 2
        req.tokens += accepted
        req.truth += accepted
        self.events["drafts rejected and their pages freed"] += int(kept < len(ids) - 1)
        return kept + 1

    def _free_past(self, req: _Request, written: int, rollback: bool = False) -> None:
        """Free the pages of ``req`` past the one holding position ``written - 1`` (the
        rejected drafts' pages, page by page; ``req_to_token`` keeps naming them, past what the
        request wrote, as SGLang's table does)."""
        keep = -(-written // self.config.page_size)
        for page in req.pages[keep:]:
            self._release(page, cache=False)
        if rollback and self.rollback_fault and keep < len(req.pages):
            # the fault: the first freed page stays the request's, first in line for others
            self.rollback_fault = False
            page = req.pages[keep]
            self.rollback_fault_made = (req.rid, page)
            self.free_pages.remove(page)
            self.free_pages.insert(0, page)
            keep += 1
        del req.pages[keep:]

    def finish(self, pick: int) -> int | None:
        """A request that has sampled a token ends: its page-aligned written prefix is cached,
        its row freed."""
        done = [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.decoding]
        req = pick_from(done, pick)
        if req is None:
            return None
        del self.running[req.rid]
        k = self._cache_prefix(req)
        for page in req.pages:
            self._release(page, cache=False)
        self.free_rows.append(req.row)
        self._row_last_len[req.row] = (req.rid, len(req.tokens))
        self.log.append(f"finish: request {req.rid}, {k} positions cached")
        rid: int = req.rid
        return rid

    def _cache_prefix(self, req: _Request) -> int:
        """Put the page-aligned prefix ``req`` wrote into the prefix cache; its length."""
        c = self.config
        k = req.written // c.page_size * c.page_size
        if not k:
            return k
        pages = tuple(req.pages[: k // c.page_size])
        tokens = tuple(req.tokens[: k + c.offset])
        for entry in self.cache:  # a path the cache holds already: a radix insert extends it
            if entry.pages[: len(pages)] == pages:
                return k
            if pages[: len(entry.pages)] == entry.pages:
                for page in pages[len(entry.pages) :]:
                    self.cache_refs[page] += 1
                entry.pages, entry.tokens, entry.length = pages, tokens, k
                return k
        for page in pages:
            self.cache_refs[page] += 1
        self.cache.append(_CacheEntry(tokens, pages, k))
        return k

    def retract(self, pick: int) -> int | None:
        """A running request that has written KV is preempted: its page-aligned prefix stays in
        the prefix cache (SGLang's radix cache keeps a retracted request's protected prefix), the
        rest of its KV is freed, and it waits with its tokens."""
        req = pick_from(self.retractable(), pick)
        if req is None:
            return None
        del self.running[req.rid]
        self._cache_prefix(req)  # the protected prefix stays in the cache
        for page in req.pages:
            self._release(page, cache=False)
        self.free_rows.append(req.row)
        self._row_last_len[req.row] = (req.rid, len(req.tokens))
        self.waiting.append(req)
        self.last_written = [e for e in self.last_written if e[0] != req.rid]
        self.log.append(f"retract: request {req.rid}")
        rid: int = req.rid
        return rid

    def readmit(self, pick: int) -> int | None:
        """A retracted request comes back in a free row and computes all its tokens again."""
        if not self.waiting or not self.free_rows:
            return None
        req = self.waiting.pop(pick % len(self.waiting))
        self.backups.pop(req.rid, None)  # computed again, not restored
        req.row = self.free_rows.pop(0)
        req.written, req.pages, req.decoding = 0, [], False
        self.events["a retracted request readmitted"] += 1
        # everything known is a prompt now: the last token is computed, not sampled again; the
        # longest cached prefix of its tokens (its own protected prefix, or another's) is shared
        matched = self._match(req)
        if matched:
            self.events["a readmitted request matched a cached prefix"] += 1
        self.running[req.rid] = req
        self.log.append(f"readmit: request {req.rid}, row {req.row}, {matched} cached")
        rid: int = req.rid
        return rid

    def _match(self, req: _Request) -> int:
        """Share with ``req`` (written 0, in its row) the longest cached page-aligned prefix of
        its tokens that leaves it a token to compute and whose window is resident; its length."""
        c = self.config
        best, best_k = self.tree_match(req, limit=len(req.tokens) - c.offset - 1)
        if best is None:
            return 0
        req.pages = list(best.pages[: best_k // c.page_size])
        for page in req.pages:
            self.req_refs[page] += 1
        for pos in range(best_k):
            self.req_to_token[req.row, pos] = self.full_slot(req, pos)
        req.written = best_k
        return best_k

    def admit_twin(
        self, pick: int, new_tokens: int = 1, pages: int = 0, entry: _CacheEntry | None = None
    ) -> int | None:
        """A new request whose prompt starts with the tokens of a cached prefix (its first
        ``pages`` pages; 0: all that fit) and ends in ``new_tokens`` fresh tokens, all of them
        computed again: a request admitted before another with the same prompt prefix had
        inserted it into the cache, as two requests with one system prompt arriving together.
        Its :meth:`insert` finds the prefix in the cache and rebinds it (``entry``: that cached
        prefix, not one ``pick`` chooses)."""
        c = self.config
        p = c.page_size
        if entry is None:
            entry = pick_from([e for e in self.cache if e.length >= p], pick)
        if entry is None or not self.free_rows or new_tokens < 1:
            return None
        n = min(
            pages or len(entry.pages),
            len(entry.pages),
            (c.context_len - new_tokens - c.offset) // p,
        )
        if n < 1:
            return None
        rid = self.admit(new_tokens)
        assert rid is not None
        req = self.running[rid]
        req.tokens = list(entry.tokens[: n * p + c.offset]) + req.tokens[-new_tokens:]
        req.truth = list(req.tokens)
        self.log[-1] = (
            f"admit(twin of a cached prefix, {n * p} + {new_tokens}): request {rid}, row {req.row}"
        )
        return rid

    def insertable(self) -> list:
        """The running requests that have written a page, by request id."""
        p = self.config.page_size
        return [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.written >= p]

    def insert(self, pick: int, rid: int | None = None) -> int | None:
        """A running request's page-aligned written prefix goes into the prefix cache after an
        extend forward (modelled on ``cache_unfinished_req`` of ``mem_cache/radix_cache.py``,
        which is not run): where the cache holds a
        prefix of the same tokens in other pages, the request's row is rebound to the cache's
        pages and its own duplicate pages freed (``rid``: that request, not one ``pick``
        chooses). The positions inserted, or None."""
        able = self.insertable()
        req = (
            pick_from(able, pick) if rid is None else next((r for r in able if r.rid == rid), None)
        )
        if req is None:
            return None
        entry, rebound = self.rebind(req)
        k = self._cache_prefix(req)
        self.log.append(f"insert: request {req.rid}, {k} positions, {len(rebound)} pages rebound")
        return k

    def tree_match(
        self, req: _Request, entry: _CacheEntry | None = None, limit: int | None = None
    ) -> tuple[_CacheEntry | None, int]:
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
                or not self._window_ok(e, range(self.window_start(max(req.written, m)), m))
            ):
                m -= c.page_size
            if m > best_m:
                best, best_m = e, m
        return best, best_m

    def _window_ok(self, entry: _CacheEntry, positions: range) -> bool:
        if self.lut is None:
            return True
        full = self.cached_full_slots(entry)
        return all(self.lut[full[pos]] for pos in positions)

    def rebind(
        self, req: _Request, entry: _CacheEntry | None = None, *, fault: str = ""
    ) -> tuple[_CacheEntry | None, list[tuple[int, int]]]:
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
                self.req_to_token[req.row, i * p : (i + 1) * p] = self._page_slots(named)
        if rebound:
            self.events["an insert rebound a row to the cache's pages"] += 1
            moved = {(req.rid, i * p + j) for i, _ in rebound for j in range(p)}
            self.last_written = [e for e in self.last_written if e not in moved]
        return entry, rebound

    def evictable(self) -> list:
        """``(entry, page index)`` of each cached prefix's last page that no running request
        holds, oldest first: the leaves the cache may evict (a locked node never is)."""
        return [(e, len(e.pages) - 1) for e in self.cache if not self.req_refs[e.pages[-1]]]

    def evict(self) -> int | None:
        """The oldest evictable leaf loses its last page, as SGLang's radix cache evicts leaves
        by truncation: the page goes back to the allocator when no one else holds it, and a
        cached prefix left empty is dropped. A page a running request holds (a locked node) is
        never evicted."""
        leaves = self.evictable()
        if not leaves:
            return None
        entry, _ = leaves[0]
        self._truncate(entry, len(entry.pages) - 1)
        length: int = entry.length
        self.log.append(f"evict: a cached prefix down to {length}")
        return length

    def _truncate(self, entry: _CacheEntry, keep: int) -> list[int]:
        """Cut a cached prefix to its first ``keep`` pages, releasing the others; the pages."""
        c = self.config
        cut = list(entry.pages[keep:])
        entry.pages = tuple(entry.pages[:keep])
        entry.length = keep * c.page_size
        entry.tokens = entry.tokens[: entry.length + c.offset]
        for page in cut:
            self._release(page, cache=True)
        if not entry.pages:
            self.cache.remove(entry)
        return cut

    def sweep(self) -> Sweep | None:
        """Every slot the cache holds, as each group's verify plan entries (translated, like
        SGLang's radix sweep; an evicted SWA slot is 0, which verify skips)."""
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

    # -- KV that moves without a forward ---------------------------------------------------------

    def _key(self) -> int:
        self._keys += 1
        return self._keys

    def _resident(self, full: list[int], positions: range | None = None) -> list[bool]:
        """Per full slot, whether its SWA slot is saved with it: it has one and (``positions``,
        the request's window) its position is in the window. Without a window, all."""
        if self.lut is None:
            return [True] * len(full)
        return [
            bool(self.lut[s]) and (positions is None or i in positions) for i, s in enumerate(full)
        ]

    def _save(self, kind: str, key: int, full: list[int], resident: list[bool]) -> Move:
        """A save of the full slots ``full`` and the SWA slots of those ``resident``."""
        groups = [MoveGroup(FULL, np.asarray(full, dtype=np.int64))]
        if self.lut is not None:
            swa = [int(self.lut[s]) for s, keep in zip(full, resident, strict=True) if keep]
            groups.append(MoveGroup(SWA, np.asarray(swa, dtype=np.int64)))
        return Move(kind, key, True, tuple(groups))

    def _load(
        self, kind: str, key: int, full: list[int], resident: list[bool], taken: np.ndarray,
        *, kv: bool = True, records: bool = True, written: int | None = None,
    ) -> Move:  # fmt: skip
        """A load of host copy ``key`` into the full slots ``full`` (slot ``i`` takes saved slot
        ``taken[i]``; ``kv`` or ``records`` False: the ``FULL`` slots keep their own), and into
        the SWA slots of the positions saved ``resident``; the SWA slots of the other
        positions before ``written`` (default: all) are evicted (a position out of the window
        has none); a later position keeps its SWA slot for the forward that writes it."""
        none = np.full(len(full), -1, dtype=np.int64)
        groups = [
            MoveGroup(
                FULL, np.asarray(full, dtype=np.int64),
                kv_from=taken if kv else none, records_from=taken if records else none,
            )
        ]  # fmt: skip
        if self.lut is not None:
            end = len(full) if written is None else written
            self._evict_slots(
                s for s, keep in zip(full[:end], resident[:end], strict=True) if not keep
            )
            swa = [int(self.lut[s]) for s, keep in zip(full, resident, strict=True) if keep]
            order = np.arange(len(swa), dtype=np.int64)
            groups.append(MoveGroup(SWA, np.asarray(swa, dtype=np.int64), order, order))
        return Move(kind, key, False, tuple(groups))

    def _cache_pages(self, n: int) -> list[int] | None:
        """``n`` pages for the prefix cache (held by it, not by a request), or None."""
        pages = self._alloc_pages(n)
        for page in pages or ():
            self.req_refs[page] -= 1
            self.cache_refs[page] += 1
        return pages

    def relocate(self, pick: int, *, kv: bool = True, records: bool = True) -> list[Move]:
        """A cached prefix no request uses is offloaded to the host pool and loaded back into
        other pages, as HiCache does (``mem_cache/memory_pool_host.py``, ``pool_host/``): its
        KV and its records go to the host and come back into the new slots, the old pages are
        freed. ``kv`` or ``records`` False: the load leaves the new ``FULL`` slots' KV or
        records as they were (a fault: :mod:`engine_model.faults`). Returns the offload and the
        reload, to run in order (none: no such prefix, or no free pages)."""
        idle = [e for e in self.cache if not any(self.req_refs[p] for p in e.pages)]
        entry = pick_from(idle, pick)
        if entry is None:
            return []
        pages = self._cache_pages(len(entry.pages))
        if pages is None:
            return []
        key = self._key()
        old = self.cached_full_slots(entry)
        resident = self._resident(old)
        offload = self._save("offload", key, old, resident)
        old_pages, entry.pages = entry.pages, tuple(pages)
        new = self.cached_full_slots(entry)
        taken = np.arange(len(new), dtype=np.int64)
        reload = self._load("reload", key, new, resident, taken, kv=kv, records=records)
        for page in old_pages:
            self._release(page, cache=True)
        self.last_move = (old, new)
        self.steps += 1
        self.events["a cached prefix offloaded and reloaded into other slots"] += 1
        self.log.append(f"relocate: a cached prefix of {entry.length} into pages {list(pages)}")
        return [offload, reload]

    def backup(self, pick: int) -> Move | None:
        """A running request is retracted (:meth:`retract`) with its KV backed up to the host
        first: its written positions, and their SWA slots in its window; :meth:`restore` loads
        them back."""
        req = pick_from(self.retractable(), pick)
        if req is None:
            return None
        key = self._key()
        full = [self.full_slot(req, p) for p in range(req.written)]
        resident = self._resident(full, range(self.window_start(req.written), req.written))
        save = self._save("backup", key, full, resident)
        self.backups[req.rid] = (key, req.written, resident)
        self.retract(pick)  # the same request: retract picks among the same list
        self.log[-1] += " (KV backed up)"
        return save

    def retractable(self) -> list:
        """The requests :meth:`retract` picks among, in its order."""
        return [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.written]

    def restore(self, pick: int) -> Move | None:
        """A retracted request whose KV was backed up comes back in a free row with new pages,
        its KV and records loaded from the backup: it goes on where it stopped."""
        ready = [r for r in self.waiting if r.rid in self.backups]
        req = pick_from(ready, pick)
        if req is None or not self.free_rows:
            return None
        key, written, resident = self.backups[req.rid]
        pages = self._alloc_pages(-(-written // self.config.page_size))
        if pages is None:
            return None
        del self.backups[req.rid]
        self.waiting.remove(req)
        req.row, req.pages, req.written = self.free_rows.pop(0), pages, written
        full = [self.full_slot(req, p) for p in range(written)]
        self.req_to_token[req.row, :written] = full
        self.running[req.rid] = req
        load = self._load("restore", key, full, resident, np.arange(written, dtype=np.int64))
        self.steps += 1
        self.events["a retracted request restored from its backup"] += 1
        self.log.append(f"restore: request {req.rid}, row {req.row}, {written} positions")
        return load

    def receive(
        self, new_tokens: int, *, left_out: int | None = None, swapped: int | None = None
    ) -> list:
        """PD disaggregation: the prefill engine (:attr:`peer`, made on first use: this
        engine's sizes, buffers and tokens of its own) admits a request of ``new_tokens`` and
        prefills it; its pages are sent to this engine page by page with their records
        (SGLang splices the canary buffers into the pool's transfer buffers,
        ``pool_patcher/buf_info_splice.py``, one item a page), into pages this engine
        allocates; the request decodes here, the prefill engine frees it. A fault leaves page
        ``left_out`` out of the transfer, or lands page ``swapped`` and the next one in each
        other's place. Returns the prefill engine's forward, the send and the receive (none: no
        room)."""
        c = self.config
        written = new_tokens - c.offset
        n_pages = -(-written // c.page_size)
        if written < 1 or new_tokens + c.offset > c.context_len or not self.free_rows:
            return []
        pages = self._alloc_pages(n_pages)
        if pages is None:
            return []
        if self.peer is None:
            self.peer = Engine(dataclasses.replace(c, seed=c.seed + 7919))
            self.peer.next_token = self.next_token + 2**28  # tokens of its own
        peer = self.peer
        rid = peer.admit(new_tokens)
        forward = peer.prefill(c.context_len) if rid is not None else None
        sent = peer.running.get(rid) if rid is not None else None
        if forward is None or sent is None or sent.written != written:
            for page in pages:
                self._release(page, cache=False)
            if sent is not None:
                peer.drop(sent.rid)
            return []
        forward = dataclasses.replace(forward, engine=PREFILL_ENGINE)
        key = self._key()
        span = n_pages * c.page_size  # whole pages, as a transfer moves them
        src = [peer.full_slot(sent, p) for p in range(span)]
        window = range(peer.window_start(written), written)
        resident = peer._resident(src, window)
        send = dataclasses.replace(peer._save("send", key, src, resident), engine=PREFILL_ENGINE)
        req = _Request(self.next_rid, self.free_rows.pop(0), list(sent.tokens), list(sent.truth))
        self.next_rid += 1
        req.written, req.pages, req.decoding = written, pages, sent.decoding
        dst = [self.full_slot(req, p) for p in range(span)]
        self.req_to_token[req.row, :written] = dst[:written]
        self.running[req.rid] = req
        taken = np.arange(span, dtype=np.int64)
        p = c.page_size
        if left_out is not None:
            j = left_out % n_pages
            taken[j * p : (j + 1) * p] = -1
        if swapped is not None and n_pages >= 2:
            j = swapped % (n_pages - 1)
            taken[j * p : (j + 2) * p] = np.roll(taken[j * p : (j + 2) * p], p)
        receive = self._load("receive", key, dst, resident, taken, written=written)
        peer.drop(sent.rid)
        self.last_move = (src, dst)
        self.steps += 1
        self.events["a request received from a prefill engine, page by page"] += 1
        self.log.append(
            f"receive: request {req.rid} (row {req.row}, {written} positions) from the prefill "
            f"engine" + (f", page {left_out % n_pages} left out" if left_out is not None else "")
            + (", two pages swapped" if swapped is not None and n_pages >= 2 else "")
        )  # fmt: skip
        return [forward, send, receive]

    def drop(self, rid: int) -> None:
        """A request leaves without caching anything (a prefill engine's, once sent)."""
        req = self.running.pop(rid)
        for page in req.pages:
            self._release(page, cache=False)
        self.free_rows.append(req.row)
        self._row_last_len[req.row] = (req.rid, len(req.tokens))

    # -- what the suite asks ------------------------------------------------------------------

    def slots_of(self, entries, group: str = FULL) -> frozenset:
        """The canary slots of ``group`` the given ``(request, position)`` pairs are written in
        now (an evicted SWA slot is left out)."""
        out = set()
        for rid, pos in entries:
            req = self.running.get(rid)
            if req is not None and pos < req.written:
                out.add(self.group_slot(group, self.full_slot(req, pos)))
        return frozenset(out - {0})

    def describe(self) -> str:
        c = self.config
        return (
            f"{c!r}\n       history: "
            + "; ".join(self.log[-16:])
            + (f" (last 16 of {len(self.log)})" if len(self.log) > 16 else "")
        )
