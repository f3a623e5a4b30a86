"""SGLang's canary runtime over the engine model's histories: its plan inputs, per forward mode.

    python -m conformance.sglang_runtime [--histories N]

SGLang builds the plan kernel's per-row inputs, on every forward, in its runtime
(``sglang/srt/kv_canary/plan_input.py``: ``PlanInput.fill_from_forward_batch``, one branch per
``ForwardMode``), from the fields of SGLang's ``ForwardBatch``. The engine model
(``engine_model/engine.py``) builds the same inputs from its own state. This leg runs SGLang's
code, unmodified and on the CPU, on a stand-in ``ForwardBatch`` made of each forward of
:data:`HISTORIES` engine histories, and requires SGLang's ``PlanInput`` to equal the engine
model's plan inputs, row by row: in every mode the model has (``EXTEND``, ``DECODE``, a decode
replaying a CUDA graph with its padding rows, ``MIXED``, ``IDLE``, ``TARGET_VERIFY``, the draft
model's multi-step draft decode and its ``DRAFT_EXTEND_V2``, a PD transfer's prefill on the
prefill engine). It runs SGLang's ``TokenOracleManager.fill_expected_inputs``
(``token_oracle/oracle_manager.py``) on the same stand-in with SGLang's ``HashOracle``, and
requires its expected inputs to come from where the engine model's come from: the oracle's
tokens in the modes of ``engine_model.engine.ORACLE_MODES``, the input ids in the others. It
prints how many forwards of each mode it compared, and fails when a mode was never reached.

What runs of SGLang: ``plan_input.PlanInput`` (it imports torch alone), ``TokenOracleManager``
and ``HashOracle`` with ``ExpectedInputs`` (torch alone too), and ``ForwardMode``,
executed from its own source in ``model_executor/forward_batch_info.py`` (whose module needs
SGLang's serving stack), both from the installed ``sglang`` wheel (``pip install --no-deps
sglang==X``; every release from 0.5.13 has them). What stands in for the rest of SGLang:

- :class:`ForwardBatchStandIn` for ``model_executor.forward_batch_info.ForwardBatch``: the
  fields ``fill_from_forward_batch`` reads (:data:`FORWARD_BATCH_FIELDS`), filled as SGLang's
  scheduler fills them in each mode: ``positions`` (each token's position, a graph's padding
  rows 0), ``seq_lens`` (a decode row's length with its new token; a target verify's written
  length, before its drafts), ``extend_prefix_lens`` (the first position each row writes) and
  ``extend_seq_lens`` (the tokens each row writes) in the extend modes, ``req_pool_indices``,
  ``req_all_ids_lens`` (each row's known tokens) and ``spec_info``;
- :class:`SpecInfoStandIn` for EAGLE's verify and draft inputs (``draft_token_num``, the tokens
  each row of a target verify writes; ``num_tokens_per_req``, those of a draft extend);
- ``input_ids`` (the forward's), ``rids_int`` (a request's pool row as its id) and
  ``bootstrap_room_ids_int`` (None: no PD bootstrap room), which the token oracle manager
  reads (:data:`ORACLE_FIELDS`).

At each cache sweep of a history it runs SGLang's ``sweep_plan_builder.py``
(``build_verify_plan_radix_sweep``) over the engine model's walk of its cache and requires its
plan to equal the model's sweep in each group (:func:`compare_sweep`), with
:class:`RadixCacheStandIn` for ``mem_cache.unified_radix_cache.UnifiedRadixCache``
(``req_to_token_pool`` and the walk) and :func:`_walk` for ``radix_cache_walker.py``'s
``walk_radix_cache_for_canary`` (whose module needs SGLang's memory-cache stack).

It runs SGLang's ``req_to_token`` perturbation (``perturb/req_to_token.py``, unmodified, with
its slot picker, config and warm-up gate; probability 1, no warm-up) on the engine model after a
warm-up, through :class:`PerturbBatchStandIn` (the ``ForwardBatch`` of the decode about to run)
and the engine's own page table as SGLang's ``ReqToTokenPool.req_to_token``, and judges the
entry it changes as the ``req_to_token`` fault class predicts, on the reference, over the
settle (:func:`perturbation_trial`); and SGLang's ``real_kv_used`` and ``real_kv_post_forward``
perturbations the same way, with SGLang's own ``CanaryBufferGroup`` and ``RealKvSource`` over
copies of the reference's KV pools (:func:`kv_perturbation_trial`), and its
``real_kv_unused_cache`` over :func:`unlocked_cache` (the stand-in walk of the tree's unlocked
nodes: the slots of cached prefixes no running request holds); and its ``next_token_swap``
(``maybe_perturb_swap_next_tokens``, the sampler's hook) on the tokens the engine's requests
just sampled (:func:`swap_trial`). All five of SGLang's perturbations run.

It also runs SGLang's ``pool_patcher/buf_info_splice.py`` (``splice_kv_buf_info``, its patch
of a pool's ``get_contiguous_buf_infos``) on SGLang's own ``CanaryBufferGroup`` and a two-layer
MHA pool's buffer list, and copies pages over the spliced ``(ptr, len, item_len)`` lists as a
PD transfer engine does, item by item (:func:`transfer`): every page's records must arrive with
its KV, and without the splice they must not (the check can fail).

A forward the model makes that SGLang never makes is not compared: a decode batch with padding
rows outside a graph (the contract's plan takes padding rows anywhere; SGLang's decode batch
has them only at a replayed graph's tail).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import functools
import importlib
import importlib.machinery
import importlib.util
import random
import sys
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from conformance import upstream
from engine_model.engine import ORACLE_MODES, Engine, EngineConfig, Forward, Move, Sweep

__all__ = [
    "FORWARD_BATCH_FIELDS",
    "HISTORIES",
    "ForwardBatchStandIn",
    "SpecInfoStandIn",
    "compare",
    "forward_batch",
    "main",
    "runtime",
]

#: Engine histories the leg runs.
HISTORIES = 24
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
ORACLE_FIELDS = ("input_ids", "rids_int", "bootstrap_room_ids_int")
#: The vocabulary of the token oracle the leg gives SGLang's ``TokenOracleManager``.
VOCAB = 2**31 - 1
#: The plan inputs compared: SGLang's ``PlanInput`` field, the engine model's plan keyword.
PLAN_INPUT_FIELDS = (
    ("req_pool_indices", "req_pool_indices"),
    ("prefix_lens", "prefix_lens"),
    ("extend_seq_lens", "extend_seq_lens"),
    ("req_to_verify_expected_tokens_valid_lens", "req_to_verify_expected_tokens_valid_lens"),
)


@dataclass(frozen=True)
class SpecInfoStandIn:
    """Stands for EAGLE's verify input (``draft_token_num``: the tokens each row of a target
    verify writes) and its draft input (``num_tokens_per_req``: the tokens each row of a draft
    extend writes), ``speculative/eagle_info.py``."""

    draft_token_num: int = 0
    num_tokens_per_req: int = 0


@dataclass(frozen=True)
class ForwardBatchStandIn:
    """Stands for SGLang's ``ForwardBatch``: the fields of :data:`FORWARD_BATCH_FIELDS`, as
    tensors (None where SGLang's scheduler leaves them unset in the mode)."""

    forward_mode: enum.IntEnum
    req_pool_indices: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    extend_prefix_lens: torch.Tensor | None
    extend_seq_lens: torch.Tensor | None
    req_all_ids_lens: torch.Tensor
    spec_info: SpecInfoStandIn | None
    input_ids: torch.Tensor
    rids_int: torch.Tensor
    bootstrap_room_ids_int: torch.Tensor | None = None


def sglang_root() -> Path:
    """The installed ``sglang`` folder (that of a bare package already registered, if any)."""
    module = sys.modules.get("sglang")
    if module is not None and getattr(module, "__path__", None):
        return Path(list(module.__path__)[0])
    return upstream.sglang_root()


def _package(name: str) -> None:
    """Register ``name`` (a package of the installed ``sglang``) as a bare package pointing at
    its folder, without running its ``__init__``, unless it is registered already."""
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(sglang_root().joinpath(*name.split(".")[1:]))]
        sys.modules[name] = importlib.util.module_from_spec(spec)


