"""fingerprint (CONTRACT §4) against the reference, and the properties of its read window."""

from __future__ import annotations

import re

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import example, given, target

import reference
import strategies as st_kv
from conformance import profiles
from conformance.assertions import assert_int64_equal, fail, to_numpy
from conformance.profiles import examples
from conformance.support import (
    describe_layouts,
    fingerprint_repro,
    materialize_all,
    mode_name,
    reference_fingerprint,
    reference_sources,
    same_device,
    slots_tensor,
)


def assert_error_type(caught, expected: type) -> None:
    """The error ``pytest.raises(Exception)`` caught is exactly the contract's ``expected`` type: any
    other one fails the property (with an assertion, not by escaping as a crash)."""
    __tracebackhide__ = True
    got = caught.value
    assert type(got) is expected, (
        f"raised {type(got).__name__}: {got}, but CONTRACT §4 gives {expected.__name__}"
    )


def refuses_nothing(call, what: str):
    """``call()``, where the contract says no launch check applies: raising fails the property."""
    __tracebackhide__ = True
    try:
        return call()
    except Exception as error:  # any refusal breaks the property
        fail(f"{what} raised {type(error).__name__}: {error}, but CONTRACT §4 refuses nothing here")


def draw_case(data, *, min_sources=0, max_sources=4, modes=None, **layout_kwargs):
    """Draw sources, slots in range of all of them, a mode, and whether they share one pool."""
    case = data.draw(
        st_kv.fingerprint_cases(
            min_sources=min_sources,
            max_sources=max_sources,
            modes=modes,
            max_slots=profiles.max_slots(),
            **{**profiles.layout_sizes(), **layout_kwargs},
        ),
        label="case",
    )
    return case.layouts, list(case.slots), case.mode, case.shared


def reading_cases(**layout_kwargs) -> st.SearchStrategy[st_kv.FingerprintCase]:
    """``fingerprint`` calls where a wrong hash can show: at least one source, at least one
    slot, and a mode that reads (PARTIAL or ALL). Mode NONE and empty calls have a property of
    their own (``test_none_and_no_sources_read_nothing``); drawn here, 69 of 100 draws of the
    main property had nothing to get wrong."""

    @st.composite
    def build(draw) -> st_kv.FingerprintCase:
        layouts = draw(st_kv.source_tuples(min_sources=1, max_sources=4, **layout_kwargs))
        capacity = min(layout.capacity for layout in layouts)  # >= 1 for every drawn source
        slots = draw(
            st_kv.slot_indices(
                capacity,
                min_size=1,
                max_size=profiles.max_slots(),
                page_size=layouts[0].page_size,
                long_size=profiles.long_slots(),
            )
        )
        mode = draw(st.sampled_from([1, 2]))
        shared = draw(st.booleans())
        return st_kv.FingerprintCase(tuple(layouts), tuple(slots), mode, shared)

    return build()


def run_both(impl, impl_name, device, layouts, slots, mode, shared):
    """Run the implementation and the reference on one case; compare bit for bit."""
    __tracebackhide__ = True
    materialized = materialize_all(layouts, device, shared=shared)
    sources = [m.build(impl) for m in materialized]
    storages = [storage_of(m.tensor) for m in materialized]
    got = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    for i, (m, storage) in enumerate(zip(materialized, storages, strict=True)):
        after = storage_of(m.tensor)
        assert after == storage, (
            f"fingerprint moved or resized source {i}'s storage: {storage[1]} bytes at "
            f"{storage[0]:#x} before, {after[1]} bytes at {after[0]:#x} after; a launch reads "
            "its sources where they are"
        )
    want = reference_fingerprint(reference_sources(materialized), slots, mode)
    assert_int64_equal(
        got,
        want,
        call=f"fingerprint(mode={mode_name(mode)}, {len(sources)} sources)",
        config=describe_layouts(layouts),
        repro=fingerprint_repro(impl_name, device, layouts, slots, mode, shared=shared),
        labels=[f"slot {s}" for s in slots],
    )
    assert same_device(got.device, device), f"fingerprint returned a tensor on {got.device}"
    return materialized, sources, got


def storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    """Where the storage behind ``tensor`` is, and how many bytes it holds."""
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _layout(**fields) -> st_kv.SourceLayout:
    """Three rows of three 32-byte tokens (seed 7) but for ``fields``, within the
    implementation's declared source rank (CANARY_CAPABILITIES), same bytes."""
    fixed = st_kv.layout(**{"rows": 3, "page_size": 3, "seed": 7, **fields})
    return st_kv.fit_source_ndim(fixed, profiles.SOURCE_NDIM_MAX)


#: bf16 [3, 2, 48] rows (page 2, 64 B/token, read 48) with a hole, a gap and an offset.
_BF16_ROWS = dict(dtype="bfloat16", rows=3, row_shape=(2, 48), page_size=2, num_bytes_per_token=64)
BF16_HOLE_GAP_OFFSET = st_kv.layout(
    **_BF16_ROWS, read_bytes=48, hole_bytes=64, gap_bytes=64, offset_bytes=48, tail_bytes=5, seed=7
)


# Pinned cases, each aimed at a bug of CONTRACT §9 that random draws find only now and then.
PAGE_MAPPING = st_kv.FingerprintCase(  # row = s // page_size, not s % page_size
    layouts=(_layout(),), slots=(0, 1, 2, 3, 4, 5, 8, 7), mode=2
)
ROW_STRIDE_NOT_SHAPE = st_kv.FingerprintCase(  # bf16 [3, 2, 48] rows with a hole, a gap, an offset
    layouts=(st_kv.fit_source_ndim(BF16_HOLE_GAP_OFFSET, profiles.SOURCE_NDIM_MAX),),
    slots=(5, 4, 3, 2, 1, 0),
    mode=2,
)
FOUR_SOURCES_IN_ORDER = st_kv.FingerprintCase(  # four layers of one pool, combined in tuple order
    layouts=tuple(
        _layout(seed=seed, dtype=dtype)
        for seed, dtype in enumerate(("uint8", "int8", "int32", "int64"))
    ),
    slots=(8, 0, 4),
    mode=1,
    shared=True,
)

PARTIAL_IS_16_BYTES = st_kv.FingerprintCase(  # one non-zero byte at the start of a 64-byte window
    layouts=(_layout(num_bytes_per_token=64, fill="first"),),
    slots=(0, 1, 2, 6),
    mode=1,
)
LAST_READ_BYTE = st_kv.FingerprintCase(  # ALL must read up to read_bytes, not num_bytes_per_token
    layouts=(_layout(num_bytes_per_token=64, read_bytes=48, fill="last"),),
    slots=(1, 2, 3),
    mode=2,
)


@examples(1.0)
@given(case=reading_cases(fills=st_kv.FILLS, **profiles.layout_sizes()))
@example(case=PAGE_MAPPING)
@example(case=ROW_STRIDE_NOT_SHAPE)
@example(case=FOUR_SOURCES_IN_ORDER)
@example(case=PARTIAL_IS_16_BYTES)
@example(case=LAST_READ_BYTE)
def test_fingerprint_equals_reference(impl, impl_name, device, case):
    """fingerprint equals the reference bit for bit on every generated layout, slot set and reading mode."""
    # steer long runs towards many slots over many sources: more ways to misaddress
    target(float(len(case.slots) * max(len(case.layouts), 1)), label="slots x sources")
    run_both(impl, impl_name, device, case.layouts, case.slots, case.mode, case.shared)


