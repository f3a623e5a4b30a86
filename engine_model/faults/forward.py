"""Fault classes of the forward itself: the sampled tokens swapped (``next_token_swap``), its
KV store misdirected or dropped (``misdirected_store``, ``dropped_store``), a position moved
before the ``TAIL`` launches (``positions_moved``), and speculative decoding's accept and
rollback gone wrong (``accept_off_by_one``, ``rejected_draft_named``). A fault of the next
forward arms a hook of the engine (:class:`engine_model.hooks.EngineHooks`).
"""

from __future__ import annotations

import numpy as np

from engine_model.config import pick_from
from engine_model.faults.base import (
    CHAIN,
    POSITION,
    REAL_KV,
    TOKEN,
    Due,
    Fault,
    FaultClass,
    tags,
    verified_next,
)
from engine_model.vocabulary import (
    DECODE,
    FULL,
    MIXED,
    STAGES,
    SWA,
    SWEEP,
    TAIL,
    TARGET_VERIFY,
)
from reference import FailReason, RealKvHashMode

__all__ = [
    "AcceptOffByOne",
    "DroppedStore",
    "MisdirectedStore",
    "NextTokenSwap",
    "PositionsMoved",
    "RejectedDraftNamed",
]


class NextTokenSwap(FaultClass):
    """``perturb/next_token_swap.py``: two requests' sampled next tokens are swapped, so each
    writes the other's token: reported by the ``HEAD`` and the ``TAIL`` write of each, in every
    group, with ``WRITE_TOKEN``, in every hash mode, at the slots the settle writes them to,
    when a ``DECODE`` forward of the target model writes it (the draft model's canary, with the
    EAGLE offset, has its input assert off in every decode, as SGLang's has: it never sees
    it). An extend mode (``EXTEND``, ``MIXED``,
    ``TARGET_VERIFY``) expects its input ids as they are (SGLang's token oracle manager), and
    the expected-token pool holds the swapped token too: a swapped token such a forward writes
    is never reported."""

    name = "next_token_swap"
    description = "two requests' sampled tokens are swapped"
    seen_by_draft_model = False  # its decodes have the input assert off
    unseen_in = {
        forward_mode: f"a {forward_mode} forward writes the swapped token, and an extend mode's "
        "expected input is its input id; the expected-token pool holds the swapped token too"
        for forward_mode in (MIXED, TARGET_VERIFY)
    }

    def make(self, engine, pick, byte):
        ready = [
            r
            for r in sorted(engine.running.values(), key=lambda r: r.rid)
            if r.decoding and engine.pending(r) == 1 and r.written < engine.config.context_len
        ]
        pairs = [
            (a, b)
            for i, a in enumerate(ready)
            for b in ready[i + 1 :]
            if a.tokens[-1] != b.tokens[-1]
        ]
        pair = pick_from(pairs, pick)
        if pair is None:
            return None
        a, b = pair
        a.tokens[-1], b.tokens[-1] = b.tokens[-1], a.tokens[-1]
        return Fault(
            self.name, None, frozenset(), ((a.rid, a.written), (b.rid, b.written)),
            f"{self.name}: requests {a.rid} and {b.rid} swap their sampled tokens",
        )  # fmt: skip

    def due(self, engine, fault, buffers):
        return [], False  # the slots are known once written: see due_after_settle

    def due_after_settle(self, engine, fault):
        decoded = [e for e in fault.entries if engine.written_by.get(e) == DECODE]
        return [
            Due(slot, FailReason.WRITE_TOKEN_MISMATCH, tags=tags(group, stage))
            for group in engine.config.groups
            for slot in sorted(engine.slots_of(decoded, group))
            for stage in STAGES
        ]


# ---------------------------------------------------------------------------------------------
# The forward stores KV where the plan did not say


class _StoreFault(FaultClass):
    """The forward's KV store into one group's pool (the group ``pick`` chooses) goes wrong;
    what the canary can see of it is the slots whose KV changed after their records were
    written. A store fault the settle's forwards never made promises nothing."""

    def due_after_settle(self, engine, fault):
        if engine.hooks.store_fault is not None:
            engine.hooks.store_fault = None  # the store never came: nothing happened
            return None
        if fault.group == SWA and not set(fault.slots) <= set(engine.lut.tolist()):
            return None  # the slot left the window before a verify could see it
        return []


