"""Faults made in engine histories after a warm-up and judged as their class predicts: SGLang's
own five perturbations on the engine model (the runtime leg) and a fault of every class run
through SGLang's per-forward runtime (the manager leg).

Every trial has one skeleton: an engine of :func:`conformance.sglang.histories.engine_config`
with the trial's seed (:data:`conformance.sglang.histories.SEEDS`), the reference's run of it,
the warm-up (:func:`start`), a fault, then one judge (:func:`judge`): the settle, the reports
against the class's predictions (:func:`conformance.engine_support.inject_and_settle`), and
through SGLang's runtime, that its reporter logged every report. The outcome is ``reported``
where a report came, the trial's word for silence where none did, and the trial's word for
"no room" where the engine had no place for the fault or too few pages to settle.
"""

from __future__ import annotations

import functools
import random
import types
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from conformance.engine_support import OracleRun, inject_and_settle, warm_up
from conformance.sglang import graphs, loading, overlap, tree, wiring
from conformance.sglang.histories import PREFILL_CHUNK, SEEDS, engine_config, hash_mode
from conformance.sglang.manager_run import ManagerRun, logged_problems
from conformance.sglang.standins import (
    PerturbBatchStandIn,
    decode_batch,
    int64_tensor,
    unlocked_cache,
)
from engine_model import KV_BYTES, Engine, EngineConfig, faults
from engine_model.vocabulary import (
    DECODE,
    FULL,
    SWA,
    TARGET_VERIFY,
    of_the_draft_model,
    settle_step,
)
from reference import RealKvHashMode

__all__ = [
    "KV_PERTURBATIONS",
    "NEXT_TOKEN_SWAP",
    "NO_ROOM",
    "PERTURBATION_TRIALS",
    "REQ_TO_TOKEN",
    "Trial",
    "fault_trial",
    "judge",
    "kv_perturbation_trial",
    "overlap_lead",
    "req_to_token_trial",
    "shared_prefix_trial",
    "start",
    "swap_trial",
]

#: The fault class of a changed entry of the page table (``req_to_token``), and of two
#: sampled tokens swapped: SGLang's perturbations of the same names make them.
REQ_TO_TOKEN = "req_to_token"
NEXT_TOKEN_SWAP = "next_token_swap"
#: The fault class of SGLang's KV perturbations (``perturb/real_<class>.py``), and the field
#: of SGLang's ``PerturbConfig`` that switches each on.
KV_PERTURBATIONS = {
    "kv_used": "real_kv_used_prob",
    "kv_post_forward": "real_kv_post_forward_prob",
    "kv_unused_cache": "real_kv_unused_cache_prob",
}
#: The flipped cached byte of the shared-prefix trial, and the tokens of the request that
#: shares its prefix.
KV_UNUSED_CACHE = "kv_unused_cache"
SHARING_REQUEST_TOKENS = 2
#: A trial whose engine had no place for the fault, or too few pages to settle.
NO_ROOM = "no room to settle"
#: The canary buffers of a group (a KV perturbation reads none: one byte each).
CANARY_BUFFERS = ("k_head", "k_tail", "v_head", "v_tail")


@dataclass(frozen=True)
class Trial:
    """An engine after its warm-up, the reference's run of it (``reference_run``), ``run``, a
    step through every side, and ``side``, SGLang's runtime (None: the reference alone)."""

    engine: Engine
    reference_run: OracleRun
    run: Callable
    side: ManagerRun | None = None


def start(
    config: EngineConfig,
    *,
    through_sglang: bool = False,
    verify: bool = True,
    eagle: bool | None = None,
    tree_records: bool | None = None,
) -> Trial:
    """An engine of ``config`` after its warm-up, run on the reference, and ``through_sglang``
    on SGLang's per-forward runtime beside it (the warm-up's decode without padding rows amid
    its batch, as SGLang makes them; the engine as a server runs it, :func:`wiring.servable`;
    ``verify`` False: a warm-up without a target verify, as a server without speculative
    decoding runs; ``eagle``: whether the server runs EAGLE, by default where the engine is
    the draft model's; ``tree_records`` (None: EAGLE drafting a chain): every target verify as
    a server drafting a tree runs it, :func:`conformance.sglang.tree.verify`, the accepted
    path's records moved with its KV where True)."""
    engine = Engine(wiring.servable(config, eagle) if through_sglang else config)
    reference_run = OracleRun(engine)
    if not through_sglang:
        warm_up(engine, reference_run.forward_or_sweep)
        return Trial(engine, reference_run, reference_run.forward_or_sweep)
    side = ManagerRun(engine, reference_run)
    run = functools.partial(side.run, reference_run)
    if tree_records is not None:
        run = _as_tree_server(engine, run, tree_records)
    warm_up(engine, run, pad=0, verify=verify)
    side.step_labels.clear()  # the labels of what follows the warm-up
    return Trial(engine, reference_run, run, side)