@functools.cache
def runtime() -> types.SimpleNamespace:
    """SGLang's ``plan_input`` module and ``ForwardMode``, from the installed wheel, without
    its serving stack (bare parent packages point at the installed folders)."""
    root = sglang_root()
    for name in ("sglang", "sglang.srt", "sglang.srt.kv_canary"):
        _package(name)
    source = (root / "srt" / "model_executor" / "forward_batch_info.py").read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")
    scope = {"IntEnum": enum.IntEnum, "auto": enum.auto, "total_ordering": functools.total_ordering}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "forward_batch_info.py", "exec"), scope)
    plan_input = importlib.import_module("sglang.srt.kv_canary.plan_input")
    return types.SimpleNamespace(ForwardMode=scope["ForwardMode"], plan_input=plan_input)


def splice_modules() -> types.SimpleNamespace:
    """SGLang's ``buffer_group`` and ``pool_patcher.buf_info_splice``, which import its
    kv_canary kernels' module: loaded through the suite's SGLang adapter (its kv_canary without
    the serving stack), then the runtime's packages beside it."""
    from conformance.adapters import sglang as adapter  # loads kv_canary

    runtime.cache_clear()  # the adapter registered the packages afresh
    runtime()
    _package("sglang.srt.kv_canary.pool_patcher")
    return types.SimpleNamespace(
        buffer_group=importlib.import_module("sglang.srt.kv_canary.buffer_group"),
        splice=importlib.import_module("sglang.srt.kv_canary.pool_patcher.buf_info_splice"),
        slot_bytes=int(adapter._module("verify").CANARY_SLOT_BYTES),
    )


