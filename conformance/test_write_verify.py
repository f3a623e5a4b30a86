"""Write and verify (CONTRACT §5-§7) against the reference: buffers, rings, indices, counters."""

from __future__ import annotations

import dataclasses

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import assume, given, target
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
    assert_same_state,
    bit_names,
    code,
    expected_reports,
    reports_of,
    run_verify,
    run_write,
    story,
)

pytestmark = pytest.mark.write_verify


def world_kwargs() -> dict:
    sizes = profiles.layout_sizes()
    return dict(max_rows=sizes["max_rows"], max_page_size=sizes["max_page_size"])


def draw_written_world(data, device, impl, *, batches=2, avoid_zero=False, **world_overrides):
    """A world with up to ``batches`` write launches done; returns (world, chains, state)."""
    world = data.draw(st_kv.canary_worlds(**world_kwargs()), label="world")
    if world_overrides:
        world = dataclasses.replace(world, **world_overrides)
    made = st_kv.materialize_world(world, device)
    state = made.reference_state()
    chains: tuple = ()
    for step in range(batches):
        written = {slot for chain in chains for slot in chain.slots}
        tails = tuple((chain.slots[-1], chain.positions[-1]) for chain in chains)
        batch = data.draw(
            st_kv.write_batches(
                world,
                seeds=tails,
                avoid=frozenset(written | ({0} if avoid_zero else set())),
            ),
            label=f"write batch {step}",
        )
        index_before = int(made.violation_write_index.item())
        run_write(impl, made, batch, device, state)
        assert_same_state(
            Snapshot.of_world(made),
            Snapshot.of_state(state),
            index_before=index_before,
            what=f"after write batch {step}",
            config=describe_world(world),
            repro=story(impl, device, made),
        )
        chains = chains + st_kv.chains_written(batch)
    return made, chains, state


@examples(0.5)
@given(data=st.data())
def test_write_equals_reference(impl, device, data):
    """Two write launches leave the buffer, ring rows, write index and counters the reference leaves."""
    draw_written_world(data, device, impl, batches=2)


@examples(0.5)
@given(data=st.data())
def test_verify_equals_reference(impl, device, data):
    """A verify launch of a varied plan over written chains reports exactly what the reference reports."""
    made, chains, state = draw_written_world(data, device, impl, batches=2)
    if data.draw(st.booleans(), label="corrupt first") and any(c.slots for c in chains):
        corruption = data.draw(st_kv.corruptions(made.world, chains), label="corruption")
        st_kv.apply_corruption(made, corruption)
        state = made.reference_state()
    batch = data.draw(st_kv.verify_batches(chains), label="verify plan")
    index_before = int(made.violation_write_index.item())
    run_verify(impl, made, batch, device, state)
    assert_same_state(
        Snapshot.of_world(made),
        Snapshot.of_state(state),
        index_before=index_before,
        what="after verify",
        config=describe_world(made.world) + "\n" + code("verify plan", batch),
        repro=story(impl, device, made),
    )


@examples(0.5)
@given(data=st.data())
def test_write_then_verify_is_clean(impl, device, data):
    """Verifying every written entry against its own chain right after the writes reports nothing."""
    made, chains, _ = draw_written_world(data, device, impl, avoid_zero=True)
    batch = data.draw(st_kv.verify_batches(chains, exact=True), label="verify plan")
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
@given(data=st.data())
def test_each_corruption_is_reported_exactly(impl, device, data):
    """A flipped canary bit, a changed KV byte, a page swap or a stale record is reported with exactly the right bits on exactly the right slots, and nothing else is."""
    made, chains, _ = draw_written_world(
        data, device, impl, avoid_zero=True, ring_capacity=64, ring_start=0
    )
    assume(any(chain.slots for chain in chains))  # something was written to corrupt
    corruption = data.draw(st_kv.corruptions(made.world, chains), label="corruption")
    records = made.records()
    page_size = made.world.sources[corruption.source].page_size if made.world.sources else 1
    check_token = data.draw(st.booleans(), label="check_token")
    expected = expected_reports(
        chains,
        corruption,
        check_token=check_token,
        page_size=page_size,
        stored=lambda slot: tuple(int(v) for v in records[slot]),
    )
    st_kv.apply_corruption(made, corruption)
    state = made.reference_state()
    batch = dataclasses.replace(
        data.draw(st_kv.verify_batches(chains, exact=True), label="verify plan"),
        check_token=check_token,
    )
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
    assert_same_state(
        Snapshot.of_world(made),
        Snapshot.of_state(state),
        index_before=index_before,
        what="after verify of a corrupted world",
        config=corruption.describe(),
        repro=story(impl, device, made),
    )


