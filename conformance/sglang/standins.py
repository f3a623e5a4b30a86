"""The stand-ins of the SGLang classes the legs' SGLang code reads, and how each is filled from
the engine model: each class's docstring names the class it stands for, and a self-test
(``tests/suite/test_sglang_runtime.py``, ``test_sglang_manager.py``) reads from SGLang's
source that it provides every field SGLang's code reads.

- :class:`ForwardBatchStandIn` (``model_executor.forward_batch_info.ForwardBatch``, as
  ``PlanInput`` and the token oracle manager read it; :func:`forward_batch` fills it from a
  forward) and :class:`SpecInfoStandIn` (EAGLE's verify and draft inputs);
- :class:`ManagerBatchStandIn` (``ForwardBatch`` as the per-forward manager reads it; the
  decode graph runner's capture batch is one too, ``conformance.sglang.graphs.capture_batch``,
  held to the runner's call by ``tests/suite/test_sglang_graphs.py``, and so is its
  ``spec_info`` in ``TARGET_VERIFY``, ``graphs.CaptureSpecInfo``, to ``get_spec_info``'s);
- :class:`RadixCacheStandIn` (``mem_cache.unified_radix_cache.UnifiedRadixCache``, as the
  sweep and ``real_kv_unused_cache`` read it: :func:`swept_cache`, :func:`unlocked_cache`);
- :class:`PerturbBatchStandIn` (``ForwardBatch`` as the perturbations read it:
  :func:`decode_batch`);
- :class:`EngineTokenOracle` (``token_oracle.oracle.HashOracle``: tensor work alone, as it is,
  so that a replayed graph answers afresh; ``test_sglang_graphs.py``).
"""

from __future__ import annotations

import enum
import types
from array import array
from dataclasses import dataclass

import numpy as np
import torch

from conformance.sglang import loading
from engine_model import Engine, Forward
from engine_model.vocabulary import DECODE, DRAFT_EXTEND_V2, FULL, HEAD, IDLE, TARGET_VERIFY

__all__ = [
    "FORWARD_BATCH_FIELDS",
    "TOKEN_ORACLE_FIELDS",
    "EngineTokenOracle",
    "ForwardBatchStandIn",
    "ManagerBatchStandIn",
    "PerturbBatchStandIn",
    "RadixCacheStandIn",
    "SpecInfoStandIn",
    "decode_batch",
    "forward_batch",
    "int64_tensor",
    "request_ids",
    "swept_cache",
    "unlocked_cache",
]

#: The fields of SGLang's ``ForwardBatch`` that ``PlanInput.fill_from_forward_batch`` reads.
FORWARD_BATCH_FIELDS = (
    "forward_mode",
    "req_pool_indices",
    "positions",
    "seq_lens",
    "extend_prefix_lens",
    "extend_seq_lens",
    "req_all_ids_lens",
    "spec_info",
)
#: The fields of SGLang's ``ForwardBatch`` that ``TokenOracleManager.fill_expected_inputs``
#: reads besides them.
TOKEN_ORACLE_FIELDS = ("input_ids", "rids_int", "bootstrap_room_ids_int")


def int64_tensor(values) -> torch.Tensor:
    """``values`` as an int64 CPU tensor of its own."""
    return torch.from_numpy(np.asarray(values, dtype=np.int64).copy())


@dataclass(frozen=True)
class SpecInfoStandIn:
    """Stands for EAGLE's verify input (``draft_token_num``: the tokens each row of a target
    verify writes) and its draft input (``num_tokens_per_req``: the tokens each row of a draft
    extend writes), ``speculative/eagle_info.py``."""

    draft_token_num: int = 0
    num_tokens_per_req: int = 0


@dataclass(frozen=True)
class ForwardBatchStandIn:
    """Stands for SGLang's ``ForwardBatch``: the fields of :data:`FORWARD_BATCH_FIELDS` and
    :data:`TOKEN_ORACLE_FIELDS`, as tensors (None where SGLang's scheduler leaves them unset in
    the mode)."""

    forward_mode: enum.IntEnum
    req_pool_indices: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor | None
    extend_seq_lens: torch.Tensor | None
    req_all_ids_lens: torch.Tensor | None
    spec_info: SpecInfoStandIn | None
    input_ids: torch.Tensor
    rids_int: torch.Tensor
    bootstrap_room_ids_int: torch.Tensor | None = None


