"""The hooks through which a fault class changes what an engine's next steps do
(:mod:`engine_model.faults`): one :class:`EngineHooks` per engine, :attr:`Engine.hooks
<engine_model.engine.Engine.hooks>`. A fault class arms a hook when it is made; the engine
reads it in the step it changes, disarms it once used and records there what it did (the
``*_made`` fields), which the class reads back when it judges the settle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["EngineHooks", "StoreFault"]

#: A fault of how a forward stores its KV: called with a buffer group's name, the slots of the
#: group's pool the forward stores and their KV bytes, it returns them as the forward stores
#: them, or None while the forward does not make the store it changes.
StoreFault = Callable[[str, np.ndarray, np.ndarray], "tuple | None"]


@dataclass
class EngineHooks:
    """The faults armed in an engine's next steps, and what they did (all off: no fault)."""

    #: a fault of how a forward stores its KV (:data:`StoreFault`); used once, then None
    store_fault: StoreFault | None = None
    #: a fault of the forward itself: the next forward's model moves its first token's
    #: position by this much before the ``TAIL`` launches (None: no fault)
    positions_fault: int | None = None
    #: the canary slot, in each buffer group, of the position the positions fault moved (None:
    #: no forward came since it was armed)
    positions_fault_made: dict[str, int] | None = None
    #: whether a check can see the moved position: the forward's input assert is on, or the
    #: moved token's chain has a predecessor whose position the write's chain check compares
    positions_fault_seen: bool = True
    #: a fault of the next target verify's accept: it keeps one rejected draft as accepted
    accept_fault: bool = False
    #: ``(request, position kept, step)`` of the draft the accept fault kept, once made
    accept_fault_made: tuple[int, int, int] | None = None
    #: a fault of the rollback after a target verify: the next one that frees a rejected
    #: draft's page frees it while the request goes on naming it
    rollback_fault: bool = False
    #: ``(request, page)`` of the page the rollback fault freed, once made
    rollback_fault_made: tuple[int, int] | None = None
    #: whether a fault was made in this engine (:func:`engine_model.faults.make`): from then
    #: on its page table may name what its cache does not hold, and a registered radix tree's
    #: code (:data:`engine_model.free_lists.TREES`) no longer holds its steps
    fault_made: bool = False
