"""An engine model: the canary as an engine runs it, step by step (CONTRACT §12, §13, §6, §7).

:class:`Engine` keeps, as plain numpy data, what an SGLang-style engine keeps around its KV
cache, and turns each step of a history into exactly the launches the engine makes:

- a request-to-token pool (``req_to_token``, row 0 the padding row) and an expected-token pool
  beside it, whose rows keep the stale tail of a longer previous owner when they are reused;
- a slot allocator handing out pages of ``page_size`` slots (page 0, and so slot 0, is the
  padding page and never handed out), with a reference count per page;
- a prefix cache (radix nodes with their access times, whose least-recently-used leaves are
  evicted whole when an allocation finds the allocator short, :mod:`engine_model.eviction`)
  that keeps the page-aligned prefix of every prefill chunk (inserted after the
  extend forward, as SGLang's scheduler inserts after every chunk), finished or inserted
  request as a path of pages (a radix tree's, one entry a leaf's path) and lets a new request
  share it; a retraction caches nothing new;
- an optional sliding window (``swa_window > 0``): every full page has an SWA page through the
  full-to-SWA table (slot ``k`` of the one, slot ``k`` of the other), in an SWA pool smaller
  than the full pool (``swa_slots``), paged in step with the full pool as SGLang's SWA
  allocator pages them (``mem_cache/allocator/swa.py``): a page that has left its request's
  window whole is evicted (its table entries set to 0, its SWA page freed for reuse), and KV
  moves carry the SWA pages the window touches; when the SWA pool runs short, the pages of
  cached positions no request uses lose their SWA pages first, as SGLang's SWA cache evicts
  under pressure;
- an optional EAGLE offset (``offset = 1``): the KV of position ``pos`` holds token
  ``pos + offset``.

Its steps are those of a serving loop: :meth:`Engine.admit` (a new request, sharing a cached
prefix or not), :meth:`Engine.prefill` (an extend batch: every request with unwritten prompt
tokens writes its next chunk, then inserts it into the prefix cache), :meth:`Engine.decode` (a decode batch, with padding rows whose
lengths are stale, or replaying a CUDA graph, and a verify capacity that may overflow),
:meth:`Engine.mixed` (a mixed batch: prompt chunks and decode rows), :meth:`Engine.idle` (an
all-padding graph step), :meth:`Engine.target_verify` (EAGLE's target verify, then accept and
rollback), :meth:`Engine.draft_decode` (the draft model's multi-step draft),
:meth:`Engine.draft_extend` (its draft extend after a target verify, ``DRAFT_EXTEND_V2``),
:meth:`Engine.finish` (the prefix goes to the cache, the row is freed), :meth:`Engine.retract`
and :meth:`Engine.readmit`, :meth:`Engine.admit_twin` (a request with a cached prefix's
tokens that computes them again), :meth:`Engine.insert` (a running request's prefix goes into
the cache after its extend forward, its row rebound to the cache's pages where the cache holds
the same tokens, its own duplicates freed) and :meth:`Engine.sweep` (a verify of every slot the cache holds). A forward step returns a :class:`Forward`: the scatter of the batch's token snapshots,
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
:class:`Engine` (through its public methods and its :attr:`Engine.hooks`) and says what it must
cause.

The engine is one class of parts, one module each: its state and the reads every part shares
(:mod:`engine_model.state`), the allocators (:mod:`engine_model.allocators`), the prefix cache
(:mod:`engine_model.prefix_cache`) and the eviction of its radix nodes
(:mod:`engine_model.eviction`), the making of a forward (:mod:`engine_model.forwards`) and
KV that moves without a forward (:mod:`engine_model.moves`); this module composes them and
holds the scheduler's steps. Its configuration is :mod:`engine_model.config`, its steps'
data :mod:`engine_model.steps`, its fault hooks :mod:`engine_model.hooks`.

Torch-free and deterministic: the same calls on the same :class:`EngineConfig` give the same
arrays, so a failing history's steps repeat it exactly.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine_model.allocators import Allocators
from engine_model.config import EngineConfig, pick_from
from engine_model.forwards import Forwards
from engine_model.moves import Moves
from engine_model.prefix_cache import PrefixCache
from engine_model.state import CacheEntry, EngineState, Request
from engine_model.steps import Forward, Move
from engine_model.vocabulary import (
    DECODE,
    DRAFT_EXTEND_V2,
    EXTEND,
    IDLE,
    MIXED,
    PREFILL_ENGINE,
    TARGET_VERIFY,
)

__all__ = ["Engine"]


class Engine(Forwards, Moves, PrefixCache, Allocators, EngineState):
    """The engine model (see the module). Every step method returns None when the step has
    nothing to do in the engine's state (no request to finish, no free page, ...)."""

    def __init__(self, config: EngineConfig):
        super().__init__(config)
        #: the prefill engine of PD transfers (made by the first :meth:`receive`): the same
        #: sizes, a seed and tokens of its own
        self.peer: Engine | None = None

    # -- the scheduler's steps --------------------------------------------------------------

    def admit(self, new_tokens: int, share: int = 0) -> int | None:
        """A new request whose prompt ends in ``new_tokens`` fresh tokens; ``share > 0`` picks a
        cached prefix for the prompt to start with (the longest page-aligned part that fits in a
        row and whose window is still resident), shared with the cache, not computed again."""
        c = self.config
        if not self.free_rows or new_tokens < 1 or new_tokens + c.offset > c.context_len:
            return None
        row = self._take_row()
        req = Request(self.next_rid, row, [], [])
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
            self.touch_match(entry, shared // c.page_size)
            req.pages = list(entry.pages[: shared // c.page_size])
            for page in req.pages:
                self.req_refs[page] += 1
            req.tokens = list(entry.tokens[: shared + c.offset])
            for pos in range(shared):
                self.req_to_token[row, pos] = self.full_slot(req, pos)
        prompt_len = len(req.tokens) + new_tokens
        req.tokens += self._fresh(prompt_len - len(req.tokens))
        req.truth = list(req.tokens)
        req.written, req.prompt = shared, prompt_len
        self.running[req.rid] = req
        self.log.append(
            f"admit(prompt_len={prompt_len}, share={share}): request {req.rid}, row {row}, {shared} cached"
        )
        rid: int = req.rid
        return rid

    def prefill(self, chunk: int, insert: bool = True) -> Forward | None:
        """An extend batch (``EXTEND``): each request with unwritten prompt tokens writes up to
        ``chunk``; then each inserts what it wrote into the prefix cache (:meth:`_inserted`;
        ``insert`` False: the caller makes that insert, a fault's)."""
        rows = self.prompt_rows(chunk)
        if any(n < self.pending(r) for r, n in rows):
            self.events["a prompt prefilled in more than one chunk"] += 1
        forward = self._forward("prefill", rows, pad=0, forward_mode=EXTEND)
        if forward is not None and insert:
            self._inserted(rows)
        return forward

    def _inserted(self, rows) -> None:
        """The prefix cache after an extend forward, as SGLang's scheduler leaves it
        (``checkpoint_kv_cache`` after every prefill chunk: ``managers/scheduler_components/
        batch_result_processor.py`` and the scheduler's ``stash_chunked_request``; when, read,
        not run): each prompt row that ran has its page-aligned written prefix inserted
        (:meth:`checkpoint`, held to SGLang's insert run from source), its row rebound to the
        cache's pages where the cache held those tokens in others."""
        for req, _ in rows:
            if self.last_run.get(req.rid) != self.steps or req.rid not in self.running:
                continue
            if req.written >= self.config.page_size:
                self.checkpoint(req)
                self.events["a prefill inserted into the prefix cache"] += 1

    def prompt_rows(self, chunk: int) -> list:
        """``(request, tokens)`` of each running request with unwritten prompt tokens, up to
        ``chunk`` each: the rows of an extend batch."""
        return [
            (r, min(chunk, self.pending(r)))
            for r in self.running.values()
            if not r.decoding and self.pending(r) > 0
        ]

    def decode_rows(self) -> list:
        """``(request, 1)`` of each running request that has sampled its next token and has
        room to write it: the rows of a decode batch."""
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
            return self._forward(
                "decode", self.decode_rows(), pad=pad, forward_mode=DECODE, graph=graph
            )
        finally:
            self._overflow = False

    def draft_decode(self, steps: int, pad: int = 0, graph: bool = False) -> list[Forward]:
        """The draft model's multi-step draft (its canary has the EAGLE offset 1; SGLang's
        ``is_eagle_draft_decode``): ``steps`` decode forwards, each writing one draft position
        past the last of every decoding request (the first with the token sampled, the rest
        with draft tokens), the write's input assert off, the snapshot's valid length the
        tokens known before drafting, so a later step's verify of an earlier draft past the
        snapshot expects no token; then the drafts are given up (the target decides) and the
        requests are back where they were, their drafts' pages still theirs (SGLang's spec v2
        frees nothing before the request is released; its ``prepare_for_draft`` takes the
        drafts' slots from the request's row past ``seq_lens``, as the SGLang legs' tree
        self-test runs it). Replaying a CUDA graph (``graph``:
        EAGLE's draft decode graph runner, ``eagle_draft_cuda_graph_runner.py``), each step has
        ``pad`` padding rows at its tail, one token each."""
        c = self.config
        if pad and not graph:
            raise ValueError("a draft decode has padding rows only when it replays a graph")
        if not c.offset or steps < 1:
            return []
        rows = [r for r, _ in self.decode_rows()]
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
                forward = self._forward(
                    "draft_decode", live, pad=pad, forward_mode=DECODE, graph=graph
                )
                if forward is None:
                    break
                self.events["a draft decode step"] += 1
                if graph:
                    self.events["a draft decode step replaying a graph"] += 1
                forwards.append(forward)
        finally:
            self._draft = {}
            for r in rows:  # the drafts' pages stay the request's (SGLang's spec v2)
                r.written = saved[r.rid]
            self.last_written = []
        return forwards

    def draft_extend(
        self, tokens: int, pad: int = 0, graph: bool = False, accept: int | None = None
    ) -> Forward | None:
        """The draft model's draft extend after a target verify (``DRAFT_EXTEND_V2``; its canary
        has the EAGLE offset 1): every decoding request writes the draft model's KV of all
        ``tokens`` positions past what it wrote, the verify's window (SGLang's
        ``prepare_for_draft_extend``: ``num_draft_tokens`` a row, rejected drafts included),
        one count for the batch (SGLang's ``num_tokens_per_req``), and commits the first
        ``kept`` of them, the target's accepted tokens (``accept``: ``kept`` is ``1 + (accept +
        i) % tokens`` for the ``i``-th row; None: all): the rejected positions' records stay in
        the request's slots, past its committed length, until a later write there replaces
        them, and their expected inputs are the inputs themselves (in the token oracle's world,
        where the assert can be on, the target's prediction at a position is the oracle's
        token); the
        plan's prefix is ``seq_lens - extend``, ``seq_lens`` counting the new positions
        (``plan_input.py``), and the write's expected inputs are the token oracle's
        (:data:`ORACLE_MODES`), its input assert on (the model's choice; SGLang's switch, in
        ``single_forward_manager/manager.py``, keeps it on there too: the per-forward leg runs
        it). A request without room for the tokens takes
        no part (None: no request has room). Replaying a CUDA graph (``graph``: EAGLE's draft
        extend graph runner, ``eagle_draft_extend_cuda_graph_runner.py``), ``pad`` padding rows
        at its tail write ``tokens`` each, as the runner pads every row to its captured width."""
        c = self.config
        if pad and not graph:
            raise ValueError("a draft extend has padding rows only when it replays a graph")
        if not c.offset or tokens < 1:
            return None
        # a request without room for the tokens is at its end: it takes no part
        rows = [
            (r, tokens)
            for r, _ in self.decode_rows()
            if r.written + tokens <= c.context_len
            and len(r.tokens) + tokens - 1 <= c.context_len + c.offset
        ]
        if not rows:
            return None
        self._extending = {}
        for i, (req, _) in enumerate(rows):  # the target's accepted tokens, known before it
            kept = tokens if accept is None else 1 + (accept + i) % tokens
            more = self._fresh(tokens - 1)
            written = req.tokens[req.written + c.offset :] + more  # one a position written
            req.tokens += more[: kept - 1]
            req.truth += more[: kept - 1]
            self._extending[req.rid] = (written[:tokens], kept)
        rejects = any(kept < tokens for _, kept in self._extending.values())
        try:
            forward = self._forward(
                "draft_extend", rows, pad=pad, forward_mode=DRAFT_EXTEND_V2, graph=graph
            )
        finally:
            self._extending = {}
        if forward is not None and rejects:
            self.events["a draft extend that wrote rejected drafts' positions"] += 1
        for req, _ in rows:  # a row that waited (no pages): its tokens are a prompt's now
            if self.pending(req) > 1:
                req.decoding = False
        return forward

    def mixed(self, chunk: int) -> Forward | None:
        """A mixed batch (``MIXED``, SGLang's mixed chunked prefill): the prompt rows of
        :meth:`prefill` and the decode rows of :meth:`decode` in one extend batch."""
        prompts = self.prompt_rows(chunk)
        rows = prompts + self.decode_rows()
        if not any(r.decoding for r, _ in rows):
            return None
        forward = self._forward("mixed", rows, pad=0, forward_mode=MIXED)
        if forward is not None:
            self._inserted(prompts)
        return forward

    def idle(self, pad: int, width: int = 1) -> Forward | None:
        """An idle step (``IDLE``, as DP attention runs one on a rank with no request): a
        replayed graph whose ``pad`` rows are all padding, each of ``width`` tokens (a decode
        graph's one; under EAGLE the target's runner replays its ``TARGET_VERIFY`` graph, whose
        rows are the draft count wide)."""
        if pad < 1 or width < 1:
            return None
        self._idle_width = width
        try:
            return self._forward("idle", [], pad=pad, forward_mode=IDLE, graph=True)
        finally:
            del self._idle_width

    def draft_idle(self, pad: int, steps: int, width: int) -> list[Forward]:
        """The draft model's idle step under EAGLE (a rank with no request): its multi-step
        draft, ``steps`` forwards replaying the draft decode graph over ``pad`` padding rows,
        then its draft extend replaying its graph, ``pad`` padding rows of ``width`` tokens
        (none without the EAGLE offset)."""
        if not self.config.offset or pad < 1 or steps < 1 or width < 1:
            return []
        made = [
            self._forward("draft_decode", [], pad=pad, forward_mode=IDLE, graph=True)
            for _ in range(steps)
        ]
        wide = self.idle(pad, width)
        return [f for f in [*made, wide] if f is not None]

    def target_verify(
        self, drafts: int, accept: int, pad: int = 0, graph: bool = False, overflow: bool = False
    ) -> Forward | None:
        """EAGLE's target verify (``TARGET_VERIFY``) of the decoding requests with room for
        ``drafts`` more positions (None when none has: the caller decodes plainly): each
        writes its sampled token and ``drafts - 1`` draft tokens at the positions past what it wrote
        (``prefix`` = ``seq_lens``, ``extend`` = ``draft_token_num``, the drafts past the
        snapshot's valid length); then each accepts the drafts that match the target's tokens,
        ``accept`` picking how many, and takes the target's own token after them. As SGLang's spec
        v2 allocates, each row holds pages to its committed length plus twice the draft
        allocation, rounded up to a page (:meth:`verify_alloc_to`; the engine's named choice:
        where the pool lacks that, what the verify writes), and a rejection frees nothing until
        the request is released. Replaying a CUDA graph (``graph``: SGLang's
        decode graph runner captures ``TARGET_VERIFY`` under speculative decoding), ``pad``
        padding rows stand at the tail, each writing ``drafts`` tokens at position 0 and slot 0,
        as the runner pads (``bs * num_tokens_per_bs`` tokens); a batch outside a graph has
        none (``ValueError``). ``overflow``: the verify plans hold one entry fewer than the
        batch verifies, as :meth:`decode`'s."""
        c = self.config
        if pad and not graph:
            raise ValueError("a target verify has padding rows only when it replays a graph")
        if drafts < 2 or c.offset:  # the draft model's canary (offset 1) runs other modes
            return None
        # every row writes ``draft_token_num`` tokens (SGLang's plan input takes one count for
        # the batch): a decoding request without room for them sits the verify out, as SGLang
        # would have finished it at its length limit
        rows = [(r, drafts) for r, _ in self.decode_rows() if r.written + drafts <= c.context_len]
        if not rows:
            return None
        self._drafting = {}
        for i, (req, e) in enumerate(rows):
            truth = self._fresh(e)  # the target's tokens after the sampled one
            kept = (accept + i) % e  # drafts accepted, 0 .. e - 1
            wrong = self._fresh(e)
            draft = truth[:kept] + wrong[kept : e - 1]
            self._drafting[req.rid] = (req.tokens[-1:] + draft, truth, kept)
        # SGLang's spec v2 reserve: twice a step's allocation, max(steps * topk, draft tokens),
        # which for a chain of ``drafts - 1`` steps is ``drafts`` (``allocation_sizing.py``)
        self._reserve, self._overflow = 2 * drafts, overflow
        try:
            forward = self._forward(
                "target_verify", rows, pad=pad, forward_mode=TARGET_VERIFY, graph=graph
            )
        finally:
            self._drafting, self._reserve, self._overflow = {}, 0, False
        return forward

    def finish(self, pick: int) -> int | None:
        """A request that has sampled a token ends: its page-aligned written prefix is cached
        (:meth:`checkpoint`, as SGLang's ``release_kv_cache`` checkpoints a finished request),
        its row freed."""
        done = [r for r in sorted(self.running.values(), key=lambda r: r.rid) if r.decoding]
        req = pick_from(done, pick)
        if req is None:
            return None
        del self.running[req.rid]
        k = self.checkpoint(req)
        self._release_request(req)
        self.log.append(f"finish: request {req.rid}, {k} positions cached")
        rid: int = req.rid
        return rid

    def retract(self, pick: int) -> int | None:
        """A running request that has written KV is preempted and waits with its tokens: as
        SGLang's ``release_kv_cache(checkpoint=False)`` (``mem_cache/common.py``; the pages it
        frees are those that function gives back, run from source by the SGLang legs' memory
        self-tests) it
        caches nothing new; what its prefills inserted stays in the prefix cache, the rest of
        its KV (its decoded positions) is freed."""
        req = pick_from(self.retractable(), pick)
        if req is None:
            return None
        del self.running[req.rid]
        self._release_request(req)
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
        req.row = self._take_row()
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

    def admit_twin(
        self, pick: int, new_tokens: int = 1, pages: int = 0, entry: CacheEntry | None = None
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
        req.truth, req.prompt = list(req.tokens), len(req.tokens)
        self.log[-1] = (
            f"admit(twin of a cached prefix, {n * p} + {new_tokens}): request {rid}, row {req.row}"
        )
        return rid

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
        req = Request(self.next_rid, self._take_row(), list(sent.tokens), list(sent.truth))
        self.next_rid += 1
        req.written, req.pages, req.decoding = written, pages, sent.decoding
        req.prompt = sent.prompt
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