def transfer(*, splice: bool, page_size: int = 4, pages: int = 6, seed: int = 0) -> list[str]:
    """A PD transfer of pages ``[1, 3, 4]`` of a prefill engine's MHA pool into pages
    ``[5, 2, 0]`` of a decode engine's, over the ``(ptr, len, item_len)`` lists a transfer
    engine copies item by item (one page of each buffer an item), as SGLang's pool returns
    them: with ``splice``, through SGLang's own ``splice_kv_buf_info`` (its canary patch of
    ``get_contiguous_buf_infos``), which puts each canary buffer in the list; without, the KV
    layers alone. The slots whose records did not arrive with their KV, as lines."""
    mods = splice_modules()
    rng = torch.Generator().manual_seed(seed)
    slots, width = pages * page_size, 16

    def side():
        layers = [
            torch.randint(1, 255, (slots, width), dtype=torch.uint8, generator=rng)
            for _ in range(4)
        ]  # K of two layers, then V of two layers
        bufs = {
            name: torch.randint(1, 255, (slots, mods.slot_bytes), dtype=torch.uint8, generator=rng)
            for name in ("k_head", "k_tail", "v_head", "v_tail")
        }
        group = mods.buffer_group.CanaryBufferGroup(
            kind=mods.buffer_group.PoolKind.FULL, **bufs, real_kv_sources_k=(),
            real_kv_sources_v=(), swa_index_lut=None, kv_token_id_vs_position_offset=0,
        )  # fmt: skip
        ptrs = [t.data_ptr() for t in layers]
        lens = [t.nbytes for t in layers]
        items = [t[0].nbytes * page_size for t in layers]
        if splice:
            ptrs, lens, items = mods.splice.splice_kv_buf_info(
                ptrs=ptrs, lens=lens, item_lens=items, group=group, has_v_half=True,
                page_size=page_size,
            )  # fmt: skip
        memory = {t.data_ptr(): t for t in [*layers, *bufs.values()]}
        return layers, bufs, list(zip(ptrs, lens, items, strict=True)), memory

    src_layers, src_bufs, src_items, src_memory = side()
    dst_layers, dst_bufs, dst_items, dst_memory = side()
    moves = list(zip((1, 3, 4), (5, 2, 0), strict=True))
    for (sp, _, item), (dp, _, dst_item) in zip(src_items, dst_items, strict=True):
        assert item == dst_item
        source = src_memory[sp].view(-1)
        target = dst_memory[dp].view(-1)
        for a, b in moves:
            target[b * item : (b + 1) * item] = source[a * item : (a + 1) * item]
    lines = []
    for a, b in moves:
        for i in range(page_size):
            s, d = a * page_size + i, b * page_size + i
            kv = all(torch.equal(x[s], y[d]) for x, y in zip(src_layers, dst_layers, strict=True))
            records = all(torch.equal(src_bufs[n][s], dst_bufs[n][d]) for n in src_bufs)
            if kv and not records:
                lines.append(f"slot {s} -> {d}: the KV arrived, its records did not")
            elif not kv:
                lines.append(f"slot {s} -> {d}: the KV did not arrive")
    return lines


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


def _walk(
    *,
    radix_cache: RadixCacheStandIn,
    unlocked_only: bool = False,
    swa_resident_only: bool = False,
    **_,
) -> object:
    """Stands for ``radix_cache_walker.walk_radix_cache_for_canary`` (whose module needs SGLang's
    memory-cache stack): the stand-in tree's walk, of its unlocked nodes only if asked, and of
    the slots still in the SWA pool only if asked."""
    walk = radix_cache.unlocked if unlocked_only else radix_cache.walk
    assert walk is not None
    if swa_resident_only:
        assert radix_cache.lut is not None
        keep = radix_cache.lut[walk.slot_indices] != 0  # 0: evicted from the SWA pool
        walk = types.SimpleNamespace(**{k: v[keep] for k, v in vars(walk).items()})
    return walk


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
        slot_indices=_tensor(slots), positions=_tensor(positions),
        prev_slot_indices=_tensor([-1] * len(slots)),
    )  # fmt: skip
    return RadixCacheStandIn(
        req_to_token_pool=types.SimpleNamespace(req_to_token=_tensor(engine.req_to_token)),
        walk=unlocked, unlocked=unlocked, lut=None if engine.lut is None else _tensor(engine.lut),
    )  # fmt: skip


@functools.cache
def sweep_builder() -> types.ModuleType:
    """SGLang's ``sweep_plan_builder`` (unmodified), with the tree walker stood in for."""
    splice_modules()  # the kernels' module (``VerifyPlan``) and the runtime's packages
    name = "sglang.srt.kv_canary.radix_cache_walker"
    walker = types.ModuleType(name)
    walker.walk_radix_cache_for_canary = _walk  # type: ignore[attr-defined]
    sys.modules[name] = walker
    return importlib.import_module("sglang.srt.kv_canary.sweep_plan_builder")


def swept_cache(req_to_token: torch.Tensor, sweep) -> RadixCacheStandIn:
    """The stand-in prefix cache of a sweep: the page table SGLang's pool holds, and as its
    walk the sweep's ``FULL`` group (every slot the engine model's cached prefixes hold)."""
    full = sweep.group("FULL")
    return RadixCacheStandIn(
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        walk=types.SimpleNamespace(
            slot_indices=_tensor(full.slots),
            positions=_tensor(full.positions),
            prev_slot_indices=_tensor(full.prev_slots),
        ),
    )


def compare_sweep(engine: Engine, sweep) -> list[str]:
    """SGLang's ``build_verify_plan_radix_sweep`` over the engine model's cache walk (its
    ``FULL`` group's entries), per buffer group, against the engine model's sweep: the
    differing entries as lines. What is compared is SGLang's assembly of the plan and its
    translation of the walk into the ``SWA`` group's slots (evicted slots 0, the anchor kept);
    the walk itself is the stand-in's."""
    cache = swept_cache(_tensor(engine.req_to_token), sweep)
    lines = []
    for group in sweep.groups:
        window = engine.config.swa_window if group.group == "SWA" else 0
        lut = None if engine.lut is None or group.group == "FULL" else _tensor(engine.lut)
        plan = sweep_builder().build_verify_plan_radix_sweep(
            radix_cache=cache, swa_window_size=window, full_to_swa_index_mapping=lut
        )
        n = int(plan.verify_num_valid.reshape(-1)[0])
        if n != group.slots.shape[0] or int(plan.enable.reshape(-1)[0]) != 1:
            lines.append(f"{group.group}: {n} entries enabled={int(plan.enable.reshape(-1)[0])}")
            continue
        for theirs, ours in (
            ("verify_slot_indices", group.slots),
            ("verify_expected_positions", group.positions),
            ("verify_prev_slot_indices", group.prev_slots),
        ):
            got = getattr(plan, theirs)[:n].numpy()
            for i in np.flatnonzero(got != ours)[:4]:
                lines.append(
                    f"{group.group} {theirs}[{i}]: SGLang {int(got[i])}, the engine model {int(ours[i])}"
                )
    return lines


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


