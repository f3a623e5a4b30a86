"""Fault classes of KV that moves without a forward: HiCache's reload of a cached prefix with
one half of what a slot holds left behind (``kv_moved_without_records``,
``records_moved_without_kv``), and a PD transfer that loses or swaps pages
(``transfer_page_left_out``, ``transfer_pages_swapped``). Each makes the faulty move itself and
judges it once the move ran (:func:`engine_model.faults.base.first_report`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

import reference
from engine_model.config import KV_BYTES
from engine_model.engine import Engine
from engine_model.faults.base import Fault, FaultClass, first_report, record, tags
from engine_model.vocabulary import DECODE, FULL, HEAD, PREFILL_ENGINE, STAGES, SWEEP
from reference import RealKvHashMode

__all__ = [
    "KvMovedWithoutRecords",
    "RecordsMovedWithoutKv",
    "TransferPageLeftOut",
    "TransferPagesSwapped",
]


def _fingerprints(kv: np.ndarray, slots: list[int], hash_mode: int) -> list[int]:
    """The real-KV hash of each slot of a group's pool in ``hash_mode``."""
    source = (reference.Source(kv, 1, KV_BYTES, KV_BYTES),)
    rows = np.asarray(slots, np.int64)
    return [int(h) for h in reference.fingerprint(source, rows, mode=hash_mode)]


def _seen(engine: Engine, buf: np.ndarray, kv: np.ndarray | None, slots: list[int]) -> list:
    """``(record, fingerprint of the KV)`` of each slot (a head buffer: no KV source, 0)."""
    fps = [0] * len(slots) if kv is None else _fingerprints(kv, slots, engine.config.mode)
    return [(tuple(record(buf, s).tolist()), fp) for s, fp in zip(slots, fps, strict=True)]


class _MoveFault(FaultClass):
    """KV that moves without a forward (:class:`engine_model.steps.Move`) goes wrong in the
    ``FULL`` pool; the move is the fault's own step, and its prediction is judged once the move
    ran: :func:`first_report` of the destination's records and KV against the source's, for
    each launch that verifies the moved positions next (:attr:`stages`)."""

    moves_kv = True
    #: the launches that verify the moved positions next, with whether they check tokens
    stages: tuple[str, ...] = ()

    def moves(self, engine: Engine, pick: int) -> list:
        """The steps of the faulty move (none: no place)."""
        raise NotImplementedError

    def make(self, engine, pick, byte):
        steps = self.moves(engine, pick)
        if not steps:
            return None
        assert engine.last_move is not None
        src, dst = engine.last_move
        what = f"{self.name}: {engine.log[-1]}"
        return Fault(
            self.name, None, frozenset(dst), (), what, steps=tuple(steps),
            moved=tuple(zip(src, dst, strict=True)),
        )  # fmt: skip

    def source(self, buffers: dict) -> dict:
        """The buffers the moved records and KV came from."""
        return buffers

    def due(self, engine, fault, buffers):
        moved = self.positions(engine, fault)
        src, dst = [s for s, _ in moved], [d for _, d in moved]
        origin = self.source(buffers)
        dues = []
        for stage in self.stages:
            (tag,) = tags(FULL, stage)
            tail = stage != HEAD
            bad = _seen(engine, buffers[tag], buffers["KV", FULL] if tail else None, dst)
            good = _seen(engine, origin[tag], origin["KV", FULL] if tail else None, src)
            verdict, report = first_report(dst, bad, good, tag=tag, tokens=stage != SWEEP)
            if verdict == "unsure":
                return None
            if report is not None:
                dues.append(report)
        return dues, not dues

    def positions(self, engine: Engine, fault: Fault) -> tuple:
        """The moved positions the next verify reads, as ``(source, destination)``."""
        return fault.moved


class _Reload(_MoveFault):
    """A cached prefix no request uses is offloaded to the host and reloaded into other pages
    (HiCache, :meth:`engine_model.engine.Engine.relocate`), but one half of what a slot holds
    stays behind: reported by the ``FULL`` group's cache sweep (the settle's last step) at the
    first moved position whose record or KV differs from the source's, with the reasons
    :func:`first_report` gives; nothing where they agree."""

    stages = (SWEEP,)
    kv, records = True, True

    def moves(self, engine, pick):
        return engine.relocate(pick, kv=self.kv, records=self.records)


class KvMovedWithoutRecords(_Reload):
    """HiCache reloads a cached prefix's KV into other slots without its records: the new
    slots keep the records of whatever they held before, so the sweep reports them, in every
    hash mode (their positions and chain are another's; their fingerprints another KV's)."""

    name = "kv_moved_without_records"
    description = "a cached prefix's KV is reloaded into other slots without its records"
    records = False


class RecordsMovedWithoutKv(_Reload):
    """HiCache moves a cached prefix's records into other slots but not its KV: the records
    agree with one another, the new slots' KV bytes are stale, so the sweep reports
    ``REAL_KV`` where the mode reads the bytes; never in ``NONE``."""

    name = "records_moved_without_kv"
    description = "a cached prefix's records are reloaded into other slots without its KV"
    kv = False

    def why_never(self, hash_mode, forward_mode=DECODE):
        if hash_mode == RealKvHashMode.NONE:
            return "NONE reads no KV byte, and the records moved intact"
        return super().why_never(hash_mode, forward_mode)


class _Transfer(_MoveFault):
    """A PD transfer (:meth:`engine_model.engine.Engine.receive`: the prefill engine's forward,
    its pages sent page by page with the records spliced in, received into this engine's
    pages) goes wrong for whole pages: reported by the ``FULL`` group's next ``HEAD`` and
    ``TAIL`` verifies of the received request (the first in the settle where it decodes), at
    the first received position whose record or KV differs from the prefill engine's, with the
    reasons :func:`first_report` gives; nothing is promised when the request never ran again."""

    stages = STAGES

    def source(self, buffers):
        return buffers[PREFILL_ENGINE]

    def make(self, engine, pick, byte):
        fault = super().make(engine, pick, byte)
        if fault is None:
            return None
        rid = max(engine.running)  # the received request is the newest
        written = engine.running[rid].written
        return dataclasses.replace(fault, entries=((rid, 0),), moved=fault.moved[:written])

    def due_after_settle(self, engine, fault):
        ((rid, _),) = fault.entries
        if engine.last_run.get(rid, -1) <= fault.made_at:
            return None  # the received request never ran again
        return []

    @staticmethod
    def tokens(engine: Engine) -> int:
        """A prompt of two pages and a bit (one page and a bit where the row is short)."""
        c = engine.config
        return min(2 * c.page_size + 1, c.context_len - 2 * c.offset) + c.offset


class TransferPageLeftOut(_Transfer):
    """A PD transfer leaves one page out: the received page keeps what this engine's slots
    held before (another request's records and KV, or the buffers' first bytes)."""

    name = "transfer_page_left_out"
    description = "a PD transfer leaves one page of a request out"

    def moves(self, engine, pick):
        return engine.receive(self.tokens(engine), left_out=pick)


class TransferPagesSwapped(_Transfer):
    """A PD transfer lands two neighbouring pages in each other's place, records and KV
    together: the records agree with their KV, but sit at another position's slot."""

    name = "transfer_pages_swapped"
    description = "a PD transfer lands two pages of a request in each other's place"

    def moves(self, engine, pick):
        written = self.tokens(engine) - engine.config.offset
        if written <= engine.config.page_size:
            return []  # one page: nothing to swap
        return engine.receive(self.tokens(engine), swapped=pick)
