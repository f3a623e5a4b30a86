"""The steps an engine's history is made of, as the suite's driver reads them: a forward
(:class:`Forward`, one :class:`GroupLaunch` per buffer group), a sweep of the prefix cache
(:class:`Sweep`, one :class:`SweepGroup` per group) and KV that moves without a forward
(:class:`Move`, one :class:`MoveGroup` per group). Plain frozen data: numpy arrays and the
keywords of the canary's launchers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine_model.vocabulary import EXTEND, STAGES, TAIL

__all__ = ["Forward", "GroupLaunch", "Move", "MoveGroup", "Sweep", "SweepGroup"]


@dataclass(frozen=True)
class GroupLaunch:
    """One buffer group's part of a forward: its ``group`` (:data:`FULL` or :data:`SWA`), the
    window and full-to-SWA table its plan takes (SGLang's ``invoke_plan``: window 0 and no table
    for ``FULL``), its verify plan's capacity, the write's ``out_cache_loc`` as the group's
    canary slots, and the KV the forward stores in the group's pool (``kv_slots``,
    ``kv_bytes``)."""

    group: str
    swa_window_size: int
    full_to_swa_index_mapping: np.ndarray | None
    verify_capacity: int
    out_cache_loc: np.ndarray
    kv_slots: np.ndarray
    kv_bytes: np.ndarray

    def plan_arguments(self) -> dict:
        """The plan kernel's keywords this group decides."""
        return dict(
            swa_window_size=self.swa_window_size,
            full_to_swa_index_mapping=self.full_to_swa_index_mapping,
        )


@dataclass(frozen=True)
class Forward:
    """One forward step's launches, as numpy arrays: ``scatter`` (the keywords of
    ``launch_scatter_req_token_ids_kernel`` but the pool, or None), ``plan`` (the keywords of
    ``launch_canary_plan_kernels`` that every group shares: SGLang's ``PlanInput``, the page
    table and the EAGLE offset), the write plan's capacity, ``write`` (the keywords of
    ``launch_canary_write_kernel`` but the context, the plan and ``out_cache_loc``, the input
    assert's flag included), ``groups`` (one :class:`GroupLaunch` per buffer group, in launch
    order) and ``stages``: the launches each group makes (``("HEAD", "TAIL")`` as an engine
    brackets a forward; ``("TAIL",)`` for a world of one buffer). ``kind`` is the forward kind,
    the engine step that made it (``prefill``, ``decode``, ``draft_decode``, ``draft_extend``,
    ``mixed``, ``idle``, ``target_verify``); ``mode`` its forward mode."""

    #: the forward kind: the name of the :class:`engine_model.engine.Engine` step that made it
    kind: str
    scatter: dict | None
    plan: dict
    write_req_capacity: int
    write: dict
    groups: tuple[GroupLaunch, ...]
    stages: tuple[str, ...] = STAGES
    #: the forward mode, SGLang's ``ForwardMode`` of the step (:data:`FORWARD_MODES`:
    #: ``EXTEND``, ``DECODE``, ``MIXED``, ``IDLE``, ``TARGET_VERIFY`` or ``DRAFT_EXTEND_V2``)
    mode: str = EXTEND
    #: whether the step replays a captured CUDA graph: its plans are the buffers the previous
    #: replay of the same batch size left (``verify_capacity`` fixed by the batch size), its
    #: padding rows stand at the tail with ``req_pool_indices``, ``positions`` and
    #: ``out_cache_loc`` zero and stale ``input_ids``
    graph: bool = False
    #: what the forward changed in the write's arrays before the ``TAIL`` launches (a model
    #: that moves ``positions`` in place): keywords replacing those of ``write`` there
    tail_write: dict = field(default_factory=dict)
    #: whose buffers the step runs on: ``""`` the engine's own, :data:`PREFILL_ENGINE` its prefill
    #: engine's (a PD transfer's prefill)
    engine: str = ""
    #: the batch row (in the plan's row order) of each token the write writes
    token_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def write_for(self, stage: str) -> dict:
        """The write's keywords at ``stage`` (``HEAD`` or ``TAIL``), but ``out_cache_loc``."""
        return {**self.write, **self.tail_write} if stage == TAIL else self.write

    def group(self, name: str) -> GroupLaunch:
        """The launch of the buffer group ``name``."""
        return next(g for g in self.groups if g.group == name)


@dataclass(frozen=True)
class SweepGroup:
    """One group's verify of every slot the prefix cache holds: canary slots (0: evicted from
    the SWA pool, which verify skips), positions, previous slots (-1: the anchor)."""

    group: str
    slots: np.ndarray
    positions: np.ndarray
    prev_slots: np.ndarray


@dataclass(frozen=True)
class Sweep:
    """A cache sweep: one :class:`SweepGroup` per buffer group, each verifying its tail
    buffer."""

    groups: tuple[SweepGroup, ...]

    def group(self, name: str) -> SweepGroup:
        """The verify of the buffer group ``name``."""
        return next(g for g in self.groups if g.group == name)


@dataclass(frozen=True)
class MoveGroup:
    """One buffer group's part of a :class:`Move`: the slots of the group's pool it saves or
    loads. A load's slot ``i`` takes the KV of the saved slot ``kv_from[i]`` and the records (in
    the head and the tail canary buffer) of the saved slot ``records_from[i]``; -1: it keeps
    its own (a fault of the move)."""

    group: str
    slots: np.ndarray
    kv_from: np.ndarray | None = None
    records_from: np.ndarray | None = None


@dataclass(frozen=True)
class Move:
    """KV that moves without a forward, no kernel launched: a ``save`` copies each group's
    slots (their KV and their records in both canary buffers) to the host copy ``key``; a load
    copies a host copy into other slots, and consumes it. ``kind`` says what moves the KV:
    ``offload`` and ``reload`` (a cached prefix goes to the host pool and comes back into other
    slots, as HiCache does), ``backup`` and ``restore`` (a retracted request's KV), ``send``
    and ``receive`` (a PD transfer from the prefill engine, page by page, the records spliced
    into it as SGLang's ``pool_patcher/buf_info_splice.py`` splices the canary buffers into
    the pool's transfer buffers); ``engine``: whose buffers (``""`` the engine's own,
    :data:`PREFILL_ENGINE` its prefill engine's)."""

    #: the move kind: what moves the KV (``offload``, ``reload``, ``backup``, ``restore``,
    #: ``send``, ``receive``)
    kind: str
    key: int
    save: bool
    groups: tuple[MoveGroup, ...]
    engine: str = ""