@functools.cache
def perturb_modules() -> types.SimpleNamespace:
    """SGLang's ``perturb`` package: its ``req_to_token`` perturbation, config and utilities."""
    sweep_builder()  # the kernels' modules, the runtime's packages and the walker stand-in
    name = "sglang.srt.kv_canary.perturb"
    _package(name)
    from conformance.adapters import sglang as adapter

    return types.SimpleNamespace(
        req_to_token=importlib.import_module(f"{name}.req_to_token"),
        kv_used=importlib.import_module(f"{name}.real_kv_used"),
        kv_post_forward=importlib.import_module(f"{name}.real_kv_post_forward"),
        kv_unused_cache=importlib.import_module(f"{name}.real_kv_unused_cache"),
        next_token_swap=importlib.import_module(f"{name}.next_token_swap"),
        config=importlib.import_module(f"{name}.config"),
        utils=importlib.import_module(f"{name}.utils"),
        RealKvSource=adapter._module("verify").RealKvSource,
    )


def _perturb_config(mods, **probabilities) -> object:
    """SGLang's ``PerturbConfig``: the named perturbations at probability 1, the others 0, no
    warm-up (``target_group_kind``: the group a KV perturbation flips a byte in)."""
    fields = {
        "req_to_token_prob": 0.0, "real_kv_used_prob": 0.0, "real_kv_unused_cache_prob": 0.0,
        "real_kv_post_forward_prob": 0.0, "target_group_kind": None, "warmup_steps": 0,
    }  # fmt: skip
    fields.update(probabilities)
    return mods.config.PerturbConfig(**fields)


