"""The contract at engine scale (CONTRACT §4-§7): long prefills, many requests, big pages and
pools, long verify sweeps.

The other properties draw unit-sized worlds; the bugs that live at real sizes (a program,
chunk or loop boundary, a grid capped at some count, an index kept in too few bits, a
persistent grid's second lap) pass them. Each property here reaches its edges in every
draw, by construction: its sizes come from :func:`strategies.sizes` with a lower bound past
the edge (:data:`conformance.profiles.SCALE_SIZES`), and its first example, the smallest,
already crosses it. Their cost is bounded for the CPU, where Triton's interpreter runs every
program in numpy: few examples (:func:`conformance.profiles.scale_examples`), one long request
rather than many, short read windows over many slots, and verify worlds whose records the
reference lays down (it writes 33,000 entries in half a second; the interpreter would take a
minute). On a GPU the same properties draw at the sizes engines run.

A failure names what differs, at most a few lines of it; the example itself is too large to
print as code, so the message says how to run it again (Hypothesis prints its blob in ``ci``).
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given

import reference
import strategies as st_kv
from conformance import profiles
from conformance.assertions import assert_int64_equal
from conformance.profiles import scale_examples
from conformance.report import rerun_command
from conformance.support import (
    describe_layouts,
    describe_world,
    materialize_all,
    mode_name,
    reference_fingerprint,
    reference_sources,
    slots_tensor,
)
from conformance.write_verify_support import (
    Snapshot,
    assert_same_state,
    flip_spread_records,
    preset_records,
    reference_verify_launch,
    reference_write_launch,
    reported_slots,
    verify_launch,
    write_launch,
)

#: Layout options of every world here: short read windows (at most 32 bytes a token) over
#: many slots, pages up to 256 (non-powers of two among them), memory bounded, and the
#: implementation's rank cap.
_SCALE_LAYOUTS = dict(
    max_page_size=256, max_bytes_per_token=32, max_rows=2**22, max_ndim=profiles.SOURCE_NDIM_MAX
)


def scale_worlds(*, min_slots: int, max_slots: int, **options) -> st.SearchStrategy:
    """Worlds of ``min_slots`` to ``max_slots`` canary slots that read KV bytes, with sources
    of short read windows that address at least that many slots (and at most twice)."""
    return st_kv.canary_worlds(
        min_slots=min_slots,
        max_slots=max_slots,
        reads_kv=True,
        max_sources=2,
        max_capacity=2 * max_slots,
        **{**_SCALE_LAYOUTS, **options},
    )


@dataclasses.dataclass(frozen=True, repr=False)
class ScaleCase:
    """A world, the write launches the implementation runs on it in order, the write whose
    records the reference lays down first (``preset``, or None), and the verify plan run
    last (or None)."""

    world: st_kv.CanaryWorld
    writes: tuple[st_kv.WriteBatch, ...]
    plan: st_kv.VerifyBatch | None
    preset: st_kv.WriteBatch | None = None

    @property
    def chains(self) -> tuple[st_kv.Chain, ...]:
        batches = ((self.preset,) if self.preset else ()) + self.writes
        return tuple(chain for batch in batches for chain in st_kv.chains_written(batch))

    def __repr__(self) -> str:
        # Hypothesis prints a failing example: the batches' entries would be megabytes
        return f"ScaleCase(<{self.sizes()}>, world={self.world!r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis' pretty printer takes a dataclass field by field unless told this way
        printer.text(repr(self))

    def sizes(self) -> str:
        """The case's sizes in one line, for failure messages."""
        parts = [f"{self.world.num_slots} slots, ring of {self.world.ring_capacity}"]
        if self.preset is not None:
            parts.append(f"records of {len(self.preset.token_arrays()[0])} entries preset")
        parts += [
            f"write {k}: {batch.capacity} requests, {len(batch.token_arrays()[0])} entries"
            for k, batch in enumerate(self.writes)
        ]
        if self.plan is not None:
            parts.append(f"verify: {self.plan.capacity} entries")
        return "; ".join(parts)


