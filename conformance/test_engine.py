"""The canary as an engine runs it: long histories of an engine model, step by step, in every
forward mode the model has (extend, decode, mixed, idle, target verify, graph replay), with
SGLang's own fault classes (CONTRACT §6, §7, §12, §13, §15; ``engine_model.engine``,
``engine_model.faults``).

Every step runs the plan, verify and write (and the scatter, or the cache sweep) on the
implementation and on the reference, and their states must agree after every launch. With no
fault the ring stays empty over the whole history: the canary never cries wolf. One fault may be
made at any step; the steps of ``SETTLE`` follow it, and by their end the report it must cause
is stored: at the slot and with the reason its class predicts, in the hash modes that can see
it, and nothing at all where the mode cannot.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import hypothesis
import hypothesis.strategies as st
import pytest
from hypothesis import stateful
from hypothesis.stateful import initialize, invariant, precondition, rule

from conformance import profiles
from conformance.assertions import fail
from conformance.engine_support import (
    SETTLE_MODES,
    ImplRun,
    OracleRun,
    inject_and_settle,
    run_step,
    warm_up,
)
from conformance.profiles import engine_sizes, engine_step_sizes, examples
from conformance.sglang import memory, radix_tree
from engine_model import KV_BYTES, Engine
from engine_model.faults import FAULT_KINDS, FAULTS
from engine_model.vocabulary import (
    DRAFT_EXTEND_V2,
    REQUIRED_FORWARDS,
    TARGET_VERIFY,
    StepLabel,
    situation,
)
from strategies.engines import engine_configs

pytestmark = pytest.mark.plan

#: The free lists that choose the engines' pages and pool rows, and why: SGLang's own
#: allocators and request pool (and its radix cache's eviction walk), run from the installed
#: release's source where it has them in the shape the suite runs (from 0.5.20), else the engine
#: model's lists and walk, held to SGLang's by self-tests (``conformance/sglang/memory.py``).
ALLOCATORS = memory.allocators()
#: The engines' sizes on this run's device, on those free lists.
ENGINES = dict(engine_sizes(), allocators=ALLOCATORS[0])


#: A new request's fresh prompt tokens: half of them the one length of a fixed-length
#: workload, as a benchmark sends (so a recycled row's new owner often reaches its old
#: owner's length), the rest any length.
PROMPT_TOKENS = st.one_of(
    st.just(engine_step_sizes()["new_tokens"] // 2),
    st.integers(1, engine_step_sizes()["new_tokens"]),
)


def _decoding(machine) -> bool:
    """Whether a request of the machine's engine decodes (a decode batch has a row)."""
    return bool(machine.engine.decode_rows())


def _prompting(machine) -> bool:
    """Whether a request of the machine's engine has prompt tokens left to prefill."""
    engine = machine.engine
    return any(not r.decoding and engine.pending(r) > 0 for r in engine.running.values())