def _decode_batch(engine: Engine) -> PerturbBatchStandIn:
    """The ``ForwardBatch`` of the decode about to run, as the perturbations read it; the page
    table names each new token's slot already, as SGLang's scheduler writes it before the
    forward (the engine model writes it with the forward's write: the same value)."""
    rows = [r for r, _ in engine._decode_rows()]
    p = engine.config.page_size
    ready = [r.written // p < len(r.pages) for r in rows]  # the new token's page allocated
    writes = [engine.full_slot(r, r.written) for r, ok in zip(rows, ready, strict=True) if ok]
    for r, ok in zip(rows, ready, strict=True):
        if ok:
            engine.req_to_token[r.row, r.written] = engine.full_slot(r, r.written)
    return PerturbBatchStandIn(
        req_pool_indices=_tensor([r.row for r in rows]),
        # a row whose new token has no page yet: SGLang's entry would name its new slot, which
        # the perturbation leaves out with out_cache_loc; the model's names none yet
        seq_lens=_tensor([r.written + ok for r, ok in zip(rows, ready, strict=True)]),
        out_cache_loc=_tensor(writes),
    )


#: The KV perturbations the leg runs: the engine model's fault class of each, SGLang's module
#: and the probability field that switches it on.
KV_PERTURBATIONS = {
    "kv_used": ("kv_used", "real_kv_used_prob"),
    "kv_post_forward": ("kv_post_forward", "real_kv_post_forward_prob"),
    "kv_unused_cache": ("kv_unused_cache", "real_kv_unused_cache_prob"),
}


def kv_perturbation_trial(kind: str, index: int) -> tuple[str, list[str]]:
    """SGLang's KV perturbation of class ``kind`` (:data:`KV_PERTURBATIONS`:
    ``perturb/real_kv_used.py`` before a decode, over the decode's batch;
    ``perturb/real_kv_post_forward.py`` after a decode, over its batch;
    ``perturb/real_kv_unused_cache.py`` at a sweep step, over the walk of the prefix cache's
    unlocked nodes, :func:`unlocked_cache`), unmodified, on the
    engine model after a warm-up, its buffer groups SGLang's ``CanaryBufferGroup`` over copies
    of the reference's KV pools (one ``RealKvSource`` of 32 bytes a slot each): the byte it flips
    is flipped in the reference's pool and judged as the class predicts over the settle.
    ``(outcome, problems)``: ``reported``, ``not reported`` (the class promised nothing: the
    mode reads no flipped byte, or the slot left the window), ``unchanged`` or ``no room to
    settle``."""
    from conformance.engine_support import OracleRun, inject_and_settle, warm_up
    from engine_model import faults

    mods = perturb_modules()
    module, prob = KV_PERTURBATIONS[kind]
    base = dataclasses.replace(config(index), offset=0, seed=9300 + index, mode=index % 3)
    engine = Engine(base)
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    c = engine.config
    target = "SWA" if c.swa_window and index % 2 else "FULL"
    batch = None
    if kind == "kv_post_forward":  # after a decode: its batch
        forward = engine.decode(0)
        if forward is None:
            return "no room to settle", []
        oracle.forward_or_sweep(forward)
        full = forward.group("FULL")
        batch = PerturbBatchStandIn(
            req_pool_indices=_tensor(forward.plan["req_pool_indices"]),
            seq_lens=_tensor(np.asarray(forward.write["positions"]) + 1),
            out_cache_loc=torch.from_numpy(full.out_cache_loc.copy()),
        )
    elif kind == "kv_used":
        batch = _decode_batch(engine)
    bg = splice_modules().buffer_group
    copies = {g: torch.from_numpy(oracle.kv(g).copy()) for g in c.groups}
    groups = tuple(
        bg.CanaryBufferGroup(
            kind=bg.PoolKind[g],
            **{n: torch.zeros(1, dtype=torch.uint8) for n in ("k_head", "k_tail", "v_head", "v_tail")},
            real_kv_sources_k=(mods.RealKvSource(
                tensor=copies[g], page_size=1, num_bytes_per_token=32, read_bytes=32,
            ),),
            real_kv_sources_v=(),
            swa_index_lut=None if g == "FULL" else _tensor(engine.lut),
            kv_token_id_vs_position_offset=0,
        )
        for g in c.groups
    )  # fmt: skip
    cfg = _perturb_config(
        mods, **{prob: 1.0}, target_group_kind=mods.config.TargetGroupKind[target]
    )
    gate = mods.utils.WarmupGate(config=cfg, outer_step_counter_getter=lambda: 1)
    torch.manual_seed(index)
    random.seed(index)
    arguments = dict(maybe_inaccurate_forward_batch=batch, config=cfg, buffer_groups=groups,
                     warmup_gate=gate)  # fmt: skip
    if kind == "kv_unused_cache":  # at a sweep step, over the tree's unlocked nodes
        arguments.pop("warmup_gate")
        arguments.update(
            radix_cache=unlocked_cache(engine), swa_window_size=c.swa_window, sweep_interval=1,
            outer_step_counter=1, warmup_gate=gate,
        )  # fmt: skip
    if kind == "kv_used":
        arguments.update(
            req_to_token_pool=types.SimpleNamespace(
                req_to_token=torch.from_numpy(engine.req_to_token.copy())
            ),
            swa_window_size=c.swa_window,
        )
    getattr(mods, module).run(**arguments)
    flipped = [
        (g, int(slot), int(byte))
        for g in c.groups
        for slot, byte in np.argwhere(copies[g].numpy() != oracle.kv(g))
    ]
    if not flipped:
        return "unchanged", []
    assert len(flipped) == 1, flipped
    group, slot, byte = flipped[0]
    full_slot = slot if group == "FULL" else int(np.flatnonzero(engine.lut == slot)[0])
    what = f"SGLang's {module} perturbation: byte {byte} of {group} slot {slot}"
    fault = faults.Fault(kind, (group, slot, byte), frozenset({slot}), (), what, group,
                         full_slot=full_slot)  # fmt: skip
    engine.log.append(f"FAULT {what}")
    made = inject_and_settle(engine, oracle, kind, 0, 0, oracle.forward_or_sweep, made=fault)
    if made is None:
        return "no room to settle", []
    _, problems, first = made
    return ("reported" if first is not None else "not reported"), problems


def swap_trial(index: int) -> tuple[str, list[str]]:
    """SGLang's ``next_token_swap`` perturbation (``perturb/next_token_swap.py``, unmodified:
    ``maybe_perturb_swap_next_tokens`` with probability 1 and no warm-up) on the tokens the
    engine model's requests just sampled, in batch order, as the sampler hands them over: the
    two it swaps are the engine's sampled tokens from then on, judged as the
    ``next_token_swap`` class predicts over the settle (decodes, where the input assert can
    fire). ``(outcome, problems)``: ``reported``, ``unchanged`` (fewer than two tokens, or two
    equal ones) or ``no room to settle``."""
    from conformance.engine_support import OracleRun, inject_and_settle, warm_up
    from engine_model import faults

    swap = perturb_modules().next_token_swap
    engine = Engine(dataclasses.replace(config(index), offset=0, seed=9700 + index))
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    c = engine.config
    ready = [
        r
        for r in sorted(engine.running.values(), key=lambda r: r.rid)
        if r.decoding and engine.pending(r) == 1 and r.written < c.context_len
    ]
    sampled = _tensor([r.tokens[-1] for r in ready])
    saved = swap._config
    swap._config = swap.NextTokenSwapConfig(prob=1.0, warmup_steps=0)
    random.seed(index)
    try:
        out = swap.maybe_perturb_swap_next_tokens(sampled)
    finally:
        swap._config = saved
    changed = torch.nonzero(out != sampled).flatten().tolist()
    if not changed:
        return "unchanged", []
    for req, token in zip(ready, out.tolist(), strict=True):
        req.tokens[-1] = token
    rids = [ready[i].rid for i in changed]
    what = f"SGLang's next_token_swap perturbation: requests {rids} swap their sampled tokens"
    entries = tuple((ready[i].rid, ready[i].written) for i in changed)
    fault = faults.Fault("next_token_swap", None, frozenset(), entries, what)
    engine.log.append(f"FAULT {what}")
    made = inject_and_settle(engine, oracle, "next_token_swap", 0, 0, oracle.forward_or_sweep,
                             made=fault)  # fmt: skip
    if made is None:
        return "no room to settle", []
    _, problems, first = made
    return ("reported" if first is not None else "not reported"), problems


def perturbation_trial(index: int) -> tuple[str, list[str]]:
    """SGLang's ``req_to_token`` perturbation (``perturb/req_to_token.py``, unmodified, with
    probability 1 and no warm-up) on the engine model after its warm-up, the batch it reads
    being the next decode's (``model_runner.py`` passes the forward's own batch as
    ``maybe_inaccurate_forward_batch``, before its launches): the entry it changes is judged
    as the ``req_to_token`` fault class predicts, on the reference, over the settle.
    ``(outcome, problems)``: ``reported``, ``harmless`` (the records are equal), ``not a
    running request's`` (no running request reads the entry: no report may come),
    ``unchanged`` or ``no room to settle``."""
    from conformance.engine_support import OracleRun, inject_and_settle, warm_up
    from engine_model import faults

    mods = perturb_modules()
    engine = Engine(dataclasses.replace(config(index), offset=0, seed=9100 + index))
    oracle = OracleRun(engine)
    run = oracle.forward_or_sweep
    warm_up(engine, run)
    # the decode batch about to run, as SGLang's model runner hands it to the perturbation
    # before the forward's launches
    stand_in = _decode_batch(engine)
    cfg = _perturb_config(mods, req_to_token_prob=1.0)
    gate = mods.utils.WarmupGate(config=cfg, outer_step_counter_getter=lambda: 1)
    before = engine.req_to_token.copy()
    torch.manual_seed(index)
    mods.req_to_token.run(
        maybe_inaccurate_forward_batch=stand_in, config=cfg, warmup_gate=gate,
        req_to_token_pool=types.SimpleNamespace(req_to_token=torch.from_numpy(engine.req_to_token)),
    )  # fmt: skip
    changed = np.argwhere(engine.req_to_token != before)
    if not len(changed):
        return "unchanged", []
    (row, pos), *_ = changed.tolist()
    new = int(engine.req_to_token[row, pos])
    owner = next((r for r in engine.running.values() if r.row == row), None)
    what = f"SGLang's req_to_token perturbation: row {row} position {pos} names slot {new}"
    if owner is None or pos >= owner.written:
        fault = faults.Fault("req_to_token", None, frozenset({new}), (), what)
        outcome = "not a running request's"
    else:
        fault = faults.Fault("req_to_token", None, frozenset({new}), ((owner.rid, pos),), what)
        outcome = ""
    engine.log.append(f"FAULT {what}")
    made = inject_and_settle(engine, oracle, "req_to_token", 0, 0, run, made=fault)
    if made is None:
        return "no room to settle", []
    _, problems, first = made
    if outcome:  # no running request reads the entry: nothing may be reported
        if first is not None:
            problems = problems + [f"{what}: reported, but no running request reads it"]
        return outcome, problems
    return ("reported" if first is not None else "harmless"), problems


def _tensor(values) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values, dtype=np.int64).copy())