@examples(0.5)
@given(data=st.data())
def test_bytes_outside_read_windows_never_report(impl, device, data):
    """Changing every KV byte no slot reads (holes, gaps, past read_bytes, around the views) causes no report."""
    made, chains, _ = draw_written_world(data, device, impl, avoid_zero=True, mode=2)
    assume(made.world.sources)  # without sources there are no bytes to change
    for layout, source in zip(made.world.sources, made.sources, strict=True):
        outside = st_kv.outside_byte_offsets(layout)
        if outside.size:
            index = torch.from_numpy(outside).to(source.backing.device)
            source.backing[index] = source.backing[index] ^ 0xA5
    batch = data.draw(st_kv.verify_batches(chains, exact=True), label="verify plan")
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
@given(data=st.data())
def test_ring_is_fill_once_and_counts_past_capacity(impl, device, data):
    """Each violation takes the next index; rows below the capacity are stored once, none is overwritten, and the index keeps counting."""
    made, chains, _ = draw_written_world(data, device, impl, avoid_zero=True, batches=1)
    entries = st_kv.plan_for_chains(chains)
    assume(entries)  # at least one entry to report
    before = Snapshot.of_world(made)
    # every entry now fails its position check: one report per entry
    wrong = dataclasses.replace(
        data.draw(st_kv.verify_batches(chains, exact=True), label="verify plan"),
    )
    wrong = dataclasses.replace(
        wrong, expected_positions=tuple(p ^ 1 for p in wrong.expected_positions)
    )
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
@given(data=st.data())
def test_disabled_verify_only_counts_the_launch(impl, device, data):
    """A verify plan with enable == 0 changes nothing but kernel_run_counter, even with entries no buffer has."""
    made, chains, _ = draw_written_world(data, device, impl, batches=1)
    num_slots = made.world.num_slots
    garbage = st.integers(num_slots, num_slots + 2**40) | st.integers(-(2**40), -1)
    cap = data.draw(st.integers(1, 6), label="capacity")
    batch = st_kv.VerifyBatch(
        slots=tuple(data.draw(st.lists(garbage, min_size=cap, max_size=cap), label="slots")),
        expected_tokens=(5,) * cap,
        expected_positions=(7,) * cap,
        prev_slots=tuple(data.draw(st.lists(garbage, min_size=cap, max_size=cap), label="prev")),
        num_valid=data.draw(st.integers(-2, cap + 2), label="num_valid"),
        enable=0,
        check_token=data.draw(st.booleans(), label="check_token"),
    )
    before = Snapshot.of_world(made)
    run_verify(impl, made, batch, device)
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

    @initialize(world=st_kv.canary_worlds(max_slots=24, max_ring=8))
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
        assert_same_state(
            Snapshot.of_world(self.world),
            Snapshot.of_state(self.model),
            index_before=getattr(self, "index_before", 0),
            what=f"after {self.step}",
            config=describe_world(self.world.world),
            repro=story(self.impl, self.device, self.world),
        )


def test_state_machine_of_writes_corruptions_and_verifies(impl, device):
    """Any sequence of writes, corruptions and verifies keeps the implementation's state equal to the reference model's."""
    settings = examples(0.3)
    run_state_machine_as_test(
        lambda: CanaryMachine(impl, device),
        settings=hypothesis.settings(settings, stateful_step_count=8),
    )
