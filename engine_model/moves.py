"""KV that moves without a forward (CONTRACT §15): each move a :class:`engine_model.steps.Move`,
a save of slots to a host copy or a load of one into other slots, with the records of both
canary buffers. HiCache's offload and reload of a cached prefix (:meth:`Moves.relocate`), a
retracted request's backup restored (:meth:`Moves.restore`; the backup is
:meth:`engine_model.engine.Engine.backup`), and a request leaving without caching anything
(:meth:`Moves.drop`); a PD transfer's send and receive is
:meth:`engine_model.engine.Engine.receive`, built of the same saves and loads.
"""

from __future__ import annotations

import numpy as np

from engine_model.config import pick_from
from engine_model.prefix_cache import PrefixCache
from engine_model.steps import Move, MoveGroup
from engine_model.vocabulary import FULL, SWA

__all__ = ["Moves"]


class Moves(PrefixCache):
    """KV that moves without a forward (a mixin of :class:`engine_model.engine.Engine`)."""

    def _key(self) -> int:
        """A new host copy's key."""
        self._keys += 1
        return self._keys

    def _resident(self, full: list[int], positions: range | None = None) -> list[bool]:
        """Per full slot, whether its SWA slot is saved with it: it has one and (``positions``,
        the request's window) its page has a position in the window and it is written, as
        SGLang moves SWA KV in whole pages. Without a window, all."""
        if self.lut is None:
            return [True] * len(full)
        p = self.config.page_size
        return [
            bool(self.lut[s])
            and (positions is None or (i < positions.stop and i // p * p + p > positions.start))
            for i, s in enumerate(full)
        ]

    def _save(self, move_kind: str, key: int, full: list[int], resident: list[bool]) -> Move:
        """A save of the full slots ``full`` and the SWA slots of those ``resident``."""
        groups = [MoveGroup(FULL, np.asarray(full, dtype=np.int64))]
        if self.lut is not None:
            swa = [int(self.lut[s]) for s, keep in zip(full, resident, strict=True) if keep]
            groups.append(MoveGroup(SWA, np.asarray(swa, dtype=np.int64)))
        return Move(move_kind, key, True, tuple(groups))

    def _load(
        self, move_kind: str, key: int, full: list[int], resident: list[bool], taken: np.ndarray,
        *, kv: bool = True, records: bool = True, written: int | None = None,
    ) -> Move:  # fmt: skip
        """A load of host copy ``key`` into the full slots ``full`` (slot ``i`` takes saved slot
        ``taken[i]``; ``kv`` or ``records`` False: the ``FULL`` slots keep their own), and into
        the SWA slots of the positions saved ``resident``; the SWA slots of the other
        positions before ``written`` (default: all) are evicted (a position out of the window
        has none); a later position keeps its SWA slot for the forward that writes it."""
        none = np.full(len(full), -1, dtype=np.int64)
        for slot in full if kv else ():
            self._slot_written[int(slot)] = self.steps + 1
        groups = [
            MoveGroup(
                FULL, np.asarray(full, dtype=np.int64),
                kv_from=taken if kv else none, records_from=taken if records else none,
            )
        ]  # fmt: skip
        if self.lut is not None:
            self.events["KV moved under a sliding window"] += 1
            end = len(full) if written is None else written
            # whole pages: those with no position saved resident and none past ``end``
            p = self.config.page_size
            kept = {i // p for i, keep in enumerate(resident) if keep or i >= end}
            self._evict_slots(s for i, s in enumerate(full[:end]) if i // p not in kept)
            swa = [int(self.lut[s]) for s, keep in zip(full, resident, strict=True) if keep]
            order = np.arange(len(swa), dtype=np.int64)
            groups.append(MoveGroup(SWA, np.asarray(swa, dtype=np.int64), order, order))
        return Move(move_kind, key, False, tuple(groups))

    def relocatable(self) -> list:
        """The cached prefixes no running request holds a page of: those a reload may move."""
        return [e for e in self.cache if not any(self.req_refs[p] for p in e.pages)]

    def relocate(self, pick: int, *, kv: bool = True, records: bool = True) -> list[Move]:
        """A cached prefix no request uses is offloaded to the host pool and loaded back into
        other pages, the movement of HiCache (``mem_cache/pool_host/``): its KV and its
        records go to the host and come back into the new slots, the old pages are freed.
        ``kv`` or ``records`` False: the load leaves the new ``FULL`` slots' KV or records as
        they were (a fault: :mod:`engine_model.faults`; SGLang's host pool leaves the records,
        [23] of ``docs/UPSTREAM.md``). Returns the offload and the reload, to run in order
        (none: no such prefix, or no free pages)."""
        entry = pick_from(self.relocatable(), pick)
        if entry is None:
            return []
        self.moving = entry  # locked while it moves: an eviction for its pages spares it
        try:
            pages = self._cache_pages(len(entry.pages))
        finally:
            self.moving = None
        if pages is None or entry not in self.cache:
            return []
        key = self._key()
        old = self.cached_full_slots(entry)
        resident = self._resident(old)
        offload = self._save("offload", key, old, resident)
        old_pages, entry.pages = entry.pages, tuple(pages)
        for old_page, page in zip(old_pages, pages):  # the same radix nodes, in other pages
            self.node_head[page], self.node_time[page] = (
                self.node_head[old_page],
                self.node_time[old_page],
            )
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

    def restore(self, pick: int, *, records: bool = True) -> Move | None:
        """A retracted request whose KV was backed up comes back in a free row with new pages,
        its KV and records loaded from the backup: it goes on where it stopped. ``records``
        False: the load leaves the new ``FULL`` slots' records as they were (SGLang's
        ``cpu_tensor`` retraction backup, :mod:`conformance.sglang.kv_paths`)."""
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
        req.row, req.pages, req.written = self._take_row(), pages, written
        full = [self.full_slot(req, p) for p in range(written)]
        self.req_to_token[req.row, :written] = full
        self.running[req.rid] = req
        taken = np.arange(written, dtype=np.int64)
        load = self._load("restore", key, full, resident, taken, records=records)
        self.steps += 1
        self.events["a retracted request restored from its backup"] += 1
        self.log.append(f"restore: request {req.rid}, row {req.row}, {written} positions")
        return load

    def drop(self, rid: int) -> None:
        """A request leaves without caching anything (a prefill engine's, once sent)."""
        req = self.running.pop(rid)
        self._release_request(req)