def forward_batch(forward: Forward) -> ForwardBatchStandIn | None:
    """The ``ForwardBatch`` SGLang's scheduler makes for ``forward`` (None: a forward SGLang
    never makes). Its tokens stand row by row in the plan's row order (the forward's
    ``token_rows``), a graph's padding rows last, one token each."""
    mode = runtime().ForwardMode[forward.mode]
    plan, write = forward.plan, forward.write_for("HEAD")
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
    decoding = forward.mode in ("DECODE", "IDLE")
    extend = not decoding
    spec = None
    seq_lens = starts + 1 if decoding else starts + counts
    if forward.mode == "TARGET_VERIFY":
        spec = SpecInfoStandIn(draft_token_num=int(counts[0]))
        seq_lens = starts  # before the drafts: SGLang bumps seq_lens after the verify
    if forward.mode == "DRAFT_EXTEND_V2":  # seq_lens bumped by the new tokens
        spec = SpecInfoStandIn(num_tokens_per_req=int(counts[0]))
    return ForwardBatchStandIn(
        forward_mode=mode,
        req_pool_indices=_tensor(rows),
        positions=_tensor(positions),
        seq_lens=_tensor(seq_lens),
        # a replayed draft extend passes no prefix lengths (``plan_input.py``)
        extend_prefix_lens=_tensor(starts)
        if extend and forward.mode != "DRAFT_EXTEND_V2"
        else None,
        extend_seq_lens=_tensor(counts) if extend else None,
        req_all_ids_lens=_tensor(plan["req_to_verify_expected_tokens_valid_lens"]),
        spec_info=spec,
        input_ids=_tensor(write["input_ids"]),
        rids_int=_tensor(rows),  # a request's id: its pool row (0: a padding row)
    )


