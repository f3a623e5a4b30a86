"""An engine model: the canary as an engine runs it, step by step (CONTRACT §12, §13, §6, §7).

:class:`Engine` keeps, as plain numpy data, what an SGLang-style engine keeps around its KV
cache, and turns each step of a history into exactly the launches the engine makes:

- a request-to-token pool (``req_to_token``, row 0 the padding row) and an expected-token pool
  beside it, whose rows keep the stale tail of a longer previous owner when they are reused;
- a slot allocator handing out pages of ``page_size`` slots (page 0, and so slot 0, is the
  padding page and never handed out), with a reference count per page;
- a prefix cache that keeps the page-aligned prefix of every finished request and lets a new
  request share it;
- an optional sliding window (``swa_window > 0``): every full slot has an SWA slot through the
  full-to-SWA table, and a position that leaves its request's window is evicted (its table
  entry set to 0, its SWA slot freed for reuse);
- an optional EAGLE offset (``offset = 1``): the KV of position ``pos`` holds token
  ``pos + offset``.

Its steps are those of a serving loop: :meth:`Engine.admit` (a new request, sharing a cached
prefix or not), :meth:`Engine.prefill` (an extend batch: every request with unwritten prompt
tokens writes its next chunk), :meth:`Engine.decode` (a decode batch, with padding rows whose
lengths are stale), :meth:`Engine.finish` (the prefix goes to the cache, the row is freed),
:meth:`Engine.retract` and :meth:`Engine.readmit`, :meth:`Engine.evict` (a cached prefix no
one uses is dropped and its pages reallocated later) and :meth:`Engine.sweep` (a verify of
every slot the cache holds). A forward step returns a :class:`Forward`: the scatter of the
batch's token snapshots, the plan kernel's arguments (SGLang's ``PlanInput``: decode rows have
the position as prefix and write one token), the write's arrays with the token oracle's
expected inputs, and the KV bytes the forward writes into every written slot (distinct and
non-zero). A sweep returns a :class:`Sweep`.

The faults are SGLang's self-test perturbations (``sglang/srt/kv_canary/perturb/``) plus two
allocator bugs, each a method that changes the engine's state and returns a :class:`Fault`
saying where a report is due: :data:`FAULT_KINDS`.

Torch-free and deterministic: the same calls on the same :class:`EngineConfig` give the same
arrays, so a failing history's steps repeat it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
import numpy as np

from strategies.sizes import check_int

__all__ = [
    "FAULT_KINDS",
    "KV_FAULTS",
    "Engine",
    "EngineConfig",
    "Fault",
    "Forward",
    "Sweep",
    "engine_configs",
]

#: The fault classes: SGLang's five self-test perturbations, then two allocator bugs.
#:
#: - ``req_to_token``: an entry of a running request's page table names another running
#:   request's slot (``perturb/req_to_token.py``);
#: - ``kv_used``: a KV byte of a slot a running request uses changes (``perturb/real_kv_used.py``);
#: - ``kv_unused_cache``: a KV byte of a slot only the prefix cache holds changes
#:   (``perturb/real_kv_unused_cache.py``);
#: - ``kv_post_forward``: a KV byte of a slot the last forward wrote changes after its write
#:   (``perturb/real_kv_post_forward.py``);
#: - ``next_token_swap``: two requests' sampled next tokens are swapped
#:   (``perturb/next_token_swap.py``), so each writes the other's token;
#: - ``page_swap``: the page table of two running requests names each other's page;
#: - ``freed_while_referenced``: a page of a running request goes back to the allocator, which
#:   hands it to another request that writes it.
FAULT_KINDS = (
    "req_to_token",
    "kv_used",
    "kv_unused_cache",
    "kv_post_forward",
    "next_token_swap",
    "page_swap",
    "freed_while_referenced",
)
#: The fault classes that change KV bytes and nothing else.
KV_FAULTS = ("kv_used", "kv_unused_cache", "kv_post_forward")

#: Bytes of KV per slot (one flat uint8 source row per slot).
KV_BYTES = 32
#: FailReason bits (CONTRACT §1), as plain ints.
_REAL_KV, _WRITE_TOKEN = 4, 8
#: Bytes each real_kv_hash_mode reads of a slot: NONE, PARTIAL, ALL.
READ_BYTES = {0: 0, 1: 16, 2: KV_BYTES}


@dataclass(frozen=True)
class EngineConfig:
    """The fixed sizes and options of an engine.

    ``num_pages`` pages of ``page_size`` slots (page 0 is padding), ``pool_rows`` rows of
    ``req_to_token`` (row 0 is padding) of ``context_len`` positions each, a sliding window of
    ``swa_window`` positions (0: full attention), the EAGLE ``offset`` (0 or 1), the canary's
    ``mode`` (real_kv_hash_mode: 0 NONE, 1 PARTIAL, 2 ALL) and the ``seed`` of every token, KV
    byte and stale value::

        EngineConfig(page_size=2, num_pages=16, pool_rows=5, context_len=16, swa_window=6,
                     offset=1, mode=1, seed=7)
    """

    page_size: int = 1  # slots of a page
    num_pages: int = 24  # pages of the full pool, page 0 the padding page
    pool_rows: int = 5  # rows of req_to_token and of the pool, row 0 the padding row
    context_len: int = 16  # positions of a row
    swa_window: int = 0  # 0: full attention
    offset: int = 0  # the EAGLE offset, 0 or 1
    mode: int = 2  # real_kv_hash_mode: 0 NONE, 1 PARTIAL, 2 ALL
    seed: int = 1  # of every token, KV byte and stale value

    def __post_init__(self) -> None:
        check_int("page_size", self.page_size, 1)
        check_int("num_pages", self.num_pages, 2)
        check_int("pool_rows", self.pool_rows, 2)
        check_int("context_len", self.context_len, 2)
        check_int("swa_window", self.swa_window, 0)
        if self.offset not in (0, 1) or self.mode not in (0, 1, 2):
            raise ValueError(f"offset must be 0 or 1 and mode 0, 1 or 2: {self!r}")

    @property
    def num_slots(self) -> int:
        """Slots of the full pool, and of the SWA pool and the canary buffer."""
        return self.num_pages * self.page_size


@st.composite
def engine_configs(
    draw,
    *,
    max_pages: int = 24,
    max_context_len: int = 16,
    max_rows: int = 6,
    min_slots: int = 12,
    modes=(0, 1, 2),
) -> EngineConfig:
    """Engines of up to ``max_pages`` pages of 1, 2 or 4 slots and ``max_rows`` pool rows of up
    to ``max_context_len`` positions (the defaults run many steps under the interpreter), with
    and without a sliding window and the EAGLE offset, in every hash mode::

        engine_configs(max_pages=24, max_context_len=16)
    """
    page_size = draw(st.sampled_from((1, 2, 4)), label="page_size")
    context_len = draw(st.integers(max(4, page_size * 2), max_context_len), label="context_len")
    return EngineConfig(
        page_size=page_size,
        num_pages=draw(
            st.integers(
                max(4, -(-min_slots // page_size)), max(4, max_pages, -(-min_slots // page_size))
            ),
            label="num_pages",
        ),
        pool_rows=draw(st.integers(3, max(3, max_rows)), label="pool_rows"),
        context_len=context_len,
        swa_window=draw(st.sampled_from((0, 0, 3, 5)), label="swa_window"),
        offset=draw(st.sampled_from((0, 1)), label="offset"),
        mode=draw(st.sampled_from(modes), label="mode"),
        seed=draw(st.integers(0, 2**16), label="seed"),
    )


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
class Forward:
    """One forward step's launches, as numpy arrays: ``scatter`` (the keywords of
    ``launch_scatter_req_token_ids_kernel`` but the pool, or None), ``plan`` (the keywords of
    ``launch_canary_plan_kernels`` but the two plans and the expected-token pool), the
    capacities of the two plans, ``write`` (the keywords of ``launch_canary_write_kernel`` but
    the context and the plan, the input assert's flag included), and the KV every written canary slot gets (``kv_slots``,
    ``kv_bytes``)."""

    kind: str
    scatter: dict | None
    plan: dict
    verify_capacity: int
    write_req_capacity: int
    write: dict
    kv_slots: np.ndarray
    kv_bytes: np.ndarray


@dataclass(frozen=True)
class Sweep:
    """A verify of every slot the prefix cache holds: canary slots, positions, previous slots."""

    slots: np.ndarray
    positions: np.ndarray
    prev_slots: np.ndarray


@dataclass(frozen=True)
class Fault:
    """A fault the engine made: what it is, the KV byte to flip (``flip``: canary slot and
    byte, or None), and where a report is due: the canary ``slots`` a report must name, or,
    when the slots are not known yet, the ``entries`` ``(request, position)`` whose next write
    must be reported (:meth:`Engine.slots_of`). ``bits``: the FailReason bits that report must
    carry (0: the verify of the entry decides, :meth:`Engine.entry_plan`)."""

    kind: str
    flip: tuple[int, int] | None
    slots: frozenset
    entries: tuple
    bits: int
    what: str


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
            swa = list(range(1, n_slots))
            self.rng.shuffle(swa)
            self.free_swa: list[int] = swa
        self.running: dict[int, _Request] = {}
        self.waiting: list[_Request] = []
        self.cache: list[_CacheEntry] = []
        self.last_written: list[tuple[int, int]] = []  # (request, position) of the last forward
        self.steps = 0
        self.log: list[str] = []

    # -- helpers ---------------------------------------------------------------------------

    def _fresh(self, n: int) -> list:
        out = [self.next_token + 7 * i for i in range(n)]
        self.next_token += 7 * n
        return out

    def full_slot(self, req: _Request, pos: int) -> int:
        page: int = req.pages[pos // self.config.page_size]
        return page * self.config.page_size + pos % self.config.page_size

    def canary_slot(self, full: int) -> int:
        """The canary slot of a full-pool slot: itself, or its SWA slot (0: evicted)."""
        return int(full) if self.lut is None else int(self.lut[full])

    def _window_start(self, prefix: int) -> int:
        w = self.config.swa_window
        return max(0, prefix - w) if w else 0

    def _will_run(self, req: _Request) -> bool:
        """Whether the request has a position left to write (a full one only waits to finish)."""
        if req.written >= self.config.context_len:
            return False
        return self._pending(req) == 1 if req.decoding else self._pending(req) > 0

    def _pending(self, req: _Request) -> int:
        return len(req.tokens) - self.config.offset - req.written

    def _alloc_page(self) -> int | None:
        if not self.free_pages:
            return None
        page = self.free_pages.pop(0)
        self.req_refs[page] += 1
        if self.lut is not None:
            for s in range(page * self.config.page_size, (page + 1) * self.config.page_size):
                if not self.lut[s]:  # a page freed while in use keeps its SWA slots
                    self.lut[s] = self.free_swa.pop(0)
        return page

    def _release(self, page: int, *, cache: bool) -> None:
        refs = self.cache_refs if cache else self.req_refs
        refs[page] = max(0, refs[page] - 1)
        if self.req_refs[page] == 0 and self.cache_refs[page] == 0 and page not in self.free_pages:
            self.free_pages.append(page)
            self._evict_slots(
                range(page * self.config.page_size, (page + 1) * self.config.page_size)
            )

    def _evict_slots(self, slots) -> None:
        if self.lut is None:
            return
        for s in slots:
            if self.lut[s]:
                self.free_swa.append(int(self.lut[s]))
                self.lut[s] = 0

    def _pick(self, items: list, pick: int) -> Any:
        return items[pick % len(items)] if items else None

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

    def _window_present(self, entry: _CacheEntry, k: int) -> bool:
        if self.lut is None:
            return True
        req = _Request(0, 0, [], [], pages=list(entry.pages))
        return all(self.lut[self.full_slot(req, p)] for p in range(self._window_start(k), k))

    def prefill(self, chunk: int) -> Forward | None:
        """An extend batch: each request with unwritten prompt tokens writes up to ``chunk``."""
        rows = [
            (r, min(chunk, self._pending(r)))
            for r in self.running.values()
            if not r.decoding and self._pending(r) > 0
        ]
        return self._forward("prefill", rows, pad=0)

    def decode(self, pad: int = 0) -> Forward | None:
        """A decode batch of every request that has sampled its next token, and ``pad`` padding
        rows, as a CUDA graph pads a batch: row 0, a stale prefix and valid length, and the
        extend length 1 SGLang gives every row of a decode batch."""
        rows = [
            (r, 1)
            for r in self.running.values()
            if r.decoding and self._pending(r) == 1 and r.written < self.config.context_len
        ]
        return self._forward("decode", rows, pad=pad)

    def _forward(self, kind: str, rows, pad: int) -> Forward | None:
        c = self.config
        batch = []
        for req, e in rows:
            e = min(e, c.context_len - req.written)
            need = (req.written + e + c.page_size - 1) // c.page_size - len(req.pages)
            if e <= 0 or need > len(self.free_pages):
                continue
            for _ in range(need):
                page = self._alloc_page()
                assert page is not None
                req.pages.append(page)
            batch.append((req, e))
        if not batch:
            return None
        self.steps += 1
        bs = len(batch) + pad
        req_pool_indices = np.zeros(bs, dtype=np.int64)
        stale = self.rng.integers(-3, c.context_len + 3, (3, bs)).astype(np.int64)
        prefix_lens, extend_lens, valid_lens = stale[0], stale[1], stale[2]
        if kind == "decode":  # SGLang fills every row's extend length of a decode batch with 1
            extend_lens[:] = 1
        ids, positions, slots, expected = [], [], [], []
        for i, (req, e) in enumerate(batch):
            req_pool_indices[i] = req.row
            prefix_lens[i], extend_lens[i], valid_lens[i] = req.written, e, len(req.tokens)
            for pos in range(req.written, req.written + e):
                full = self.full_slot(req, pos)
                self.req_to_token[req.row, pos] = full
                ids.append(req.tokens[pos + c.offset])
                expected.append(req.truth[pos + c.offset])
                positions.append(pos)
                slots.append(self.canary_slot(full))
        order = self.rng.permutation(bs)  # padding rows stand anywhere in the batch
        req_pool_indices, prefix_lens = req_pool_indices[order], prefix_lens[order]
        extend_lens, valid_lens = extend_lens[order], valid_lens[order]
        # the write arrays follow the plan's row order
        chunks = {}
        start = 0
        for i, (_req, e) in enumerate(batch):
            chunks[i] = slice(start, start + e)
            start += e
        arrays = [np.asarray(x, dtype=np.int64) for x in (ids, positions, slots, expected)]
        pick = [np.arange(chunks[i].start, chunks[i].stop) for i in order if i < len(batch)]
        idx = np.concatenate(pick) if pick else np.zeros(0, np.int64)
        ids_o, positions_o, slots_o, expected_o = (a[idx] for a in arrays)
        live_rows = [batch[i][0] for i in order if i < len(batch)]
        flat = np.concatenate([np.asarray(r.tokens, np.int64) for r in live_rows])
        lens = np.asarray([len(r.tokens) for r in live_rows], dtype=np.int64)
        scatter = dict(
            flat_in=flat,
            offsets=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64),
            req_pool_indices=np.asarray([r.row for r in live_rows], dtype=np.int64),
        )
        table = self.req_to_token.copy()
        plan = dict(
            req_pool_indices=req_pool_indices,
            prefix_lens=prefix_lens,
            extend_seq_lens=extend_lens,
            req_to_token=table,
            swa_window_size=c.swa_window,
            full_to_swa_index_mapping=None if self.lut is None else self.lut.copy(),
            req_to_verify_expected_tokens_valid_lens=valid_lens,
            kv_token_id_vs_position_offset=c.offset,
        )
        starts = np.where(
            req_pool_indices != 0, np.maximum(prefix_lens - (c.swa_window or 10**9), 0), 0
        )
        need = int(np.where(req_pool_indices != 0, prefix_lens - starts, 0).sum())
        forward = Forward(
            kind=kind,
            scatter=scatter,
            plan=plan,
            verify_capacity=max(1, need),
            write_req_capacity=bs,
            write=dict(
                input_ids=ids_o,
                positions=positions_o,
                out_cache_loc=slots_o,
                expected_input_tokens=expected_o,
                expected_input_positions=positions_o.copy(),
                enable_write_input_assert=True,
            ),
            kv_slots=slots_o.copy(),
            kv_bytes=self._kv(slots_o.shape[0]),
        )
        # after the forward: positions written, next tokens sampled, SWA windows slide
        self.last_written = []
        for req, e in batch:
            self.last_written += [(req.rid, pos) for pos in range(req.written, req.written + e)]
            req.written += e
            if self._pending(req) == 0 and len(req.tokens) < c.context_len + c.offset:
                token = self._fresh(1)[0]
                req.tokens.append(token)
                req.truth.append(token)
                req.decoding = True
            if self.lut is not None:
                self._evict_slots(
                    self.full_slot(req, p) for p in range(self._window_start(req.written))
                )
        self.log.append(
            f"{kind}: "
            + ", ".join(f"request {r.rid} writes {e}" for r, e in batch)
            + (f", {pad} padding rows" if pad else "")
        )
        return forward

    def finish(self, pick: int) -> int | None:
        """A request that has sampled a token ends: its page-aligned written prefix is cached,
        its row freed."""
        done = [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.decoding]
        req = self._pick(done, pick)
        if req is None:
            return None
        del self.running[req.rid]
        c = self.config
        k = req.written // c.page_size * c.page_size
        if k:
            pages = tuple(req.pages[: k // c.page_size])
            for page in pages:
                self.cache_refs[page] += 1
            self.cache.append(_CacheEntry(tuple(req.tokens[: k + c.offset]), pages, k))
        for page in req.pages:
            self._release(page, cache=False)
        self.free_rows.append(req.row)
        self.log.append(f"finish: request {req.rid}, {k} positions cached")
        rid: int = req.rid
        return rid

    def retract(self, pick: int) -> int | None:
        """A running request that has written KV is preempted: its KV is freed and it waits
        with its tokens."""
        req = self._pick(
            [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.written], pick
        )
        if req is None:
            return None
        del self.running[req.rid]
        for page in req.pages:
            self._release(page, cache=False)
        self.free_rows.append(req.row)
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
        req.row = self.free_rows.pop(0)
        req.written, req.pages, req.decoding = 0, [], False
        # everything known is a prompt now: the last token is computed, not sampled again
        self.running[req.rid] = req
        self.log.append(f"readmit: request {req.rid}, row {req.row}")
        rid: int = req.rid
        return rid

    def evict(self) -> int | None:
        """The oldest cached prefix is dropped; pages no one else holds go back to the allocator."""
        if not self.cache:
            return None
        entry = self.cache.pop(0)
        for page in entry.pages:
            self._release(page, cache=True)
        self.log.append(f"evict: a cached prefix of {entry.length}")
        return entry.length

    def sweep(self) -> Sweep | None:
        """Every slot the cache holds, as a verify plan's entries (translated, like SGLang's
        radix sweep; an evicted SWA slot is 0, which verify skips)."""
        slots, positions, prevs = [], [], []
        for entry in self.cache:
            req = _Request(0, 0, [], [], pages=list(entry.pages))
            full = [self.full_slot(req, p) for p in range(entry.length)]
            slots += [self.canary_slot(s) for s in full]
            positions += list(range(entry.length))
            prevs += [-1] + [self.canary_slot(s) for s in full[:-1]]
        if not slots:
            return None
        self.steps += 1
        self.log.append(f"sweep: {len(slots)} cached slots")
        return Sweep(*(np.asarray(x, dtype=np.int64) for x in (slots, positions, prevs)))

    # -- what the suite asks ------------------------------------------------------------------

    def slots_of(self, entries) -> frozenset:
        """The canary slots the given ``(request, position)`` pairs are written in now."""
        out = set()
        for rid, pos in entries:
            req = self.running.get(rid)
            if req is not None and pos < req.written:
                out.add(self.canary_slot(self.full_slot(req, pos)))
        return frozenset(out)

    def entry_plan(self, row: int, pos: int) -> tuple[int, int, int]:
        """``(slot, prev_slot, position)`` the plan makes of ``req_to_token[row, pos]`` now."""
        table = self.req_to_token
        slot = self.canary_slot(table[row, pos])
        prev = -1 if pos == 0 else self.canary_slot(table[row, pos - 1])
        return slot, prev, pos

    def describe(self) -> str:
        c = self.config
        return (
            f"{c!r}\n       history: "
            + "; ".join(self.log[-16:])
            + (f" (last 16 of {len(self.log)})" if len(self.log) > 16 else "")
        )

    # -- faults ------------------------------------------------------------------------------

    def _verified_next(self) -> list[tuple[_Request, int]]:
        """(request, position) of every written position the next forward of its request
        verifies (inside the window the request will have then)."""
        out = []
        for req in sorted(self.running.values(), key=lambda r: r.rid):
            if not self._will_run(req):
                continue
            for pos in range(self._window_start(req.written), req.written):
                if self.canary_slot(self.full_slot(req, pos)):
                    out.append((req, pos))
        return out

    def fault(self, kind: str, pick: int, byte: int = 0) -> Fault | None:
        """Make a fault of ``kind`` (:data:`FAULT_KINDS`) at the place ``pick`` chooses among
        those where the next step can see it; None when there is none."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}")
        fault: Fault | None = getattr(self, f"_fault_{kind}")(pick, byte % KV_BYTES)
        if fault is not None:
            self.log.append(f"FAULT {fault.what}")
        return fault

    def _kv_fault(self, kind: str, place, byte: int, note: str) -> Fault | None:
        """A KV byte fault at ``place``, ``(request, position)`` or None (no place)."""
        if place is None:
            return None
        req, pos = place
        slot = self.canary_slot(self.full_slot(req, pos))
        what = f"{kind}: byte {byte} of slot {slot} (request {req.rid}, position {pos}{note})"
        return Fault(kind, (slot, byte), frozenset({slot}), (), _REAL_KV, what)

    def _fault_kv_used(self, pick, byte):
        return self._kv_fault("kv_used", self._pick(self._verified_next(), pick), byte, "")

    def _fault_kv_post_forward(self, pick, byte):
        just = set(self.last_written)
        places = [(r, p) for r, p in self._verified_next() if (r.rid, p) in just]
        return self._kv_fault("kv_post_forward", self._pick(places, pick), byte, ", just written")

    def _fault_kv_unused_cache(self, pick, byte):
        places: dict[int, int] = {}  # canary slot -> cached position, slots no request uses
        for entry in self.cache:
            holder = _Request(0, 0, [], [], pages=list(entry.pages))
            for pos in range(entry.length):
                page = entry.pages[pos // self.config.page_size]
                slot = self.canary_slot(self.full_slot(holder, pos))
                if self.req_refs[page] == 0 and slot:
                    places.setdefault(slot, pos)
        place = self._pick(sorted(places.items()), pick)
        if place is None:
            return None
        slot, pos = place
        what = f"kv_unused_cache: byte {byte} of slot {slot} (cached position {pos}, no request uses it)"
        return Fault("kv_unused_cache", (slot, byte), frozenset({slot}), (), _REAL_KV, what)

    def _table_fault(self, kind: str, full_slots, entries: tuple, what: str) -> Fault:
        """A fault of the page table or the allocator: reported at one of the canary slots of
        ``full_slots``, by the verify of ``entries``."""
        slots = frozenset(self.canary_slot(s) for s in full_slots)
        return Fault(kind, None, slots, entries, 0, f"{kind}: {what}")

    def _fault_req_to_token(self, pick, byte):
        places = self._verified_next()
        place = self._pick(places, pick)
        if place is None:
            return None
        req, pos = place
        old = int(self.req_to_token[req.row, pos])
        others = sorted(
            {
                self.full_slot(r, p)
                for r in self.running.values()
                for p in range(r.written)
                if r.rid != req.rid
                and self.full_slot(r, p) != old
                and self.canary_slot(self.full_slot(r, p))
            }
        )
        new = self._pick(others, pick // max(1, len(places)))
        if new is None:
            return None
        self.req_to_token[req.row, pos] = new
        what = f"request {req.rid} (row {req.row}) position {pos} names slot {new}, not {old}"
        return self._table_fault("req_to_token", {new}, ((req.rid, pos),), what)

    def _fault_page_swap(self, pick, byte):
        p = self.config.page_size
        pages = []
        for req, pos in self._verified_next():
            first = pos - pos % p
            if (
                pos == first
                and first + p <= req.written
                and first >= self._window_start(req.written)
            ):
                pages.append((req, first))
        pairs = [
            (a, b)
            for i, a in enumerate(pages)
            for b in pages[i + 1 :]
            if a[0].rid != b[0].rid and self.full_slot(a[0], a[1]) != self.full_slot(b[0], b[1])
        ]
        pair = self._pick(pairs, pick)
        if pair is None:
            return None
        (ra, fa), (rb, fb) = pair
        table = self.req_to_token
        a = table[ra.row, fa : fa + p].copy()
        table[ra.row, fa : fa + p] = table[rb.row, fb : fb + p]
        table[rb.row, fb : fb + p] = a
        what = (
            f"request {ra.rid} positions {fa}..{fa + p - 1} and request {rb.rid} positions "
            f"{fb}..{fb + p - 1} swap pages"
        )
        slots = np.concatenate([a, table[ra.row, fa : fa + p]]).tolist()
        return self._table_fault("page_swap", slots, ((ra.rid, fa), (rb.rid, fb)), what)

    def _fault_freed_while_referenced(self, pick, byte):
        p = self.config.page_size
        places = []
        for req, pos in self._verified_next():
            page = req.pages[pos // p]
            if pos % p == 0 and self.req_refs[page] == 1 and self.cache_refs[page] == 0:
                places.append((req, pos, page))
        place = self._pick(places, pick)
        if place is None:
            return None
        req, pos, page = place
        self.req_refs[page] = 0
        self.free_pages.insert(0, page)  # the next allocation takes it
        what = f"page {page} (request {req.rid} positions {pos}..{pos + p - 1}) freed while in use"
        slots = range(page * p, (page + 1) * p)
        return self._table_fault("freed_while_referenced", slots, ((req.rid, pos),), what)

    def _fault_next_token_swap(self, pick, byte):
        ready = [
            r
            for r in sorted(self.running.values(), key=lambda r: r.rid)
            if r.decoding and self._pending(r) == 1 and r.written < self.config.context_len
        ]
        pairs = [
            (a, b)
            for i, a in enumerate(ready)
            for b in ready[i + 1 :]
            if a.tokens[-1] != b.tokens[-1]
        ]
        pair = self._pick(pairs, pick)
        if pair is None:
            return None
        a, b = pair
        a.tokens[-1], b.tokens[-1] = b.tokens[-1], a.tokens[-1]
        return Fault(
            "next_token_swap", None, frozenset(), ((a.rid, a.written), (b.rid, b.written)), _WRITE_TOKEN,
            f"next_token_swap: requests {a.rid} and {b.rid} swap their sampled tokens",
        )  # fmt: skip
