"""The canary as an engine runs it: long histories of an engine model, step by step, with
SGLang's own fault classes (CONTRACT §6, §7, §12, §13; ``strategies.engine``,
``strategies.faults``).

Every step runs the plan, verify and write (and the scatter, or the cache sweep) on the
implementation and on the reference, and their states must agree after every launch. With no
fault the ring stays empty over the whole history: the canary never cries wolf. One fault may be
made at any step; the steps of ``SETTLE`` follow it, and by their end the report it must cause
is stored: at the slot and with the reason its class predicts, in the hash modes that can see
it, and nothing at all where the mode cannot.
"""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest
from hypothesis import stateful
from hypothesis.stateful import initialize, invariant, precondition, rule

from conformance.assertions import fail
from conformance.engine_support import ImplRun, OracleRun, inject_and_settle, run_step, warm_up
from conformance.profiles import engine_sizes, engine_step_sizes, examples
from strategies.engine import KV_BYTES, Engine, engine_configs
from strategies.faults import FAULT_KINDS

pytestmark = pytest.mark.plan


class EngineMachine(stateful.RuleBasedStateMachine):
    """An engine's history: admissions, prefills, decodes, finishes, retractions, evictions and
    sweeps in any order, at most one fault, the reference as the model."""

    def __init__(self, impl, device):
        super().__init__()
        self.impl, self.device = impl, device
        self.fault = None

    @initialize(config=engine_configs(**engine_sizes(), min_slots=32))
    def start(self, config):
        self.engine = Engine(config)
        self.oracle = OracleRun(self.engine)
        self.run_impl = ImplRun(self.impl, self.device, self.engine, self.oracle.states)
        # a running start: requests prefilled and decoding, one sharing a cached prefix, and a
        # cached prefix no request uses
        warm_up(self.engine, self._run)

    def _run(self, step) -> None:
        if step is None:
            return
        run_step(
            self.run_impl, self.oracle, step,
            what=f"step {self.engine.steps} ({self.engine.log[-1]})", config=self.engine.describe(),
        )  # fmt: skip

    def _tick(self) -> None:
        """The scheduler's next forward after an event: an extend batch if a prompt is pending,
        else a decode batch."""
        self._run(self.engine.prefill(engine_step_sizes()["chunk"]) or self.engine.decode(0))

    @rule(new_tokens=st.integers(1, engine_step_sizes()["new_tokens"]), share=st.integers(0, 3))
    def admit(self, new_tokens, share):
        self.engine.admit(new_tokens, share)
        self._tick()

    @rule(chunk=st.integers(1, engine_step_sizes()["chunk"]))
    def prefill(self, chunk):
        self._run(self.engine.prefill(chunk))

    @rule(pad=st.sampled_from(engine_step_sizes()["pads"]))
    def decode(self, pad):
        self._run(self.engine.decode(pad))

    @rule(pick=st.integers(0, 7))
    def finish(self, pick):
        self.engine.finish(pick)
        self._tick()

    @rule(pick=st.integers(0, 7))
    def retract(self, pick):
        self.engine.retract(pick)
        self._tick()

    @rule(pick=st.integers(0, 7))
    def readmit(self, pick):
        self.engine.readmit(pick)
        self._tick()

    @rule()
    def evict(self):
        self.engine.evict()
        self._tick()

    @rule()
    def sweep(self):
        self._run(self.engine.sweep())

    @precondition(lambda self: self.fault is None)
    @rule(
        kind=st.sampled_from(FAULT_KINDS),
        pick=st.integers(0, 2**10),
        byte=st.integers(0, KV_BYTES - 1),
    )
    def inject(self, kind, pick, byte):
        made = inject_and_settle(
            self.engine, self.oracle, kind, pick, byte, self._run, flip=self.run_impl.flip
        )
        if made is None:
            return
        self.fault, problems, _ = made
        if problems:
            fail(
                "the fault's reports are not what its class predicts (the implementation "
                "agreed with the reference up to here):\n  " + "\n  ".join(problems),
                config=self.engine.describe(),
            )

    @invariant()
    def silent_without_a_fault(self):
        if hasattr(self, "engine") and self.fault is None and self.oracle.index:
            fail(
                f"{self.oracle.index} reports on a correct history (the implementation agreed "
                f"with the reference): first {self.oracle.rows(0)[:2].tolist()}",
                config=self.engine.describe(),
            )


def test_engine_histories_agree_with_the_reference_and_report_each_fault(impl, device):
    """Over an engine's history (prefix sharing, chunked prefill, padding, retraction, eviction, SWA, EAGLE) the implementation equals the reference after every launch, the ring stays empty without a fault, and a fault is reported where its class predicts."""
    settings = examples(0.2)
    stateful.run_state_machine_as_test(
        lambda: EngineMachine(impl, device),
        settings=hypothesis.settings(settings, stateful_step_count=engine_step_sizes()["steps"]),
    )


@pytest.mark.parametrize("kind", FAULT_KINDS)
@examples(0.02)
@hypothesis.given(
    config=engine_configs(**engine_sizes()), pick=st.integers(0, 2**10), byte=st.integers(0, 31)
)
def test_each_fault_class_is_reported_where_it_predicts(impl, device, kind, config, pick, byte):
    """After a short engine history, a fault of each class is reported at the slot and with the reason its class predicts, in the hash modes that can see it, and not at all in the others."""
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
    made = inject_and_settle(engine, oracle, kind, pick, byte, run, flip=run_impl.flip)
    hypothesis.assume(made is not None)
    fault, problems, _ = made
    if problems:
        fail(
            "the fault's reports are not what its class predicts:\n  " + "\n  ".join(problems),
            config=engine.describe(),
        )