def expected_inputs(forward: Forward) -> list[str] | None:
    """SGLang's ``TokenOracleManager.fill_expected_inputs`` for ``forward`` against the engine
    model's choice of expected inputs: the token oracle's in the modes of
    :data:`engine_model.engine.ORACLE_MODES`, the input ids in the others. The differing entries
    as lines, or None for a forward SGLang never makes or one whose input assert is off."""
    batch = forward_batch(forward)
    if batch is None or forward.write["expected_input_tokens"] is None:
        return None
    mods = oracle_modules()
    n = int(batch.input_ids.shape[0])
    out = mods.expected_inputs.ExpectedInputs.allocate(capacity=n, device=torch.device("cpu"))
    oracle = mods.oracle.HashOracle(vocab_size=VOCAB)
    mods.oracle_manager.TokenOracleManager(oracle=oracle).fill_expected_inputs(
        forward_batch=batch, expected_inputs_out=out
    )
    rids = batch.rids_int[torch.from_numpy(forward.token_rows)]
    from_oracle = oracle.expected_tokens(generalized_req_ids=rids, positions=batch.positions)
    want = from_oracle if forward.mode in ORACLE_MODES else batch.input_ids
    source = "the token oracle's" if forward.mode in ORACLE_MODES else "the input ids"
    lines = []
    got_tokens, got_positions = out.tokens[:n].to(torch.int64), out.positions[:n]
    for i in torch.nonzero(got_tokens != want.to(torch.int64)).flatten()[:4].tolist():
        lines.append(f"token {i}: SGLang {int(got_tokens[i])}, {source} {int(want[i])}")
    if not torch.equal(got_positions.to(torch.int64), batch.positions):
        lines.append("positions: SGLang's differ from the forward's")
    return lines


@functools.cache
def oracle_modules() -> types.SimpleNamespace:
    """SGLang's ``token_oracle`` (its manager and oracle) and ``expected_inputs`` modules."""
    runtime()
    _package("sglang.srt.kv_canary.token_oracle")
    return types.SimpleNamespace(
        expected_inputs=importlib.import_module("sglang.srt.kv_canary.expected_inputs"),
        oracle=importlib.import_module("sglang.srt.kv_canary.token_oracle.oracle"),
        oracle_manager=importlib.import_module("sglang.srt.kv_canary.token_oracle.oracle_manager"),
    )


def compare(forward: Forward) -> list[str] | None:
    """SGLang's ``PlanInput`` for ``forward`` against the engine model's plan inputs: the
    differing entries as lines (none: equal), or None for a forward SGLang never makes."""
    batch = forward_batch(forward)
    if batch is None:
        return None
    bs = int(batch.req_pool_indices.shape[0])
    sglang = runtime().plan_input.PlanInput.allocate(bs_capacity=bs, device=torch.device("cpu"))
    sglang.fill_from_forward_batch(forward_batch=batch)
    lines = []
    for theirs, ours in PLAN_INPUT_FIELDS:
        got = getattr(sglang, theirs).numpy()
        want = np.asarray(forward.plan[ours], dtype=np.int64)
        for i in np.flatnonzero(got != want)[:4]:
            lines.append(f"{theirs}[{i}]: SGLang {int(got[i])}, the engine model {int(want[i])}")
    return lines


