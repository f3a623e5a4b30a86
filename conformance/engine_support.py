"""Engine histories run on an implementation and on the reference (CONTRACT §6, §7, §12, §13).

:class:`OracleRun` runs the launches of a :class:`engine_model.engine.Engine` on the numpy
reference: the scatter into the expected-token pool, the plan, verify, the forward's KV bytes
and write, and the cache sweep, in the order an engine makes them. :class:`ImplRun` runs the
same launches on an implementation's tensors, and :func:`run_step` runs one step on both and
compares them after every launch. :func:`inject_and_settle` makes a fault, runs
:data:`SETTLE`, a short run of steps after it, and holds the reports to what its class
predicts (:mod:`engine_model.faults`).

Both runs start from one world: a canary slot per slot of the pool (SWA slots under a window),
one flat source of 32 KV bytes per slot, a ring wide enough for every report of a history, the
chain position assert on, and the write's input assert on with the token oracle's tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance import driver
from conformance.assertions import fail_bits_name
from conformance.driver import ImplementationSide, ReferenceSide
from engine_model import KV_BYTES, Engine, Forward, Move, Sweep, faults
from engine_model.faults import Due, Fault
from engine_model.vocabulary import (
    DECODE,
    DRAFT_EXTEND_V2,
    DRAFT_SETTLE_MODES,
    GROUPS,
    LAUNCH_STAGES,
    MIXED,
    PREFILL_ENGINE,
    SETTLE_MODES,
    STAGES,
    SWEEP,
    TAIL,
    TARGET_VERIFY,
    launch_tag,
    settle_step,
)

__all__ = [
    "RING_CAPACITY",
    "SETTLE",
    "DRAFT_SETTLE_MODES",
    "SETTLE_MODES",
    "TAGS",
    "ImplRun",
    "OracleRun",
    "inject_and_settle",
    "oracle_world",
    "run_step",
    "warm_up",
]

#: Rows of the violation ring: more than any history of the suite reports.
RING_CAPACITY = 512
#: The steps run right after a fault: a fresh request of one page is admitted and everyone
#: prefills (a token each), decodes, prefills and decodes again, then the cache is swept, so
#: that every running request is verified after any page was reused.
SETTLE = ("admit", "prefill", "decode", "prefill", "decode", "sweep")
SLOT, BITS = reference.ViolationField.SLOT_IDX, reference.ViolationField.FAIL_REASON_BITS
KIND = reference.ViolationField.KERNEL_KIND


#: The launch tag of each endpoint ``(group, stage)`` (SGLang's K half; its V half runs only
#: with ``SGLANG_KV_CANARY_ENABLE_MHA_V``, and repeats the K half's launches on other buffers).
TAGS = {
    (group, stage): reference.CanaryLaunchTag[launch_tag(stage, group)]
    for group in GROUPS
    for stage in LAUNCH_STAGES
}


def oracle_world(engine: Engine) -> dict:
    """The reference's worlds for ``engine``, made from its seed alone (no torch), keyed by
    endpoint ``(group, stage)``: per group a head and a tail canary buffer of random non-zero
    bytes (the group's pool size), the group's KV pool (one flat source of random non-zero
    bytes) as the tail's source and none for the head, and the sweep on the tail's buffer and
    source; one empty ring of random rows and one write index for all, and each endpoint's
    counters at 0."""
    c = engine.config
    rng = np.random.default_rng(c.seed + 1)
    ring = rng.integers(1, 2**62, (RING_CAPACITY, reference.VIOLATION_FIELDS)).astype(np.int64)
    index = np.zeros(1, dtype=np.int32)
    past: list = []
    states = {}
    for group in c.groups:
        n = c.group_slots(group)
        kv = rng.integers(1, 256, (n, KV_BYTES)).astype(np.uint8)
        pool = (reference.Source(kv, 1, KV_BYTES, KV_BYTES),)
        for stage in STAGES:
            buf = rng.integers(1, 256, (n, reference.CANARY_SLOT_BYTES)).astype(np.uint8)
            states[(group, stage)] = reference.CanaryState(
                canary_buf=buf,
                kernel_kind=TAGS[(group, stage)],
                violation_ring=ring,
                violation_write_index=index,
                slot_run_counter=np.zeros(1, dtype=np.int64),
                kernel_run_counter=np.zeros(1, dtype=np.int64),
                real_kv_sources=pool if stage == TAIL else (),
                real_kv_hash_mode=c.mode,
                enable_chain_position_assert=np.ones(1, dtype=np.int32),
                past_capacity=past,
            )
        tail = states[(group, TAIL)]
        states[(group, SWEEP)] = dataclasses.replace(
            tail,
            kernel_kind=TAGS[(group, SWEEP)],
            slot_run_counter=np.zeros(1, dtype=np.int64),
            kernel_run_counter=np.zeros(1, dtype=np.int64),
        )
    return states


class OracleRun(ReferenceSide):
    """The reference side of an engine's history: the worlds of :func:`oracle_world` and the
    engine's expected-token pool; ``peer``, the side of its prefill engine (PD transfers),
    made on first use, sharing the host copies of moved KV."""

    def __init__(self, engine: Engine, states: dict | None = None):
        super().__init__(oracle_world(engine) if states is None else states, engine.pool)
        self.engine = engine
        self.peer: OracleRun | None = None

    def peer_run(self) -> OracleRun:
        """The reference side of the engine's prefill engine."""
        if self.peer is None:
            assert self.engine.peer is not None
            self.peer = OracleRun(self.engine.peer)
            self.peer.host = self.host
        return self.peer

    def forward_or_sweep(self, step: Forward | Sweep | Move) -> None:
        """Run one step of a history (the reference alone), on the prefill engine's side for
        a step of a PD transfer's prefill engine."""
        side = self.peer_run() if getattr(step, "engine", "") == PREFILL_ENGINE else self
        ReferenceSide.forward_or_sweep(side, step)

    def buffers(self) -> dict:
        """Each endpoint's canary buffer as it is now, keyed by its launch tag; each group's KV
        pool keyed ``("KV", group)``; the prefill engine's, if any, under :data:`PREFILL_ENGINE`."""
        out: dict = {TAGS[key]: state.canary_buf for key, state in self.states.items()}
        out.update({("KV", g): self.kv(g) for g in self.engine.config.groups})
        if self.peer is not None:
            out[PREFILL_ENGINE] = self.peer.buffers()
        return out

    def silence_problem(self, since: int = 0) -> str:
        """What the rings stored that a correct history must not: this engine's since write
        index ``since``, and its prefill engine's (which no fault touches), in words ("": none)."""
        lines = []
        if self.index != since:
            lines.append(f"{self.index - since} reports: first {self.rows(since)[:2].tolist()}")
        if self.peer is not None and self.peer.index:
            lines.append(
                f"{self.peer.index} reports of the prefill engine: first "
                f"{self.peer.rows(0)[:2].tolist()}"
            )
        return "; ".join(lines)


class ImplRun(ImplementationSide):
    """The implementation side of an engine's history, on ``device``: the worlds of
    :func:`oracle_world` as tensors (one ring and write index for all; the sweep's world on
    its tail's buffer and source), and the engine's page table, SWA table and pool."""

    def __init__(self, impl, device, engine: Engine, states: dict):
        self.engine = engine
        self.peer: ImplRun | None = None
        c = engine.config
        worlds: dict = {}
        shared = None
        for (group, stage), state in states.items():
            if stage == SWEEP:
                continue
            n = c.group_slots(group)
            sources = (st_kv.layout(rows=n, num_bytes_per_token=KV_BYTES),) if stage == TAIL else ()
            world = st_kv.world(
                sources=sources, mode=c.mode, num_slots=n, ring_capacity=RING_CAPACITY,
                chain_assert=1, seed=c.seed, kernel_kind=int(state.kernel_kind),
            )  # fmt: skip
            made = st_kv.materialize_world(world, device)
            made.canary_buf.copy_(torch.from_numpy(state.canary_buf))
            made.slot_run_counter.zero_()
            made.kernel_run_counter.zero_()
            if sources:
                made.sources[0].tensor.copy_(torch.from_numpy(state.real_kv_sources[0].data))
            if shared is None:
                shared = made
                made.violation_ring.copy_(torch.from_numpy(state.violation_ring))
                made.violation_write_index.zero_()
            made.violation_ring = shared.violation_ring
            made.violation_write_index = shared.violation_write_index
            worlds[(group, stage)] = made
        for group in c.groups:
            tail = worlds[(group, TAIL)]
            worlds[(group, SWEEP)] = dataclasses.replace(
                tail,
                world=dataclasses.replace(tail.world, kernel_kind=int(TAGS[(group, SWEEP)])),
                slot_run_counter=torch.zeros_like(tail.slot_run_counter),
                kernel_run_counter=torch.zeros_like(tail.kernel_run_counter),
            )
        super().__init__(
            impl, device, worlds, pool=engine.pool, table=engine.req_to_token, lut=engine.lut
        )

    def peer_run(self, oracle: OracleRun) -> ImplRun:
        """The implementation side of the engine's prefill engine, from its reference side."""
        if self.peer is None:
            assert self.engine.peer is not None
            self.peer = ImplRun(self.impl, self.device, self.engine.peer, oracle.states)
            self.peer.host = self.host
        return self.peer


def run_step(
    impl: ImplRun, oracle: OracleRun, step: Forward | Sweep | Move, *, what: str, config: str
):
    """One step of a history on both sides, compared after every launch
    (:func:`conformance.driver.run_step`), on the prefill engine's sides for a step of a PD
    transfer's prefill engine; ``what`` names the step in failure messages."""
    __tracebackhide__ = True
    if getattr(step, "engine", "") == PREFILL_ENGINE:
        oracle = oracle.peer_run()
        impl = impl.peer_run(oracle)
        what = f"{what}, on the prefill engine"
    driver.run_step(impl, oracle, step, what=lambda launch: f"{what}, {launch}", config=config)


def missing(dues: list[Due], rows: np.ndarray, fault: Fault) -> list[str]:
    """The dues no row of ``rows`` meets, as lines."""
    out = []
    for due in dues:
        tagged = [r for r in rows if not due.tags or int(r[KIND]) in due.tags]
        if due.slot == -1:  # any slot of the fault's, any of the bits
            ok = any(int(r[SLOT]) in fault.slots and int(r[BITS]) & due.bits for r in tagged)
        elif due.any_of:
            ok = any(int(r[SLOT]) == due.slot and int(r[BITS]) & due.bits for r in tagged)
        elif due.exact:
            ok = any(int(r[SLOT]) == due.slot and int(r[BITS]) == due.bits for r in tagged)
        else:
            ok = any(
                int(r[SLOT]) == due.slot and int(r[BITS]) & due.bits == due.bits for r in tagged
            )
        if not ok:
            where = (
                " by " + " or ".join(reference.CanaryLaunchTag(t).name for t in sorted(due.tags))
                if due.tags
                else ""
            )
            out.append(
                f"no report at slot {due.slot} with bits {fail_bits_name(due.bits)}{where} "
                f"({fault.what})"
            )
    return out


def warm_up(engine: Engine, run, pad: int = 1, verify: bool = True) -> None:
    """A short history that leaves running requests (two sharing a cached prefix, in one
    batch), a cached prefix no request uses and freshly sampled tokens, with a target verify
    that rejects drafts on the way (without the EAGLE offset): every fault class has a
    place. Its first decode has ``pad`` padding rows amid its rows (0: none, as SGLang's
    batches outside a replayed graph); ``verify`` False: no target verify (a server without
    speculative decoding), and so no rejected draft."""
    c = engine.config

    def each(*makes) -> None:
        # one step made and run before the next is made: a failure names its own step
        for make in makes:
            step = make()
            if step is not None:
                run(step)

    for _ in range(3):
        engine.admit(c.context_len // 4 + 1, share=0)
    # a target verify (the target model's canary: no EAGLE offset) that rejects a draft
    each(
        lambda: engine.prefill(c.context_len),
        lambda: engine.decode(pad),
        lambda: engine.target_verify(3, 1) if verify else None,
    )
    engine.finish(0)  # its prefix is cached, and shared by the next two requests
    engine.admit(2, share=1)
    engine.admit(3, share=1)
    each(lambda: engine.prefill(c.context_len), lambda: engine.decode(0))
    engine.finish(0)  # its prefix is cached, and no request uses it


def inject_and_settle(
    engine: Engine,
    oracle: OracleRun,
    kind: str,
    pick: int,
    byte: int,
    run,
    flip=None,
    mode: str = DECODE,
    made: Fault | None = None,
    lead=None,
):
    """Make a fault of class ``kind`` (``flip(group, slot, byte)`` changes the
    implementation's KV too), run its own steps (a faulty move) and :data:`SETTLE` through
    ``run``, and judge the reports by what the class predicts
    (:mod:`engine_model.faults`): ``(fault, problems, first)`` with ``first`` the number of steps
    after the fault until the first report (None: none), or None when the engine has no place
    for the fault or too few free or evictable pages (or SWA slots) to settle. ``made``: a fault of the
    class already made in ``engine`` by other code (SGLang's own perturbation), judged the
    same way. ``lead(run)``: steps of the settle's own made before :data:`SETTLE` (a request
    finishing as a server with overlap scheduling orders it)."""
    room = 2 * len(engine.running) + 1  # pages the settle may take, free or evictable
    if not engine.free_rows or len(engine.free_pages) + engine.evictable_pages() < room:
        return None
    if engine.spare_swa_slots() < room * engine.config.page_size:
        return None
    since = oracle.index
    # a fault made by other code is stamped with the step it was made at, as faults.make does
    fault = (
        faults.make(engine, kind, pick, byte)
        if made is None
        else dataclasses.replace(made, made_at=engine.steps)
    )
    if fault is None:
        return None
    cls = faults.FAULTS[kind]
    steps = [0, None]

    def counted(step):
        run(step)
        steps[0] += 1
        if steps[1] is None and oracle.index != since:
            steps[1] = steps[0]

    for step in fault.steps:  # the fault's own steps (a faulty move of KV) come first
        run(step)
    due = cls.due(engine, fault, oracle.buffers())
    if fault.flip is not None:
        oracle.flip(*fault.flip)
        if flip is not None:
            flip(*fault.flip)
    if lead is not None:
        lead(counted)
    settle(engine, counted, mode, pick)
    peer = "" if oracle.peer is None else oracle.peer.silence_problem()
    if peer:
        return fault, [f"the prefill engine, which no fault touches, reported: {peer}"], steps[1]
    later = None if due is None else cls.due_after_settle(engine, fault)
    if due is None or later is None:
        return fault, [], steps[1]  # nothing promised
    dues, silent = due
    problems = missing(swept_dues(engine, dues + later), oracle.rows(since), fault)
    if silent and oracle.index != since:
        problems.append(
            f"{oracle.index - since} reports, none due: mode {engine.config.mode} cannot see "
            f"{fault.what}"
        )
    return fault, problems, steps[1]


def swept_dues(engine: Engine, dues: list[Due]) -> list[Due]:
    """The dues an engine's canary can meet: all of them, but where it sweeps no cache
    (``EngineConfig.cache_swept``: the draft model's, in the per-forward leg) a due that a
    sweep may meet (its launch tags include a ``SWEEP`` one) is not promised."""
    if engine.config.cache_swept:
        return dues
    sweeps = {int(TAGS[group, SWEEP]) for group in GROUPS}
    return [due for due in dues if not set(due.tags) & sweeps]


def _graph_step(engine: Engine, pick: int, verify: bool) -> Forward | None:
    """A settle's step replaying a CUDA graph, two padding rows at its tail: a target verify
    (``verify``) where one runs, else a decode."""
    made = engine.target_verify(3, pick, 2, graph=True) if verify else None
    return made or engine.decode(2, graph=True)


def settle(engine: Engine, run, mode: str = DECODE, pick: int = 0) -> None:
    """Run :data:`SETTLE` through ``run(step)``, its decodes in ``mode`` (:data:`SETTLE_MODES`;
    an engine with the EAGLE offset, the draft model's canary, decodes plainly where the mode
    is ``TARGET_VERIFY``, which only the target model runs; :data:`DRAFT_SETTLE_MODES`, for
    such an engine: its multi-step draft then a decode, or its draft extend;
    :data:`MANAGER_SETTLE_MODES`, the per-forward leg's: a target verify replaying a graph, or a
    decode replaying one where no target verify runs; the draft model's multi-step draft decode
    replaying its graph, then a decode; its draft extend replaying its graph)."""
    c = engine.config
    step = settle_step(mode)
    verify = step.mode == TARGET_VERIFY
    if step.graph and step.draft:  # the draft decode graph runner's, two padding rows a step
        decode = lambda: [*engine.draft_decode(2, 2, graph=True), engine.decode(0)]  # noqa: E731
    elif step.graph and step.mode == DRAFT_EXTEND_V2:  # the draft extend runner's, likewise
        decode = lambda: engine.draft_extend(3, 2, graph=True) or engine.decode(0)  # noqa: E731
    elif step.graph:
        decode = lambda: _graph_step(engine, pick, verify)  # noqa: E731
    elif step.draft:  # the draft model's own forwards (the EAGLE offset; not drawn by the suite)
        decode = lambda: [*engine.draft_decode(2), engine.decode(0)]  # noqa: E731
    else:
        decode = {
            DECODE: lambda: engine.decode(0),
            MIXED: lambda: engine.mixed(1),
            TARGET_VERIFY: lambda: engine.target_verify(3, pick) or engine.decode(0),
            DRAFT_EXTEND_V2: lambda: engine.draft_extend(2) or engine.decode(0),
        }[step.mode]
    for name in SETTLE:
        if name == "admit":
            engine.admit(c.page_size + c.offset, share=0)
            continue
        step = {"prefill": lambda: engine.prefill(1), "decode": decode, "sweep": engine.sweep}[
            name
        ]()
        for one in step if isinstance(step, list) else [step]:
            if one is not None:
                run(one)