class MisdirectedStore(_StoreFault):
    """The first KV store of the next forward into a group's pool lands in a slot another
    position wrote, not in the slot the plan names (a forward that scatters to a stale
    ``out_cache_loc``): reported at that slot with ``REAL_KV`` by the group's next ``TAIL``
    verify or sweep that reads it, when the mode reads the bytes (a whole row of fresh bytes:
    ``PARTIAL`` and ``ALL``); never in ``NONE``. The slot the store missed keeps its old bytes,
    which its ``TAIL`` write fingerprints as they are: it stays silent."""

    name = "misdirected_store"
    description = "a forward stores a token's KV in a slot another position wrote"
    changes_kv = True

    def make(self, engine, pick, byte):
        places = [(g, r, p) for g in engine.config.groups for r, p in verified_next(engine, g)]
        place = pick_from(places, pick)
        if place is None:
            return None
        group, req, pos = place
        victim = engine.group_slot(group, engine.full_slot(req, pos))

        def store(name: str, slots: np.ndarray, kv: np.ndarray):
            if name != group or not slots.size or slots[0] == victim:
                return None
            slots = slots.copy()
            slots[0] = victim
            return slots, kv

        engine.hooks.store_fault = store
        what = (
            f"{self.name}: the next forward's first KV store into the {group} pool lands in "
            f"slot {victim} (request {req.rid}, position {pos})"
        )
        return Fault(self.name, None, frozenset({victim}), ((req.rid, pos),), what, group)

    def due(self, engine, fault, buffers):
        if engine.config.mode == RealKvHashMode.NONE:
            return [], True
        (victim,) = fault.slots
        return [Due(victim, REAL_KV, tags=tags(fault.group, TAIL, SWEEP))], False


class DroppedStore(_StoreFault):
    """The forward never stores the KV of a request's next position in a group's pool: the
    slot keeps the bytes it held, and the ``TAIL`` write after the forward fingerprints those
    bytes, so the record agrees with them. No mode can see it: the canary checks that a slot's
    KV is what was there when its record was written, not that the model stored it."""

    name = "dropped_store"
    description = "a forward drops the KV store of a token it writes"
    unseeable = (
        "a write fingerprints the bytes its slot holds after the forward, so the record agrees "
        "with the stale bytes a dropped store leaves"
    )

    def make(self, engine, pick, byte):
        ready = [
            (g, r)
            for g in engine.config.groups
            for r in sorted(engine.running.values(), key=lambda r: r.rid)
            if engine.will_run(r)
        ]
        place = pick_from(ready, pick)
        if place is None:
            return None
        group, req = place
        pos = req.written

        def store(name: str, slots: np.ndarray, kv: np.ndarray):
            if name != group or pos >= len(req.pages) * engine.config.page_size:
                return None
            target = engine.group_slot(group, engine.full_slot(req, pos))
            hits = np.flatnonzero(slots == target)
            if not hits.size:
                return None
            keep = np.arange(slots.shape[0]) != hits[0]
            return slots[keep], kv[keep]

        engine.hooks.store_fault = store
        what = (
            f"{self.name}: request {req.rid} position {pos} is written without its KV in the "
            f"{group} pool"
        )
        return Fault(self.name, None, frozenset(), ((req.rid, pos),), what, group)

    def due(self, engine, fault, buffers):
        return [], True


# ---------------------------------------------------------------------------------------------
# The forward and speculative decoding


class PositionsMoved(FaultClass):
    """The model of the next forward moves its first token's position in place (SGLang has an
    option for a model that mutates ``positions``) after the ``HEAD`` launches: the ``TAIL``
    write of each group stores that token's record with the moved position, and reports it with
    ``WRITE_POSITION`` (the expected input positions were taken before the forward, and the
    chain's position check compares it with its predecessor's); the ``HEAD`` launches saw the
    positions as planned. Every hash mode and forward mode sees it, but a forward without the
    input assert (an engine configured so) whose moved token starts its request's chain."""

    name = "positions_moved"
    description = "the forward moves a token's position before the TAIL launches"

    def make(self, engine, pick, byte):
        ready = [r for r in engine.running.values() if engine.will_run(r)]
        if not ready:
            return None
        engine.hooks.positions_fault = 1 + pick % 3
        engine.hooks.positions_fault_made = None
        what = f"{self.name}: the next forward moves its first position by {1 + pick % 3}"
        return Fault(self.name, None, frozenset(), (), what)

    def due(self, engine, fault, buffers):
        return [], False  # the slot is known once the forward ran: see due_after_settle

    def due_after_settle(self, engine, fault):
        made, engine.hooks.positions_fault = engine.hooks.positions_fault_made, None
        if made is None:
            return None  # no forward came
        if not engine.hooks.positions_fault_seen:
            return []  # the input assert off, and no predecessor for the chain to compare
        return [
            Due(slot, FailReason.WRITE_POSITION_MISMATCH, tags=tags(group, TAIL))
            for group, slot in made.items()
            if slot
        ]