def _as_tree_server(engine: Engine, run: Callable, records: bool) -> Callable:
    """``run`` of each step as a server drafting a tree runs it (:func:`tree.verify`)."""

    def each(step) -> None:
        for one in tree.verify(engine, step, records=records):
            run(one)

    return each


def judge(
    trial: Trial,
    fault_class: str,
    *,
    made: faults.Fault | None = None,
    pick: int = 0,
    byte: int = 0,
    settle_mode: str = DECODE,
    quiet: str = "not reported",
    no_room: str = NO_ROOM,
    lead=None,
) -> tuple[str, list[str]]:
    """A fault of ``fault_class`` (``made`` by SGLang's code already, or made here at ``pick``
    and ``byte``) settled with decodes in ``settle_mode`` and judged as its class predicts
    (through SGLang's replayed graphs, without the ``TOKEN`` bit a replay cannot report, [21]:
    :func:`conformance.sglang.graphs.graph_dues`); through SGLang's runtime, its reporter must
    have logged every report; ``lead``: the settle's first steps
    (:func:`conformance.engine_support.inject_and_settle`). ``(outcome, problems)``:
    ``reported``, ``quiet`` (no report) or ``no_room``."""
    if made is not None:
        trial.engine.log.append(f"FAULT {made.what}")
    flip = None if trial.side is None else trial.side.flip
    replays = trial.side is not None and settle_step(settle_mode).graph
    counted = [0]
    runner = graphs.settle_runner(settle_step(settle_mode))
    with graphs.graph_dues(faults.FAULTS[fault_class], replays, counted, runner):
        judged = inject_and_settle(
            trial.engine, trial.reference_run, fault_class, pick, byte, trial.run, flip=flip,
            mode=settle_mode, made=made, lead=lead,
        )  # fmt: skip
    if trial.side is not None:
        trial.side.token_dues += counted[0]
    if judged is None:
        return no_room, []
    _, problems, first = judged
    if trial.side is not None:
        problems = problems + logged_problems(trial.side)
    return ("reported" if first is not None else quiet), problems


def perturb_config(mods: types.SimpleNamespace, **probabilities) -> tuple[object, object]:
    """SGLang's ``PerturbConfig`` (the named perturbations at probability 1, the others 0, no
    warm-up; ``target_group_kind``: the group a KV perturbation flips a byte in) and its
    ``WarmupGate`` one step in."""
    fields = {
        "req_to_token_prob": 0.0, "real_kv_used_prob": 0.0, "real_kv_unused_cache_prob": 0.0,
        "real_kv_post_forward_prob": 0.0, "target_group_kind": None, "warmup_steps": 0,
    }  # fmt: skip
    fields.update(probabilities)
    config = mods.config.PerturbConfig(**fields)
    return config, mods.utils.WarmupGate(config=config, outer_step_counter_getter=lambda: 1)


def _groups_over(engine: Engine, copies: dict, mods: types.SimpleNamespace) -> tuple:
    """SGLang's ``CanaryBufferGroup`` of each group over ``copies`` of the reference's KV pools
    (one ``RealKvSource`` of :data:`engine_model.KV_BYTES` a slot each)."""
    bg = mods.buffer_group
    return tuple(
        bg.CanaryBufferGroup(
            kind=bg.PoolKind[g],
            **{n: torch.zeros(1, dtype=torch.uint8) for n in CANARY_BUFFERS},
            real_kv_sources_k=(mods.RealKvSource(
                tensor=copies[g], page_size=1, num_bytes_per_token=KV_BYTES, read_bytes=KV_BYTES,
            ),),
            real_kv_sources_v=(),
            swa_index_lut=None if g == FULL else int64_tensor(engine.lut),
            kv_token_id_vs_position_offset=0,
        )
        for g in engine.config.groups
    )  # fmt: skip


