"""Write and verify (CONTRACT §5-§7) against the reference: buffers, rings, indices, counters."""

from __future__ import annotations

import dataclasses

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, target
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import strategies as st_kv
from conformance import profiles
from conformance.assertions import fail, row_text
from conformance.profiles import examples
from conformance.support import describe_world
from conformance.write_verify_support import (
    Snapshot,
    assert_world_holds,
    bit_names,
    code,
    expected_reports,
    launch_and_compare,
    reports_of,
    run_verify,
    run_write,
    story,
)
from strategies.verify import corruption_kinds

pytestmark = pytest.mark.write_verify


def world_kwargs() -> dict:
    sizes = profiles.layout_sizes()
    return {key: sizes[key] for key in ("max_rows", "max_page_size", "max_ndim")}


# ---------------------------------------------------------------------------------------------
# What each property draws, as plain descriptions (no tensor, no launch): a meta-test
# (tests/strategies/test_draw_strength.py) collects them and checks that they can fail. The draws
# themselves hold what a property needs (entries written, sources read, entries checked), so
# no example is thrown away after its launches ran.

#: World kinds and their weights: worlds that read KV bytes are the bulk; mode NONE and
#: worlds without sources, which write and verify a zero real-KV hash, keep a share.
WORLD_KINDS = ("reads KV",) * 6 + ("mode NONE", "no sources")


@st.composite
def worlds(draw, *, kind: str | None = None, **world_options) -> st_kv.CanaryWorld:
    """A world of one of :data:`WORLD_KINDS` (``kind``, or drawn with their weights; "any"
    puts no condition on it), with the run's layout sizes unless ``world_options`` says
    otherwise."""
    kind = kind or draw(st.sampled_from(WORLD_KINDS), label="world kind")
    options = {**world_kwargs(), **world_options}
    if kind == "any":
        pass
    elif kind == "reads KV":
        options["reads_kv"] = True
    elif kind == "mode NONE":
        options["modes"] = (0,)
    else:
        options["max_sources"] = 0
    return draw(st_kv.canary_worlds(**options), label="world")


@dataclasses.dataclass(frozen=True)
class Written:
    """A world and the write launches done on it, in order."""

    world: st_kv.CanaryWorld
    batches: tuple[st_kv.WriteBatch, ...]

    @property
    def chains(self) -> tuple[st_kv.Chain, ...]:
        return tuple(chain for batch in self.batches for chain in st_kv.chains_written(batch))


@st.composite
def written_worlds(
    draw, *, batches=2, avoid_zero=False, min_written=1, world=None, **world_overrides
) -> Written:
    """A world (from ``world``, :func:`worlds` by default) and ``batches`` write launches on
    it, each continuing the chains of the ones before; the first writes at least
    ``min_written`` entries. ``world_overrides`` replace fields of the drawn world."""
    described = draw(world if world is not None else worlds(), label="world")
    if world_overrides:
        described = dataclasses.replace(described, **world_overrides)
    done: tuple[st_kv.WriteBatch, ...] = ()
    for step in range(batches):
        chains = Written(described, done).chains
        written = {slot for chain in chains for slot in chain.slots}
        batch = draw(
            st_kv.write_batches(
                described,
                seeds=tuple((chain.slots[-1], chain.positions[-1]) for chain in chains),
                avoid=frozenset(written | ({0} if avoid_zero else set())),
                min_written=min_written if step == 0 else 0,
            ),
            label=f"write batch {step}",
        )
        done += (batch,)
    return Written(described, done)


@dataclasses.dataclass(frozen=True)
class VerifyCase:
    """Written chains, perhaps a corruption (applied after the writes), and the verify plan
    that runs then."""

    written: Written
    corruption: st_kv.Corruption | None
    plan: st_kv.VerifyBatch


#: Verify plans: most check at least one entry; the rest are drawn freely (disabled, no valid
#: entry, padding only), as the state machine also does.
PLAN_KINDS = ("checks an entry",) * 9 + ("any",)


@st.composite
def verify_cases(draw) -> VerifyCase:
    """Two write launches, a corruption half of the time, and a varied verify plan."""
    # two entries written: one at least is not slot 0, which verify skips
    written = draw(written_worlds(batches=2, min_written=2), label="written")
    chains = written.chains
    corruption = None
    if draw(st.booleans(), label="corrupt first"):
        corruption = draw(st_kv.corruptions(written.world, chains), label="corruption")
    checkable = any(slot != 0 for chain in chains for slot in chain.slots)
    checks = draw(st.sampled_from(PLAN_KINDS), label="plan kind") == "checks an entry"
    plan = draw(
        st_kv.verify_batches(chains, min_checked=1 if checks and checkable else 0),
        label="verify plan",
    )
    return VerifyCase(written, corruption, plan)