def forward_batch(forward: Forward) -> ForwardBatchStandIn | None:
    """The ``ForwardBatch`` SGLang's scheduler makes for ``forward`` (None: a forward SGLang
    never makes). Its tokens stand row by row in the plan's row order (the forward's
    ``token_rows``), a graph's padding rows last, one token each."""
    forward_mode = loading.runtime().ForwardMode[forward.mode]
    plan, write = forward.plan, forward.write_for(HEAD)
    rows = np.asarray(plan["req_pool_indices"])
    live = rows != 0
    if live.any() and not forward.graph and not live.all():
        return None  # padding rows outside a replayed graph: SGLang's batches have none
    if forward.graph and not live.all() and live.argmin() < live.sum():
        return None  # a graph pads at the tail (argmin: the first padding row)
    positions = np.asarray(write["positions"])
    counts = np.bincount(forward.token_rows, minlength=rows.shape[0])
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    starts = positions[first] if positions.size else np.zeros(0, np.int64)
    decoding = forward.mode in (DECODE, IDLE)
    extend = not decoding
    spec = None
    seq_lens = starts + 1 if decoding else starts + counts
    if forward.mode == TARGET_VERIFY:
        spec = SpecInfoStandIn(draft_token_num=int(counts[0]))
        seq_lens = starts  # before the drafts: SGLang bumps seq_lens after the verify
    if forward.mode == DRAFT_EXTEND_V2:  # seq_lens bumped by the new tokens
        spec = SpecInfoStandIn(num_tokens_per_req=int(counts[0]))
    return ForwardBatchStandIn(
        forward_mode=forward_mode,
        req_pool_indices=int64_tensor(rows),
        positions=int64_tensor(positions),
        seq_lens=int64_tensor(seq_lens),
        # a replayed draft extend passes no prefix lengths (``plan_input.py``)
        extend_prefix_lens=int64_tensor(starts)
        if extend and forward.mode != DRAFT_EXTEND_V2
        else None,
        extend_seq_lens=int64_tensor(counts) if extend else None,
        req_all_ids_lens=int64_tensor(plan["req_to_verify_expected_tokens_valid_lens"]),
        spec_info=spec,
        input_ids=int64_tensor(write["input_ids"]),
        rids_int=int64_tensor(rows),  # a request's id: its pool row (0: a padding row)
    )


@dataclass(frozen=True)
class ManagerBatchStandIn(ForwardBatchStandIn):
    """Stands for SGLang's ``ForwardBatch`` as the manager, its launches and the expected-token
    scatter read it: the fields of :class:`ForwardBatchStandIn` and ``batch_size``,
    ``out_cache_loc`` (the forward's slots in the full pool), ``req_all_ids_flat`` and
    ``req_all_ids_lens`` (each live row's known tokens, made by SGLang's
    ``compute_req_all_ids_info``; None where the engine keeps no expected-token pool)."""

    batch_size: int = 0
    out_cache_loc: torch.Tensor | None = None
    req_all_ids_flat: torch.Tensor | None = None


def request_ids(values) -> array:
    """A request's token ids as SGLang's ``Req`` keeps them (``origin_input_ids``)."""
    return array("q", [int(v) for v in values])


@dataclass(frozen=True)
class RadixCacheStandIn:
    """Stands for SGLang's ``UnifiedRadixCache`` as its sweep reads it: ``req_to_token_pool``
    (whose ``req_to_token`` gives the device) and the walk of the tree that
    ``radix_cache_walker.walk_radix_cache_for_canary`` returns (``slot_indices``,
    ``positions``, ``prev_slot_indices``: every slot the tree holds, in full-pool slots, the
    anchor -1), here the engine model's cached prefixes."""

    req_to_token_pool: types.SimpleNamespace
    walk: types.SimpleNamespace
    #: the walk of the tree's unlocked nodes only (slots no running request holds), as
    #: ``real_kv_unused_cache`` asks for it; ``lut``: the full-to-SWA table (None: no window)
    unlocked: types.SimpleNamespace | None = None
    lut: torch.Tensor | None = None