@examples(0.5)
@given(data=st.data())
def test_one_read_word_changes_only_its_slot(impl, impl_name, device, data):
    """Changing one byte of one read word changes that slot's hash and no other slot's."""
    layouts, slots, mode, shared = draw_case(
        data, min_sources=1, modes=st.sampled_from([1, 2]), min_capacity=1
    )
    materialized, sources, before = run_both(
        impl, impl_name, device, layouts, slots or [0], mode, shared
    )
    slots = slots or [0]
    which = data.draw(st.integers(0, len(layouts) - 1), label="source")
    slot = data.draw(st.sampled_from(slots), label="slot")
    window = st_kv.window_byte_offsets(layouts[which], slot, mode)
    offset = int(data.draw(st.sampled_from(list(window)), label="byte"))
    flip = data.draw(st.integers(1, 255), label="xor")
    backing = materialized[which].backing
    backing[offset] ^= flip
    after = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    want = reference_fingerprint(reference_sources(materialized), slots, mode)
    config = describe_layouts(layouts) + f"; byte {offset} of source {which} ^= {flip:#x}"
    assert_int64_equal(after, want, call="fingerprint after a write", config=config)
    changed = to_numpy(after) != to_numpy(before)
    is_slot = np.asarray(slots) == slot
    if not changed[is_slot].all() or changed[~is_slot].any():
        fail(
            f"changing a byte read by slot {slot} changed the hash of slots "
            f"{sorted(set(np.asarray(slots)[changed].tolist()))}, expected exactly [{slot}]",
            config=config,
        )


@examples(0.5)
@given(data=st.data())
def test_bytes_outside_the_read_window_change_nothing(impl, impl_name, device, data):
    """Holes, row gaps, bytes past read_bytes (past 16 in PARTIAL) and bytes around the view never change a hash."""
    layouts, slots, mode, shared = draw_case(data, min_sources=1, modes=st.sampled_from([1, 2]))
    materialized, sources, before = run_both(impl, impl_name, device, layouts, slots, mode, shared)
    touched = 0
    for layout, m in zip(layouts, materialized):
        outside = st_kv.outside_byte_offsets(layout)
        if mode == 1 and layout.capacity:
            # in PARTIAL mode the bytes of a slot past its first 16 are outside too
            starts = st_kv.slot_window_starts(layout)
            past16 = (starts[:, None] + np.arange(16, layout.read_bytes)).ravel()
            outside = np.concatenate([outside, past16])
        if outside.size:
            index = torch.from_numpy(outside).to(m.backing.device)
            m.backing[index] = m.backing[index] ^ 0x5A
            touched += outside.size
    after = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    assert_int64_equal(
        after,
        to_numpy(before),
        call=f"fingerprint after changing {touched} bytes outside every read window",
        config=describe_layouts(layouts),
        repro=fingerprint_repro(impl_name, device, layouts, slots, mode, shared=shared),
    )


@examples(0.5)
@given(data=st.data())
def test_source_order_matters(impl, impl_name, device, data):
    """Reversing the sources gives the reference's hash of the reversed tuple, which differs where the sources differ."""
    layouts, slots, mode, _ = draw_case(
        data, min_sources=2, modes=st.sampled_from([1, 2]), min_capacity=1
    )
    slots = slots or [0]
    materialized = materialize_all(layouts, device, shared=True)  # per-layer bytes differ
    sources = [m.build(impl) for m in materialized]
    refs = reference_sources(materialized)
    forward = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    backward = impl.fingerprint(sources[::-1], slots_tensor(slots, device), mode=mode)
    config = describe_layouts(layouts)
    assert_int64_equal(
        forward, reference_fingerprint(refs, slots, mode), call="fingerprint", config=config
    )
    assert_int64_equal(
        backward,
        reference_fingerprint(refs[::-1], slots, mode),
        call="fingerprint(sources[::-1])",
        config=config,
    )
    if (to_numpy(forward) == to_numpy(backward)).any():
        fail(
            "reversing two sources with different bytes left a slot's hash unchanged", config=config
        )