class EngineMachine(stateful.RuleBasedStateMachine):
    """An engine's history: admissions, prefills, decodes, finishes, retractions, evictions and
    sweeps in any order, at most one fault, the reference as the model."""

    def __init__(self, impl, device):
        super().__init__()
        self.impl, self.device = impl, device
        self.fault = None

    # no prologue: every situation the histories count (REQUIRED_SITUATIONS) comes from the
    # rules' own draws, and the CPU's fixed draws must reach each SITUATION_FLOOR times
    @initialize(config=engine_configs(**ENGINES, min_slots=32, min_rows=4))
    def start(self, config):
        self.engine = Engine(config)
        self.oracle = OracleRun(self.engine)
        self.run_impl = ImplRun(self.impl, self.device, self.engine, self.oracle.states)

    def _run(self, step) -> None:
        if step is None:
            return
        run_step(
            self.run_impl, self.oracle, step,
            what=f"step {self.engine.steps} ({self.engine.log[-1]})", config=self.engine.describe(),
        )  # fmt: skip

    def _tick(self) -> None:
        """The scheduler's next forward after an event: an extend batch if a prompt is pending,
        else a decode batch. A retracted request waiting without a backup is readmitted first
        where a row is free, as the scheduler's default first-come-first-served policy takes its
        waiting queue before new requests."""
        first = next((r for r in self.engine.waiting if r.rid not in self.engine.backups), None)
        if first is not None:
            self.engine.readmit(self.engine.waiting.index(first))
        self._run(self.engine.prefill(engine_step_sizes()["chunk"]) or self.engine.decode(0))

    @precondition(lambda self: self.engine.free_rows)
    @rule(new_tokens=PROMPT_TOKENS, share=st.integers(0, 3))
    def admit(self, new_tokens, share):
        self.engine.admit(new_tokens, share)
        self._tick()

    @precondition(lambda self: self.engine.free_rows and self.engine.cache)
    @rule(pick=st.integers(0, 7), new_tokens=st.integers(1, engine_step_sizes()["new_tokens"]))
    def twin(self, pick, new_tokens):
        """A request admitted with a cached prefix's tokens (before the prefix was cached, so
        not sharing it), its extend forward, then its insert, which rebinds its row."""
        rid = self.engine.admit_twin(pick, new_tokens)
        self._tick()
        if rid is not None:
            self.engine.insert(0, rid=rid)

    @precondition(lambda self: self.engine.insertable())
    @rule(pick=st.integers(0, 7))
    def insert(self, pick):
        self.engine.insert(pick)

    @precondition(_prompting)
    @rule(chunk=st.integers(1, engine_step_sizes()["chunk"]))
    def prefill(self, chunk):
        self._run(self.engine.prefill(chunk))

    @precondition(_decoding)
    @rule(
        pad=st.sampled_from(engine_step_sizes()["pads"]),
        graph=st.booleans(),
        overflow=st.sampled_from((False, True)),
    )
    def decode(self, pad, graph, overflow):
        """A decode step as the model's role runs it: the target model's canary a plain decode
        batch; the draft model's (the EAGLE offset) its multi-step draft, then its draft extend
        of what the target accepted (both replaying graphs, or neither)."""
        if self.engine.config.offset:
            for forward in self.engine.draft_decode(3, pad if graph else 0, graph=graph):
                self._run(forward)
            self._run(self.engine.draft_extend(
                2 + pad % 2, pad if graph else 0, graph=graph, accept=self.engine.steps
            ))  # fmt: skip
        else:
            self._run(self.engine.decode(pad, graph=graph, overflow=overflow))

    @precondition(lambda self: _decoding(self) and not self.engine.config.offset)
    @rule(
        drafts=st.sampled_from((2, 3)),
        accept=st.integers(0, 2),
        graph=st.booleans(),
        pad=st.sampled_from(engine_step_sizes()["pads"]),
        overflow=st.sampled_from((False, True)),
    )
    def verify(self, drafts, accept, graph, pad, overflow):
        """EAGLE's target verify of the decoding requests (the target model's canary): a
        plain decode where no request has room for the drafts."""
        step = self.engine.target_verify(drafts, accept, pad if graph else 0, graph, overflow)
        self._run(step or self.engine.decode(pad if graph else 0, graph=graph, overflow=overflow))

    @precondition(lambda self: self.engine.running)
    @rule(chunk=st.integers(1, engine_step_sizes()["chunk"]))
    def mixed(self, chunk):
        self._run(self.engine.mixed(chunk))

    @rule(pad=st.integers(1, 2))
    def idle(self, pad):
        self._run(self.engine.idle(pad))

    @precondition(_decoding)
    @rule(pick=st.integers(0, 7))
    def finish(self, pick):
        self.engine.finish(pick)
        self._tick()

    @precondition(lambda self: self.engine.retractable())
    @rule(pick=st.integers(0, 7))
    def retract(self, pick):
        self.engine.retract(pick)
        self._tick()

    @precondition(lambda self: self.engine.waiting and self.engine.free_rows)
    @rule(pick=st.integers(0, 7))
    def readmit(self, pick):
        self.engine.readmit(pick)
        self._tick()

    @precondition(lambda self: self.engine.retractable())
    @rule(pick=st.integers(0, 7), restore=st.sampled_from((True, True, False)))
    def backup(self, pick, restore):
        """A request retracted with its KV backed up; restored after the next forward, or by a
        later rule (or computed again by a readmission)."""
        self._run(self.engine.backup(pick))
        self._tick()
        if restore:
            self.restore(pick)

    @precondition(lambda self: self.engine.backups)
    @rule(pick=st.integers(0, 7))
    def restore(self, pick):
        self._run(self.engine.restore(pick))
        self._tick()

    @precondition(lambda self: self.engine.free_rows and self.engine.free_pages)
    @rule(new_tokens=st.integers(2, engine_step_sizes()["new_tokens"]))
    def receive(self, new_tokens):
        for step in self.engine.receive(new_tokens):
            self._run(step)
        self._tick()

    @precondition(lambda self: self.engine.cache)
    @rule()
    def sweep(self):
        self._run(self.engine.sweep())

    @precondition(lambda self: self.engine.relocatable())
    @rule(pick=st.integers(0, 7))
    def relocate(self, pick):
        for step in self.engine.relocate(pick):
            self._run(step)
        self._tick()

    @precondition(lambda self: self.fault is None)
    @rule(
        kind=st.sampled_from(FAULT_KINDS),
        pick=st.integers(0, 2**10),
        byte=st.integers(0, KV_BYTES - 1),
        mode=st.sampled_from(SETTLE_MODES),
    )
    def inject(self, kind, pick, byte, mode):
        made = inject_and_settle(
            self.engine, self.oracle, kind, pick, byte, self._run, flip=self.run_impl.flip,
            mode=mode,
        )  # fmt: skip
        if made is None:
            return
        self.fault, problems, _ = made
        if problems:
            fail(
                "the fault's reports are not what its class predicts (the implementation "
                "agreed with the reference up to here):\n  " + "\n  ".join(problems),
                config=self.engine.describe(),
            )

    def teardown(self):
        if hasattr(self, "engine"):
            SITUATIONS.update(self.engine.events)

    @invariant()
    def silent_without_a_fault(self):
        if not hasattr(self, "engine"):
            return
        if self.fault is None:  # this engine's ring and its prefill engine's
            problem = self.oracle.silence_problem()
        else:  # no fault touches the prefill engine
            problem = "" if self.oracle.peer is None else self.oracle.peer.silence_problem()
        if problem:
            fail(
                f"{problem} on a correct history (the implementation agreed with the reference)",
                config=self.engine.describe(),
            )


