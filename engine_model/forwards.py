"""How an engine makes a forward (:class:`engine_model.steps.Forward`): the rows that run get
their pages (a row that would race another waits), the batch is laid out (padding rows
anywhere, or at the tail of a replayed graph), the write's tokens and expected inputs are made
per forward mode, the plan's inputs and the scatter of the token snapshots per SGLang's
``PlanInput``, each buffer group's launch with the KV the forward stores; then the bookkeeping
after it: positions written, tokens sampled, a target verify's accept and rollback, windows
that slide, and the situations the suite counts.
"""

from __future__ import annotations

import numpy as np

from engine_model.allocators import Allocators
from engine_model.state import Request
from engine_model.steps import Forward, GroupLaunch
from engine_model.vocabulary import (
    DECODE,
    DRAFT_DECODE,
    FULL,
    IDLE,
    ORACLE_MODES,
    SWA,
    StepLabel,
    situation,
)
from reference import REQ_POOL_IDX_PADDING, window_starts

__all__ = ["Forwards"]


class Forwards(Allocators):
    """Building a forward, and the engine's state after it (a mixin of
    :class:`engine_model.engine.Engine`)."""

    #: the tokens each padding row of an idle step writes (:meth:`engine_model.engine.Engine.idle`)
    _idle_width = 1

    def _forward(
        self, forward_kind: str, rows, pad: int, *, forward_mode: str, graph: bool = False
    ) -> Forward | None:
        """One forward step of ``forward_kind`` in ``forward_mode`` over ``rows``,
        ``(request, tokens to write)``, and ``pad`` padding rows: the pages allocated, the batch
        laid out (padding rows anywhere, or at the tail of a replayed graph), the launches'
        arrays made per buffer group, then the engine moved past the forward."""
        batch = self._allocate(rows)
        if not batch and forward_mode != IDLE:
            return None
        self.steps += 1
        self.events[situation(StepLabel(forward_mode, graph=graph))] += 1
        lens = self._batch_rows(forward_kind, batch, pad, graph)
        written = self._written_tokens(batch, forward_mode)
        # the write's input assert is off in every decode of the draft model (the EAGLE
        # offset), as SGLang's SingleForwardManager turns it off (is_eagle_draft_decode), and
        # everywhere in an engine configured without it
        assert_off = (
            not self.config.write_input_assert
            or bool(self._draft)
            or self._draft_model_decode(forward_mode)
        )
        bs = len(batch) + pad
        # padding rows stand anywhere in the batch; a graph's at the tail
        order = np.arange(bs) if graph else self.rng.permutation(bs)
        lens = {name: value[order] for name, value in lens.items()}
        ids, positions, full_slots, expected, token_rows = self._laid_out(
            batch, order, written, pad if graph else 0, int(lens["extend"][-1]) if pad else 1
        )
        live = [batch[i][0] for i in order if i < len(batch)]
        for slot in full_slots.tolist():
            self._slot_written[slot] = self.steps
        self._count_situations(live, lens, graph)
        for req in live:
            self.last_run[req.rid] = self.steps
        groups = self._group_launches(full_slots, lens, graph)
        forward = Forward(
            kind=forward_kind,
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
            groups=groups,
            mode=forward_mode,
            graph=graph,
            tail_write=self._tail_write(positions),
            token_rows=token_rows.astype(np.int64),
        )
        if forward.tail_write:
            self.hooks.positions_fault_made = {g.group: int(g.out_cache_loc[0]) for g in groups}
            self.hooks.positions_fault_seen = not assert_off or int(positions[0]) > 0
        self._after_forward(batch)
        self.log.append(
            f"{forward_kind}: "
            + ", ".join(f"request {r.rid} writes {e}" for r, e in batch)
            + (", " if batch and pad else "")
            + (f"{pad} padding rows" if pad else "")
            + (" (graph replay)" if graph and forward_kind != "idle" else "")
        )
        return forward

    def _laid_out(
        self, batch, order: np.ndarray, written: list[np.ndarray], pad: int, per_pad: int
    ) -> list[np.ndarray]:
        """The write's token arrays (input ids, positions, full slots, expected inputs) in the
        plan's row order, and the batch row of each token; a replayed graph's ``pad`` padding
        rows (none outside a graph) write ``per_pad`` tokens each at its tail (their extend
        length: 1 in a decode, the draft count in a target verify): position 0, slot 0, a stale
        input id."""
        bs = len(batch) + pad
        ids, positions, full_slots, expected = self._in_plan_order(batch, order, written)
        sizes = {i: e for i, (_, e) in enumerate(batch)}
        token_rows = np.repeat(np.arange(len(order)), [sizes.get(int(i), 0) for i in order])
        if pad:  # a padding row's tokens: position 0, slot 0, a stale input id
            token_rows = np.concatenate([token_rows, np.repeat(np.arange(bs - pad, bs), per_pad)])
            stale = self.rng.integers(1, 2**20, pad * per_pad).astype(np.int64)
            zero = np.zeros(pad * per_pad, dtype=np.int64)
            ids, expected = np.concatenate([ids, stale]), np.concatenate([expected, stale])
            positions = np.concatenate([positions, zero])
            full_slots = np.concatenate([full_slots, zero])
        return [ids, positions, full_slots, expected, token_rows]

    def _group_launches(
        self, full_slots: np.ndarray, lens: dict[str, np.ndarray], graph: bool
    ) -> tuple[GroupLaunch, ...]:
        """Each buffer group's part of the forward, in launch order: the write's slots in the
        group, the KV the forward stores there, the group's plan arguments and capacity."""
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
        return tuple(groups)

    def _tail_write(self, positions: np.ndarray) -> dict:
        """The write's arrays as a positions fault leaves them for the ``TAIL`` launches."""
        if self.hooks.positions_fault is None or not positions.size:
            return {}
        moved = positions.copy()
        moved[0] += self.hooks.positions_fault
        self.hooks.positions_fault = None
        self.events["positions moved between the HEAD and the TAIL launches"] += 1
        return {"positions": moved}

    def _stored(self, group: str, slots: np.ndarray, kv: np.ndarray) -> tuple[np.ndarray, ...]:
        """The slots of ``group``'s pool and the KV bytes the forward stores there: those it
        writes, unless a store fault changes them."""
        if self.hooks.store_fault is not None:
            stored = self.hooks.store_fault(group, slots, kv)
            if stored is not None:
                self.hooks.store_fault = None
                return stored
        return slots, kv

    def _allocate(self, rows) -> list[tuple[Request, int]]:
        """The rows that run, ``(request, tokens it writes)``, each with the pages it needs
        allocated; a row past its context or without enough free pages (or SWA slots) waits,
        and so does a row that would race a row before it (:meth:`_writes_and_seed`)."""
        c = self.config
        batch = []
        written: dict[str, set[int]] = {g: set() for g in c.groups}
        seeds: dict[str, set[int]] = {g: set() for g in c.groups}
        for req, e in rows:
            e = min(e, c.context_len - req.written)
            if e <= 0:
                continue
            pages = None
            if self._reserve:  # SGLang's spec v2: its committed length plus the reserve
                to = min(self.verify_alloc_to(req, self._reserve), c.context_len)
                pages = self._alloc_pages(
                    max(0, -(-to // c.page_size) - len(req.pages)), exclude=self._named_pages(req)
                )
            if pages is None:  # what it writes (the reserve short: the model's named choice)
                need = (req.written + e + c.page_size - 1) // c.page_size - len(req.pages)
                pages = self._alloc_pages(max(0, need), exclude=self._named_pages(req))
            if pages is None:
                continue
            req.pages += pages
            mine = {g: self._writes_and_seed(req, e, g) for g in c.groups}
            if self._slot_lost(req, e) or any(
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

    def _named_pages(self, req: Request) -> set[int]:
        """The pages ``req`` holds and those its page table names for the positions it wrote
        (the same unless a fault made them differ)."""
        p = self.config.page_size
        return set(req.pages) | {int(s) // p for s in self.req_to_token[req.row, : req.written]}

    def _slot_lost(self, req: Request, e: int) -> bool:
        """Whether a position ``req`` would write has no SWA slot: a page in use handed to
        another request by a fault, whose window then slid past the page's positions and
        freed their SWA slots. Its writes would all land in the padding slot 0, a write with
        no defined result: the row waits."""
        if self.lut is None:
            return False
        return any(
            not self.lut[self.full_slot(req, p)] for p in range(req.written, req.written + e)
        )

    def _writes_and_seed(self, req: Request, e: int, group: str) -> tuple[set[int], set[int]]:
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

    def _batch_rows(self, forward_kind: str, batch, pad: int, graph: bool) -> dict[str, np.ndarray]:
        """Each row's pool row and lengths, the batch's rows first and the padding rows after
        them, with stale lengths (a decode batch's extend lengths are all 1, as SGLang's); a
        replayed graph's padding rows have the prefix of their zeroed ``positions``."""
        bs = len(batch) + pad
        rows = np.full(bs, REQ_POOL_IDX_PADDING, dtype=np.int64)
        stale = self.rng.integers(-3, self.config.context_len + 3, (3, bs)).astype(np.int64)
        prefix, extend, valid = stale[0], stale[1], stale[2]
        if forward_kind in ("decode", "idle", "draft_decode"):
            extend[:] = self._idle_width if forward_kind == "idle" else 1
        if forward_kind in ("target_verify", "draft_extend") and batch:  # one count a batch
            extend[:] = batch[0][1]
        if graph:
            prefix[:] = 0
        for i, (req, e) in enumerate(batch):
            rows[i] = req.row
            prefix[i], extend[i], valid[i] = req.written, e, len(req.tokens)
        return {"rows": rows, "prefix": prefix, "extend": extend, "valid": valid}

    def _written_tokens(self, batch, forward_mode: str) -> list[np.ndarray]:
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
            extending = self._extending.get(req.rid)
            for i, pos in enumerate(range(req.written, req.written + e)):
                full = self.full_slot(req, pos)
                self.req_to_token[req.row, pos] = full
                if req.rid in self._draft:
                    token = self._draft[req.rid]
                elif extending is not None:
                    token = extending[0][i]
                else:
                    token = drafted[0][i] if drafted else req.tokens[pos + c.offset]
                ids.append(token)
                # a draft extend's rejected position: the target's prediction there is, in
                # the token oracle's world where the assert can be on, the oracle's own token
                rejected = extending is not None and i >= extending[1]
                oracle = (
                    forward_mode in ORACLE_MODES
                    and req.rid not in self._draft
                    and not self._draft_model_decode(forward_mode)
                    and not rejected
                )
                expected.append(req.truth[pos + c.offset] if oracle else token)
                positions.append(pos)
                slots.append(full)
                self.written_by[(req.rid, pos)] = (
                    forward_mode if oracle or forward_mode != DECODE else DRAFT_DECODE.name
                )
                self.written_at[(req.rid, pos)] = self.steps
        return [np.asarray(x, dtype=np.int64) for x in (ids, positions, slots, expected)]

    def _draft_model_decode(self, forward_mode: str) -> bool:
        """Whether a forward in ``forward_mode`` is a decode of the draft model's canary (the
        EAGLE offset), whose input assert SGLang turns off."""
        return bool(self.config.offset) and forward_mode == DECODE

    @staticmethod
    def _in_plan_order(batch, order: np.ndarray, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The write's arrays in the plan's row order (``order`` of the batch's rows)."""
        starts = np.cumsum([0] + [e for _, e in batch])
        pick = [np.arange(starts[i], starts[i + 1]) for i in order if i < len(batch)]
        idx = np.concatenate(pick) if pick else np.zeros(0, np.int64)
        return [a[idx] for a in arrays]

    @staticmethod
    def _scatter(live: list[Request]) -> dict:
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

    def _count_situations(self, live: list[Request], lens: dict, graph: bool) -> None:
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
            last = self._row_last_len.get(req.row)
            if last is not None and last[0] != req.rid and last[1] > len(req.tokens):
                self.events["a recycled row whose new owner is shorter than the old"] += 1
            verified = range(self.window_start(req.written, FULL), req.written)
            cut = [p for p in verified if p + c.offset >= len(req.tokens)]
            if cut:
                self.events["an expected-token read cut off by the valid length"] += 1
            if cut and last is not None and last[0] != req.rid and last[1] > len(req.tokens):
                # the old owner's stale tokens lie past the valid length the plan reads to
                self.events["a plan read past the snapshot of a row a longer owner left"] += 1
            start = self.window_start(req.written)
            if self.lut is not None and start > 0:
                if not self.lut[self.full_slot(req, start - 1)]:
                    self.events["an SWA window that slid past an evicted slot"] += 1
        if graph:  # a graph per batch size and tokens a row (a decode's, a target verify's)
            key = (int(lens["rows"].shape[0]), int(lens["extend"][-1]))
            if key in self._captured:
                self.events["plans reused by a replayed graph"] += 1
            self._captured.add(key)

    def _after_forward(self, batch) -> None:
        """After the forward: positions written, next tokens sampled (a target verify's
        accepted drafts and the target's token after them), SWA windows slide."""
        c = self.config
        self.last_written = []
        made_before = self.hooks.rollback_fault_made
        for req, e in batch:
            if req.rid in self._draft:  # a draft position: written, nothing sampled
                req.written += e
                continue
            drafted = self._drafting.get(req.rid)
            if drafted is not None:
                e = self._accept(req, *drafted)
            if req.rid in self._extending:  # the rejected positions' records stay, uncommitted
                e = self._extending[req.rid][1]
            self.last_written += [(req.rid, pos) for pos in range(req.written, req.written + e)]
            req.written += e
            if drafted is not None:
                self._rollback(req)
            if self.pending(req) == 0 and len(req.tokens) < c.context_len + c.offset:
                token = self._fresh(1)[0]
                req.tokens.append(token)
                req.truth.append(token)
                req.decoding = True
            if self.lut is not None:
                # the pages wholly behind the window, but those of a shared prefix that another
                # request's window still reaches
                ps = c.page_size
                behind = self.swa_freed_to(req.written)
                kept = {p // ps for p in range(behind) if self._in_another_window(req, p)}
                self._evict_slots(
                    self.full_slot(req, p) for p in range(behind) if p // ps not in kept
                )
        made = self.hooks.rollback_fault_made
        if made is not None and made is not made_before and made[1] in self.free_pages:
            # the faulty rollback's page stays first in line: frees of the batch's later rows,
            # which SGLang's paged allocator puts before every free page, come after it
            self.put_first([made[1]])

    def _in_another_window(self, req: Request, pos: int) -> bool:
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

    def _accept(self, req: Request, ids: list, truth: list, kept: int) -> int:
        """A target verify's outcome for ``req``: the sampled token and ``kept`` drafts stay
        written, and the target's own token after them is sampled; the positions it keeps."""
        room = self.config.context_len + self.config.offset - len(req.tokens)
        accepted = (truth[:kept] + [truth[kept]])[:room]  # a full row samples nothing more
        if self.hooks.accept_fault and kept < len(ids) - 1 and len(accepted) == kept + 1:
            # the fault: the first rejected draft counts as accepted, its record kept; the
            # target's token after it is sampled as if that draft were right
            self.hooks.accept_fault = False
            self.hooks.accept_fault_made = (req.rid, req.written + kept + 1, self.steps)
            more = self._fresh(1)
            accepted = (accepted + more)[:room]
            req.tokens += accepted
            req.truth += accepted
            return kept + 2
        req.tokens += accepted
        req.truth += accepted
        self.events["drafts rejected, their pages kept for the next verify"] += int(
            kept < len(ids) - 1
        )
        return kept + 1

    def _free_past(self, req: Request, written: int) -> None:
        """Free the pages of ``req`` past the one holding position ``written - 1``, in one free
        call (``req_to_token`` keeps naming them, past what the request wrote, as SGLang's table
        does)."""
        keep = -(-written // self.config.page_size)
        self._release_pages(req.pages[keep:], cache=False)
        del req.pages[keep:]

    def verify_alloc_to(self, req: Request, reserve: int) -> int:
        """The positions ``req`` holds pages for in a speculative decode step of SGLang's spec
        v2 (``page_aligned_decode_alloc_lens``, ``mem_cache/allocation_sizing.py``): what it
        holds already, or its committed length plus ``reserve`` rounded up to a page, whichever
        is more."""
        p = self.config.page_size
        return max(len(req.pages) * p, (req.written + reserve + p - 1) // p * p)

    def _rollback(self, req: Request) -> None:
        """After a target verify: nothing is freed. SGLang's spec v2 keeps a request's pages,
        rejected drafts' included, until the request is released (``eagle_utils.py``, read;
        its v1 worker, which freed them at once, is gone). The fault
        (``rejected_draft_named``) frees, as a v1 rollback would, the first page past the one
        holding the last committed position, first in line for others, while the request goes
        on naming it."""
        keep = -(-req.written // self.config.page_size)
        if not self.hooks.rollback_fault or keep >= len(req.pages):
            return
        self.hooks.rollback_fault = False
        page = req.pages[keep]
        self.hooks.rollback_fault_made = (req.rid, page)
        self._release_pages([page], cache=False)
        self.put_first([page])  # first in line once the batch's frees are done