@examples(0.5)
@given(data=st.data())
def test_partial_is_all_at_read_16(impl, device, data):
    """PARTIAL hashes equal ALL hashes of the same tensors declared with read_bytes=16."""
    layouts, slots, _, shared = draw_case(data, min_sources=1, min_capacity=1)
    materialized = materialize_all(layouts, device, shared=shared)
    partial = impl.fingerprint(
        [m.build(impl) for m in materialized],
        slots_tensor(slots, device),
        mode=impl.RealKvHashMode.PARTIAL,
    )
    read16 = [
        impl.RealKvSource(tensor=m.tensor, **{**m.kwargs(), "read_bytes": 16}) for m in materialized
    ]
    full16 = impl.fingerprint(read16, slots_tensor(slots, device), mode=impl.RealKvHashMode.ALL)
    assert_int64_equal(
        partial,
        to_numpy(full16),
        call="fingerprint(PARTIAL) vs ALL at read_bytes=16",
        config=describe_layouts(layouts),
    )
    if layouts and all(layout.read_bytes == 16 for layout in layouts):
        all_mode = impl.fingerprint(
            [m.build(impl) for m in materialized],
            slots_tensor(slots, device),
            mode=impl.RealKvHashMode.ALL,
        )
        assert_int64_equal(all_mode, to_numpy(partial), call="ALL vs PARTIAL at read_bytes=16")


@examples(0.5)
@given(data=st.data())
def test_none_and_no_sources_read_nothing(impl, device, data):
    """Mode NONE and an empty source tuple give 0 for every slot, even slots no source has."""
    layouts, slots, _, _ = draw_case(data)
    stray = data.draw(
        st.lists(st.integers(-(2**40), 2**40), max_size=4), label="slots outside every source"
    )
    materialized = materialize_all(layouts, device)
    sources = [m.build(impl) for m in materialized]
    everything = slots_tensor(list(slots) + stray, device)
    zeros = np.zeros(len(slots) + len(stray), dtype=np.int64)
    assert_int64_equal(
        refuses_nothing(
            lambda: impl.fingerprint(sources, everything, mode=impl.RealKvHashMode.NONE),
            "fingerprint(mode=NONE)",
        ),
        zeros,
        call="fingerprint(mode=NONE)",
        config=describe_layouts(layouts),
    )
    inside = slots_tensor(slots, device)
    for mode in (0, 1, 2):
        assert_int64_equal(
            refuses_nothing(
                lambda mode=mode: impl.fingerprint([], inside, mode=mode),
                f"fingerprint([], mode={mode})",
            ),
            np.zeros(len(slots), dtype=np.int64),
            call=f"fingerprint([], mode={mode_name(mode)})",
        )


@examples(0.5)
@given(data=st.data())
def test_dtype_does_not_matter(impl, device, data):
    """The same bytes hash the same whichever dtype the source tensor views them as."""
    layouts, slots, mode, _ = draw_case(
        data, min_sources=1, max_sources=2, modes=st.sampled_from([1, 2]), min_capacity=1
    )
    materialized = materialize_all(layouts, device)
    base = impl.fingerprint(
        [m.build(impl) for m in materialized], slots_tensor(slots, device), mode=mode
    )
    as_dtype = data.draw(
        st.sampled_from([torch.uint8, torch.int8, torch.float16, torch.int32, torch.int64]),
        label="view dtype",
    )
    views = []
    for m in materialized:
        last = m.tensor.shape[-1] * m.tensor.element_size()
        if last % as_dtype.itemsize:
            as_dtype = torch.uint8  # the row's last dim must split into whole elements
        views.append(m.tensor.view(torch.uint8).view(as_dtype))
    sources = [impl.RealKvSource(tensor=v, **m.kwargs()) for v, m in zip(views, materialized)]
    again = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    call = f"fingerprint of the same bytes viewed as {as_dtype}"
    assert_int64_equal(again, to_numpy(base), call=call, config=describe_layouts(layouts))


@examples(0.5)
@given(data=st.data())
def test_hash_follows_the_live_tensor(impl, device, data):
    """Writing to the tensor after the source is built changes the hash: the source is not a snapshot."""
    layouts, slots, mode, shared = draw_case(
        data, min_sources=1, modes=st.sampled_from([1, 2]), min_capacity=1
    )
    slots = slots or [0]
    materialized = materialize_all(layouts, device, shared=shared)
    sources = [m.build(impl) for m in materialized]
    before = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    for m in materialized:  # a new KV write into the pool, through the pool's own tensor
        m.tensor.view(torch.uint8).add_(1)
    after = impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    assert_int64_equal(
        after,
        reference_fingerprint(reference_sources(materialized), slots, mode),
        call="fingerprint after writing the pool",
        config=describe_layouts(layouts),
    )
    if (to_numpy(after) == to_numpy(before)).any():
        fail("a slot's hash did not follow a write to its bytes", config=describe_layouts(layouts))


