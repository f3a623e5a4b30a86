"""Self-tests of the valid-source strategies: what they draw is valid, filled and placed as promised."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis.errors import InvalidArgument

import reference
import strategies as st_kv
from tests.strategies.draws import collect

NONE = reference.RealKvHashMode.NONE
PARTIAL = reference.RealKvHashMode.PARTIAL
ALL = reference.RealKvHashMode.ALL

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ANY_FILL = st_kv.source_layouts(fills=st_kv.FILLS)


def row_bytes_of(tensor: torch.Tensor, row: int) -> np.ndarray:
    return tensor[row].contiguous().view(torch.uint8).reshape(-1).numpy()


def window_bytes(data: np.ndarray, layout, slot: int, mode: int) -> bytes:
    return data[st_kv.window_byte_offsets(layout, slot, mode)].tobytes()


@FAST
@given(layout=ANY_FILL)
def test_valid_layouts_validate(layout):
    """Every drawn layout, materialized, passes every CONTRACT §3 rule of the reference validator."""
    src = st_kv.materialize(layout, "cpu")
    desc = st_kv.describe(src.tensor, **src.kwargs())
    assert reference.validate_source(desc) is None, (layout, desc)


@FAST
@given(layout=ANY_FILL)
def test_view_is_the_layout_over_its_backing(layout):
    """The tensor is an aligned strided view of ``backing`` with the layout's dtype, shape and strides."""
    src = st_kv.materialize(layout, "cpu")
    tensor, backing = src.tensor, src.backing
    assert backing.dtype == torch.uint8 and backing.shape == (layout.backing_bytes,)
    assert tensor.dtype == getattr(torch, layout.dtype)
    assert tuple(tensor.shape) == (layout.rows, *layout.row_shape)
    assert tuple(tensor.stride()) == layout.strides
    assert tensor.stride(0) * tensor.element_size() == layout.row_stride_bytes
    assert tensor.untyped_storage().data_ptr() == backing.untyped_storage().data_ptr()
    start = tensor.storage_offset() * tensor.element_size() - backing.storage_offset()
    assert start == layout.offset_bytes
    assert tensor.data_ptr() % 16 == 0 and backing.data_ptr() % 16 == 0
    assert math.prod(layout.row_shape) * tensor.element_size() == layout.row_bytes
    assert layout.capacity == layout.rows * layout.page_size


@FAST
@given(layout=ANY_FILL, data=st.data())
def test_reference_source_is_a_snapshot_of_the_tensor_bytes(layout, data):
    """``reference_source()`` rows equal the tensor's row bytes now, and later writes need a new one."""
    src = st_kv.materialize(layout, "cpu")
    before = src.reference_source()
    assert before.capacity == layout.capacity
    for row in range(layout.rows):
        np.testing.assert_array_equal(before.data[row], row_bytes_of(src.tensor, row), strict=True)
    if layout.rows == 0:
        return
    row = data.draw(st.integers(0, layout.rows - 1), label="row")
    byte = data.draw(st.integers(0, layout.row_bytes - 1), label="byte in row")
    # Write through the typed view to prove it aliases the backing buffer.
    src.tensor[row].view(torch.uint8).reshape(-1)[byte] ^= 0xFF
    after = src.reference_source()
    np.testing.assert_array_equal(after.data[row], row_bytes_of(src.tensor, row), strict=True)
    assert after.data[row, byte] != before.data[row, byte]
    assert (
        src.backing[layout.offset_bytes + row * layout.row_stride_bytes + byte]
        == after.data[row, byte]
    )


@FAST
@given(layout=st_kv.source_layouts(fills=("dense",)))
def test_dense_fill_is_non_zero_and_distinct_per_slot(layout):
    """Dense fill: no zero byte anywhere, and no two slots share a PARTIAL or an ALL window."""
    data = st_kv.materialize(layout, "cpu").backing.numpy()
    np.testing.assert_array_equal(data, st_kv.layout_bytes(layout), strict=True)
    assert np.all(data != 0)
    for mode in (PARTIAL, ALL):
        windows = {window_bytes(data, layout, slot, mode) for slot in range(layout.capacity)}
        assert len(windows) == layout.capacity, f"mode {mode}"