#: Corruption kinds and their weights: KV ones (in worlds that read KV) are the bulk.
CORRUPTION_WEIGHTS = (
    ("field",) * 2 + ("kv_inside",) * 3 + ("page_swap",) * 2 + ("kv_outside", "stale")
)
KV_CORRUPTIONS = ("kv_inside", "kv_outside", "page_swap")


@st.composite
def corruption_cases(draw) -> VerifyCase:
    """A kind of corruption, a world that allows it (one reading KV for a KV kind), two
    write launches into an empty 64-row ring, the corruption, and the plan verifying every
    written entry, with the token check on or off."""
    kind = draw(st.sampled_from(CORRUPTION_WEIGHTS), label="corruption kind")
    world = worlds(kind="reads KV") if kind in KV_CORRUPTIONS else worlds()
    written = draw(
        written_worlds(world=world, avoid_zero=True, ring_capacity=64, ring_start=0),
        label="written",
    )
    chains = written.chains
    if kind not in corruption_kinds(written.world, chains):
        kind = "field"  # a stale record needs two chains
    corruption = draw(st_kv.corruptions(written.world, chains, kinds=(kind,)), label="corruption")
    plan = draw(st_kv.verify_batches(chains, exact=True), label="verify plan")
    check_token = draw(st.booleans(), label="check_token")
    return VerifyCase(written, corruption, dataclasses.replace(plan, check_token=check_token))


@st.composite
def exact_cases(draw, writes, *, wrong_positions=False) -> VerifyCase:
    """Chains from ``writes`` and the plan verifying each written entry against its
    own chain, every expected position off by one bit with ``wrong_positions``."""
    written = draw(writes, label="written")
    plan = draw(st_kv.verify_batches(written.chains, exact=True), label="verify plan")
    if wrong_positions:
        wrong = tuple(p ^ 1 for p in plan.expected_positions)
        plan = dataclasses.replace(plan, expected_positions=wrong)
    return VerifyCase(written, None, plan)


def clean_cases() -> st.SearchStrategy[VerifyCase]:
    """Two write launches, none through slot 0, and the plan verifying them."""
    return exact_cases(written_worlds(avoid_zero=True))


def outside_cases() -> st.SearchStrategy[VerifyCase]:
    """Writes into a world of mode ALL with sources, none through slot 0, and the plan
    verifying them."""
    return exact_cases(written_worlds(world=worlds(kind="reads KV", modes=(2,)), avoid_zero=True))


def ring_cases() -> st.SearchStrategy[VerifyCase]:
    """One write launch of at least one entry, none through slot 0, and a plan in which every
    entry fails its position check (the ring does not care whether the world reads KV)."""
    return exact_cases(
        written_worlds(world=worlds(kind="any"), batches=1, avoid_zero=True),
        wrong_positions=True,
    )


@st.composite
def disabled_cases(draw) -> VerifyCase:
    """A write launch in any world, then a disabled plan of garbage slots whose ``num_valid``
    mostly reaches some of them (an enabled launch would have work to do, and refuse it)."""
    written = draw(
        written_worlds(world=worlds(kind="any"), batches=1, min_written=0), label="written"
    )
    num_slots = written.world.num_slots
    garbage = st.integers(num_slots, num_slots + 2**40) | st.integers(-(2**40), -1)
    cap = draw(st.integers(1, 6), label="capacity")
    reaches = draw(st.sampled_from((True,) * 9 + (False,)), label="num_valid reaches entries")
    return VerifyCase(
        written,
        None,
        st_kv.VerifyBatch(
            slots=tuple(draw(st.lists(garbage, min_size=cap, max_size=cap), label="slots")),
            expected_tokens=(5,) * cap,
            expected_positions=(7,) * cap,
            prev_slots=tuple(draw(st.lists(garbage, min_size=cap, max_size=cap), label="prev")),
            num_valid=draw(
                st.integers(1, cap + 2) if reaches else st.integers(-2, 0), label="num_valid"
            ),
            enable=0,
            check_token=draw(st.booleans(), label="check_token"),
        ),
    )


def machine_worlds() -> st.SearchStrategy[st_kv.CanaryWorld]:
    """The state machine's first world: mostly one that reads KV, so KV corruptions happen."""
    return worlds(max_slots=24, max_ring=8, max_rows=8, max_page_size=8)


# ---------------------------------------------------------------------------------------------
# Running the descriptions.