def _kv_batch(trial: Trial, fault_class: str) -> PerturbBatchStandIn | None | str:
    """The batch a KV perturbation reads: the decode about to run (``kv_used``), the decode
    just run (``kv_post_forward``; :data:`NO_ROOM` where none can run), or none."""
    engine = trial.engine
    if fault_class == "kv_used":
        return decode_batch(engine)
    if fault_class != "kv_post_forward":
        return None
    forward = engine.decode(0)
    if forward is None:
        return NO_ROOM
    trial.run(forward)
    return PerturbBatchStandIn(
        req_pool_indices=int64_tensor(forward.plan["req_pool_indices"]),
        seq_lens=int64_tensor(np.asarray(forward.write["positions"]) + 1),
        out_cache_loc=torch.from_numpy(forward.group(FULL).out_cache_loc.copy()),
    )


def kv_perturbation_trial(fault_class: str, index: int) -> tuple[str, list[str]]:
    """SGLang's KV perturbation of class ``fault_class`` (:data:`KV_PERTURBATIONS`:
    ``perturb/real_kv_used.py`` before a decode, over the decode's batch;
    ``perturb/real_kv_post_forward.py`` after a decode, over its batch;
    ``perturb/real_kv_unused_cache.py`` at a sweep step, over the walk of the prefix cache's
    unlocked nodes, :func:`conformance.sglang.standins.unlocked_cache`), unmodified, on the
    engine model after a warm-up, its buffer groups SGLang's ``CanaryBufferGroup`` over copies
    of the reference's KV pools: the byte it flips is flipped in the reference's pool and
    judged as the class predicts over the settle. ``(outcome, problems)``: ``reported``, ``not
    reported`` (the class promised nothing: the hash mode reads no flipped byte, or the slot
    left the window), ``unchanged`` or ``no room to settle``."""
    mods = loading.perturb_modules()
    trial = start(
        engine_config(
            index, seed=SEEDS.kv_perturbation_trial, real_kv_hash_mode=hash_mode(index),
            eagle_offset=0,
        )
    )  # fmt: skip
    engine, reference_run = trial.engine, trial.reference_run
    c = engine.config
    target = SWA if c.swa_window and index % 2 else FULL
    batch = _kv_batch(trial, fault_class)
    if isinstance(batch, str):
        return NO_ROOM, []
    copies = {g: torch.from_numpy(reference_run.kv(g).copy()) for g in c.groups}
    groups = _groups_over(engine, copies, mods)
    config, gate = perturb_config(
        mods, **{KV_PERTURBATIONS[fault_class]: 1.0},
        target_group_kind=mods.config.TargetGroupKind[target],
    )  # fmt: skip
    torch.manual_seed(SEEDS.sglang_picks(index))
    random.seed(SEEDS.sglang_picks(index))
    arguments = dict(maybe_inaccurate_forward_batch=batch, config=config, buffer_groups=groups,
                     warmup_gate=gate)  # fmt: skip
    if fault_class == "kv_unused_cache":  # at a sweep step, over the tree's unlocked nodes
        arguments.update(
            radix_cache=unlocked_cache(engine), swa_window_size=c.swa_window, sweep_interval=1,
            outer_step_counter=1,
        )  # fmt: skip
    if fault_class == "kv_used":
        page_table = torch.from_numpy(engine.req_to_token.copy())
        arguments.update(
            req_to_token_pool=types.SimpleNamespace(req_to_token=page_table),
            swa_window_size=c.swa_window,
        )
    getattr(mods, fault_class).run(**arguments)
    flipped = [
        (g, int(slot), int(byte))
        for g in c.groups
        for slot, byte in np.argwhere(copies[g].numpy() != reference_run.kv(g))
    ]
    if not flipped:
        return "unchanged", []
    assert len(flipped) == 1, flipped
    group, slot, byte = flipped[0]
    full_slot = slot if group == FULL else int(np.flatnonzero(engine.lut == slot)[0])
    what = f"SGLang's {fault_class} perturbation: byte {byte} of {group} slot {slot}"
    fault = faults.Fault(fault_class, (group, slot, byte), frozenset({slot}), (), what, group,
                         full_slot=full_slot)  # fmt: skip
    return judge(trial, fault_class, made=fault)