@FAST
@given(layout=st_kv.source_layouts(fills=("first", "middle", "last")))
def test_sparse_fill_has_one_byte_per_window(layout):
    """Sparse fills: each ALL window is zero but for one byte at its first/middle/last offset."""
    data = st_kv.layout_bytes(layout)
    position = {"first": 0, "middle": layout.read_bytes // 2, "last": layout.read_bytes - 1}[
        layout.fill
    ]
    for slot in range(layout.capacity):
        window = data[st_kv.window_byte_offsets(layout, slot, ALL)]
        assert np.flatnonzero(window).tolist() == [position], slot
    assert np.all(data[st_kv.outside_byte_offsets(layout)] != 0)


@FAST
@given(layout=ANY_FILL)
def test_window_and_outside_offsets_partition_the_backing(layout):
    """Windows are disjoint per slot, PARTIAL inside ALL, and with the outside bytes cover the buffer."""
    outside = st_kv.outside_byte_offsets(layout)
    assert np.all(np.diff(outside) > 0)
    covered = np.zeros(layout.backing_bytes, dtype=np.int64)
    covered[outside] += 1
    for slot in range(layout.capacity):
        assert st_kv.window_byte_offsets(layout, slot, NONE).size == 0
        partial = st_kv.window_byte_offsets(layout, slot, PARTIAL)
        full = st_kv.window_byte_offsets(layout, slot, ALL)
        assert partial.size == 16 and full.size == layout.read_bytes
        np.testing.assert_array_equal(partial, full[:16], strict=True)
        covered[full] += 1
    np.testing.assert_array_equal(covered, np.ones_like(covered), strict=True)


@FAST
@given(layout=ANY_FILL)
def test_windows_are_where_the_tensor_puts_the_slot(layout):
    """Each window starts where the torch view's ``stride(0)`` says the slot is, inside its row."""
    src = st_kv.materialize(layout, "cpu")
    base = src.backing.data_ptr()
    row_stride_bytes = src.tensor.stride(0) * src.tensor.element_size()
    for slot in range(layout.capacity):
        row, token = divmod(slot, layout.page_size)
        row_start = src.tensor.data_ptr() - base + row * row_stride_bytes
        window = st_kv.window_byte_offsets(layout, slot, ALL)
        assert window[0] == row_start + token * layout.num_bytes_per_token
        assert window[-1] < row_start + layout.row_bytes


@FAST
@given(layout=st_kv.source_layouts(fills=st_kv.FILLS, min_rows=1), data=st.data())
def test_outside_bytes_are_never_read(layout, data):
    """Rewriting every outside byte leaves the reference fingerprint of every slot unchanged."""
    src = st_kv.materialize(layout, "cpu")
    slots = np.arange(layout.capacity)
    mode = data.draw(st.sampled_from((PARTIAL, ALL)), label="mode")
    before = reference.fingerprint([src.reference_source()], slots, mode)
    outside = torch.from_numpy(st_kv.outside_byte_offsets(layout))
    src.backing[outside] = src.backing[outside] ^ 0x5A
    after = reference.fingerprint([src.reference_source()], slots, mode)
    np.testing.assert_array_equal(after, before, strict=True)
    if layout.fill == "dense":
        # The converse, so the check above is not vacuous: a read byte does change its slot.
        slot = data.draw(st.integers(0, layout.capacity - 1), label="slot")
        src.backing[int(st_kv.window_byte_offsets(layout, slot, mode)[-1])] ^= 0x5A
        changed = reference.fingerprint([src.reference_source()], slots, mode) != before
        assert changed.tolist() == [s == slot for s in range(layout.capacity)]