def unlocked_cache(engine: Engine) -> RadixCacheStandIn:
    """The engine model's prefix cache as SGLang's ``real_kv_unused_cache`` walks it: the slots
    of cached prefixes whose pages no running request holds (the tree's unlocked nodes)."""
    slots, positions = [], []
    for entry in engine.cache:
        for pos, full in enumerate(engine.cached_full_slots(entry)):
            if engine.req_refs[full // engine.config.page_size] == 0 and full not in slots:
                slots.append(full)
                positions.append(pos)
    unlocked = types.SimpleNamespace(
        slot_indices=int64_tensor(slots), positions=int64_tensor(positions),
        prev_slot_indices=int64_tensor([-1] * len(slots)),
    )  # fmt: skip
    lut = None if engine.lut is None else int64_tensor(engine.lut)
    return RadixCacheStandIn(
        req_to_token_pool=types.SimpleNamespace(req_to_token=int64_tensor(engine.req_to_token)),
        walk=unlocked, unlocked=unlocked, lut=lut,
    )  # fmt: skip


def swept_cache(page_table: torch.Tensor, sweep) -> RadixCacheStandIn:
    """The stand-in prefix cache of a sweep: the page table SGLang's pool holds, and as its
    walk the sweep's ``FULL`` group (every slot the engine model's cached prefixes hold)."""
    full = sweep.group(FULL)
    return RadixCacheStandIn(
        req_to_token_pool=types.SimpleNamespace(req_to_token=page_table),
        walk=types.SimpleNamespace(
            slot_indices=int64_tensor(full.slots),
            positions=int64_tensor(full.positions),
            prev_slot_indices=int64_tensor(full.prev_slots),
        ),
    )


@dataclass(frozen=True)
class PerturbBatchStandIn:
    """Stands for the ``ForwardBatch`` SGLang's perturbations read (``perturb/slot_picker.py``):
    the rows of the decode about to run, their lengths with the new token, the slots it writes
    (``out_cache_loc``) and the count of its tokens that are not padding (None: all of them;
    ``global_num_token_non_padded_cpu`` from 0.5.21, ``num_token_non_padded_cpu`` before)."""

    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    global_num_token_non_padded_cpu: int | None = None
    num_token_non_padded_cpu: int | None = None


def decode_batch(engine: Engine) -> PerturbBatchStandIn:
    """The ``ForwardBatch`` of the decode about to run, as the perturbations read it; the page
    table names each new token's slot already, as SGLang's scheduler writes it before the
    forward (the engine model writes it with the forward's write: the same value)."""
    rows = [r for r, _ in engine.decode_rows()]
    p = engine.config.page_size
    ready = [r.written // p < len(r.pages) for r in rows]  # the new token's page allocated
    writes = [engine.full_slot(r, r.written) for r, ok in zip(rows, ready, strict=True) if ok]
    for r, ok in zip(rows, ready, strict=True):
        if ok:
            engine.req_to_token[r.row, r.written] = engine.full_slot(r, r.written)
    return PerturbBatchStandIn(
        req_pool_indices=int64_tensor([r.row for r in rows]),
        # a row whose new token has no page yet: SGLang's entry would name its new slot, which
        # the perturbation leaves out with out_cache_loc; the model's names none yet
        seq_lens=int64_tensor([r.written + ok for r, ok in zip(rows, ready, strict=True)]),
        out_cache_loc=int64_tensor(writes),
    )


class EngineTokenOracle:
    """Stands for SGLang's token oracle (``token_oracle/oracle.py``: ``HashOracle``, whose
    tokens SGLang's oracle sampler makes the sampled ones): the engine model's own, each
    request's true token at a position (``expected_tokens``, keyed by the request's pool row,
    which the batch stand-in gives as its id; 0 for a padding row, a row no request runs on or
    a position past what the request knows).

    As ``HashOracle``, it answers with tensor work alone (no host read, no Python decision on
    a value), so a CUDA graph that captured a call of it answers afresh at every replay: its
    tokens are one table, ``[pool rows, width]`` (:attr:`table`, one object for the oracle's
    life), which :meth:`refresh` rewrites in place from the engine's running requests before
    each forward (``HashOracle``'s tokens are a fixed function of the request and position;
    the table is that function for the requests on each row now), and ``expected_tokens``
    gathers from it by the ids and positions it is given. A position or row outside the table
    answers 0, by a mask, not a branch."""

    def __init__(self, engine: Engine):
        self.engine = engine
        c = engine.config
        # a request knows at most its context and the EAGLE offset's tokens past it
        self.width = c.context_len + c.offset + 1
        self.table = torch.zeros((engine.req_to_token.shape[0], self.width), dtype=torch.int64)
        self.refresh()

    def refresh(self) -> None:
        """The table rewritten in place from the engine's running requests (each request's
        known tokens on its row, zeros elsewhere)."""
        self.table.zero_()
        for req in self.engine.running.values():
            truth = req.truth[: self.width]
            self.table[req.row, : len(truth)] = torch.tensor(truth, dtype=torch.int64)

    def expected_tokens(self, *, generalized_req_ids: torch.Tensor, positions: torch.Tensor):
        rows = generalized_req_ids.to(torch.int64)
        cols = positions.to(torch.int64)
        inside = (rows >= 0) & (rows < self.table.shape[0]) & (cols >= 0) & (cols < self.width)
        token = self.table[rows.clamp(0, self.table.shape[0] - 1), cols.clamp(0, self.width - 1)]
        return torch.where(inside, token, torch.zeros_like(token)).to(torch.int32)
