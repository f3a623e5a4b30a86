"""The registry of the fault classes (:data:`FAULTS`), in the order of the suite's parameters,
its Hypothesis draws and the detection table (an order to keep: moving a class changes the
examples drawn and the table's rows), the lists derived from it, and :func:`make`; the package
:mod:`engine_model.faults` exports them.
"""

from __future__ import annotations

import dataclasses

from engine_model.config import KV_BYTES
from engine_model.engine import Engine
from engine_model.faults.base import Fault, FaultClass
from engine_model.faults.forward import (
    AcceptOffByOne,
    DroppedStore,
    MisdirectedStore,
    NextTokenSwap,
    PositionsMoved,
    RejectedDraftNamed,
)
from engine_model.faults.kv_bytes import KvPostForward, KvUnusedCache, KvUsed
from engine_model.faults.moved_kv import (
    KvMovedWithoutRecords,
    RecordsMovedWithoutKv,
    TransferPageLeftOut,
    TransferPagesSwapped,
)
from engine_model.faults.page_table import (
    DuplicateFreedWhileNamed,
    FreedWhileReferenced,
    LockedNodeEvicted,
    PageSwap,
    RebindOffByOnePage,
    ReqToToken,
)

#: The ``req_to_token`` class, which the pipeline property's page-table change uses too.
REQ_TO_TOKEN = ReqToToken()
#: Every fault class by name, in the order of the suite's parameters and the detection table:
#: SGLang's five self-test perturbations, two allocator bugs, a cache that evicts a locked
#: page, two radix inserts that rebind wrongly, two bugs of the forward's KV
#: store, a forward that moves positions, an off-by-one accept of speculative decoding, and four
#: of KV that moves without a forward (HiCache's reload, a PD transfer).
FAULTS: dict[str, FaultClass] = {
    cls.name: cls
    for cls in (
        REQ_TO_TOKEN,
        KvUsed(),
        KvUnusedCache(),
        KvPostForward(),
        NextTokenSwap(),
        PageSwap(),
        FreedWhileReferenced(),
        LockedNodeEvicted(),
        RebindOffByOnePage(),
        DuplicateFreedWhileNamed(),
        MisdirectedStore(),
        DroppedStore(),
        PositionsMoved(),
        AcceptOffByOne(),
        RejectedDraftNamed(),
        KvMovedWithoutRecords(),
        RecordsMovedWithoutKv(),
        TransferPageLeftOut(),
        TransferPagesSwapped(),
    )
}
#: The names of the fault classes.
FAULT_KINDS = tuple(FAULTS)
#: The fault classes that change KV bytes and nothing else.
KV_FAULTS = tuple(name for name, cls in FAULTS.items() if cls.changes_kv)
#: The fault classes that flip the drawn byte of one slot's KV.
KV_BYTE_FAULTS = tuple(name for name, cls in FAULTS.items() if cls.flips_byte)
#: The fault classes that move KV without a forward.
MOVE_FAULTS = tuple(name for name, cls in FAULTS.items() if cls.moves_kv)
#: The fault classes no hash mode can see (each says why: ``FaultClass.unseeable``).
UNSEEABLE = tuple(name for name, cls in FAULTS.items() if cls.unseeable)


def make(engine: Engine, kind: str, pick: int, byte: int = 0) -> Fault | None:
    """Make a fault of the class named ``kind`` (:data:`FAULT_KINDS`) in ``engine`` at the place
    ``pick`` chooses among those where the next step can see it (``byte``: modulo the KV bytes
    of a slot); None when there is none. The engine's log records it."""
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}")
    fault = FAULTS[kind].make(engine, pick, byte % KV_BYTES)
    if fault is not None:
        fault = dataclasses.replace(fault, made_at=engine.steps)
        engine.log.append(f"FAULT {fault.what}")
        engine.hooks.fault_made = True
    return fault
