"""The plan kernel (CONTRACT §12): an engine's batch made into a verify plan and a write plan,
equal to the reference's, exactly; padding rows, overflow and request order; and the plans it
makes, fed to write and verify over an engine's steps, keep the canary silent until the page
table changes."""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, target

import reference
import strategies as st_kv
from conformance import profiles
from conformance.assertions import fail
from conformance.driver import VERIFY_FIELDS
from conformance.golden.plan_scenarios import engine_scale
from conformance.plan_support import (
    PLAN_FIELDS,
    TableChange,
    assert_plans_equal,
    describe_batch,
    implementation_plan,
    implementation_plans,
    pipeline_steps,
    pipeline_world,
    plan_args,
    plan_host,
    plan_snippet,
    reference_plan,
    run_pipeline,
    write_arrays,
)
from conformance.profiles import examples
from conformance.write_verify_support import (
    Snapshot,
    assert_same_state,
    flip_spread_records,
    launch_rows,
    reported_slots,
)
from strategies.batches import EngineBatch, RowSpec, engine_batches

pytestmark = pytest.mark.plan


def batch_sizes() -> dict:
    """Rows per batch and tokens per row a property draws on this run's device."""
    if profiles.ON_CPU:
        return dict(max_reqs=6, max_context_len=24)
    return dict(max_reqs=64, max_context_len=512)


def check_plan(impl, impl_name, device, batch: EngineBatch, call: str) -> dict:
    """The implementation's plans for ``batch`` equal the reference's; returns them."""
    __tracebackhide__ = True
    args = plan_args(batch)
    got = implementation_plan(impl, args, device)
    want = reference_plan(args)
    assert_plans_equal(
        got, want, call=call, batch=batch, repro=plan_snippet(impl_name, device, batch)
    )
    return got


@examples(0.5)
@given(batch=engine_batches(**batch_sizes()))
def test_plan_equals_reference(impl, impl_name, device, batch):
    """Both plans equal the reference's, field by field, for every batch an engine can make."""
    target(float(batch.total_verify()), label="verify entries")
    check_plan(impl, impl_name, device, batch, "launch_canary_plan_kernels")


@examples(0.3)
@given(batch=engine_batches(**batch_sizes(), overflow=True))
def test_overflow_disables_the_plan_and_leaves_its_entries_untouched(
    impl, impl_name, device, batch
):
    """A batch needing more entries than the capacity gives enable 0, num_valid = capacity, and
    no entry written; the write plan is made all the same."""
    got = check_plan(impl, impl_name, device, batch, "launch_canary_plan_kernels (overflow)")
    args = plan_args(batch)
    for (plan, name), value in got.items():
        if plan == "verify" and value.shape[0] > 1:
            if (value != args.verify[name]).any():
                fail(f"an overflowing plan wrote {name} (CONTRACT §12 item 4)")
    assert int(got["verify", "enable"][0]) == 0
    assert int(got["verify", "verify_num_valid"][0]) == batch.verify_capacity


