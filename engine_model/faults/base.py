"""What every fault class shares: a fault made (:class:`Fault`), a report it must cause
(:class:`Due`), the class itself (:class:`FaultClass`), the launch tags a report names
(:func:`tags`), the first report of a moved run of positions (:func:`first_report`), and the
places of an engine where a fault is seen next (:func:`verified_next`).
A fault class is described in :mod:`engine_model.faults`; the classes are in the modules of
what they break, the registry in :mod:`engine_model.faults.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import reference
from engine_model.config import KV_BYTES
from engine_model.engine import Engine
from engine_model.vocabulary import DECODE, FULL, launch_tag
from reference import CanaryField, FailReason, RealKvHashMode

__all__ = [
    "CHAIN",
    "POSITION",
    "READ_BYTES",
    "REAL_KV",
    "TOKEN",
    "Due",
    "Fault",
    "FaultClass",
    "Prediction",
    "first_report",
    "page_heads",
    "ran_after_another_wrote",
    "record",
    "tags",
    "verified_next",
]

#: Bytes of a slot's KV each real_kv_hash_mode reads.
READ_BYTES = {
    RealKvHashMode.NONE: 0,
    RealKvHashMode.PARTIAL: reference.PARTIAL_READ_BYTES,
    RealKvHashMode.ALL: KV_BYTES,
}
#: The report bits the fault classes predict, by short name.
CHAIN = FailReason.VERIFY_CHAIN_HASH_MISMATCH
REAL_KV = FailReason.VERIFY_REAL_KV_HASH_MISMATCH
POSITION = FailReason.VERIFY_POSITION_MISMATCH
TOKEN = FailReason.VERIFY_TOKEN_MISMATCH


def tags(group: str, *stages: str) -> frozenset:
    """The launch tags of a group's endpoints at ``stages`` (``HEAD``, ``TAIL``, ``SWEEP``;
    the K half, as SGLang runs by default)."""
    return frozenset(int(reference.CanaryLaunchTag[launch_tag(stage, group)]) for stage in stages)


@dataclass(frozen=True)
class Fault:
    """A fault the engine model made: its class (``kind``, the fault class's name, a key of
    :data:`~engine_model.faults.FAULTS`), the KV byte to flip (``flip``:
    group, slot of the group's pool and byte, or None), the canary ``slots`` a report may name
    (in the group the fault's predictions name), the ``entries`` ``(request, position)`` whose
    next verify or write reads what it changed, ``what``, the fault in words, and ``group``,
    the buffer group whose pool or records it changes (``FULL`` for the page table's faults,
    which both groups read)."""

    kind: str
    flip: tuple[str, int, int] | None
    slots: frozenset
    entries: tuple
    what: str
    group: str = FULL
    made_at: int = 0  # the engine's step count when it was made
    #: the steps the fault itself makes, run right after it and before its predictions are
    #: judged (a move of KV without a forward, and the prefill engine's forward before it)
    steps: tuple = ()
    #: a move's ``(source slot, destination slot)`` of each position, in order
    moved: tuple = ()
    #: the full-pool slot whose KV ``flip`` changes (in the ``SWA`` group: the slot that maps
    #: to the flipped SWA slot when the fault is made)
    full_slot: int = -1


@dataclass(frozen=True)
class Due:
    """A report a fault must cause: a ring row stamped with one of ``tags`` (empty: any launch)
    naming ``slot`` (-1: any of the fault's ``slots``) whose bits hold ``bits`` (-1 slot or
    ``any_of``: any of them; ``exact``: are exactly ``bits``)."""

    slot: int
    bits: int
    exact: bool = False
    tags: frozenset = frozenset()
    any_of: bool = False  # whose bits hold any of ``bits``


#: What a fault must cause, judged when it is made: ``(reports, silent)``: every :class:`Due`
#: must be among the rows stored by the end of the settle, and with ``silent`` no row at all may
#: be; None: nothing is promised.
Prediction = tuple[list[Due], bool]


class FaultClass:
    """One fault class: its name, its one-line description, how it is made and what it
    predicts. Subclasses fill in :meth:`make` and :meth:`due`."""

    name: str
    description: str
    changes_kv = False  # whether it changes KV bytes and nothing else
    #: whether it moves KV without a forward, leaving records and KV bytes that may disagree
    #: (``REAL_KV`` is then a reason it may be reported with)
    moves_kv = False
    flips_byte = False  # whether it flips the drawn KV byte of one slot (``Fault.flip``)
    #: why no hash mode can see the class, for a class the canary cannot see at all ("": it
    #: is seen in some mode)
    unseeable = ""
    #: why a forward mode that writes what the fault changed never reports it, by SGLang's
    #: ``ForwardMode`` (the settle's decodes in that mode)
    unseen_in: dict[str, str] = {}
    #: the forward mode of the settle's decodes in which the class is judged by default (the
    #: detection table's first table), and whether only the target model's canary (no EAGLE
    #: offset) has a place for it
    settle_mode = DECODE
    target_model_only = False
    #: whether the draft model's canary (the EAGLE offset) can see it at all (False: only a
    #: check it has off reports it)
    seen_by_draft_model = True
    #: whether it hands a page a request still names to another request: under a window the
    #: first request's ``SWA`` verify may then read, through the page's new SWA slots, records
    #: the new owner has not written yet (stale memory, with any reason bits, ``REAL_KV``
    #: among them)
    frees_pages_in_use = False
    #: the share of the detection table's histories with a place for it (at least)
    place_share = 3 / 4
    #: whether a placed fault of the class always has a report due in hash mode ``ALL``
    #: outside a sliding window (False: its prediction may be nothing, said in its docstring)
    always_due = True

    def why_never(self, hash_mode: int, forward_mode: str = DECODE) -> str:
        """Why the class is never reported in ``hash_mode`` with the settle's decodes in
        ``forward_mode`` ("" where it is)."""
        if self.unseeable:
            return self.unseeable
        if forward_mode in self.unseen_in:
            return self.unseen_in[forward_mode]
        if self.changes_kv and hash_mode == RealKvHashMode.NONE:
            return "NONE reads no KV byte"
        return ""

    def make(self, engine: Engine, pick: int, byte: int) -> Fault | None:
        """Make the fault at the place ``pick`` chooses (``byte``: the KV byte, for a class that
        changes one); None when the engine has no place the next step can see."""
        raise NotImplementedError

    def due(self, engine: Engine, fault: Fault, buffers: dict) -> Prediction | None:
        """The reports ``fault`` must cause in the engine's hash mode, judged right after it was
        made, with ``buffers`` the reference's canary buffers then, keyed by launch tag."""
        raise NotImplementedError

    def due_after_settle(self, engine: Engine, fault: Fault) -> list[Due] | None:
        """Reports known only once the settle ran, added to :meth:`due`'s; None: nothing is
        promised after all."""
        return []

    def __repr__(self) -> str:
        return f"<fault class {self.name}>"


def record(canary_buf: np.ndarray, slot: int) -> np.ndarray:
    """A slot's record: its int64 fields, indexed by ``CanaryField``."""
    return np.ascontiguousarray(canary_buf[slot, : reference.CANARY_SLOT_BYTES]).view("<i8")


def first_report(
    dst: list[int], bad: list, good: list, *, tag: int, tokens: bool
) -> tuple[str, Due | None]:
    """What the first verify of a moved run of positions reports, in position order: ``dst``
    the slot of each position (the verify reads them as one chain), ``bad[i]`` the record of
    ``dst[i]`` after the move and the fingerprint of its KV then, ``good[i]`` what a correct
    move leaves there (a source's records, whose chain and fingerprints agree). Up to the first
    position where they differ the verify reads a correct chain, so at that position it expects
    the good record: it reports ``TOKEN`` (when ``tokens`` are checked), ``POSITION`` and
    ``CHAIN`` for each field that differs, and ``REAL_KV`` where the record's fingerprint is
    not that of the KV. ``("report", due)``; ``("silent", None)`` where nothing differs;
    ``("unsure", None)`` where the first difference is one the verify does not read (a token
    under a sweep), after which the chain says little."""
    for slot, (rec, fp), (want, want_fp) in zip(dst, bad, good, strict=True):
        if tuple(rec) == tuple(want) and fp == want_fp:
            continue
        bits = 0
        if tokens and rec[CanaryField.TOKEN] != want[CanaryField.TOKEN]:
            bits |= TOKEN
        if rec[CanaryField.POSITION] != want[CanaryField.POSITION]:
            bits |= POSITION
        if rec[CanaryField.PREV_HASH] != want[CanaryField.PREV_HASH]:
            bits |= CHAIN
        if rec[CanaryField.REAL_KV_HASH] != fp:
            bits |= REAL_KV
        if not bits:
            return "unsure", None
        return "report", Due(slot, bits, exact=True, tags=frozenset({tag}))
    return "silent", None


def ran_after_another_wrote(engine: Engine, pages: set, readers: set, since: int) -> bool:
    """Whether a request of ``readers`` ran after a request not among them wrote a slot of
    ``pages`` at a step after ``since`` (its verify then read what that write left)."""
    p = engine.config.page_size
    writes = [
        step
        for (who, pos), step in engine.written_at.items()
        if step > since
        and who not in readers
        and who in engine.running
        and pos < engine.running[who].written
        and engine.running[who].pages[pos // p] in pages
    ]
    return bool(writes) and any(
        rid in engine.running and engine.last_run.get(rid, -1) > min(writes) for rid in readers
    )


def verified_next(engine: Engine, group: str = FULL) -> list:
    """``(request, position)`` of every written position the next forward of its request
    verifies in ``group`` (the whole prefix in ``FULL``, the window it will have then in
    ``SWA``, where the slot is not evicted): where a fault is seen next."""
    out = []
    for req in sorted(engine.running.values(), key=lambda r: r.rid):
        if not engine.will_run(req):
            continue
        for pos in range(engine.window_start(req.written, group), req.written):
            if engine.group_slot(group, engine.full_slot(req, pos)):
                out.append((req, pos))
    return out


def page_heads(engine: Engine) -> list:
    """``(request, position, page)`` of each place of :func:`verified_next` in ``FULL`` that is
    the first position of its page."""
    p = engine.config.page_size
    return [(req, pos, req.pages[pos // p]) for req, pos in verified_next(engine) if pos % p == 0]