@FAST
@given(
    layouts=st.lists(ANY_FILL, min_size=1, max_size=4),
    repeat=st.booleans(),
)
def test_materialize_shared_layers_do_not_overlap(layouts, repeat):
    """Shared layers live in one storage, in disjoint regions, each valid and with its own bytes."""
    if repeat:
        layouts = [layouts[0]] * len(layouts)
    shared = st_kv.materialize_shared(layouts, "cpu")
    assert len(shared) == len(layouts)
    storages = {m.tensor.untyped_storage().data_ptr() for m in shared}
    assert len(storages) == 1
    spans = sorted(
        (m.backing.data_ptr(), m.backing.data_ptr() + m.layout.backing_bytes) for m in shared
    )
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    for layer, m in enumerate(shared):
        assert m.layout == layouts[layer]
        assert m.tensor.data_ptr() % 16 == 0
        # Storage offsets, not data_ptr(): torch reports 0 for a tensor with no elements.
        start = m.tensor.storage_offset() * m.tensor.element_size() - m.backing.storage_offset()
        assert start == m.layout.offset_bytes
        assert reference.validate_source(st_kv.describe(m.tensor, **m.kwargs())) is None
        np.testing.assert_array_equal(
            m.backing.numpy(), st_kv.layout_bytes(m.layout, layer=layer), strict=True
        )
        ref = m.reference_source()
        for row in range(m.layout.rows):
            np.testing.assert_array_equal(ref.data[row], row_bytes_of(m.tensor, row), strict=True)
    if repeat and layouts[0].fill == "dense" and layouts[0].capacity:
        # Equal layouts in different layers still have different windows.
        windows = {window_bytes(m.backing.numpy(), m.layout, 0, 1) for m in shared}
        assert len(windows) == len(shared)
    # A write to one layer leaves every other layer's bytes alone.
    snapshot = [m.backing.clone() for m in shared]
    shared[0].backing[:] = 0
    for m, old in zip(shared[1:], snapshot[1:]):
        assert torch.equal(m.backing, old)


def test_layout_draws_cover_every_feature():
    """Fixed-seed draws reach every dtype, 0 and 1 rows, holes, gaps, offsets, N-D rows and fills."""
    layouts = collect(ANY_FILL, 300)
    assert {lay.dtype for lay in layouts} == set(st_kv.available_dtypes())
    assert {0, 1} <= {lay.rows for lay in layouts}
    assert {lay.fill for lay in layouts} == set(st_kv.FILLS)
    assert {len(lay.row_shape) for lay in layouts} >= {1, 2, 3}
    for feature in ("hole_bytes", "gap_bytes", "offset_bytes", "tail_bytes"):
        values = {getattr(lay, feature) > 0 for lay in layouts}
        assert values == {False, True}, feature
    assert any(lay.read_bytes < lay.num_bytes_per_token for lay in layouts)
    assert any(lay.read_bytes == lay.num_bytes_per_token for lay in layouts)
    assert {lay.page_size > 1 for lay in layouts} == {False, True}
    assert max(lay.backing_bytes for lay in layouts) < 64 * 1024
    if hasattr(torch, "float8_e4m3fn"):
        assert "float8_e4m3fn" in st_kv.available_dtypes()


@FAST
@given(layout=st_kv.source_layouts(holes=False, row_gaps=False, offsets=False, nd_rows=False))
def test_layout_features_can_be_switched_off(layout):
    """With every option off a layout is a plain contiguous ``[rows, page_size * bytes]`` view."""
    assert layout.hole_bytes == 0 and layout.gap_bytes == 0
    assert layout.offset_bytes == 0 and layout.tail_bytes == 0
    assert len(layout.row_shape) == 1


@FAST
@given(
    sources=st_kv.source_tuples(min_sources=1, max_sources=6, min_capacity=5, max_rows=2),
)
def test_source_tuples_respect_count_and_capacity(sources):
    """Tuples hold 1..6 layouts, each with at least ``min_capacity`` slots."""
    assert isinstance(sources, tuple) and 1 <= len(sources) <= 6
    assert all(layout.capacity >= 5 for layout in sources)


def test_source_tuples_reach_past_the_cap():
    """Fixed-seed draws of up to 6 sources include 0 and more than 4 sources."""
    sizes = collect(st_kv.source_tuples(max_sources=6), 100, len)
    assert 0 in sizes and max(sizes) > 4


@FAST
@given(data=st.data())
def test_slot_indices_stay_in_range(data):
    """Slots are in ``[0, capacity)`` and the list length is within bounds."""
    capacity = data.draw(st.integers(0, 40), label="capacity")
    page_size = data.draw(st.none() | st.integers(1, 8), label="page_size")
    max_size = data.draw(st.integers(0, 30), label="max_size")
    min_size = data.draw(st.integers(0, max_size if capacity else 0), label="min_size")
    slots = data.draw(
        st_kv.slot_indices(capacity, min_size=min_size, max_size=max_size, page_size=page_size),
        label="slots",
    )
    assert all(isinstance(s, int) and 0 <= s < capacity for s in slots)
    assert min_size <= len(slots) <= max_size if capacity else slots == []


