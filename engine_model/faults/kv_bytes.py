"""Fault classes that change a KV byte: of a slot in use (``kv_used``), of a slot just written
(``kv_post_forward``), of a cached slot no request uses (``kv_unused_cache``); SGLang's
``perturb/real_kv_*.py``.
"""

from __future__ import annotations

import numpy as np

from engine_model.config import pick_from
from engine_model.engine import Engine
from engine_model.faults.base import (
    READ_BYTES,
    REAL_KV,
    Due,
    Fault,
    FaultClass,
    tags,
    verified_next,
)
from engine_model.vocabulary import FULL, SWA, SWEEP, TAIL
from reference import RealKvHashMode

__all__ = ["KvPostForward", "KvUnusedCache", "KvUsed"]


class _KvByte(FaultClass):
    """A byte of one slot's KV changes, in the pool of the group ``pick`` chooses (SGLang's
    ``target_group_kind``): reported at that slot with ``REAL_KV`` when the mode reads the byte,
    by the group's next ``TAIL`` verify or sweep that reads the slot (``HEAD`` launches have no
    real-KV source); nothing at all where the mode does not read it."""

    changes_kv = True
    flips_byte = True

    def places(self, engine: Engine, group: str) -> list[tuple[int, str]]:
        """``(slot of the group's pool, where it is in words)`` of every place the fault may
        take in ``group``."""
        raise NotImplementedError

    def make(self, engine, pick, byte):
        places = [(g, *place) for g in engine.config.groups for place in self.places(engine, g)]
        place = pick_from(places, pick)
        if place is None:
            return None
        group, slot, where = place
        what = f"{self.name}: byte {byte} of {group} slot {slot} ({where})"
        full = slot if group == FULL else int(np.flatnonzero(engine.lut == slot)[0])
        return Fault(self.name, (group, slot, byte), frozenset({slot}), (), what, group,
                     full_slot=full)  # fmt: skip

    def due(self, engine, fault, buffers):
        assert fault.flip is not None
        group, slot, byte = fault.flip
        if byte >= READ_BYTES[RealKvHashMode(engine.config.mode)]:
            return [], True
        return [Due(slot, REAL_KV, tags=tags(group, TAIL, SWEEP))], False

    def due_after_settle(self, engine, fault):
        assert fault.flip is not None
        group, slot, _ = fault.flip
        page = fault.full_slot // engine.config.page_size
        if engine.freed_since(page, fault.made_at) or engine.rewritten_since(
            fault.full_slot, fault.made_at + 1
        ):
            # the slot's page went back to the allocator (evicted for an allocation, or let go
            # by its request: no verify or sweep reads it from then on) or a later write took
            # the slot, perhaps before a verify read the changed byte
            return None
        if group == SWA and engine.lut[fault.full_slot] != slot:
            # the slot left the window (or the SWA pool took it under pressure) before a verify
            # could see it, and another position's write may have taken it since
            return None
        return []


class KvUsed(_KvByte):
    """``perturb/real_kv_used.py``: a KV byte of a slot a running request reads changes."""

    name = "kv_used"
    description = "a KV byte of a slot in use changes"

    def places(self, engine, group):
        return [
            (engine.group_slot(group, engine.full_slot(r, p)), f"request {r.rid}, position {p}")
            for r, p in verified_next(engine, group)
        ]


class KvPostForward(_KvByte):
    """``perturb/real_kv_post_forward.py``: a KV byte of a slot the last forward wrote changes
    after its write."""

    name = "kv_post_forward"
    description = "a KV byte changes after the write that fingerprinted it"

    def places(self, engine, group):
        just = set(engine.last_written)
        return [
            (
                engine.group_slot(group, engine.full_slot(r, p)),
                f"request {r.rid}, position {p}, just written",
            )
            for r, p in verified_next(engine, group)
            if (r.rid, p) in just
        ]


class KvUnusedCache(_KvByte):
    """``perturb/real_kv_unused_cache.py``: a KV byte of a slot only the prefix cache holds
    changes."""

    name = "kv_unused_cache"
    description = "a KV byte of a cached slot no request uses changes"

    def places(self, engine, group):
        places: dict[int, int] = {}  # slot -> cached position, slots no request uses
        for entry in engine.cache:
            for pos, full in enumerate(engine.cached_full_slots(entry)):
                slot = engine.group_slot(group, full)
                if engine.req_refs[full // engine.config.page_size] == 0 and slot:
                    places.setdefault(slot, pos)
        return [
            (slot, f"cached position {pos}, no request uses it")
            for slot, pos in sorted(places.items())
        ]