def config(index: int) -> EngineConfig:
    """The engine of history ``index``: pages of 1, 2 and 4 slots, with and without a window
    and the EAGLE offset."""
    page = (1, 2, 4)[index % 3]
    window = (0, 5)[index // 3 % 2]
    return EngineConfig(
        page_size=page, num_pages=96 // page, pool_rows=6, context_len=16, swa_window=window,
        offset=(0, 1)[index // 6 % 2], seed=7000 + index, swa_slots=60 if window else 0,
    )  # fmt: skip


def history(
    index: int, steps: int = 40, on_sweep=None, run=None, engine: Engine | None = None
) -> list[Forward]:
    """The forwards of one engine history: random scheduler events and every forward mode;
    ``on_sweep(engine, sweep)`` is called at each cache sweep, with the engine as it is then;
    ``run(step)``, if given, at each step as it is made (forwards, sweeps and moves of KV
    without a forward, in order); ``engine``: the engine to run it on (default: a new one of
    :func:`config`)."""
    engine = Engine(config(index)) if engine is None else engine
    rng = np.random.default_rng(index)
    out: list[Forward] = []

    def keep(*made) -> None:
        for one in made:
            items = one if isinstance(one, list) else [one]
            out.extend(f for f in items if isinstance(f, Forward))
            if run is not None:
                for step in items:
                    if isinstance(step, (Forward, Sweep, Move)):
                        run(step)

    for _ in range(3):
        engine.admit(int(rng.integers(2, 7)), 0)
    for _ in range(steps):
        op = rng.choice(
            ("admit", "prefill", "decode", "graph", "mixed", "idle", "verify", "draft", "draftext")
            + ("finish", "retract", "readmit", "receive", "relocate", "twin", "sweep")
        )
        pick = int(rng.integers(0, 8))
        if op == "admit":
            engine.admit(int(rng.integers(1, 8)), pick % 3)
        elif op in ("finish", "retract", "readmit", "relocate"):
            keep(getattr(engine, op)(pick))
        elif op == "receive":
            keep(engine.receive(int(rng.integers(2, 8))))
        elif op == "twin":  # computed again, then inserted: its row rebound to the cache's pages
            rid = engine.admit_twin(pick, int(rng.integers(1, 4)))
            keep(engine.prefill(6))
            if rid is not None:
                engine.insert(0, rid=rid)
        chunk = int(rng.integers(1, 7))
        if op == "prefill":
            keep(engine.prefill(chunk))
        elif op == "graph":
            keep(engine.decode(pick % 3, graph=True))
        elif op == "mixed":
            keep(engine.mixed(chunk))
        elif op == "idle":
            keep(engine.idle(1 + pick % 2))
        elif op == "verify":
            keep(engine.target_verify(2 + pick % 3, pick))
        elif op == "draft":
            keep(engine.draft_decode(3))
        elif op == "sweep":
            sweep = engine.sweep()
            if sweep is not None and on_sweep is not None:
                on_sweep(engine, sweep)
            keep(sweep)
        elif op == "draftext":
            keep(engine.draft_extend(1 + pick % 3))
        else:
            keep(engine.prefill(6) or engine.decode(0))
    return out


def label(forward: Forward) -> str:
    """The forward's mode as the leg counts it."""
    if forward.engine:
        return f"{forward.mode} on the prefill engine"
    if forward.kind == "draft_decode":
        return "DECODE of the draft model"
    return forward.mode + (" replaying a graph" if forward.graph and forward.mode != "IDLE" else "")


#: The modes whose expected inputs every run must compare at least once.
ORACLE_MODES_REQUIRED = ("DECODE", "IDLE", "DRAFT_EXTEND_V2", "EXTEND", "MIXED", "TARGET_VERIFY")
#: The modes every run must compare at least once.
REQUIRED = (
    "EXTEND",
    "DECODE",
    "DECODE replaying a graph",
    "MIXED",
    "IDLE",
    "TARGET_VERIFY",
    "DECODE of the draft model",
    "DRAFT_EXTEND_V2",
    "EXTEND on the prefill engine",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.sglang_runtime", description=__doc__
    )
    parser.add_argument("--histories", type=int, default=HISTORIES)
    options = parser.parse_args(argv)
    try:
        runtime()
    except ImportError as error:  # no sglang, or one without the runtime
        print(f"error: {error}", file=sys.stderr)
        return 2
    version = upstream.installed_version()
    counts: Counter[str] = Counter()
    oracle_counts: Counter[str] = Counter()  # forwards whose expected inputs were compared
    skipped = 0
    problems = []
    sweeps: Counter[str] = Counter()

    def swept(engine: Engine, sweep) -> None:
        lines = compare_sweep(engine, sweep)
        sweeps["with a window" if engine.lut is not None else "without a window"] += 1
        if lines:
            problems.append(f"history {index}, sweep: " + "; ".join(lines))

    for index in range(options.histories):
        for step, forward in enumerate(history(index, on_sweep=swept)):
            lines = compare(forward)
            if lines is None:
                skipped += 1
                continue
            counts[label(forward)] += 1
            if lines:
                problems.append(
                    f"history {index}, forward {step} ({label(forward)}): " + "; ".join(lines)
                )
            inputs = expected_inputs(forward)
            if inputs is not None:
                oracle_counts[forward.mode] += 1
            if inputs:
                problems.append(
                    f"history {index}, forward {step} ({label(forward)}), expected inputs: "
                    + "; ".join(inputs)
                )
    print(f"sglang {version}: PlanInput.fill_from_forward_batch against the engine model")
    for name in REQUIRED:
        print(
            f"  {name}: {counts[name]} forwards equal"
            if not problems
            else f"  {name}: {counts[name]}"
        )
    print(f"  not compared (padding rows SGLang's batches never have): {skipped}")
    modes = sorted(oracle_counts, key=lambda m: (m not in ORACLE_MODES, m))
    print(
        "TokenOracleManager.fill_expected_inputs against the engine model: "
        + ", ".join(
            f"{m} {oracle_counts[m]} ({'the oracle' if m in ORACLE_MODES else 'the input ids'})"
            for m in modes
        )
        + (" forwards equal" if not problems else "")
    )
    print(
        "build_verify_plan_radix_sweep against the engine model's sweep: "
        + ", ".join(f"{sweeps[k]} {k}" for k in ("without a window", "with a window"))
        + (" equal" if not problems else "")
    )
    perturbed: dict[str, Counter[str]] = {}
    for kind in ("req_to_token", *KV_PERTURBATIONS, "next_token_swap"):
        outcomes = perturbed[kind] = Counter()
        for index in range(options.histories):
            if kind == "req_to_token":
                outcome, lines = perturbation_trial(index)
            elif kind == "next_token_swap":
                outcome, lines = swap_trial(index)
            else:
                outcome, lines = kv_perturbation_trial(kind, index)
            outcomes[outcome] += 1
            problems += [f"history {index}, SGLang's {kind} perturbation: {x}" for x in lines]
        print(
            f"SGLang's {kind} perturbation on the engine model, judged as the class predicts: "
            + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
            + ("" if problems else " (every prediction met)")
        )
    missing = [name for name in REQUIRED if not counts[name]]
    missing += [f"a sweep {k}" for k in ("without a window", "with a window") if not sweeps[k]]
    missing += [f"expected inputs of {m}" for m in ORACLE_MODES_REQUIRED if not oracle_counts[m]]
    missing += [f"a {k} perturbation reported" for k, o in perturbed.items() if not o["reported"]]
    for line in problems[:20]:
        print(f"DIFFERS: {line}")
    if missing:
        print(f"NEVER REACHED: {', '.join(missing)}")
    lost = transfer(splice=True)
    control = transfer(splice=False)  # the KV layers alone: the check must see records stay
    print(
        "PD transfer over SGLang's splice_kv_buf_info: "
        + (f"{len(lost)} slots lost their records: {lost[:3]}" if lost else
           "every page's records arrive with its KV")
        + f" (without the splice, {len(control)} of 12 slots arrive without their records)"
    )  # fmt: skip
    return 1 if problems or missing or lost or not control else 0


if __name__ == "__main__":
    sys.exit(main())