def test_slot_indices_draw_repeats_runs_and_shuffles():
    """Fixed-seed draws include repeats, runs across a page boundary and out-of-order slots."""
    lists = collect(st_kv.slot_indices(24, min_size=4, page_size=4), 100)
    assert any(len(set(slots)) < len(slots) for slots in lists)
    assert any(a % 4 == 3 and b == a + 1 for slots in lists for a, b in zip(slots, slots[1:]))
    assert any(b < a for slots in lists for a, b in zip(slots, slots[1:]))
    assert any(0 in slots for slots in lists) and any(23 in slots for slots in lists)


def test_long_size_draws_a_few_long_lists():
    """``long_size``: a few of 100 draws are lists of ``long_size // 2 + 1`` to ``long_size``
    slots (wrapping around a small capacity, so with repeats); the others stay within
    ``max_size``, and every slot is in range."""
    lists = collect(st_kv.slot_indices(10, min_size=1, page_size=4, long_size=256), 100)
    long = [slots for slots in lists if len(slots) > 24]
    assert 1 <= len(long) <= 20
    assert all(129 <= len(slots) <= 256 for slots in long)
    assert all(0 <= s < 10 for slots in lists for s in slots)
    assert all(1 <= len(slots) <= 24 for slots in lists if slots not in long)


def test_default_dtypes_are_those_the_installed_torch_has():
    """The dtypes drawn by default, read without importing torch, are exactly those the
    installed torch has (asked of torch itself), in the same order."""
    assert st_kv.default_dtypes() == st_kv.available_dtypes()
    for dtype in st_kv.available_dtypes():
        find(st_kv.source_layouts(), lambda layout, dtype=dtype: layout.dtype == dtype)


def test_modes_are_the_three_hash_modes():
    """``modes()`` draws exactly 0, 1 and 2: NONE, PARTIAL and ALL."""
    assert set(collect(st_kv.modes(), 30)) == {NONE, PARTIAL, ALL}


@pytest.mark.parametrize(
    "call",
    [
        lambda: st_kv.source_layouts(dtypes=["complex64"]),
        lambda: st_kv.source_layouts(dtypes=[]),
        lambda: st_kv.source_layouts(min_rows=3, max_rows=2),
        lambda: st_kv.source_layouts(max_page_size=0),
        lambda: st_kv.source_layouts(max_bytes_per_token=8),
        lambda: st_kv.source_layouts(fills=("sparse",)),
        lambda: st_kv.source_layouts(holes=1),
        lambda: st_kv.source_tuples(max_sources=7),
        lambda: st_kv.source_tuples(min_sources=3, max_sources=2),
        lambda: st_kv.source_tuples(min_capacity=10_000),
        lambda: st_kv.slot_indices(-1),
        lambda: st_kv.slot_indices(0, min_size=1),
        lambda: st_kv.slot_indices(4, min_size=5, max_size=4),
        lambda: st_kv.slot_indices(4, page_size=0),
        lambda: st_kv.slot_indices(4, max_size=24, long_size=24),
        lambda: st_kv.slot_indices(4, long_size=5000),
    ],
    ids=lambda call: call.__code__.co_firstlineno,
)
def test_bad_arguments_raise_invalid_argument(call):
    """Strategy arguments are validated when the strategy is made, with InvalidArgument."""
    with pytest.raises(InvalidArgument):
        call()


def test_hand_written_invalid_layout_is_refused():
    """A SourceLayout that would break CONTRACT §3 cannot be constructed."""
    good = collect(st_kv.source_layouts(min_rows=1), 1)[0]
    fields = {k: getattr(good, k) for k in good.__dataclass_fields__}
    with pytest.raises(ValueError, match="row_stride_bytes"):
        st_kv.SourceLayout(**{**fields, "row_stride_bytes": good.row_stride_bytes + 8})
    with pytest.raises(ValueError, match="num_bytes_per_token"):
        st_kv.SourceLayout(**{**fields, "num_bytes_per_token": 24})


def test_window_offsets_reject_slots_outside_capacity():
    """``window_byte_offsets`` refuses a slot the layout does not have."""
    layout = collect(st_kv.source_layouts(min_rows=1), 1)[0]
    with pytest.raises(IndexError):
        st_kv.window_byte_offsets(layout, layout.capacity, ALL)