def swap_trial(index: int) -> tuple[str, list[str]]:
    """SGLang's ``next_token_swap`` perturbation (``perturb/next_token_swap.py``, unmodified:
    ``maybe_perturb_swap_next_tokens`` with probability 1 and no warm-up) on the tokens the
    engine model's requests just sampled, in batch order, as the sampler hands them over: the
    two it swaps are the engine's sampled tokens from then on, judged as the
    ``next_token_swap`` class predicts over the settle (decodes, where the input assert can
    fire). ``(outcome, problems)``: ``reported``, ``unchanged`` (fewer than two tokens, or two
    equal ones) or ``no room to settle``."""
    swap = loading.perturb_modules().next_token_swap
    trial = start(engine_config(index, seed=SEEDS.next_token_swap_trial, eagle_offset=0))
    engine = trial.engine
    ready = [
        r
        for r in sorted(engine.running.values(), key=lambda r: r.rid)
        if r.decoding and engine.pending(r) == 1 and r.written < engine.config.context_len
    ]
    sampled = int64_tensor([r.tokens[-1] for r in ready])
    saved = swap._config
    swap._config = swap.NextTokenSwapConfig(prob=1.0, warmup_steps=0)
    random.seed(SEEDS.sglang_picks(index))
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
    fault = faults.Fault(NEXT_TOKEN_SWAP, None, frozenset(), entries, what)
    return judge(trial, NEXT_TOKEN_SWAP, made=fault)


def req_to_token_trial(index: int) -> tuple[str, list[str]]:
    """SGLang's ``req_to_token`` perturbation (``perturb/req_to_token.py``, unmodified, with
    probability 1 and no warm-up) on the engine model after its warm-up, the batch it reads
    being the next decode's (``model_runner.py`` passes the forward's own batch as
    ``maybe_inaccurate_forward_batch``, before its launches): the page-table entry it changes
    is judged as the ``req_to_token`` fault class predicts, on the reference, over the settle.
    ``(outcome, problems)``: ``reported``, ``harmless`` (the records are equal), ``not a
    running request's`` (no running request reads the entry: no report may come),
    ``unchanged`` or ``no room to settle``."""
    mods = loading.perturb_modules()
    trial = start(engine_config(index, seed=SEEDS.req_to_token_trial, eagle_offset=0))
    engine = trial.engine
    # the decode batch about to run, as SGLang's model runner hands it to the perturbation
    # before the forward's launches
    stand_in = decode_batch(engine)
    config, gate = perturb_config(mods, req_to_token_prob=1.0)
    before = engine.req_to_token.copy()
    torch.manual_seed(SEEDS.sglang_picks(index))
    mods.req_to_token.run(
        maybe_inaccurate_forward_batch=stand_in, config=config, warmup_gate=gate,
        req_to_token_pool=types.SimpleNamespace(req_to_token=torch.from_numpy(engine.req_to_token)),
    )  # fmt: skip
    changed = np.argwhere(engine.req_to_token != before)
    if not len(changed):
        return "unchanged", []
    (row, pos), *_ = changed.tolist()
    new = int(engine.req_to_token[row, pos])
    owner = next((r for r in engine.running.values() if r.row == row), None)
    what = f"SGLang's req_to_token perturbation: row {row} position {pos} names slot {new}"
    read = owner is not None and pos < owner.written
    entries = ((owner.rid, pos),) if read else ()
    fault = faults.Fault(REQ_TO_TOKEN, None, frozenset({new}), entries, what)
    outcome, problems = judge(trial, REQ_TO_TOKEN, made=fault, quiet="harmless")
    if read or outcome == NO_ROOM:
        return outcome, problems
    if outcome == "reported":  # no running request reads the entry: nothing may be reported
        problems = problems + [f"{what}: reported, but no running request reads it"]
    return "not a running request's", problems


#: SGLang's five perturbations by fault class, in the order the runtime leg runs them.
PERTURBATION_TRIALS: dict[str, Callable[[int], tuple[str, list[str]]]] = {
    REQ_TO_TOKEN: req_to_token_trial,
    **{name: functools.partial(kv_perturbation_trial, name) for name in KV_PERTURBATIONS},
    NEXT_TOKEN_SWAP: swap_trial,
}