@examples(0.3)
@given(batch=engine_batches(**batch_sizes(), overflow=False), data=st.data())
def test_a_padding_row_contributes_nothing_wherever_it_stands(impl, impl_name, device, batch, data):
    """Inserting a padding row with stale lengths anywhere leaves the verify plan as it was, and
    the write plan gains only an empty request with seed -1 at that place."""
    if batch.bs >= reference.MAX_PLAN_REQS:
        return
    at = data.draw(st.integers(0, batch.bs), label="padding row at")
    stale = st.integers(-3, batch.context_len + 3)
    row = RowSpec("padding", 0, data.draw(stale), data.draw(stale), data.draw(stale))
    padded = dataclasses.replace(
        batch,
        rows=batch.rows[:at] + (row,) + batch.rows[at:],
        write_req_capacity=batch.write_req_capacity + 1,
    )
    before = implementation_plan(impl, plan_args(batch), device)
    after = implementation_plan(impl, plan_args(padded), device)
    problems = [
        f"{name} changed: {before[plan, name].tolist()[:8]} -> {after[plan, name].tolist()[:8]}"
        for plan, name in PLAN_FIELDS
        if plan == "verify" and not np.array_equal(before[plan, name], after[plan, name])
    ]
    offsets_b = before["write", "write_offsets"][: batch.bs + 1]
    offsets_a = after["write", "write_offsets"][: padded.bs + 1]
    if not np.array_equal(offsets_a, np.insert(offsets_b, at, offsets_b[at])):
        problems.append(f"write_offsets {offsets_b.tolist()} -> {offsets_a.tolist()}")
    seeds_b = before["write", "write_seed_slot_indices"][: batch.bs]
    seeds_a = after["write", "write_seed_slot_indices"][: padded.bs]
    if not np.array_equal(seeds_a, np.insert(seeds_b, at, -1)):
        problems.append(f"write_seed_slot_indices {seeds_b.tolist()} -> {seeds_a.tolist()}")
    if int(after["write", "write_num_valid_reqs"][0]) != padded.bs:
        problems.append(f"write_num_valid_reqs {int(after['write', 'write_num_valid_reqs'][0])}")
    if problems:
        fail(
            f"a padding row ({row}) inserted at {at} changed the plans (CONTRACT §12 item 1):\n  "
            + "\n  ".join(problems),
            config=describe_batch(batch),
        )


@examples(0.3)
@given(batch=engine_batches(**batch_sizes(), overflow=False), data=st.data())
def test_permuting_the_requests_permutes_the_entries(impl, impl_name, device, batch, data):
    """The batch in another row order gives the same entries per request, in the new order, and
    the same write lengths and seeds per request."""
    order = data.draw(st.permutations(range(batch.bs)), label="row order")
    moved = dataclasses.replace(batch, rows=tuple(batch.rows[i] for i in order))
    before = implementation_plan(impl, plan_args(batch), device)
    after = implementation_plan(impl, plan_args(moved), device)

    def per_request(got, b: EngineBatch) -> dict:
        n = int(got["verify", "verify_num_valid"][0])
        a = b.arrays()
        entries = b.entries()
        owner = a.req_pool_indices[entries.rows[:n]]
        fields = [got["verify", name][:n] for name in
                  ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                   "verify_prev_slot_indices")]  # fmt: skip
        result: dict = {}
        for i, rp in enumerate(owner.tolist()):
            result.setdefault(rp, []).append(tuple(int(f[i]) for f in fields))
        offsets = got["write", "write_offsets"]
        for r, spec in enumerate(b.rows):
            if spec.kind != "padding":
                width = int(offsets[r + 1] - offsets[r])
                result[("write", spec.pool_row)] = (
                    width,
                    int(got["write", "write_seed_slot_indices"][r]),
                )
        return result

    if per_request(before, batch) != per_request(after, moved):
        fail(
            f"the batch in row order {list(order)} planned other entries or writes per request "
            "(CONTRACT §12 item 2)",
            config=describe_batch(batch),
        )


def live_positions(batch: EngineBatch) -> list[tuple[int, int]]:
    """``(pool row, position)`` of every position the last pipeline step verifies."""
    prefix, _ = pipeline_steps(batch)[2]
    starts = reference.window_starts(prefix, batch.swa_window)
    return [
        (spec.pool_row, pos)
        for r, spec in enumerate(batch.rows)
        if spec.kind != "padding"
        for pos in range(int(starts[r]), int(prefix[r]))
    ]


def pipeline_batches():
    return engine_batches(**batch_sizes(), overflow=False).filter(lambda b: bool(live_positions(b)))


def what(step, launch) -> str:
    names = ("prefill", "the batch's step", "decode")
    return f"after the {launch} of {names[step] if isinstance(step, int) else step}"


@examples(0.2)
@given(batch=pipeline_batches())
def test_plan_write_verify_over_an_engines_steps_is_clean(impl, impl_name, device, batch):
    """Scatter, then plan, verify and write over prefill, the batch's step and a decode: the
    implementation holds the reference's state after every launch, and no violation is stored."""
    state, _ = run_pipeline(impl, device, batch, what=what)
    if int(state.violation_write_index[0]) != 0:
        rows = launch_rows(state.violation_ring, 0, int(state.violation_write_index[0]))
        fail(f"a correct engine history raised violations: {rows.tolist()[:4]}")