#: The situations of CONTRACT §12 and §15 the histories must reach (``Engine.events``), each
#: :data:`SITUATION_FLOOR` times in the derandomized CPU profiles (``ci`` and ``mutation``),
#: whose draws are fixed, by the rules' own draws: a history starts from an empty engine. (An expected-token read cut off by the valid length needs three draft
#: steps of one request, which :func:`test_draft_steps_verify_drafts_past_the_snapshot` makes in
#: every example; one past the snapshot of a row a longer owner left,
#: :func:`test_a_recycled_row_s_draft_reads_stop_at_its_own_snapshot`.)
REQUIRED_SITUATIONS = (
    "rows of one batch that share a cached prefix",
    "a recycled row whose new owner has the old owner's length",
    "a recycled row whose new owner is shorter than the old",
    "an SWA window that slid past an evicted slot",
    "swa slot of a cached position evicted under pressure",
    "a verify plan that overflows",
    "plans reused by a replayed graph",
    "a retracted request readmitted",
    "a readmitted request matched a cached prefix",
    "an insert rebound a row to the cache's pages",
    "an insert split at the prompt's end",
    "drafts rejected, their pages kept for the next verify",
    "a draft extend that wrote rejected drafts' positions",
    *(situation(step) for step in REQUIRED_FORWARDS),
    situation(StepLabel(TARGET_VERIFY, graph=True)),
    situation(StepLabel(DRAFT_EXTEND_V2, graph=True)),
    "a draft decode step",
    "a draft decode step replaying a graph",
    "a cached prefix offloaded and reloaded into other slots",
    "a retracted request restored from its backup",
    "a request received from a prefill engine, page by page",
    "a cached page evicted",
    "an allocation that evicted cached leaves",
    "a prompt prefilled in more than one chunk",
    "a page freed and handed out again within one step",
    "KV moved under a sliding window",
)
#: How often the fixed CPU draws must reach each situation.
SITUATION_FLOOR = 3
#: The steps of the prefix cache that SGLang's radix tree code holds in the histories on its
#: allocators (``conformance/sglang/radix_tree.py``, engines without a window, until a fault),
#: each reached :data:`SITUATION_FLOOR` times too; the kinds of each (splits, the prompt's end,
#: duplicates freed) are printed, and reached in the radix tree's own self-test.
HELD_STEPS = ("inserts", "matches")
#: The share of the profile's examples the histories test runs: in the CPU's fixed draws, with
#: the rules alone, 0.2 left several situations under the floor (graph-replayed draft steps
#: and target verifies among them); 0.4 reaches each at least four times. A GPU's histories,
#: of 200 rules each and no floor, keep 0.2.
HISTORIES_SHARE = 0.4 if profiles.ON_CPU else 0.2
SITUATIONS: Counter[str] = Counter()