def test_a_source_whose_storage_starts_at_an_odd_address(impl, device):
    """A 16-byte aligned view whose storage begins 15 bytes before it, at an odd address (a KV
    pool carved out of a buffer that is not word-aligned): every slot hashes as the reference
    says, in modes PARTIAL and ALL. Only host memory can be placed so (``torch.frombuffer``);
    GPU allocations are always aligned."""
    if device.type != "cpu":
        pytest.skip("an odd storage address is made from host memory only")
    rows, row_bytes = 3, 256
    buffer = bytearray(rows * row_bytes + 64)
    base = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    storage = torch.frombuffer(buffer, dtype=torch.uint8, offset=(1 - base) % 16)
    view = storage[15 : 15 + rows * row_bytes].view(rows, row_bytes)
    assert storage.data_ptr() % 16 == 1 and view.data_ptr() % 16 == 0
    view.copy_(
        torch.arange(7, 7 + rows * row_bytes, dtype=torch.int64)
        .remainder(251)
        .add(1)
        .view(rows, -1)
    )
    kwargs = {"page_size": 2, "num_bytes_per_token": 128, "read_bytes": 64}
    source = impl.RealKvSource(tensor=view, **kwargs)
    reference_source = reference.Source(data=view.numpy().copy(), **kwargs)
    slots = list(range(rows * 2))
    for mode in (1, 2):
        got = impl.fingerprint([source], slots_tensor(slots, device), mode=mode)
        assert_int64_equal(
            got,
            reference_fingerprint([reference_source], slots, mode),
            call=f"fingerprint(mode={mode_name(mode)}) of a source in an odd-address storage",
            labels=[f"slot {s}" for s in slots],
        )


def _far_source(impl, device, *, gap: int):
    """A source whose rows lie ``gap`` bytes apart inside one large, lazily allocated buffer.

    The view starts ``2**31 + 64`` bytes into the buffer, so an implementation that wraps
    addresses to 32 bits reads other (zero) bytes of the same buffer rather than faulting.
    """
    start = 2**31 + 64
    rows, row_bytes = 3, 256
    total = start + (rows - 1) * gap + row_bytes + 4096
    raw = torch.empty(total, dtype=torch.uint8, device=device)
    view = torch.as_strided(raw, (rows, row_bytes), (gap, 1), start)
    fill = torch.arange(1, rows * row_bytes + 1, dtype=torch.int64).remainder(251).add(1)
    view.copy_(fill.to(torch.uint8).reshape(rows, row_bytes))
    return (
        raw,
        view,
        impl.RealKvSource(tensor=view, page_size=2, num_bytes_per_token=128, read_bytes=128),
    )


# N-D sources, whatever rank the implementation declares: CONTRACT §3 reads a row as its bytes.
ND_ROWS = {
    "bf16 [3, 2, 48], hole, gap, offset": BF16_HOLE_GAP_OFFSET,
    "fp16 [2, 2, 2, 32]": st_kv.layout(
        dtype="float16", rows=2, row_shape=(2, 2, 32), page_size=4, num_bytes_per_token=64, seed=11
    ),
    "int32 [3, 1, 48]": st_kv.layout(
        dtype="int32",
        rows=3,
        row_shape=(1, 48),
        page_size=3,
        num_bytes_per_token=64,
        read_bytes=48,
        offset_bytes=16,
        tail_bytes=3,
        seed=12,
    ),
}


@pytest.mark.parametrize("mode", [1, 2], ids=["PARTIAL", "ALL"])
@pytest.mark.parametrize("name", list(ND_ROWS))
def test_nd_rows_hash_as_their_bytes(impl, impl_name, device, name, mode):
    """An N-D source (dense rows) hashes like the reference, i.e. like its rows' bytes."""
    layout = ND_ROWS[name]
    slots = list(range(layout.capacity))[::-1]
    run_both(impl, impl_name, device, (layout,), slots, mode, False)