def _tails(chains) -> tuple[tuple[int, int], ...]:
    return tuple((chain.slots[-1], chain.positions[-1]) for chain in chains)


def _written(chains) -> frozenset[int]:
    return frozenset(slot for chain in chains for slot in chain.slots)


@st.composite
def prefill_cases(draw) -> ScaleCase:
    """One request of 8192+ tokens from the anchor, the next chunk of the same sequence as a
    second launch seeded from its last slot, and the plan verifying every written entry."""
    sizes = profiles.scale_sizes()
    lo, hi = sizes["prefill_tokens"]
    chunk = sizes["chunk_tokens"]
    world = draw(scale_worlds(min_slots=hi + chunk[1] + 8, max_slots=2 * hi), label="world")
    first = draw(
        st_kv.write_batches(world, max_requests=1, max_entries=hi, min_written=lo, seeded=False),
        label="prefill",
    )
    chains = st_kv.chains_written(first)
    longest = max(chains, key=lambda chain: len(chain.slots))
    second = draw(
        st_kv.write_batches(
            world,
            seeds=_tails([longest]),
            avoid=_written(chains),
            max_requests=1,
            max_entries=chunk[1],
            min_written=chunk[0],
            seeded=True,
        ),
        label="next chunk",
    )
    all_chains = chains + st_kv.chains_written(second)
    plan = draw(st_kv.verify_batches(all_chains, exact=True), label="verify plan")
    return ScaleCase(world, (first, second), plan)


@st.composite
def many_request_cases(draw) -> ScaleCase:
    """A launch of 257+ short prefill requests, a decode launch of as many one-token
    requests each continuing one of them, and the plan verifying every written entry."""
    sizes = profiles.scale_sizes()
    lo, hi = sizes["requests"]
    per = sizes["decode_entries"]
    slots = (per + 1) * hi + 8
    world = draw(scale_worlds(min_slots=slots, max_slots=2 * slots), label="world")
    prefill = draw(
        st_kv.write_batches(
            world,
            max_requests=hi,
            min_requests=lo,
            max_entries=per,
            min_written=lo,
            seeded=False,
        ),
        label="prefill requests",
    )
    chains = st_kv.chains_written(prefill)
    decode = draw(
        st_kv.write_batches(
            world,
            seeds=_tails(chains),
            avoid=_written(chains),
            max_requests=hi,
            min_requests=lo,  # a chain may be continued twice: its tail is only read
            max_entries=1,
            min_written=lo,
            seeded=True,
        ),
        label="decode requests",
    )
    all_chains = chains + st_kv.chains_written(decode)
    plan = draw(st_kv.verify_batches(all_chains, exact=True), label="verify plan")
    return ScaleCase(world, (prefill, decode), plan)


