"""The engine histories the SGLang legs run, their engines, their seeds, and how a run counts
their steps.

Every seed of the legs (and of the detection table, ``tools/detection_table.py``) is named in
:data:`SEEDS`: the engine of history or trial ``i`` takes the seed its kind starts at plus
``i``. :func:`engine_config` is the one place an engine of the legs is configured: the options
cycle over the index (pages of 1, 2 and 4 slots, then without and with a window, then without
and with the EAGLE offset), the sizes are :data:`POOL_SLOTS` and :data:`SWA_SLOTS`.
:func:`history` is a history of random scheduler events in every forward mode;
:func:`step_label` is how a run counts a step (a :class:`engine_model.vocabulary.StepLabel`),
and :data:`REQUIRED_STEPS` the labels every run of the runtime leg must reach.

Torch-free: the detection table reads its seeds from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from conformance.sglang import memory, overlap, tree
from engine_model import Engine, EngineConfig, Forward, Move, Sweep
from engine_model.vocabulary import (
    DECODE,
    DRAFT_DECODE,
    DRAFT_EXTEND_V2,
    EXTEND,
    FORWARD_MODES,
    IDLE,
    MIXED,
    MOVE_STEP,
    ORACLE_MODES,
    SWEEP_STEP,
    TARGET_VERIFY,
    StepLabel,
)
from reference import RealKvHashMode

__all__ = [
    "DRAFT_OPS",
    "EVERY_EVENT",
    "MOVE_OPS",
    "PLAIN_OPS",
    "EXPECTED_INPUTS_REQUIRED",
    "GRAPH_DRAFT_DECODE_STEP",
    "GRAPH_DRAFT_EXTEND_STEP",
    "REQUIRED",
    "REQUIRED_STEPS",
    "SEEDS",
    "Seed",
    "Scheduling",
    "TARGET_OPS",
    "Seeds",
    "engine_config",
    "hash_mode",
    "history",
    "served_scheduling",
    "speculative",
    "step_label",
]


@dataclass(frozen=True)
class Seed:
    """Where the seeds of one kind start, and ``what`` they seed: the one of history or trial
    ``index`` is ``first + index`` (``seed(index)``)."""

    first: int
    what: str

    def __call__(self, index: int) -> int:
        return self.first + index


@dataclass(frozen=True)
class Seeds:
    """Every seed of the SGLang legs and of the detection table, by what it is for: an engine's
    (its ``EngineConfig.seed``: every token, KV byte and stale value) or a generator's draws."""

    history: Seed = Seed(7000, "the engines of the correct histories both legs run")
    scheduler: Seed = Seed(0, "the scheduler's draws of a history (numpy's default_rng)")
    req_to_token_trial: Seed = Seed(9100, "the runtime leg's req_to_token perturbation trials")
    kv_perturbation_trial: Seed = Seed(9300, "the runtime leg's KV perturbation trials")
    fault_trial: Seed = Seed(9500, "the manager leg's trials of a fault of every class")
    next_token_swap_trial: Seed = Seed(9700, "the runtime leg's next_token_swap trials")
    shared_prefix_trial: Seed = Seed(9900, "the manager leg's shared-prefix trials")
    sglang_picks: Seed = Seed(0, "SGLang's own random picks in a perturbation trial")
    detection_class: Seed = Seed(
        1000, "the detection table's engines: trial t of the k-th fault class takes 1000 k + t"
    )
    detection_trial: Seed = Seed(0, "the detection table's draws of a fault's place and byte")
    detection_serving: Seed = Seed(10_000, "the detection table's draws after a fault")

    def detection_engine(self, class_index: int, trial: int) -> int:
        """The seed of the detection table's engine of ``trial`` of the ``class_index``-th
        fault class."""
        return self.detection_class.first * class_index + trial


#: Every seed of the SGLang legs and of the detection table.
SEEDS = Seeds()