@examples(0.2)
@given(batch=pipeline_batches(), data=st.data())
def test_a_changed_page_table_entry_is_reported_as_the_reference_predicts(
    impl, impl_name, device, batch, data
):
    """A req_to_token entry pointed at another written slot between two steps is reported by
    the next verify, at the slots and with the reasons the reference gives."""
    live = live_positions(batch)
    row, position = data.draw(st.sampled_from(live), label="changed entry")
    # another position: the entry's stored position then always differs (two chain heads
    # swapped at position 0, tokens unchecked, are alike to the canary)
    others = [p for p in live if p[1] != position]
    if not others:
        return
    other_row, other_position = data.draw(st.sampled_from(others), label="now pointing at")
    change = TableChange(row, position, other_row, other_position)
    state, since = run_pipeline(impl, device, batch, change=change, what=what)
    reported = launch_rows(state.violation_ring, since, int(state.violation_write_index[0]))
    # the reference must see it for the property to say anything: the entry now names a slot
    # whose record is another position's
    if int(state.violation_write_index[0]) == since:
        fail(f"the reference reported no violation for {change}", config=describe_batch(batch))
    assert reported.shape[0] >= 1


def test_an_engine_scale_plan_feeds_one_verify_launch(impl, impl_name, device):
    """The 4096-row batch with a prefix of 8200 tokens (70,000+ entries, past 2^16): its plan
    equals the reference's, and one verify launch of it, over records the reference wrote with
    records flipped at entries spread over the whole plan (the first and the last among them), reports what the reference reports and leaves the reference's state: a
    verify that stops reading before the end misses the last faults."""
    batch = engine_scale()
    a = batch.arrays()
    made = st_kv.materialize_world(pipeline_world(batch), device)
    state = made.reference_state()
    # the prefixes, written by the reference and handed to the implementation's buffer
    prefix, extend = pipeline_steps(batch)[0]
    pre = plan_args(dataclasses.replace(batch, verify_capacity=1))
    write_pre = reference.WritePlan(**pre.write)
    reference.plan(
        reference.VerifyPlan(**pre.verify), write_pre,
        **{**pre.inputs, "prefix_lens": prefix, "extend_seq_lens": extend, "verify_capacity": 1},
    )  # fmt: skip
    ids, positions, slots = write_arrays(batch, a.req_to_token, None, prefix, extend)
    reference.write(
        state, write_pre, input_ids=ids, positions=positions, out_cache_loc=slots,
        enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None,
    )  # fmt: skip
    want = reference_plan(args := plan_args(batch))
    count = int(want["verify", "verify_num_valid"][0])
    faulty = flip_spread_records(state.canary_buf, want["verify", "verify_slot_indices"][:count])
    made.canary_buf.copy_(torch.from_numpy(state.canary_buf))
    made.slot_run_counter.copy_(torch.from_numpy(state.slot_run_counter))
    made.kernel_run_counter.copy_(torch.from_numpy(state.kernel_run_counter))

    verify, write = implementation_plans(impl, args, device)
    impl.launch_canary_plan_kernels(
        verify_plan_out=verify, write_plan_out=write, **args.tensors(device)
    )
    assert_plans_equal(
        plan_host(verify, write), want, call="launch_canary_plan_kernels (engine scale)",
        batch=batch, repro=plan_snippet(impl_name, device, batch),
    )  # fmt: skip
    assert int(want["verify", "verify_num_valid"][0]) > 2**16
    since = int(state.violation_write_index[0])
    impl.launch_canary_verify_kernel(
        context=made.context(impl), plan=verify, check_verify_expected_token=True
    )
    reference.verify(
        state, reference.VerifyPlan(**{name: want["verify", name] for name in VERIFY_FIELDS}),
        check_verify_expected_token=True,
    )  # fmt: skip
    # before the comparison, which gives the reference the implementation's ring
    assert reported_slots(state, since) >= faulty, "the reference missed a flipped record"
    assert_same_state(
        Snapshot.of_world(made), Snapshot.of_state(state), index_before=since,
        what="verify of the engine-scale plan", config=describe_batch(batch), state=state,
    )  # fmt: skip