def fault_trial(
    fault_class: str,
    index: int,
    settle_mode: str,
    *,
    eagle_offset: int | None = None,
    page_size: int | None = None,
    window: int | None = None,
    verify: bool = True,
    overlap_graphs: bool | None = None,
    tree_records: bool | None = None,
) -> tuple[str, list[str], ManagerRun]:
    """A fault of class ``fault_class`` made after a warm-up (no padding rows amid a batch, as
    SGLang makes them) and settled with decodes in ``settle_mode``, on SGLang's runtime and the
    reference side by side (their states compared after every step); the reference's reports
    judged as the class predicts (:func:`judge`). The engine is the draft model's in a draft
    settle mode, else the target model's, and runs as a server with EAGLE runs it where it
    verifies or drafts (:func:`wiring.servable`), else as one without; ``page_size``,
    ``window``: the engine's, not those :func:`engine_config` cycles over; ``verify`` False: a
    warm-up without a target verify (:func:`start`); ``overlap_graphs`` (None: a server
    without overlap scheduling): the settle starts with request ``index`` finishing as SGLang's
    overlap loop orders it, its overshoot decode replaying a graph where True
    (:func:`overlap_lead`); ``tree_records`` (None: EAGLE drafting a chain): every target
    verify, the warm-up's and the settle's, as a server drafting a tree runs it (:func:`start`).
    ``(outcome, problems, side)``:
    ``reported``, ``silent`` (nothing due, nothing reported) or ``no place``."""
    cls = faults.FAULTS[fault_class]
    if cls.target_model_only:
        eagle_offset, settle_mode = 0, cls.settle_mode
    draft = of_the_draft_model(settle_step(settle_mode))
    if draft:  # the draft model's canary
        eagle_offset = 1
    eagle = settle_step(settle_mode).mode == TARGET_VERIFY or draft
    if eagle_offset is None or settle_step(settle_mode).mode == TARGET_VERIFY:
        eagle_offset = 0  # the target model's canary: with EAGLE where it verifies, else without
    config = engine_config(
        index, seed=SEEDS.fault_trial, real_kv_hash_mode=hash_mode(index),
        eagle_offset=eagle_offset, page_size=page_size, window=window,
    )  # fmt: skip
    trial = start(config, through_sglang=True, verify=verify, eagle=eagle,
                  tree_records=tree_records)  # fmt: skip
    lead = None if overlap_graphs is None else overlap_lead(trial.engine, index, overlap_graphs)
    outcome, problems = judge(
        trial, fault_class, pick=index, byte=index % KV_BYTES, settle_mode=settle_mode,
        quiet="silent", no_room="no place", lead=lead,
    )  # fmt: skip
    assert trial.side is not None
    return outcome, problems, trial.side


#: The overlap lead's overshoot decode: its graph's padding rows; the tokens of the request
#: the next batch admits into the freed row.
OVERLAP_PAD, OVERLAP_TOKENS = 2, 3


def overlap_lead(engine: Engine, pick: int, graph: bool) -> Callable:
    """A settle's first steps under overlap scheduling: request ``pick`` finishes, its overshoot
    decode (replaying a graph where ``graph``) read as SGLang's overlap loop lets its canary
    read it, then the next batch admitted into the freed row and prefilled
    (:func:`conformance.sglang.overlap.finish`)."""

    def lead(run: Callable) -> None:
        def keep(step) -> None:
            if step is not None:
                run(step)

        overlap.finish(engine, pick, graph, OVERLAP_PAD, OVERLAP_TOKENS, PREFILL_CHUNK, keep)

    return lead


def shared_prefix_trial(index: int) -> ManagerRun:
    """A KV byte of a cached slot no request uses flipped (the ``kv_unused_cache`` class, hash
    mode ``ALL``), then a request admitted sharing that prefix and prefilled: its ``EXTEND``
    forward's ``TAIL`` verify reads the shared slots' KV, through SGLang's runtime and the
    reference side by side (equal after every step); the runtime side, whose ``fired`` counts
    the reports (``REAL_KV`` in ``EXTEND`` where the flipped slot is in the shared part)."""
    config = engine_config(
        index, seed=SEEDS.shared_prefix_trial, real_kv_hash_mode=int(RealKvHashMode.ALL),
        eagle_offset=0,
    )  # fmt: skip
    trial = start(config, through_sglang=True)
    engine, side = trial.engine, trial.side
    assert side is not None
    fault = faults.make(engine, KV_UNUSED_CACHE, index, index)
    if fault is not None and fault.flip is not None:
        trial.reference_run.flip(*fault.flip)
        side.flip(*fault.flip)
        for share in range(1, len(engine.cache) + 1):
            if engine.admit(SHARING_REQUEST_TOKENS, share=share) is not None:
                break
        step = engine.prefill(engine.config.context_len)
        if step is not None:
            trial.run(step)
    return side