#: The options that cycle over a history's index: pages of 1, 2 and 4 slots, then no window or
#: a window of 5 positions, then without and with the EAGLE offset.
PAGE_SIZES = (1, 2, 4)
WINDOWS = (0, 5)
EAGLE_OFFSETS = (0, 1)
#: The sizes of the legs' engines: slots of the full pool, of the SWA pool under a window, rows
#: of the page table and positions of a row.
POOL_SLOTS = 96
SWA_SLOTS = 60
POOL_ROWS = 6
CONTEXT_LEN = 16
#: The hash modes a trial's index cycles over.
HASH_MODES = tuple(RealKvHashMode)


def hash_mode(index: int) -> int:
    """The hash mode of trial ``index``: NONE, PARTIAL and ALL in turn."""
    return int(HASH_MODES[index % len(HASH_MODES)])


#: The fewest pages of an engine's pool: with larger pages than :data:`PAGE_SIZES`, pages enough
#: for a warm-up and a fault's settle (:func:`conformance.engine_support.inject_and_settle`).
MIN_PAGES = 16


def engine_config(
    index: int,
    *,
    seed: Seed = SEEDS.history,
    real_kv_hash_mode: int = int(RealKvHashMode.ALL),
    eagle_offset: int | None = None,
    page_size: int | None = None,
    window: int | None = None,
) -> EngineConfig:
    """The engine of history or trial ``index``, its seed ``seed(index)``: the options of
    :data:`PAGE_SIZES`, :data:`WINDOWS` and :data:`EAGLE_OFFSETS` in turn (``eagle_offset``,
    ``page_size``, ``window``: that option instead; a pool of :data:`POOL_SLOTS` slots, or of
    :data:`MIN_PAGES` pages where those are fewer), its pages and pool rows chosen by SGLang's
    own allocators where the installed release has them (:func:`memory.allocators`)."""
    page = PAGE_SIZES[index % len(PAGE_SIZES)] if page_size is None else page_size
    if window is None:
        window = WINDOWS[index // len(PAGE_SIZES) % len(WINDOWS)]
    if eagle_offset is None:
        eagle_offset = EAGLE_OFFSETS[index // (len(PAGE_SIZES) * len(WINDOWS)) % 2]
    return EngineConfig(
        page_size=page, num_pages=max(POOL_SLOTS // page, MIN_PAGES), pool_rows=POOL_ROWS,
        context_len=CONTEXT_LEN, swa_window=window, offset=eagle_offset,
        mode=real_kv_hash_mode, seed=seed(index), swa_slots=SWA_SLOTS if window else 0,
        allocators=memory.allocators()[0],
    )  # fmt: skip


#: The steps a history has by default (:attr:`Scheduling.first_requests` admitted before them).
STEPS = 40
#: The prefill chunk of a step that prefills or decodes, and the draft model's draft steps.
PREFILL_CHUNK = 6
DRAFT_STEPS = 3
#: A decode replaying a CUDA graph, and the op that makes it (the step's settle-mode name).
GRAPH_DECODE_STEP = StepLabel(DECODE, graph=True)
GRAPH_DECODE = GRAPH_DECODE_STEP.name
#: A target verify replaying a CUDA graph (the ``verify`` op makes one for half its picks), and
#: the draft count every such graph is captured with (a server's ``speculative_num_draft_tokens``).
GRAPH_VERIFY_STEP = StepLabel(TARGET_VERIFY, graph=True)
GRAPH_DRAFT_TOKENS = 3
#: The draft model's multi-step draft decode and its draft extend replaying their graphs (the
#: ``draft`` and ``draftext`` ops make one for half their picks; a draft extend graph's rows
#: each write :data:`GRAPH_DRAFT_TOKENS`, the runner's captured width).
GRAPH_DRAFT_DECODE_STEP = StepLabel(DECODE, draft=True, graph=True)
GRAPH_DRAFT_EXTEND_STEP = StepLabel(DRAFT_EXTEND_V2, graph=True)
#: A history's scheduler events, drawn uniformly: their order and number decide the draws.
OPS = ("admit", "prefill", "decode", GRAPH_DECODE, "mixed", "idle", "verify", "draft",
       "draftext", "finish", "retract", "readmit", "receive", "relocate", "twin", "sweep")  # fmt: skip


#: Events no history of the legs draws, a scheduling may: a running request retracted with its
#: KV backed up to the host (a PD decode server's retraction), and one restored from its backup.
MOVE_OPS = ("backup", "restore")
#: The forward a step without another makes: a decode, EAGLE's target verify or its draft
#: model's multi-step draft decode, or (a PD prefill engine) a prefill alone.
FALLBACKS = ("decode", "verify", "draft", "prefill")


@dataclass(frozen=True)
class Scheduling:
    """How a server schedules a history: the events it draws (``ops``, some of :data:`OPS`),
    whether its decodes and target verifies that the ops would replay as graphs do
    (``graphs``; False: eagerly, without padding rows), the forward a step without another
    makes (``fallback``: ``decode``, ``verify`` for EAGLE's target model, ``draft`` for its
    draft model), padding rows at least ``min_pad`` in every replayed graph, and the prefill
    chunk of a ``prefill`` (None: drawn; a whole request's otherwise). The default is every
    event, as the legs' histories draw them."""

    ops: tuple[str, ...] = OPS
    graphs: bool = True
    fallback: str = "decode"
    min_pad: int = 0
    chunk: int | None = None
    first_requests: int = 3  # admitted before the first step (none on a PD decode engine)
    #: whether a HiCache reload and a retraction's restore carry the canary's records with the
    #: KV (as the legs' engines move them; SGLang's paths: :mod:`conformance.sglang.kv_paths`)
    reload_records: bool = True
    restore_records: bool = True
    #: whether the server overlaps scheduling with the forward: each finish makes its
    #: overshoot decode, and the next batch's page-table writes may land before that decode's
    #: canary reads them (:mod:`conformance.sglang.overlap`)
    overlap: bool = False
    #: whether EAGLE drafts a tree (``topk`` 2): each target verify as SGLang's tree verify
    #: launches it, then its accepted path's KV moved without the records
    #: (:mod:`conformance.sglang.tree`)
    tree: bool = False
    #: whether the move of a tree's accepted path carries the canary's records with the KV
    tree_records: bool = True

    def __post_init__(self) -> None:
        if not self.ops or set(self.ops) - set(OPS + MOVE_OPS):
            raise ValueError(f"ops must be some of {OPS + MOVE_OPS}: {self.ops}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}: {self.fallback!r}")


#: The legs' histories: every event.
EVERY_EVENT = Scheduling()

#: The events of a server without speculative decoding, hierarchical cache or PD: every event
#: of the legs' histories but target verifies, the draft model's, relocations (HiCache) and
#: receptions (PD).
PLAIN_OPS = tuple(o for o in OPS if o not in ("verify", "draft", "draftext", "relocate", "receive"))
#: EAGLE's target model: its verifies decode. Its draft model: its multi-step draft decode and
#: its draft extend; no sweep (SGLang attaches its radix cache to the target's canary alone).
TARGET_OPS = tuple(o for o in PLAIN_OPS if o not in ("decode", GRAPH_DECODE, "mixed")) + ("verify",)
DRAFT_OPS = tuple(o for o in TARGET_OPS if o not in ("verify", "sweep")) + ("draft", "draftext")


def speculative(index: int) -> bool:
    """Whether history ``index`` is of a server with EAGLE: the draft model's (the offset), and
    every other one of the target model's."""
    return engine_config(index).offset == 1 or index % 2 == 1


def served_scheduling(index: int) -> Scheduling:
    """The events a server makes in history ``index`` (the per-forward leg's, whose histories
    are each of one configuration SGLang serves): the draft model's forwards under EAGLE, the
    target model's verifies under EAGLE, or plain decodes, mixed batches and PD receptions
    without it; no HiCache relocation (SGLang's leaves the records behind, [23]: the support
    matrix's row shows it)."""
    if engine_config(index).offset == 1:
        return Scheduling(DRAFT_OPS, fallback="draft")
    if speculative(index):
        return Scheduling(TARGET_OPS + ("receive",), fallback="verify")
    return Scheduling(PLAIN_OPS + ("receive",))


def history(
    index: int,
    steps: int = STEPS,
    on_sweep=None,
    run=None,
    engine: Engine | None = None,
    scheduling: Scheduling = EVERY_EVENT,
) -> list[Forward]:
    """The forwards of one engine history: random scheduler events and every forward mode
    (``scheduling``: the events and forwards a server configuration makes);
    ``on_sweep(engine, sweep)`` is called at each cache sweep, with the engine as it is then;
    ``run(step)``, if given, at each step as it is made (forwards, sweeps and moves of KV
    without a forward, in order); ``engine``: the engine to run it on (default: a new one of
    :func:`engine_config`)."""
    engine = Engine(engine_config(index)) if engine is None else engine
    rng = np.random.default_rng(SEEDS.scheduler(index))
    out: list[Forward] = []

    def keep(*made) -> None:
        for one in made:
            items = one if isinstance(one, list) else [one]
            out.extend(f for f in items if isinstance(f, Forward))
            if run is not None:
                for step in items:
                    if isinstance(step, (Forward, Sweep, Move)):
                        run(step)

    for _ in range(scheduling.first_requests):
        engine.admit(int(rng.integers(2, 7)), 0)
    for _ in range(steps):
        op = rng.choice(scheduling.ops)
        pick = int(rng.integers(0, 8))
        _event(engine, rng, op, pick, keep, scheduling)
        chunk = int(rng.integers(1, 7))
        _forward(engine, op, pick, chunk if scheduling.chunk is None else scheduling.chunk, keep,
                 on_sweep, scheduling)  # fmt: skip
    return out


def _event(engine: Engine, rng, op: str, pick: int, keep, scheduling: Scheduling) -> None:
    """The scheduler event of ``op`` that comes before a step's forward, if any."""
    if op == "admit":
        engine.admit(int(rng.integers(1, 8)), pick % 3)
    elif op == "finish" and scheduling.overlap:
        pad = max(pick % 3, scheduling.min_pad)
        overlap.finish(engine, pick, scheduling.graphs, pad, int(rng.integers(2, 7)),
                       scheduling.chunk or PREFILL_CHUNK, keep)  # fmt: skip
    elif op in ("finish", "retract", "readmit", "backup"):
        keep(getattr(engine, op)(pick))
    elif op == "relocate":
        keep(engine.relocate(pick, records=scheduling.reload_records))
    elif op == "restore":
        keep(engine.restore(pick, records=scheduling.restore_records))
    elif op == "receive":
        keep(engine.receive(int(rng.integers(2, 8))))
    elif op == "twin":  # computed again, then inserted: its row rebound to the cache's pages
        rid = engine.admit_twin(pick, int(rng.integers(1, 4)))
        keep(engine.prefill(scheduling.chunk or PREFILL_CHUNK))
        if rid is not None:
            engine.insert(0, rid=rid)


def _forward(
    engine: Engine, op: str, pick: int, chunk: int, keep, on_sweep, scheduling: Scheduling
) -> None:
    """The step of ``op`` (a prefill, or else the scheduling's fallback, after a scheduler
    event); a tree server's target verifies as :func:`conformance.sglang.tree.verify` makes
    them."""
    if scheduling.tree:
        plain = keep

        def keep(*made) -> None:
            for one in made:
                for step in one if isinstance(one, list) else [one]:
                    plain(tree.verify(engine, step, records=scheduling.tree_records))

    graphs, pad = scheduling.graphs, max(pick % 3, scheduling.min_pad)
    whole = scheduling.chunk or PREFILL_CHUNK  # a step's prefill before its fallback
    if op == "prefill":
        keep(engine.prefill(chunk))
    elif op == GRAPH_DECODE:
        keep(engine.decode(pad, graph=True) if graphs else engine.decode(0))
    elif op == "mixed":
        keep(engine.mixed(chunk))
    elif op == "idle" and scheduling.fallback == "draft":  # the draft model's two runners
        keep(engine.draft_idle(1 + pick % 2, DRAFT_STEPS, GRAPH_DRAFT_TOKENS))
    elif op == "idle":  # EAGLE's target model replays its TARGET_VERIFY graph
        keep(
            engine.idle(1 + pick % 2, GRAPH_DRAFT_TOKENS if scheduling.fallback == "verify" else 1)
        )
    elif op == "verify" and pick >= 4 and graphs:  # replaying a graph, padding rows at its tail
        keep(engine.target_verify(GRAPH_DRAFT_TOKENS, pick, pad, graph=True))
    elif op == "verify":
        keep(engine.target_verify(2 + pick % 3, pick))
    elif op == "draft" and pick >= 4 and graphs:  # the draft decode graph runner's replay
        keep(engine.draft_decode(DRAFT_STEPS, pad, graph=True))
    elif op == "draft":
        keep(engine.draft_decode(DRAFT_STEPS))
    elif op == "sweep":
        sweep = engine.sweep()
        if sweep is not None and on_sweep is not None:
            on_sweep(engine, sweep)
        keep(sweep)
    elif op == "draftext" and pick >= 4 and graphs:  # the draft extend graph runner's replay
        keep(engine.draft_extend(GRAPH_DRAFT_TOKENS, pad, graph=True, accept=pick))
    elif op == "draftext":
        keep(engine.draft_extend(1 + pick % 3, accept=pick))
    elif scheduling.fallback == "verify":  # EAGLE's target model decodes by its verifies
        keep(engine.prefill(whole) or engine.target_verify(2 + pick % 3, pick))
    elif scheduling.fallback == "prefill":  # a PD prefill engine decodes nothing
        keep(engine.prefill(whole))
    elif scheduling.fallback == "draft":  # EAGLE's draft model: its multi-step draft decode
        keep(engine.prefill(whole) or engine.draft_decode(DRAFT_STEPS))
    else:
        keep(engine.prefill(whole) or engine.decode(0))


def step_label(step) -> StepLabel:
    """How a run counts ``step``: a forward by its mode and how it ran (on the prefill engine,
    in the draft model, replaying a graph: an idle step replays nothing), or a sweep, or KV
    moved without a forward."""
    if isinstance(step, Sweep):
        return SWEEP_STEP
    if isinstance(step, Move):
        return MOVE_STEP
    if step.engine:
        return StepLabel(step.mode, prefill_engine=True)
    if step.kind == "draft_decode" and step.mode != IDLE:
        return GRAPH_DRAFT_DECODE_STEP if step.graph else DRAFT_DECODE
    return StepLabel(step.mode, graph=step.graph and step.mode != IDLE)


#: The step labels every run of the runtime leg must compare at least once: every forward
#: mode, a decode and a target verify replaying a graph, the draft model's decode and its draft
#: extend each eagerly and replaying a graph, and a prefill engine's extend.
REQUIRED_STEPS = (
    StepLabel(EXTEND),
    StepLabel(DECODE),
    GRAPH_DECODE_STEP,
    StepLabel(MIXED),
    StepLabel(IDLE),
    StepLabel(TARGET_VERIFY),
    GRAPH_VERIFY_STEP,
    DRAFT_DECODE,
    GRAPH_DRAFT_DECODE_STEP,
    StepLabel(DRAFT_EXTEND_V2),
    GRAPH_DRAFT_EXTEND_STEP,
    StepLabel(EXTEND, prefill_engine=True),
)
#: Their text, as the leg prints them.
REQUIRED = tuple(str(label) for label in REQUIRED_STEPS)
#: The forward modes whose expected inputs every run must compare at least once: those of the
#: token oracle, then the others.
EXPECTED_INPUTS_REQUIRED = (*ORACLE_MODES, *(m for m in FORWARD_MODES if m not in ORACLE_MODES))