def fixed_cpu_draws() -> bool:
    """Whether this run draws the CPU's fixed examples (a derandomized profile on the CPU)."""
    return profiles.ON_CPU and bool(hypothesis.settings.default.derandomize)


def test_engine_histories_agree_with_the_reference_and_report_each_fault(impl, device):
    """Over an engine's history (prefix sharing, chunked prefill, padding, retraction, eviction, SWA, EAGLE, every forward mode) the implementation equals the reference after every launch, the ring stays empty without a fault, a fault is reported where its class predicts, and the CPU's fixed draws reach every situation the suite counts."""
    settings = examples(HISTORIES_SHARE)
    SITUATIONS.clear()
    radix_tree.TREE.seen.clear()
    stateful.run_state_machine_as_test(
        lambda: EngineMachine(impl, device),
        settings=hypothesis.settings(settings, stateful_step_count=engine_step_sizes()["steps"]),
    )
    counts = ", ".join(f"{name}: {SITUATIONS[name]}" for name in REQUIRED_SITUATIONS)
    print(f"situations reached: {counts}")
    print(f"pages and pool rows chosen by: {ALLOCATORS[1]}")
    never = [name for name in REQUIRED_SITUATIONS if SITUATIONS[name] < SITUATION_FLOOR]
    if ALLOCATORS[0] == "sglang" and radix_tree.usable()[0]:  # SGLang's tree held each step
        held = radix_tree.TREE.seen
        print("radix tree steps held by SGLang's insert and match: " + ", ".join(f"{kind}: {held[kind]}" for kind in radix_tree.KINDS))  # fmt: skip
        never += [f"SGLang's {kind}" for kind in HELD_STEPS if held[kind] < SITUATION_FLOOR]
    if never and fixed_cpu_draws():
        fail(
            f"the histories reached fewer than {SITUATION_FLOOR} times: {'; '.join(never)} "
            f"(reached: {counts})",
            config="the derandomized CPU draws of this test",
        )


