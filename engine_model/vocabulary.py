"""The engine model's words, each spelled once: every other module derives its lists from here.

As ``array_api_tests.dtype_helpers`` holds every dtype name once, this module holds the names a
history's steps are counted and judged by, so that a new forward mode, step label or settle
mode is one edit here:

- a **forward mode** (:data:`FORWARD_MODES`): SGLang's ``ForwardMode``, how a forward fills the
  plan's inputs (:attr:`engine_model.steps.Forward.mode`);
- a **buffer group** (:data:`GROUPS`): SGLang's ``PoolKind``, the canary buffers a forward
  launches on;
- a **launch stage** (:data:`LAUNCH_STAGES`): ``HEAD`` and ``TAIL`` around a forward and the
  prefix cache's ``SWEEP``; with a group and a K or V half it makes a **launch tag**
  (:func:`launch_tag`, SGLang's ``CanaryLaunchTag``);
- a **step label** (:class:`StepLabel`): a forward mode as a run counts it, with how the
  forward ran (replaying a CUDA graph, in the draft model, on a PD prefill engine), or a step
  that is no forward (:data:`SWEEP_STEP`, :data:`MOVE_STEP`);
- a **settle mode** (:data:`SETTLE_MODES`, :data:`DRAFT_SETTLE_MODES`, and the SGLang
  per-forward leg's own :data:`MANAGER_SETTLE_MODES`): the step label of the decodes that follow
  a fault, by its short name (``DECODE_GRAPH``).

A **hash mode** is the canary's ``real_kv_hash_mode`` (:class:`reference.RealKvHashMode`), a
word of the contract, not of this module.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DECODE",
    "DRAFT_DECODE",
    "DRAFT_EXTEND_V2",
    "DRAFT_SETTLE_MODES",
    "EXTEND",
    "FORWARD_MODES",
    "FULL",
    "GROUPS",
    "HEAD",
    "IDLE",
    "LAUNCH_STAGES",
    "MANAGER_SETTLE_MODES",
    "MANAGER_SETTLE_STEPS",
    "MIXED",
    "MOVE_STEP",
    "ORACLE_MODES",
    "PREFILL_ENGINE",
    "REQUIRED_FORWARDS",
    "SETTLE_MODES",
    "SETTLE_STEPS",
    "STAGES",
    "SWA",
    "SWEEP",
    "SWEEP_STEP",
    "TAIL",
    "TARGET_VERIFY",
    "StepLabel",
    "launch_tag",
    "of_the_draft_model",
    "settle_step",
    "situation",
]

# -- forward modes: SGLang's ``ForwardMode`` names ----------------------------------------------

EXTEND = "EXTEND"
DECODE = "DECODE"
MIXED = "MIXED"
IDLE = "IDLE"
TARGET_VERIFY = "TARGET_VERIFY"
DRAFT_EXTEND_V2 = "DRAFT_EXTEND_V2"
#: Every forward mode the engine model makes, in the order a run lists them.
FORWARD_MODES = (EXTEND, DECODE, MIXED, IDLE, TARGET_VERIFY, DRAFT_EXTEND_V2)
#: The forward modes whose write takes its expected inputs from the token oracle (the others,
#: every extend mode, take the input ids themselves), as SGLang's
#: ``token_oracle/oracle_manager.py`` fills them: ``ForwardMode.is_extend()`` leaves
#: ``DRAFT_EXTEND_V2`` out.
ORACLE_MODES = (DECODE, IDLE, DRAFT_EXTEND_V2)

# -- buffer groups and launch stages ------------------------------------------------------------

#: The buffer groups: ``FULL`` (window 0, the full pool's slots) and ``SWA`` (the window, the
#: SWA pool's slots through the full-to-SWA table), SGLang's ``PoolKind``.
FULL, SWA = "FULL", "SWA"
GROUPS = (FULL, SWA)
#: The launches of a forward on each group's buffers, in order: ``HEAD`` (before the forward,
#: no real-KV sources) and ``TAIL`` (after it, the group's KV pool as source); ``SWEEP``, the
#: prefix cache's verify of the tail buffer under a tag of its own.
HEAD, TAIL, SWEEP = "HEAD", "TAIL", "SWEEP"
STAGES = (HEAD, TAIL)
LAUNCH_STAGES = (HEAD, TAIL, SWEEP)


def launch_tag(stage: str, group: str, half: str = "K") -> str:
    """The name of the launch tag of ``stage`` on ``group``'s ``half`` (``K`` or ``V``) buffers,
    as SGLang's ``CanaryLaunchTag`` spells it: ``launch_tag(TAIL, SWA) == "TAIL_K_SWA"``."""
    if stage not in LAUNCH_STAGES or group not in GROUPS or half not in ("K", "V"):
        raise ValueError(f"no launch tag for stage={stage!r}, group={group!r}, half={half!r}")
    return f"{stage}_{half}_{group}"


#: The engine a step of a PD transfer runs on when it is not the engine that made it: its
#: prefill engine (:attr:`engine_model.engine.Engine.peer`), which has buffers of its own.
PREFILL_ENGINE = "prefill"