@pytest.mark.parametrize(
    "gap", [2**31 + 16, 2**32 + 16], ids=["rows 2^31 apart", "rows 2^32 apart"]
)
def test_addresses_past_2_to_the_31_and_32(impl, device, gap):
    """A source whose byte offsets pass 2^31 and 2^32 hashes like the reference (64-bit addressing)."""
    import reference

    raw, view, source = _far_source(impl, device, gap=gap)
    slots = [0, 1, 2, 3, 4, 5]
    got = impl.fingerprint([source], slots_tensor(slots, device), mode=impl.RealKvHashMode.ALL)
    host_rows = view.cpu().numpy()
    want = reference.fingerprint(
        [reference.Source(host_rows, 2, 128, 128)], np.asarray(slots, dtype=np.int64), 2
    )
    assert_int64_equal(got, want, call=f"fingerprint with rows {gap} bytes apart")
    del raw


def test_launch_checks_source_cap(impl, device):
    """More than 4 sources raise CONTRACT §4's ValueError in every mode, even with no slots."""
    source = st_kv.materialize(st_kv.layout(rows=1), device).build(impl)
    for count in (5, 6):
        for mode in (0, 1, 2):
            for slots in ([], [0]):
                with pytest.raises(Exception) as caught:
                    impl.fingerprint([source] * count, slots_tensor(slots, device), mode=mode)
                assert_error_type(caught, ValueError)
                assert str(caught.value) == (
                    f"kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got {count}"
                )


def test_launch_checks_source_cap_comes_first(impl, device):
    """With more than 4 sources the cap error wins over every other launch check (a source on another device)."""
    here = torch.zeros(2, 64, dtype=torch.uint8, device=device)
    elsewhere = torch.zeros(2, 64, dtype=torch.uint8, device="meta")
    sources = [
        impl.RealKvSource(tensor=t, page_size=2, num_bytes_per_token=32, read_bytes=32)
        for t in (here, here, elsewhere, here, here)
    ]
    for slots in ([], [0, 99]):
        with pytest.raises(Exception) as caught:
            impl.fingerprint(sources, slots_tensor(slots, device), mode=impl.RealKvHashMode.ALL)
        assert_error_type(caught, ValueError)
        assert str(caught.value) == (
            "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"
        )


def test_launch_checks_device(impl, device):
    """A source on another device than slot_indices raises ValueError naming the source index and both devices."""
    here = torch.zeros(2, 64, dtype=torch.uint8, device=device)
    elsewhere = torch.zeros(2, 64, dtype=torch.uint8, device="meta")
    sources = [
        impl.RealKvSource(tensor=t, page_size=2, num_bytes_per_token=32, read_bytes=32)
        for t in (here, elsewhere)
    ]
    here_name = str(torch.device(device))
    for slots in ([], [0, 1]):
        with pytest.raises(Exception) as caught:
            impl.fingerprint(sources, slots_tensor(slots, device), mode=impl.RealKvHashMode.ALL)
        assert_error_type(caught, ValueError)
        message = str(caught.value)
        assert re.search(r"(real_kv_sources\[1\]|\bsource 1)(?!\d)", message), (
            f"{message!r} does not name source 1"
        )
        # whole device names: "cpu" must not be found inside another word
        for name in ("meta", here_name):
            assert re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", message), (
                f"{message!r} does not name device {name!r}"
            )