@pytest.mark.parametrize("kind", FAULT_KINDS)
@examples(0.02)
@hypothesis.given(
    # room for the settle after the warm-up in most draws: few examples are discarded
    config=engine_configs(**ENGINES, min_slots=48, min_rows=4, small_swa=False),
    pick=st.integers(0, 2**10),
    byte=st.integers(0, 31),
    mode=st.sampled_from(SETTLE_MODES),
)
def test_each_fault_class_is_reported_where_it_predicts(
    impl, device, kind, config, pick, byte, mode
):
    """After a short engine history, a fault of each class is reported at the slot, by the launches and with the reason its class predicts, in the hash modes and forward modes that can see it, and not at all in the others."""
    cls = FAULTS[kind]
    if cls.target_model_only:  # its place is the target model's target verify
        config, mode = dataclasses.replace(config, offset=0), cls.settle_mode
    engine = Engine(config)
    oracle = OracleRun(engine)
    run_impl = ImplRun(impl, device, engine, oracle.states)

    def run(step):
        run_step(
            run_impl,
            oracle,
            step,
            what=f"step {engine.steps} ({engine.log[-1]})",
            config=engine.describe(),
        )

    warm_up(engine, run)
    if oracle.index:
        fail(f"{oracle.index} reports on a correct history", config=engine.describe())
    made = inject_and_settle(engine, oracle, kind, pick, byte, run, flip=run_impl.flip, mode=mode)
    hypothesis.assume(made is not None)
    fault, problems, _ = made
    if problems:
        fail(
            "the fault's reports are not what its class predicts:\n  " + "\n  ".join(problems),
            config=engine.describe(),
        )


def _engine_and_run(impl, device, config):
    """An engine of ``config``, the reference's run of it, and ``run(step)``: one step on the
    implementation and the reference, compared after every launch."""
    engine = Engine(config)
    oracle = OracleRun(engine)
    run_impl = ImplRun(impl, device, engine, oracle.states)

    def run(step):
        run_step(
            run_impl, oracle, step, what=f"step {engine.steps} ({engine.log[-1]})",
            config=engine.describe(),
        )  # fmt: skip

    return engine, oracle, run


def _draft(engine, oracle, run, steps: int, reached: str) -> None:
    """The draft model's multi-step draft of ``steps`` steps through ``run`` (discarded unless a
    row had room for every draft): no report, and the situation ``reached`` met."""
    forwards = engine.draft_decode(steps)
    hypothesis.assume(len(forwards) == steps)
    for forward in forwards:
        run(forward)
    if oracle.index:
        fail(f"{oracle.index} reports on a correct draft", config=engine.describe())
    if not engine.events[reached]:
        fail(f"the draft steps never reached: {reached}", config=engine.describe())


#: Engines of the draft model's canary (the EAGLE offset 1).
DRAFT_MODEL_ENGINES = engine_configs(**ENGINES, min_slots=32).map(
    lambda c: dataclasses.replace(c, offset=1)
)


@examples(0.02)
@hypothesis.given(config=DRAFT_MODEL_ENGINES, steps=st.integers(3, 4))
def test_draft_steps_verify_drafts_past_the_snapshot(impl, device, config, steps):
    """The draft model's multi-step draft (its canary with the EAGLE offset): after the third draft step a verify reads drafts past the snapshot, whose expected tokens the valid length cuts off, and the implementation equals the reference after every launch while the ring stays empty."""
    engine, oracle, run = _engine_and_run(impl, device, config)
    warm_up(engine, run)
    _draft(engine, oracle, run, steps, "an expected-token read cut off by the valid length")


@examples(0.02)
@hypothesis.given(config=DRAFT_MODEL_ENGINES, steps=st.integers(3, 4))
def test_a_recycled_row_s_draft_reads_stop_at_its_own_snapshot(impl, device, config, steps):
    """A pool row recycled from a longer owner to a shorter one keeps the old owner's tokens past the new owner's: the draft model's multi-step draft then verifies drafts past the new owner's snapshot, whose expected tokens the valid length cuts off before the stale tail, and the implementation equals the reference after every launch while the ring stays empty."""
    engine, oracle, run = _engine_and_run(impl, device, config)
    hypothesis.assume(config.context_len - config.offset > 3)  # longer than the next owner
    engine.admit(config.context_len - config.offset)
    run(engine.prefill(config.context_len))
    engine.finish(0)  # its row goes back with its tokens
    engine.admit(2)  # the shorter owner takes the row (the last freed)
    run(engine.prefill(config.context_len))
    _draft(engine, oracle, run, steps, "a plan read past the snapshot of a row a longer owner left")