def do_writes(written: Written, device, impl):
    """Materialise ``written.world`` and run its write launches, each checked against the
    reference; returns (world, chains, state)."""
    made = st_kv.materialize_world(written.world, device)
    state = made.reference_state()
    for step, batch in enumerate(written.batches):
        what = f"after write batch {step}"
        config = describe_world(written.world)
        launch_and_compare(run_write, impl, device, made, batch, state, what=what, config=config)
    return made, written.chains, state


@examples(0.5)
@given(case=written_worlds(batches=2))
def test_write_equals_reference(impl, device, case):
    """Two write launches leave the buffer, ring rows, write index and counters the reference leaves."""
    do_writes(case, device, impl)


@examples(0.5)
@given(case=verify_cases())
def test_verify_equals_reference(impl, device, case):
    """A verify launch of a varied plan over written chains reports exactly what the reference reports."""
    made, _, state = do_writes(case.written, device, impl)
    if case.corruption is not None:
        st_kv.apply_corruption(made, case.corruption)
        state = made.reference_state()
    config = describe_world(made.world) + "\n" + code("verify plan", case.plan)
    launch_and_compare(
        run_verify, impl, device, made, case.plan, state, what="after verify", config=config
    )


@examples(0.5)
@given(case=clean_cases())
def test_write_then_verify_is_clean(impl, device, case):
    """Verifying every written entry against its own chain right after the writes reports nothing."""
    made, chains, _ = do_writes(case.written, device, impl)
    batch = case.plan
    before = Snapshot.of_world(made)
    run_verify(impl, made, batch, device)
    after = Snapshot.of_world(made)
    rows = after.new_rows(before.write_index)
    if after.write_index != before.write_index:
        fail(
            f"a clean verify of {batch.capacity} entries reported "
            f"{after.write_index - before.write_index} violations:\n"
            + "\n".join(line for row in rows for line in row_text(row)),
            config=describe_world(made.world) + "\n" + code("chains", chains),
        )
    assert after.kernel_run_counter == before.kernel_run_counter + 1
    assert after.slot_run_counter == before.slot_run_counter + batch.capacity
    assert np.array_equal(after.canary_buf, before.canary_buf), "verify wrote the canary buffer"


@examples(1.0)
@given(case=corruption_cases())
def test_each_corruption_is_reported_exactly(impl, device, case):
    """A flipped canary bit, a changed KV byte, a page swap or a stale record is reported with exactly the right bits on exactly the right slots, and nothing else is."""
    made, chains, _ = do_writes(case.written, device, impl)
    corruption, batch = case.corruption, case.plan
    check_token = batch.check_token
    records = made.records()
    page_size = made.world.sources[corruption.source].page_size if made.world.sources else 1
    expected = expected_reports(
        chains,
        corruption,
        check_token=check_token,
        page_size=page_size,
        stored=lambda slot: tuple(int(v) for v in records[slot]),
    )
    st_kv.apply_corruption(made, corruption)
    state = made.reference_state()
    index_before = int(made.violation_write_index.item())
    run_verify(impl, made, batch, device, state)
    target(float(len(expected)), label="slots that must report")
    got = reports_of(Snapshot.of_world(made), index_before)
    if got != expected:
        fail(
            f"after {corruption.describe()}, verify reported {bit_names(got)}, "
            f"but CONTRACT §7 requires {bit_names(expected)}",
            config=describe_world(made.world) + "\n" + code("chains", chains),
            repro=story(impl, device, made),
        )
    assert_world_holds(
        impl,
        device,
        made,
        state,
        index_before=index_before,
        what="after verify of a corrupted world",
        config=corruption.describe(),
    )


@examples(0.5)
@given(case=outside_cases())
def test_bytes_outside_read_windows_never_report(impl, device, case):
    """Changing every KV byte no slot reads (holes, gaps, past read_bytes, around the views) causes no report."""
    made, _, _ = do_writes(case.written, device, impl)
    for layout, source in zip(made.world.sources, made.sources, strict=True):
        outside = st_kv.outside_byte_offsets(layout)
        if outside.size:
            index = torch.from_numpy(outside).to(source.backing.device)
            source.backing[index] = source.backing[index] ^ 0xA5
    batch = case.plan
    before = int(made.violation_write_index.item())
    run_verify(impl, made, batch, device)
    after = Snapshot.of_world(made)
    if after.write_index != before:
        fail(
            "changing bytes outside every read window caused reports:\n"
            + "\n".join(line for row in after.new_rows(before) for line in row_text(row)),
            config=describe_world(made.world),
        )


