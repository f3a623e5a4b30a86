"""Valid RealKvSource layouts as plain data, slot sets and modes (CONTRACT §3, §4).

Nothing here touches torch, nor imports it: a :class:`SourceLayout` is a description, and
:mod:`strategies.materialize` is the one place that turns it into tensors and numpy rows.

The dtypes drawn by default (:func:`default_dtypes`) still follow the installed torch: they
are read from the version of the installed ``torch`` distribution (its metadata, without
importing it), against the first torch release that has each dtype. A self-test checks that
this agrees with :func:`strategies.materialize.available_dtypes`, which asks torch itself.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import math
import re
from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np
from hypothesis.errors import InvalidArgument

from strategies.sizes import check_int, power_of_two_edges, sizes

__all__ = [
    "ELEMENT_SIZES",
    "default_dtypes",
    "FILLS",
    "FingerprintCase",
    "fingerprint_cases",
    "fit_source_ndim",
    "layout",
    "PARTIAL_READ_BYTES",
    "SourceLayout",
    "modes",
    "outside_byte_offsets",
    "bulk_slots",
    "capacity_edges",
    "slot_indices",
    "slot_window_starts",
    "source_layouts",
    "source_tuples",
    "window_byte_offsets",
]

#: Bytes per element of every dtype a layout may name (torch attribute names).
ELEMENT_SIZES: dict[str, int] = {
    "uint8": 1,
    "int8": 1,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "int32": 4,
    "int64": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

# The first torch release (major, minor) that has each dtype of ELEMENT_SIZES, where later
# than any torch the project supports would lack it; the others are in every torch release.
_FIRST_TORCH_WITH = {"float8_e4m3fn": (2, 1), "float8_e5m2": (2, 1)}


@functools.cache
def _installed_torch_version() -> tuple[int, int] | None:
    """(major, minor) of the installed torch distribution, read from its metadata (torch is
    not imported); None when torch is not installed or its version does not parse."""
    try:
        text = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def default_dtypes() -> tuple[str, ...]:
    """Names from :data:`ELEMENT_SIZES` that the installed torch has, in that order; every
    name when no torch is installed (a description needs none). Torch is not imported.

    Example (torch 2.13): ``('uint8', 'int8', 'float16', 'bfloat16', 'float32', 'int32',
    'int64', 'float8_e4m3fn', 'float8_e5m2')``.
    """
    version = _installed_torch_version()
    if version is None:
        return tuple(ELEMENT_SIZES)
    return tuple(name for name in ELEMENT_SIZES if version >= _FIRST_TORCH_WITH.get(name, (0, 0)))


#: Byte fills a layout may ask for; see :class:`SourceLayout`.
FILLS: tuple[str, ...] = ("dense", "first", "middle", "last")

#: Bytes of a slot read in PARTIAL mode (CONTRACT §3).
PARTIAL_READ_BYTES = 16

# Bounds of the arguments, not defaults: the defaults keep one source well under 64 KiB (the
# Triton interpreter folds a few MB/s); engine-scale properties ask for pools of 2^20+ slots,
# pages of 256 and calls of tens of thousands of slots.
_MAX_ROWS = 2**24
_MAX_PAGE_SIZE = 1024
_MAX_BYTES_PER_TOKEN = 1024
_MAX_SOURCES = 6
_MAX_SLOT_LIST = 2**17
_MAX_LONG_SLOT_LIST = 4096
# Slots of a list drawn piece by piece; past this many, the rest come from a drawn seed (a
# Hypothesis example holds a few thousand choices, not tens of thousands).
_DRAWN_SLOTS = 64
# One draw in this many is a long list, when slot_indices is given long_size.
_LONG_ONE_IN = 12


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def fit_source_ndim(layout: SourceLayout, max_ndim: int | None) -> SourceLayout:
    """``layout``, with its row flattened (same bytes, same strides in bytes) if its rank
    (rows included) is above ``max_ndim``; unchanged otherwise, and always with ``None``.

    ``max_ndim`` is a capability of the implementation under test: an engine whose launch
    contract takes ``[rows, bytes]`` views only declares 2, and the fixed layouts of a suite
    are fitted to it as :func:`source_layouts` (``max_ndim=``) draws within it.
    """
    if max_ndim is None or 1 + len(layout.row_shape) <= max_ndim:
        return layout
    return dataclasses.replace(layout, row_shape=(math.prod(layout.row_shape),))


@dataclass(frozen=True)
class SourceLayout:
    """A valid RealKvSource as plain data: the view, the buffer around it and its bytes.

    The backing buffer is ``offset_bytes`` of padding, then ``rows`` rows every
    ``row_stride_bytes`` (each ``row_bytes`` long, the rest of the stride a gap), then
    ``tail_bytes``. Slot ``s`` reads row ``s // page_size`` at byte
    ``(s % page_size) * num_bytes_per_token``; row bytes past ``page_size *
    num_bytes_per_token`` are holes.

    ``fill`` says what the bytes are (``seed`` drives the random ones):

    - ``"dense"``: every byte of the buffer random and non-zero, and every slot's read window
      (in PARTIAL and in ALL mode) differs from every other slot's, for certain: the first
      bytes of each window carry the slot number.
    - ``"first"`` / ``"middle"`` / ``"last"``: each slot's ALL-mode window (``read_bytes``
      long) is zero except one random non-zero byte at offset ``0`` /
      ``read_bytes // 2`` / ``read_bytes - 1``; every byte outside the windows is random
      and non-zero.
    """

    dtype: str
    rows: int
    row_shape: tuple[int, ...]
    page_size: int
    num_bytes_per_token: int
    read_bytes: int
    row_stride_bytes: int
    offset_bytes: int
    tail_bytes: int
    fill: str
    seed: int

    def __post_init__(self) -> None:
        # A layout is a promise of validity; catch hand-written ones that break it early.
        problems = _layout_problems(self)
        if problems:
            raise ValueError(f"invalid SourceLayout {self!r}: {'; '.join(problems)}")

    @property
    def element_size(self) -> int:
        return ELEMENT_SIZES[self.dtype]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.element_size

    @property
    def slot_layout_bytes(self) -> int:
        """Bytes of a row that slots address: ``page_size * num_bytes_per_token``."""
        return self.page_size * self.num_bytes_per_token

    @property
    def hole_bytes(self) -> int:
        return self.row_bytes - self.slot_layout_bytes

    @property
    def gap_bytes(self) -> int:
        return self.row_stride_bytes - self.row_bytes

    @property
    def capacity(self) -> int:
        return self.rows * self.page_size

    @property
    def view_bytes(self) -> int:
        """Bytes from the view's first byte to the end of its last row."""
        if self.rows == 0:
            return 0
        return (self.rows - 1) * self.row_stride_bytes + self.row_bytes

    @property
    def backing_bytes(self) -> int:
        return self.offset_bytes + self.view_bytes + self.tail_bytes

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the tensor view, in elements."""
        return (self.rows, *self.row_shape)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides of the tensor view, in elements (as ``torch.Tensor.stride()``)."""
        inner = []
        step = 1
        for n in reversed(self.row_shape):
            inner.append(step)
            step *= n
        return (self.row_stride_bytes // self.element_size, *reversed(inner))


def _layout_problems(layout: SourceLayout) -> list[str]:
    problems = []
    if layout.dtype not in ELEMENT_SIZES:
        problems.append(f"dtype must be one of {sorted(ELEMENT_SIZES)}")
        return problems
    if layout.fill not in FILLS:
        problems.append(f"fill must be one of {FILLS}")
    if layout.rows < 0:
        problems.append("rows must be >= 0")
    if not layout.row_shape or any(n < 1 for n in layout.row_shape):
        problems.append("row_shape must be non-empty with every dim >= 1")
    if layout.page_size < 1:
        problems.append("page_size must be >= 1")
    if layout.num_bytes_per_token < 16 or layout.num_bytes_per_token % 16:
        problems.append("num_bytes_per_token must be a positive multiple of 16")
    if not 0 < layout.read_bytes <= layout.num_bytes_per_token or layout.read_bytes % 16:
        problems.append("read_bytes must be a positive multiple of 16 <= num_bytes_per_token")
    if problems:
        return problems
    if layout.row_bytes < layout.slot_layout_bytes:
        problems.append("row_bytes must be >= page_size * num_bytes_per_token")
    if layout.row_stride_bytes < layout.row_bytes or layout.row_stride_bytes % 16:
        problems.append("row_stride_bytes must be a multiple of 16 and >= row_bytes")
    if layout.offset_bytes < 0 or layout.offset_bytes % 16:
        problems.append("offset_bytes must be a non-negative multiple of 16")
    if layout.tail_bytes < 0:
        problems.append("tail_bytes must be >= 0")
    return problems


def _row_shapes(
    row_elems: int, nd_rows: bool, ndim_max: int | None = None
) -> st.SearchStrategy[tuple[int, ...]]:
    """Ways to shape ``row_elems`` elements as dims 1.. of a tensor; flat rows shrink first.

    ``ndim_max`` caps the rank of the tensor (rows included); None: no cap.
    """
    flat = st.just((row_elems,))
    if not nd_rows or (ndim_max is not None and ndim_max <= 2):
        return flat
    two_d: list[tuple[int, ...]] = []
    three_d: list[tuple[int, ...]] = []
    # (heads, head_dim), and (tokens, heads, head_dim) when the row splits three ways.
    for outer in range(2, min(row_elems, 64) + 1):
        if row_elems % outer:
            continue
        rest = row_elems // outer
        two_d.append((outer, rest))
        three_d.extend(
            (outer, inner, rest // inner)
            for inner in range(2, min(rest, 16) + 1)
            if rest % inner == 0 and rest // inner > 1
        )
    # Grouped so each kind of shape is drawn often, however many factorizations there are.
    choices = [flat, st.just((1, row_elems))]
    groups = (two_d, three_d) if ndim_max is None or ndim_max > 3 else (two_d,)
    choices += [st.sampled_from(group) for group in groups if group]
    return st.one_of(choices)


@st.composite
def _source_layouts(
    draw,
    *,
    dtypes,
    min_rows,
    max_rows,
    max_page_size,
    max_bytes_per_token,
    holes,
    row_gaps,
    offsets,
    nd_rows,
    fills,
    min_capacity,
    min_page_size,
    max_capacity,
    max_ndim,
):
    dtype = draw(st.sampled_from(dtypes))
    element_size = ELEMENT_SIZES[dtype]
    min_page = min_page_size
    if min_capacity > max_rows * min_page:
        min_page = -(-min_capacity // max_rows)
    page_size = draw(sizes(max_page_size, min_size=min_page, block=16))
    fewest_rows = max(min_rows, -(-min_capacity // page_size))
    most_rows = max_rows if max_capacity is None else max(fewest_rows, max_capacity // page_size)
    rows = draw(sizes(min(most_rows, max_rows), min_size=fewest_rows))
    num_bytes_per_token = 16 * draw(st.integers(1, max_bytes_per_token // 16))
    read_bytes = 16 * draw(st.integers(1, num_bytes_per_token // 16))
    slot_layout_bytes = page_size * num_bytes_per_token

    hole_bytes = 0
    if holes:
        # Without row gaps the row itself must end on a 16-byte boundary.
        unit = 16 if not row_gaps else element_size
        hole_bytes = unit * draw(st.integers(0, max(1, 48 // unit)))
    row_elems = (slot_layout_bytes + hole_bytes) // element_size
    row_shape = draw(_row_shapes(row_elems, nd_rows, max_ndim))
    row_bytes = row_elems * element_size

    row_stride_bytes = _align16(row_bytes)
    if row_gaps:
        row_stride_bytes += 16 * draw(st.integers(0, 3))
    offset_bytes = tail_bytes = 0
    if offsets:
        offset_bytes = 16 * draw(st.integers(0, 4))
        tail_bytes = draw(st.integers(0, 40))
    fill = draw(st.sampled_from(fills))
    seed = draw(st.integers(0, 2**32 - 1))
    return SourceLayout(
        dtype=dtype,
        rows=rows,
        row_shape=row_shape,
        page_size=page_size,
        num_bytes_per_token=num_bytes_per_token,
        read_bytes=read_bytes,
        row_stride_bytes=row_stride_bytes,
        offset_bytes=offset_bytes,
        tail_bytes=tail_bytes,
        fill=fill,
        seed=seed,
    )


def source_layouts(
    *,
    dtypes=None,
    min_rows: int = 0,
    max_rows: int = 6,
    max_page_size: int = 16,
    max_bytes_per_token: int = 256,
    holes: bool = True,
    row_gaps: bool = True,
    offsets: bool = True,
    nd_rows: bool = True,
    fills=("dense",),
    min_capacity: int = 0,
    min_page_size: int = 1,
    max_capacity: int | None = None,
    max_ndim: int | None = None,
) -> st.SearchStrategy[SourceLayout]:
    """Valid RealKvSource layouts: every CONTRACT §3 rule holds for the view they describe.

    ``dtypes`` defaults to every dtype in :data:`ELEMENT_SIZES` that the installed torch
    has (:func:`default_dtypes`). ``holes`` lets a row be longer than ``page_size * num_bytes_per_token``;
    ``row_gaps`` lets the row stride exceed the row; ``offsets`` puts bytes before the view
    and after its last row; ``nd_rows`` draws rows like ``(heads, head_dim)`` as well as
    flat ones; ``max_ndim`` (None: no limit, else at least 2) caps the tensor's rank, rows
    included (2: flat rows only); ``fills`` is drawn from :data:`FILLS`. Every layout has
    ``capacity >= min_capacity``, and with ``max_capacity`` at most that many slots unless
    ``min_rows`` or ``min_capacity`` need more (a bound on memory for pools of many rows).
    Page sizes (from ``min_page_size``) and row counts are drawn by :func:`strategies.sizes`,
    so pages of 2^k +- 1 and multiples of 16 (96, 112, ...) come up often.

    Example draw::

        SourceLayout(dtype='float16', rows=3, row_shape=(4, 20), page_size=2,
                     num_bytes_per_token=64, read_bytes=32, row_stride_bytes=192,
                     offset_bytes=32, tail_bytes=7, fill='dense', seed=1234)

    i.e. a ``float16[3, 4, 20]`` view (row 160 bytes: 128 addressed by 2 slots, a 32-byte
    hole; a 32-byte gap to the next row) 32 bytes into a 583-byte buffer.
    """
    arguments = dict(locals())  # every option by name, passed on once checked
    dtypes = default_dtypes() if dtypes is None else tuple(dtypes)
    if not dtypes or any(d not in ELEMENT_SIZES for d in dtypes):
        raise InvalidArgument(
            f"dtypes={dtypes!r} must be a non-empty subset of {sorted(ELEMENT_SIZES)}"
        )
    check_int("min_rows", min_rows, 0, _MAX_ROWS)
    check_int("max_rows", max_rows, min_rows, _MAX_ROWS)
    check_int("max_page_size", max_page_size, 1, _MAX_PAGE_SIZE)
    check_int("min_page_size", min_page_size, 1, max_page_size)
    check_int("max_bytes_per_token", max_bytes_per_token, 16, _MAX_BYTES_PER_TOKEN)
    check_int("min_capacity", min_capacity, 0, max_rows * max_page_size)
    if max_capacity is not None:
        check_int("max_capacity", max_capacity, max(min_capacity, 1), _MAX_ROWS * _MAX_PAGE_SIZE)
    if max_ndim is not None:
        check_int("max_ndim", max_ndim, 2, 64)
    fills = tuple(fills)
    if not fills or any(f not in FILLS for f in fills):
        raise InvalidArgument(f"fills={fills!r} must be a non-empty subset of {FILLS}")
    for name, flag in (
        ("holes", holes),
        ("row_gaps", row_gaps),
        ("offsets", offsets),
        ("nd_rows", nd_rows),
    ):
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{name}={flag!r} must be a bool")
    return _source_layouts(**{**arguments, "dtypes": dtypes, "fills": fills})


def source_tuples(
    *, min_sources: int = 0, max_sources: int = 4, min_capacity: int = 1, **layout_kwargs
) -> st.SearchStrategy[tuple[SourceLayout, ...]]:
    """Tuples of valid layouts, as passed to ``fingerprint`` or a context's ``real_kv_sources``.

    Every layout has ``capacity >= min_capacity`` so a slot below it is valid in all of them.
    ``max_sources`` may go up to 6 so that the 4-source cap of CONTRACT §4 can be exercised;
    ``layout_kwargs`` go to :func:`source_layouts`.

    Example draw (two sources, each with at least one slot)::

        (SourceLayout(dtype='uint8', rows=1, row_shape=(32,), page_size=2, ...),
         SourceLayout(dtype='bfloat16', rows=4, row_shape=(8, 16), page_size=1, ...))
    """
    check_int("min_sources", min_sources, 0, _MAX_SOURCES)
    check_int("max_sources", max_sources, min_sources, _MAX_SOURCES)
    if "min_capacity" in layout_kwargs:
        raise InvalidArgument("pass min_capacity once, as a keyword of source_tuples")
    layouts = source_layouts(min_capacity=min_capacity, **layout_kwargs)
    return st.lists(layouts, min_size=min_sources, max_size=max_sources).map(tuple)


_SLOT_PIECES = ("any", "run", "repeat", "permutation", "edge")


@st.composite
def _slot_indices(draw, capacity, min_size, max_size, page_size, long_size, edges):
    if capacity == 0:
        return []
    size = draw(sizes(max_size, min_size=min_size))
    drawn = min(size, _DRAWN_SLOTS)
    slots: list[int] = []
    while len(slots) < drawn:
        piece = draw(st.sampled_from(_SLOT_PIECES))
        if piece == "any":
            slots.append(draw(st.integers(0, capacity - 1)))
        elif piece == "run":
            length = draw(st.integers(2, 8))
            if page_size is not None and capacity > page_size:
                # Start just before a page boundary so the run crosses it.
                boundary = page_size * draw(st.integers(1, (capacity - 1) // page_size))
                start = boundary - draw(st.integers(1, min(length - 1, boundary)))
            else:
                start = draw(st.integers(0, capacity - 1))
            slots.extend(range(start, min(start + length, capacity)))
        elif piece == "repeat":
            slots.extend([draw(st.integers(0, capacity - 1))] * draw(st.integers(2, 4)))
        elif piece == "permutation":
            start = draw(st.integers(0, capacity - 1))
            block = list(range(start, min(start + 6, capacity)))
            slots.extend(draw(st.permutations(block)))
        else:
            slots.append(draw(st.sampled_from((0, capacity - 1))))
    slots = slots[:drawn]
    if size > drawn:
        seed = draw(st.integers(0, 2**32 - 1), label="slots past the drawn ones: seed")
        slots += bulk_slots(capacity, size - drawn, page_size=page_size, seed=seed)
    if edges:
        slots += capacity_edges(capacity, page_size)
    # Drawn last, and shrinking towards "no", so a failure shrinks to a short list.
    if long_size is not None and draw(st.integers(1, _LONG_ONE_IN)) == _LONG_ONE_IN:
        length = draw(st.integers(max(max_size + 1, long_size // 2 + 1), long_size))
        start = draw(st.integers(0, capacity - 1))
        # one cheap piece: a run that wraps around the capacity as often as it takes
        slots.extend((start + i) % capacity for i in range(length - len(slots)))
    return slots


def bulk_slots(capacity: int, count: int, *, page_size: int | None = None, seed: int) -> list[int]:
    """``count`` slots in ``[0, capacity)`` from ``seed``, as many cheaply as a property needs:
    half single slots anywhere, half runs of 2 to 64 consecutive slots, each run starting just
    before a page boundary when ``page_size`` is given.

    Example: ``bulk_slots(1000, 6, page_size=16, seed=1)`` is
    ``[942, 943, 944, 945, 946, 947]`` (one run across the page boundary at 944).
    """
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < count:
        if rng.random() < 0.5:
            out.append(int(rng.integers(capacity)))
            continue
        length = int(rng.integers(2, 65))
        if page_size is not None and capacity > page_size:
            boundary = page_size * int(rng.integers(1, (capacity - 1) // page_size + 1))
            start = max(0, boundary - int(rng.integers(1, length)))
        else:
            start = int(rng.integers(capacity))
        out.extend(range(start, min(start + length, capacity)))
    return out[:count]


def capacity_edges(capacity: int, page_size: int | None = None) -> list[int]:
    """The slots at every power-of-two edge of ``capacity`` (``2^k - 1, 2^k, 2^k + 1`` below
    it, 0 and the last slot), and with ``page_size`` the same edges of the in-page index in
    the first and the last page (slot 64 of a page of 96 is where a 6-bit index wraps).

    Example: ``capacity_edges(10)`` is ``[0, 1, 2, 3, 4, 5, 7, 8, 9]``.
    """
    edges = set(power_of_two_edges(capacity - 1)) | {capacity - 1}
    if page_size is not None and page_size > 1:
        last_page = (capacity - 1) // page_size * page_size
        for index in power_of_two_edges(page_size - 1):
            edges.update(s for s in (index, last_page + index) if s < capacity)
    return sorted(edges)


def slot_indices(
    capacity: int,
    *,
    min_size: int = 0,
    max_size: int = 24,
    page_size: int | None = None,
    long_size: int | None = None,
    edges: bool = False,
) -> st.SearchStrategy[list[int]]:
    """Lists of slots in ``[0, capacity)``, built from pieces that stress the page mapping.

    Pieces: any slot; a run of consecutive slots (crossing a page boundary when
    ``page_size`` is given, and often anyway); one slot repeated; a shuffled block; the
    first or last slot. ``capacity == 0`` gives only ``[]``. The list's length is drawn by
    :func:`strategies.sizes` (so 2^k +- 1 slots come up often); past 64 slots the rest are
    :func:`bulk_slots` from a drawn seed.

    ``edges`` appends :func:`capacity_edges`: every power-of-two edge of the capacity (and of
    the in-page index), the slots where an index kept in too few bits goes wrong.

    ``long_size`` (None: never) lets about one draw in 12 be a long list, of
    ``max(max_size + 1, long_size // 2 + 1)`` to ``long_size`` slots: a list drawn as above,
    continued by a run that wraps around the capacity (so slots repeat). That is how a small
    source still gets a call longer than a kernel program's block of slots, at the cost of a
    few draws; the other draws are those without the option.

    Example draw from ``slot_indices(12, page_size=4)``::

        [2, 3, 4, 5, 9, 9, 9, 11, 7, 6, 8, 0]

    (a run across the page boundary at 4, a repeat, the last slot, a shuffled block, slot 0).
    """
    check_int("capacity", capacity, 0, 2**40)
    check_int("max_size", max_size, 0, _MAX_SLOT_LIST)
    check_int("min_size", min_size, 0, max_size)
    if capacity == 0 and min_size > 0:
        raise InvalidArgument(f"min_size={min_size} needs capacity > 0")
    if page_size is not None:
        check_int("page_size", page_size, 1, 2**40)
    if long_size is not None:
        check_int("long_size", long_size, max_size + 1, _MAX_LONG_SLOT_LIST)
    if not isinstance(edges, bool):
        raise InvalidArgument(f"edges={edges!r} must be a bool")
    return _slot_indices(capacity, min_size, max_size, page_size, long_size, edges)


def modes() -> st.SearchStrategy[int]:
    """RealKvHashMode values as plain ints: ``0`` (NONE), ``1`` (PARTIAL), ``2`` (ALL).

    Example draw: ``2``.
    """
    return st.sampled_from((0, 1, 2))


_MODES = modes()


def _read_length(layout: SourceLayout, mode) -> int:
    mode = int(mode)
    if mode not in (0, 1, 2):
        raise ValueError(f"mode must be 0, 1 or 2 (RealKvHashMode), got {mode}")
    return (0, PARTIAL_READ_BYTES, layout.read_bytes)[mode]


def slot_window_starts(layout: SourceLayout) -> np.ndarray:
    """Offset inside the backing buffer of the first byte each slot reads, int64 ``[capacity]``."""
    slots = np.arange(layout.capacity, dtype=np.int64)
    rows, tokens = np.divmod(slots, layout.page_size)
    starts: np.ndarray = (
        layout.offset_bytes + rows * layout.row_stride_bytes + tokens * layout.num_bytes_per_token
    )
    return starts


def window_byte_offsets(layout: SourceLayout, slot: int, mode) -> np.ndarray:
    """Offsets inside the backing buffer of the bytes the canary reads for ``slot`` in ``mode``.

    int64, ascending; empty in mode NONE. Example: for a layout with ``offset_bytes=32``,
    ``row_stride_bytes=192``, ``page_size=2``, ``num_bytes_per_token=64``, slot 3 in PARTIAL
    mode reads ``[288, 289, ..., 303]``.
    """
    length = _read_length(layout, mode)
    if not 0 <= slot < layout.capacity:
        raise IndexError(f"slot {slot} is outside [0, {layout.capacity})")
    row, token = divmod(int(slot), layout.page_size)
    start = layout.offset_bytes + row * layout.row_stride_bytes + token * layout.num_bytes_per_token
    return start + np.arange(length, dtype=np.int64)


def outside_byte_offsets(layout: SourceLayout) -> np.ndarray:
    """Offsets inside the backing buffer that no slot reads in any mode, int64 ascending.

    That is the leading offset, row gaps, holes, bytes of a slot past ``read_bytes``, and
    the tail. ALL-mode windows contain the PARTIAL ones, so only they are excluded.
    """
    read = np.zeros(layout.backing_bytes, dtype=bool)
    starts = slot_window_starts(layout)
    read[(starts[:, None] + np.arange(layout.read_bytes, dtype=np.int64)).ravel()] = True
    return np.flatnonzero(~read).astype(np.int64)


@dataclass(frozen=True)
class FingerprintCase:
    """One ``fingerprint`` call as plain data: sources, slots, mode, and whether the sources
    are per-layer views of one shared pool (see :func:`strategies.materialize_shared`)."""

    layouts: tuple[SourceLayout, ...]
    slots: tuple[int, ...]
    mode: int
    shared: bool = False


@st.composite
def fingerprint_cases(
    draw,
    *,
    min_sources: int = 0,
    max_sources: int = 4,
    modes: st.SearchStrategy[int] | None = None,
    max_slots: int = 24,
    **layout_kwargs,
) -> FingerprintCase:
    """``fingerprint`` calls whose slots every source can address.

    Example draw::

        FingerprintCase(layouts=(SourceLayout(dtype='int32', rows=2, ...),), slots=(3, 4, 4, 0),
                        mode=1, shared=True)
    """
    layouts = draw(
        source_tuples(min_sources=min_sources, max_sources=max_sources, **layout_kwargs),
        label="layouts",
    )
    capacity = min((layout.capacity for layout in layouts), default=8)
    page_size = layouts[0].page_size if layouts else None
    slots = draw(slot_indices(capacity, max_size=max_slots, page_size=page_size), label="slots")
    mode = draw(_MODES if modes is None else modes, label="mode")
    shared = draw(st.booleans(), label="shared pool")
    return FingerprintCase(tuple(layouts), tuple(slots), mode, shared)


def layout(
    *,
    dtype: str = "uint8",
    rows: int = 4,
    page_size: int = 1,
    num_bytes_per_token: int = 32,
    read_bytes: int | None = None,
    hole_bytes: int = 0,
    gap_bytes: int = 0,
    offset_bytes: int = 0,
    tail_bytes: int = 0,
    row_shape: tuple[int, ...] | None = None,
    fill: str = "dense",
    seed: int = 1,
) -> SourceLayout:
    """A fixed layout from what a test cares about, the rest left at plain defaults.

    A row holds ``page_size`` tokens of ``num_bytes_per_token`` bytes and then ``hole_bytes``
    no slot owns; rows are ``gap_bytes`` apart past their 16-byte-rounded width. The row is
    flat unless ``row_shape`` is given (its bytes must be the row's). ``read_bytes`` defaults
    to the whole token::

        layout(dtype="bfloat16", rows=3, row_shape=(2, 48), page_size=2,
               num_bytes_per_token=64, read_bytes=48, hole_bytes=64, gap_bytes=64)
    """
    element_size = ELEMENT_SIZES[dtype]
    row_bytes = page_size * num_bytes_per_token + hole_bytes
    if row_shape is None:
        row_shape = (row_bytes // element_size,)
    if math.prod(row_shape) * element_size != row_bytes:
        raise ValueError(f"row_shape {row_shape} of {dtype} is not {row_bytes} bytes")
    return SourceLayout(
        dtype=dtype,
        rows=rows,
        row_shape=tuple(row_shape),
        page_size=page_size,
        num_bytes_per_token=num_bytes_per_token,
        read_bytes=num_bytes_per_token if read_bytes is None else read_bytes,
        row_stride_bytes=_align16(row_bytes) + gap_bytes,
        offset_bytes=offset_bytes,
        tail_bytes=tail_bytes,
        fill=fill,
        seed=seed,
    )