@examples(0.5)
@given(data=st.data())
def test_launch_checks_slot_range(impl, device, data):
    """In PARTIAL and ALL a slot outside [0, rows*page_size) of any source raises IndexError naming slot, source and capacity."""
    layouts = data.draw(
        st_kv.source_tuples(min_sources=1, max_sources=4, **profiles.layout_sizes()),
        label="layouts",
    )
    capacities = [layout.capacity for layout in layouts]
    bad = data.draw(
        st.one_of(
            st.sampled_from([-1, min(capacities)]),  # the first slots past either end
            st.integers(-(2**40), -1),
            st.integers(min(capacities), max(capacities) + 2**40),
        ),
        label="bad slot",
    )
    first = next(i for i, c in enumerate(capacities) if not 0 <= bad < c)
    # slots valid in every source beside it (0 or not): the message must name the bad slot,
    # not whichever is the lowest or the highest of the tensor
    valid = st.integers(0, min(capacities) - 1) if min(capacities) else st.nothing()
    good = data.draw(st.lists(valid, max_size=3), label="good slots")
    slots = data.draw(st.permutations([*good, bad]), label="slots")
    mode = data.draw(st.sampled_from([1, 2]), label="mode")
    sources = [st_kv.materialize(layout, device).build(impl) for layout in layouts]
    with pytest.raises(Exception) as caught:
        impl.fingerprint(sources, slots_tensor(slots, device), mode=mode)
    assert_error_type(caught, IndexError)
    message = str(caught.value)
    # whole numbers: slot 4 must not be found inside "40", nor capacity 8 inside "-8"
    for what in (str(bad), str(capacities[first])):
        assert re.search(rf"(?<![\w-]){re.escape(what)}(?!\d)", message), (
            f"IndexError {message!r} does not name {what}"
        )
    assert re.search(rf"(real_kv_sources\[{first}\]|\bsource {first})(?!\d)", message), (
        f"IndexError {message!r} does not name source {first}"
    )


#: Every integer dtype a slot tensor may have (CONTRACT §11), narrow and unsigned ones too.
SLOT_DTYPES = (
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64,
)  # fmt: skip


def slot_edges(dtype: torch.dtype, capacity: int) -> list[int]:
    """Out-of-range slots of ``dtype`` where a cast shows: its extremes, and the first values
    that a cast to int64 or int32 turns negative or small."""
    info = torch.iinfo(dtype)
    edges = {info.min, info.max, -1, capacity, 2**31, 2**32 + 1, 2**63, 2**63 + capacity}
    return sorted(v for v in edges if info.min <= v <= info.max and not 0 <= v < capacity)


@examples(0.5)
@given(data=st.data())
def test_a_refused_slot_is_named_as_given(impl, device, data):
    """A slot outside a source is named as the caller gave it, in any integer dtype: uint64 2^63 is 9223372036854775808, never its int64 cast."""
    layouts = data.draw(
        st_kv.source_tuples(min_sources=1, max_sources=2, **profiles.layout_sizes()),
        label="layouts",
    )
    capacity = min(layout.capacity for layout in layouts)
    dtypes = [d for d in SLOT_DTYPES if slot_edges(d, capacity)]  # uint8 holds no slot past 255
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    info = torch.iinfo(dtype)
    outside = [st.sampled_from(slot_edges(dtype, capacity))]
    if info.min < 0:
        outside.append(st.integers(info.min, -1))
    if capacity <= info.max:
        outside.append(st.integers(capacity, info.max))
    bad = data.draw(st.one_of(outside), label="bad slot")
    valid = st.integers(0, min(capacity - 1, info.max)) if capacity else st.nothing()
    good = data.draw(st.lists(valid, max_size=3), label="good slots")
    slots = data.draw(st.permutations([*good, bad]), label="slots")
    mode = data.draw(st.sampled_from([1, 2]), label="mode")
    sources = [st_kv.materialize(layout, device).build(impl) for layout in layouts]
    with pytest.raises(Exception) as caught:
        impl.fingerprint(sources, torch.tensor(slots, dtype=dtype, device=device), mode=mode)
    assert_error_type(caught, IndexError)
    message = str(caught.value)
    # the number as given, whole: not "-1" for uint64 2^64 - 1, nor "-9223372036854775808"
    # for 2^63, nor the tail of a longer number
    assert re.search(rf"(?<![\w-]){re.escape(str(bad))}(?!\d)", message), (
        f"IndexError {message!r} does not name slot {bad} as given in a {dtype} tensor"
    )