@examples(0.5)
@given(case=ring_cases())
def test_ring_is_fill_once_and_counts_past_capacity(impl, device, case):
    """Each violation takes the next index; rows below the capacity are stored once, none is overwritten, and the index keeps counting."""
    made, chains, _ = do_writes(case.written, device, impl)
    entries = st_kv.plan_for_chains(chains)
    before = Snapshot.of_world(made)
    wrong = case.plan  # every entry fails its position check: one report per entry
    run_verify(impl, made, wrong, device)
    after = Snapshot.of_world(made)
    cap, start, n = len(before.ring), before.write_index, len(entries)
    if after.write_index != start + n:
        fail(
            f"{n} violations moved the write index from {start} to {after.write_index}, "
            f"expected {start + n} (the index counts every violation, stored or not)",
            config=f"ring capacity {cap}",
        )
    kept = np.r_[0 : min(start, cap), min(start + n, cap) : cap]
    if not np.array_equal(after.ring[kept], before.ring[kept]):
        fail(
            "ring rows outside [index before, index after) changed: the ring wrapped or overwrote",
            config=f"ring capacity {cap}, index {start} -> {after.write_index}",
        )
    stored = after.ring[min(start, cap) : min(start + n, cap)]
    if len(stored) and not (stored[:, 7] == 2).all():
        fail(
            f"stored rows are not the {n} position reports:\n"
            + "\n".join(line for row in stored for line in row_text(row))
        )


@examples(0.5)
@given(case=disabled_cases())
def test_disabled_verify_only_counts_the_launch(impl, device, case):
    """A verify plan with enable == 0 changes nothing but kernel_run_counter, even with entries no buffer has."""
    made, _, _ = do_writes(case.written, device, impl)
    before = Snapshot.of_world(made)
    run_verify(impl, made, case.plan, device)
    after = Snapshot.of_world(made)
    assert after.kernel_run_counter == before.kernel_run_counter + 1
    for name in ("write_index", "slot_run_counter"):
        assert getattr(after, name) == getattr(before, name), f"{name} changed on a disabled plan"
    assert np.array_equal(after.ring, before.ring)
    assert np.array_equal(after.canary_buf, before.canary_buf)


class CanaryMachine(RuleBasedStateMachine):
    """Writes, corruptions and verifies in any order, with the reference as the model."""

    def __init__(self, impl, device):
        super().__init__()
        self.impl, self.device = impl, device

    @initialize(world=machine_worlds())
    def make_world(self, world):
        self.world = st_kv.materialize_world(world, self.device)
        self.model = self.world.reference_state()
        self.chains: tuple = ()
        self.step = "the first launch"

    @rule(data=st.data())
    def write(self, data):
        written = {slot for chain in self.chains for slot in chain.slots}
        tails = tuple((chain.slots[-1], chain.positions[-1]) for chain in self.chains)
        batch = data.draw(
            st_kv.write_batches(self.world.world, seeds=tails, avoid=frozenset(written | {0})),
            label="write",
        )
        self.index_before = int(self.world.violation_write_index.item())
        run_write(self.impl, self.world, batch, self.device, self.model)
        self.chains += st_kv.chains_written(batch)
        self.step = f"write {batch!r}"

    @precondition(lambda self: any(chain.slots for chain in self.chains))
    @rule(data=st.data())
    def corrupt(self, data):
        corruption = data.draw(st_kv.corruptions(self.world.world, self.chains), label="corrupt")
        st_kv.apply_corruption(self.world, corruption)
        # the model sees the same damage: its buffer and sources are taken from the world again
        fresh = self.world.reference_state()
        self.model.canary_buf = fresh.canary_buf
        self.model.real_kv_sources = fresh.real_kv_sources
        self.index_before = int(self.world.violation_write_index.item())
        self.step = corruption.describe()

    @rule(data=st.data())
    def verify(self, data):
        batch = data.draw(st_kv.verify_batches(self.chains), label="verify")
        self.index_before = int(self.world.violation_write_index.item())
        run_verify(self.impl, self.world, batch, self.device, self.model)
        self.step = f"verify {batch!r}"

    @invariant()
    def agrees_with_the_model(self):
        if not hasattr(self, "world"):
            return
        assert_world_holds(
            self.impl,
            self.device,
            self.world,
            self.model,
            index_before=getattr(self, "index_before", 0),
            what=f"after {self.step}",
            config=describe_world(self.world.world),
        )


def test_state_machine_of_writes_corruptions_and_verifies(impl, device):
    """Any sequence of writes, corruptions and verifies keeps the implementation's state equal to the reference model's."""
    settings = examples(0.3)
    run_state_machine_as_test(
        lambda: CanaryMachine(impl, device),
        settings=hypothesis.settings(settings, stateful_step_count=8),
    )