@st.composite
def sweep_cases(draw) -> ScaleCase:
    """A world of 2^16+ canary slots and a ring of 1024+ rows, 33,280+ entries of records laid
    down by the reference, and a varied verify plan of 33,280+ entries over them (512+ past a persistent grid's first lap)."""
    sizes = profiles.scale_sizes()
    lo, hi = sizes["sweep_entries"]
    world = draw(
        scale_worlds(
            min_slots=sizes["sweep_slots"][0],
            max_slots=sizes["sweep_slots"][1],
            min_ring=sizes["ring_rows"][0],
            max_ring=sizes["ring_rows"][1],
        ),
        label="world",
    )
    preset = draw(
        st_kv.write_batches(
            world,
            max_requests=64,
            min_requests=32,
            long_requests=32,
            max_entries=-(-hi // 32),
            min_written=lo,
        ),
        label="records",
    )
    chains = st_kv.chains_written(preset)
    plan = draw(st_kv.verify_batches(chains, min_entries=lo, min_checked=1), label="verify plan")
    return ScaleCase(world, (), plan, preset=preset)


@dataclasses.dataclass(frozen=True, repr=False)
class PoolCase:
    """A ``fingerprint`` call on big pages and pools: the layouts (the first with a page of
    65 to 256 slots), slots at every power-of-two edge of the capacity and of the page, mode,
    and whether the sources are layers of one pool."""

    kind: str
    layouts: tuple[st_kv.SourceLayout, ...]
    slots: tuple[int, ...]
    mode: int
    shared: bool

    def __repr__(self) -> str:
        slots = f"<{len(self.slots)} slots up to {max(self.slots)}>"
        return (
            f"PoolCase(kind={self.kind!r}, layouts={self.layouts!r}, slots={slots}, "
            f"mode={self.mode}, shared={self.shared})"
        )

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


#: The pools a fingerprint call reads: one source past 2^20 slots, or up to three past 2^16.
POOL_KINDS = ("one pool past 2^20 slots", "pools past 2^16 slots")


@st.composite
def pool_cases(draw) -> PoolCase:
    """Sources of 2^16+ slots (one draw kind: a single one of 2^20+), the first with a page of
    65 to 256 slots, and slots at every power-of-two edge besides drawn ones."""
    sizes = profiles.scale_sizes()
    kind = draw(st.sampled_from(POOL_KINDS), label="pool kind")
    low, high = sizes["huge_pool_slots" if kind == POOL_KINDS[0] else "pool_slots"]
    options = dict(
        min_capacity=low,
        max_capacity=high,
        max_bytes_per_token=32,
        max_rows=2**22,
        max_page_size=sizes["page_sizes"][1],
        max_ndim=profiles.SOURCE_NDIM_MAX,
    )
    big = draw(
        st_kv.source_layouts(**options, min_page_size=sizes["page_sizes"][0]), label="big pages"
    )
    others = (
        []
        if kind == POOL_KINDS[0]
        else draw(st.lists(st_kv.source_layouts(**options), max_size=2), label="other sources")
    )
    layouts = (big, *others)
    capacity = min(layout.capacity for layout in layouts)
    slots = draw(
        st_kv.slot_indices(
            capacity,
            min_size=sizes["fingerprint_slots"][0],
            max_size=sizes["fingerprint_slots"][1],
            page_size=big.page_size,
            edges=True,
        ),
        label="slots",
    )
    mode = draw(st.sampled_from([2, 1]), label="mode")
    shared = draw(st.booleans(), label="shared pool")
    return PoolCase(kind, layouts, tuple(slots), mode, shared)


# ---------------------------------------------------------------------------------------------
# Running the cases.


def _rerun(test: str, rerun_options: str) -> str:
    """The lines that rerun the property, pasted as printed from the run's folder."""
    return (
        f"    {rerun_command(f'conformance/test_scale.py::{test}', rerun_options)}\n"
        "    # the example is too large to print as code: with --hypothesis-profile ci, "
        "Hypothesis prints the @reproduce_failure blob of this example above"
    )


def _launch(kind: str, impl, made, batch, device, state) -> None:
    """One launch of ``batch`` by the implementation on ``made`` and by the reference on
    ``state`` (none of the suite's logging: these batches are too large to print)."""
    if kind == "write":
        impl.launch_canary_write_kernel(
            context=made.context(impl), **write_launch(impl, batch, device)
        )
        reference.write(state, **reference_write_launch(batch))
    else:
        impl.launch_canary_verify_kernel(
            context=made.context(impl), **verify_launch(impl, batch, device)
        )
        reference.verify(state, **reference_verify_launch(batch))


def run_scale_case(impl, device, case: ScaleCase, *, test: str, rerun_options: str) -> None:
    """Materialise the case's world, lay down its preset records with the reference, run its
    writes and its verify on the implementation and the reference, and after each launch
    require both to hold the same records, ring rows, write index and counters."""
    __tracebackhide__ = True
    made = st_kv.materialize_world(case.world, device)
    if case.preset is not None:
        # the records a long history of writes left: laid down by the reference, so that the
        # implementation under test only verifies them
        records = preset_records(made.reference_state(), case.preset)
        made.canary_buf.copy_(torch.from_numpy(records).to(made.canary_buf.device))
    state = made.reference_state()
    launches = [("write", batch) for batch in case.writes]
    if case.plan is not None:
        launches.append(("verify", case.plan))
    config = describe_world(case.world) + "\n" + case.sizes()
    for step, (kind, batch) in enumerate(launches):
        index_before = int(made.violation_write_index.item())
        faulty = set()
        if kind == "verify" and batch.enable:
            # faults over the whole launch, its last entry included: records both sides hold
            faulty = flip_spread_records(state.canary_buf, np.asarray(batch.slots[: batch.active]))
            made.canary_buf.copy_(torch.from_numpy(state.canary_buf).to(made.canary_buf.device))
        _launch(kind, impl, made, batch, device, state)
        assert reported_slots(state, index_before) >= faulty, (
            "the reference missed a flipped record"
        )
        assert_same_state(
            Snapshot.of_world(made),
            Snapshot.of_state(state),
            index_before=index_before,
            what=f"after launch {step} ({kind} of {batch.capacity} "
            f"{'requests' if kind == 'write' else 'entries'})",
            config=config,
            repro=_rerun(test, rerun_options),
            state=state,
        )


@pytest.mark.write_verify
@scale_examples()
@given(case=prefill_cases())
def test_long_prefill_in_chunks_equals_reference(impl, device, rerun_options, case):
    """A prefill of 8192+ tokens in one request, its next chunk seeded from its last slot, and a verify of every entry leave what the reference leaves."""
    run_scale_case(
        impl,
        device,
        case,
        test="test_long_prefill_in_chunks_equals_reference",
        rerun_options=rerun_options,
    )


@pytest.mark.write_verify
@scale_examples()
@given(case=many_request_cases())
def test_many_requests_in_one_launch_equal_reference(impl, device, rerun_options, case):
    """A write launch of 257+ requests, a decode launch continuing each of them, and a verify of every entry leave what the reference leaves."""
    run_scale_case(
        impl,
        device,
        case,
        test="test_many_requests_in_one_launch_equal_reference",
        rerun_options=rerun_options,
    )


@pytest.mark.write_verify
@scale_examples()
@given(case=sweep_cases())
def test_long_verify_sweep_equals_reference(impl, device, rerun_options, case):
    """A verify sweep of 33,280+ varied entries over a world of 2^16+ slots, with a ring of 1024+ rows, reports exactly what the reference reports."""
    run_scale_case(
        impl,
        device,
        case,
        test="test_long_verify_sweep_equals_reference",
        rerun_options=rerun_options,
    )


@scale_examples(3)
@given(case=pool_cases())
def test_big_pages_and_pools_fingerprint_equals_reference(impl, device, rerun_options, case):
    """fingerprint equals the reference bit for bit on pages of 65 to 256 slots and pools of 2^16+ (and 2^20+) slots, at every power-of-two edge of the capacity and of the page."""
    made = materialize_all(case.layouts, device, shared=case.shared)
    sources = [m.build(impl) for m in made]
    got = impl.fingerprint(sources, slots_tensor(case.slots, device), mode=case.mode)
    want = reference_fingerprint(reference_sources(made), list(case.slots), case.mode)
    pages = ", ".join(f"page {layout.page_size}" for layout in case.layouts)
    assert_int64_equal(
        got,
        want,
        call=f"fingerprint(mode={mode_name(case.mode)}, {len(sources)} sources: {case.kind}, "
        f"{pages}; {len(case.slots)} slots)",
        config=describe_layouts(case.layouts),
        repro=_rerun("test_big_pages_and_pools_fingerprint_equals_reference", rerun_options),
        labels=[f"slot {s}" for s in case.slots],
    )
    assert np.asarray(case.slots).max() < min(layout.capacity for layout in case.layouts)