class AcceptOffByOne(FaultClass):
    """EAGLE's accept keeps one draft too many: at the next target verify that rejects a
    draft, the first rejected draft's position stays written (its record holds the draft
    token) and the target's token for that position is sampled as if it were right: reported
    with ``TOKEN`` at that slot by the ``FULL`` group's next ``HEAD`` and ``TAIL`` verifies of
    the request, in every hash mode. Only a target verify accepts drafts: with the settle's
    decodes in another mode nothing happens."""

    name = "accept_off_by_one"
    description = "a target verify keeps one rejected draft as accepted"
    settle_mode = TARGET_VERIFY
    target_model_only = True
    unseen_in = {
        forward_mode: f"no draft is accepted in a {forward_mode} forward: the fault is never made"
        for forward_mode in (DECODE, MIXED)
    }

    def make(self, engine, pick, byte):
        if engine.config.offset or not any(
            r.decoding and engine.will_run(r) for r in engine.running.values()
        ):
            return None
        engine.hooks.accept_fault, engine.hooks.accept_fault_made = True, None
        what = f"{self.name}: the next target verify that rejects a draft keeps it"
        return Fault(self.name, None, frozenset(), (), what)

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        made, engine.hooks.accept_fault = engine.hooks.accept_fault_made, False
        if made is None:
            return None  # no target verify rejected a draft
        rid, pos, step = made
        req = engine.running.get(rid)
        if req is None or engine.last_run.get(rid, -1) <= step or pos >= req.written:
            return None  # the request never ran again
        slot = engine.full_slot(req, pos)
        return [Due(slot, TOKEN, tags=tags(FULL, stage)) for stage in STAGES]


class RejectedDraftNamed(FaultClass):
    """A target verify's rollback frees a page of rejected drafts while the request goes on
    naming it, as SGLang's spec v1 rollback freed them, on a request that spec v2's bookkeeping
    keeps holding them (SGLang's v2 frees nothing at a rejection,
    :meth:`engine_model.forwards.Forwards._rollback`): a target verify (the fault's own step)
    rejects drafts so that a page past the one holding the last committed position exists, and
    the first such page goes back to the allocator, first in line, but stays the request's,
    whose next positions are written there. The next request to allocate takes the page, and
    the two write its slots in turn: reported at a slot both wrote, by the ``FULL`` group's
    next ``HEAD`` and ``TAIL`` verifies of the one that wrote it first, once it runs after the
    other's write, with ``CHAIN``, ``POSITION`` or ``TOKEN``; nothing is promised when no slot
    was written by both in that order. The target model's canary only (the draft model's runs
    no target verify)."""

    frees_pages_in_use = True
    always_due = False  # no slot written by both in that order: nothing promised
    name = "rejected_draft_named"
    description = "a rollback frees a rejected draft's page the request still names"
    target_model_only = True
    drafts = 3

    def make(self, engine, pick, byte):
        c = engine.config
        p = c.page_size
        rows = [r for r, _ in engine.decode_rows()]
        if c.offset or not rows or any(r.written + self.drafts > c.context_len for r in rows):
            return None
        # the accepts (``target_verify``'s) after which a row holds a page past its committed
        # one even without spec v2's reserve (with it, it holds at least as many)
        frees = []
        for accept in range(self.drafts):
            for i, r in enumerate(rows):
                kept = r.written + (accept + i) % self.drafts + 1
                held = max(len(r.pages), -(-(r.written + self.drafts) // p))
                if -(-kept // p) < held:
                    frees.append(accept)
                    break
        accept = pick_from(frees, pick)
        if accept is None:
            return None
        engine.hooks.rollback_fault, engine.hooks.rollback_fault_made = True, None
        step = engine.target_verify(self.drafts, accept)
        if step is None:  # no room for the drafts' pages
            engine.hooks.rollback_fault = False
            return None
        assert engine.hooks.rollback_fault_made is not None, engine.describe()
        rid, page = engine.hooks.rollback_fault_made
        what = (
            f"{self.name}: the target verify's rollback frees request {rid}'s page {page} "
            "of rejected drafts, which it still names"
        )
        slots = frozenset(engine.page_slots(page))
        return Fault(self.name, None, slots, ((rid, 0),), what, steps=(step,))

    def due(self, engine, fault, buffers):
        return [], False

    def due_after_settle(self, engine, fault):
        rid, page = engine.hooks.rollback_fault_made
        p = engine.config.page_size
        writes: dict[int, list] = {}  # slot: (step, request) of each write of the page
        for (who, pos), step in engine.written_at.items():
            req = engine.running.get(who)
            if req is not None and pos < req.written and req.pages[pos // p] == page:
                writes.setdefault(page * p + pos % p, []).append((step, who))
        dues = []
        for slot, both in writes.items():
            both.sort()
            first = both[0][1]  # the request that wrote the slot first
            others = [step for step, who in both if who != first]
            if rid not in {who for _, who in both} or not others:
                continue
            if engine.last_run.get(first, -1) > min(others):  # it ran after the other's write
                dues += [Due(slot, CHAIN | POSITION | TOKEN, any_of=True, tags=tags(FULL, s))
                         for s in STAGES]  # fmt: skip
                break
        return dues or None