# -- step labels --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepLabel:
    """A forward mode as a run counts it, with how the forward ran: ``graph``, replaying a CUDA
    graph; ``draft``, in the draft model (its multi-step decode; with ``graph``, the draft
    decode graph runner's replay of it); ``prefill_engine``, on a PD prefill engine. Its text (``str``) is what tables print, :attr:`short` what a table header
    of the README says, :attr:`name` the settle mode's spelling::

        str(StepLabel(DECODE, graph=True)) == "DECODE replaying a graph"
        StepLabel(DECODE, graph=True).short == "graph DECODE"
        StepLabel(DECODE, graph=True).name == "DECODE_GRAPH"
    """

    mode: str
    graph: bool = False
    draft: bool = False
    prefill_engine: bool = False

    def __post_init__(self) -> None:
        if self.mode not in (*FORWARD_MODES, SWEEP, _MOVE) or (
            self.prefill_engine and (self.graph or self.draft)
        ):
            raise ValueError(f"no such step: {self!r}")

    def _spelled(self, way: int) -> str:
        """The label in one of its three spellings (0: text, 1: short, 2: name), from the one
        table of how each way of running a forward is written."""
        ran: tuple[str, str | None, str]
        if self.prefill_engine:
            ran = ("{} on the prefill engine", None, "{}")
        elif self.draft and self.graph:
            ran = ("{} of the draft model replaying a graph", "graph draft {}", "DRAFT_{}_GRAPH")
        elif self.draft:
            ran = ("{} of the draft model", "draft {}", "DRAFT_{}")
        elif self.graph:
            ran = ("{} replaying a graph", "graph {}", "{}_GRAPH")
        else:
            ran = ("{}", None, "{}")
        return (ran[way] or ran[0]).format(self.mode)

    def __str__(self) -> str:
        return self._spelled(0)

    @property
    def short(self) -> str:
        """The label in a table header: ``graph DECODE``, ``draft DECODE``."""
        return self._spelled(1)

    @property
    def name(self) -> str:
        """The label as a settle mode names it: ``DECODE_GRAPH``, ``DRAFT_DECODE``."""
        return self._spelled(2)


_MOVE = "KV moved without a forward"
#: A sweep of the prefix cache, and KV moved without a forward: steps that are no forward.
SWEEP_STEP = StepLabel(SWEEP)
MOVE_STEP = StepLabel(_MOVE)
#: A decode of the draft model (its multi-step draft, or any decode of a canary with the EAGLE
#: offset), whose write has its input assert off: what
#: :attr:`engine_model.engine.Engine.written_by` records, by :attr:`StepLabel.name`, for the
#: positions such a decode writes.
DRAFT_DECODE = StepLabel(DECODE, draft=True)


def situation(step: StepLabel) -> str:
    """The situation an engine counts for a forward run as ``step`` (its ``events`` key):
    ``situation(StepLabel(DECODE, graph=True)) == "forward DECODE replaying a graph"``."""
    return f"forward {step}"


#: The forwards every engine history of the suite must reach, as their situations count them.
REQUIRED_FORWARDS = (
    StepLabel(EXTEND),
    StepLabel(DECODE),
    StepLabel(DECODE, graph=True),
    StepLabel(MIXED),
    StepLabel(IDLE, graph=True),
    StepLabel(TARGET_VERIFY),
    StepLabel(DRAFT_EXTEND_V2),
)

# -- settle modes -------------------------------------------------------------------------------

#: The steps a settle's decodes can take after a fault: a plain decode, a decode replaying a
#: CUDA graph (two padding rows at its tail), a mixed batch, and EAGLE's target verify (three
#: tokens a row: the sampled one and two drafts); then the draft model's own (an engine with
#: the EAGLE offset): its multi-step draft decode, and its ``DRAFT_EXTEND_V2``.
SETTLE_STEPS = (
    StepLabel(DECODE),
    StepLabel(DECODE, graph=True),
    StepLabel(MIXED),
    StepLabel(TARGET_VERIFY),
    DRAFT_DECODE,
    StepLabel(DRAFT_EXTEND_V2),
)
#: The target model's settle modes, by name.
SETTLE_MODES = tuple(step.name for step in SETTLE_STEPS[:4])
#: The draft model's settle modes, by name.
DRAFT_SETTLE_MODES = tuple(step.name for step in SETTLE_STEPS[4:])
#: The steps only the SGLang per-forward leg settles with (``conformance/sglang_manager.py``):
#: EAGLE's target verify replaying a CUDA graph (two padding rows at its tail, three tokens a
#: row), and the draft model's draft decode and draft extend replaying theirs (two padding rows
#: each), where SGLang's replay runs only what its capture recorded. To the reference each is a
#: forward with a graph's padding and capacity, so the suite's engine tests and the detection
#: table leave them out.
MANAGER_SETTLE_STEPS = (
    StepLabel(TARGET_VERIFY, graph=True),
    StepLabel(DECODE, draft=True, graph=True),
    StepLabel(DRAFT_EXTEND_V2, graph=True),
)
#: The per-forward leg's own settle modes, by name.
MANAGER_SETTLE_MODES = tuple(step.name for step in MANAGER_SETTLE_STEPS)


def of_the_draft_model(step: StepLabel) -> bool:
    """Whether only the draft model's canary (the EAGLE offset) runs ``step``: its multi-step
    draft decode and its draft extend, eagerly or replaying a graph."""
    return step.draft or step.mode == DRAFT_EXTEND_V2


def settle_step(name: str) -> StepLabel:
    """The step label of the settle mode ``name`` (``"DECODE_GRAPH"``)."""
    for step in (*SETTLE_STEPS, *MANAGER_SETTLE_STEPS):
        if step.name == name:
            return step
    raise ValueError(
        f"no settle mode {name!r}: one of {SETTLE_MODES + DRAFT_SETTLE_MODES + MANAGER_SETTLE_MODES}"
    )
