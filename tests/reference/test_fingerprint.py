"""The oracle's fingerprint matches CONTRACT §4: pinned vectors and an independent slow fold."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

import reference
from reference import RealKvHashMode, Source

MODES = list(RealKvHashMode)
U64 = (1 << 64) - 1


def pinned_source(data: bytes, read_bytes: int) -> Source:
    """One row, one slot holding exactly ``data``."""
    row = np.frombuffer(data, dtype=np.uint8).reshape(1, len(data)).copy()
    return Source(row, 1, len(data), read_bytes)


def as_u64(hashes: np.ndarray) -> list[int]:
    return [int(h) & U64 for h in hashes]


# ---------------------------------------------------------------------------------------------
# Pinned vectors of CONTRACT §2.


@pytest.mark.parametrize("mode", [RealKvHashMode.PARTIAL, RealKvHashMode.ALL])
def test_pinned_single_16_byte_window(mode):
    """Bytes 01 02 04 .. C0 FF, read 16, hash to 6041580849E6407D in PARTIAL and ALL."""
    data = bytes.fromhex("01020408102040808182848890A0C0FF")
    result = reference.fingerprint([pinned_source(data, 16)], np.array([0]), mode=mode)
    np.testing.assert_array_equal(
        result, np.array([reference.to_signed64(0x6041580849E6407D)], np.int64), strict=True
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [(RealKvHashMode.ALL, 0xB44181DFE9420039), (RealKvHashMode.PARTIAL, 0xD6D75024DFD6C30C)],
)
def test_pinned_32_byte_window(mode, expected):
    """Bytes 00..1F, read 32: ALL folds all four words, PARTIAL only the first two."""
    result = reference.fingerprint([pinned_source(bytes(range(32)), 32)], [0], mode=mode)
    assert as_u64(result) == [expected]


def test_pinned_two_sources():
    """Sources 00..0F then 10..1F, read 16 each, ALL, hash to B6209A488C3F52B0."""
    sources = [pinned_source(bytes(range(16)), 16), pinned_source(bytes(range(16, 32)), 16)]
    assert as_u64(reference.fingerprint(sources, [0])) == [0xB6209A488C3F52B0]


# ---------------------------------------------------------------------------------------------
# An independent slow fold: plain Python ints, bytes addressed in the backing buffer by hand.


def slow_splitmix64(x: int) -> int:
    x &= U64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & U64
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Layout:
    """A source as a strided view of a backing byte buffer.

    Example: ``Layout(page_size=2, num_bytes_per_token=32, read_bytes=32, num_rows=3,
    row_bytes=80, row_stride_bytes=96, offset_bytes=16)`` has a 16-byte hole at the end of
    each row and a 16-byte gap between rows.
    """

    page_size: int
    num_bytes_per_token: int
    read_bytes: int
    num_rows: int
    row_bytes: int
    row_stride_bytes: int
    offset_bytes: int = 0

    @property
    def capacity(self) -> int:
        return self.num_rows * self.page_size

    def build(self, seed: int) -> tuple[Source, np.ndarray]:
        """The source and its backing buffer, filled with random non-zero bytes."""
        total = self.offset_bytes + (self.num_rows - 1) * self.row_stride_bytes + self.row_bytes
        backing = np.random.default_rng(seed).integers(0, 256, total, dtype=np.uint8)
        backing[backing == 0] = 1
        data = np.lib.stride_tricks.as_strided(
            backing[self.offset_bytes :],
            shape=(self.num_rows, self.row_bytes),
            strides=(self.row_stride_bytes, 1),
        )
        return Source(data, self.page_size, self.num_bytes_per_token, self.read_bytes), backing

    def slow_fold(self, backing: np.ndarray, slot: int, mode: RealKvHashMode) -> int:
        read = 16 if mode is RealKvHashMode.PARTIAL else self.read_bytes
        row, column = divmod(slot, self.page_size)
        start = self.offset_bytes + row * self.row_stride_bytes + column * self.num_bytes_per_token
        raw = backing[start : start + read].tobytes()
        acc = 0
        for word_start in range(0, read, 8):
            acc = slow_splitmix64(acc ^ int.from_bytes(raw[word_start : word_start + 8], "little"))
        return acc


def slow_fingerprint(layouts, backings, slots, mode) -> list[int]:
    if mode is RealKvHashMode.NONE or not layouts:
        return [0 for _ in slots]
    result = []
    for slot in slots:
        combined = 0
        for layout, backing in zip(layouts, backings, strict=True):
            combined = slow_splitmix64(combined ^ layout.slow_fold(backing, slot, mode))
        result.append(reference.to_signed64(combined))
    return result


LAYOUTS = {
    "dense-page1": Layout(1, 16, 16, num_rows=12, row_bytes=16, row_stride_bytes=16),
    "holes-gaps-page2": Layout(
        2, 32, 32, num_rows=6, row_bytes=80, row_stride_bytes=96, offset_bytes=16
    ),
    "page16": Layout(16, 16, 16, num_rows=1, row_bytes=256, row_stride_bytes=256),
    "partial-read-page2": Layout(2, 64, 48, num_rows=7, row_bytes=144, row_stride_bytes=160),
    "page4-wide-gap": Layout(
        4, 32, 16, num_rows=3, row_bytes=128, row_stride_bytes=256, offset_bytes=48
    ),
}

SOURCE_COMBINATIONS = [
    ("dense-page1",),
    ("holes-gaps-page2",),
    ("page16",),
    ("partial-read-page2",),
    ("page4-wide-gap", "dense-page1"),
    ("dense-page1", "page4-wide-gap"),
    ("holes-gaps-page2", "page16", "partial-read-page2"),
    ("page16", "dense-page1", "holes-gaps-page2", "page4-wide-gap"),
]


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
@pytest.mark.parametrize(
    "names", SOURCE_COMBINATIONS, ids=["+".join(c) for c in SOURCE_COMBINATIONS]
)
def test_fingerprint_matches_slow_fold(names, mode):
    """fingerprint equals a per-slot Python fold over hand-addressed bytes, for every slot."""
    layouts = [LAYOUTS[name] for name in names]
    built = [layout.build(seed) for seed, layout in enumerate(layouts)]
    sources = [source for source, _ in built]
    backings = [backing for _, backing in built]
    capacity = min(layout.capacity for layout in layouts)
    rng = np.random.default_rng(len(names))
    # Every slot once, in shuffled order, plus repeats.
    slots = np.concatenate([rng.permutation(capacity), rng.integers(0, capacity, 5)])

    result = reference.fingerprint(sources, slots, mode=mode)
    expected = np.array(slow_fingerprint(layouts, backings, slots.tolist(), mode), np.int64)
    np.testing.assert_array_equal(
        result, expected, strict=True, err_msg=f"sources={names}, mode={mode.name}"
    )
    if mode is not RealKvHashMode.NONE:
        # Distinct bytes per slot must give distinct hashes, or the comparison proves little.
        assert len(set(expected[:capacity].tolist())) == capacity


def test_fingerprint_accepts_plain_int_mode_and_list_slots():
    """mode may be 0/1/2 and slot_indices any 1-D integer sequence."""
    source, _ = LAYOUTS["dense-page1"].build(3)
    for mode in MODES:
        np.testing.assert_array_equal(
            reference.fingerprint([source], [1, 2], mode=int(mode)),
            reference.fingerprint([source], np.array([1, 2], dtype=np.int32), mode=mode),
            strict=True,
        )


# ---------------------------------------------------------------------------------------------
# Reading rules: what is and is not read.


class TrapArray(np.ndarray):
    """A uint8 array that fails the test if any byte is indexed."""

    def __getitem__(self, key):
        raise AssertionError("a source byte was read")


def trap_source() -> Source:
    return Source(np.ones((4, 32), dtype=np.uint8).view(TrapArray), 2, 16, 16)


@pytest.mark.parametrize("slots", [[0, 3, 1], [0, 99, -5]], ids=["in-range", "out-of-range"])
def test_mode_none_is_zero_and_reads_nothing(slots):
    """Mode NONE gives int64 zeros, reads no byte and checks no slot."""
    result = reference.fingerprint([trap_source(), trap_source()], slots, mode=RealKvHashMode.NONE)
    np.testing.assert_array_equal(result, np.zeros(3, dtype=np.int64), strict=True)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_no_sources_is_zero(mode):
    """With no sources every slot hashes to 0, whatever the mode."""
    result = reference.fingerprint([], np.array([0, 7, 123]), mode=mode)
    np.testing.assert_array_equal(result, np.zeros(3, dtype=np.int64), strict=True)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_more_than_four_sources_is_rejected_in_every_mode(mode):
    """Five sources raise the CONTRACT §4 ValueError before anything else, even in NONE."""
    sources = [trap_source() for _ in range(5)]
    message = "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"
    with pytest.raises(ValueError) as excinfo:
        reference.fingerprint(sources, [10**6], mode=mode)
    assert str(excinfo.value) == message


@pytest.mark.parametrize("mode", [RealKvHashMode.PARTIAL, RealKvHashMode.ALL])
@pytest.mark.parametrize("bad_slot", [8, 12, -1])
def test_out_of_range_slot_names_slot_source_and_capacity(mode, bad_slot):
    """A slot outside [0, capacity) of any source raises IndexError naming all three."""
    big, _ = LAYOUTS["dense-page1"].build(0)  # capacity 12
    small = Source(np.ones((4, 32), dtype=np.uint8), 2, 16, 16)  # capacity 8
    if bad_slot == 8:
        expected = "kv-canary: slot 8 is out of range for real_kv_sources[1] with capacity 8 slots"
    elif bad_slot == 12:
        expected = (
            "kv-canary: slot 12 is out of range for real_kv_sources[0] with capacity 12 slots"
        )
    else:
        expected = (
            "kv-canary: slot -1 is out of range for real_kv_sources[0] with capacity 12 slots"
        )
    with pytest.raises(IndexError) as excinfo:
        # valid slots on both sides of the bad one, 0 among them: the message must single out
        # the bad slot, whatever the valid ones are
        reference.fingerprint([big, small], [3, 0, bad_slot, 1], mode=mode)
    assert str(excinfo.value) == expected


def test_empty_slot_list():
    """No slots gives an empty int64 array."""
    source, _ = LAYOUTS["page16"].build(0)
    for slots in ([], np.array([], dtype=np.int64)):
        np.testing.assert_array_equal(
            reference.fingerprint([source], slots), np.zeros(0, np.int64), strict=True
        )


def test_bytes_outside_the_window_are_ignored():
    """Changing holes, row gaps, bytes past read_bytes or around the view changes no hash."""
    layout = LAYOUTS["page4-wide-gap"]  # read 16 of 32 per slot, 128-byte rows, 256 stride
    source, backing = layout.build(5)
    slots = np.arange(layout.capacity)
    before = reference.fingerprint([source], slots)
    read_mask = np.zeros(backing.shape[0], dtype=bool)
    for slot in range(layout.capacity):
        row, column = divmod(slot, layout.page_size)
        start = layout.offset_bytes + row * layout.row_stride_bytes + column * 32
        read_mask[start : start + 16] = True
    backing[~read_mask] ^= 0xFF
    np.testing.assert_array_equal(reference.fingerprint([source], slots), before, strict=True)


def test_every_read_byte_changes_its_slot_only():
    """Flipping any one read byte changes that slot's hash and no other slot's."""
    layout = LAYOUTS["holes-gaps-page2"]
    source, backing = layout.build(9)
    slots = np.arange(layout.capacity)
    before = reference.fingerprint([source], slots)
    for slot, byte in itertools.product([0, 5, 11], [0, 7, 8, 31]):
        row, column = divmod(slot, layout.page_size)
        address = layout.offset_bytes + row * layout.row_stride_bytes + column * 32 + byte
        backing[address] ^= 0x5A
        after = reference.fingerprint([source], slots)
        backing[address] ^= 0x5A
        changed = np.flatnonzero(after != before).tolist()
        assert changed == [slot], f"flipping byte {byte} of slot {slot} changed slots {changed}"


def test_partial_reads_16_bytes_and_equals_all_at_read_16():
    """PARTIAL ignores bytes past 16 and equals ALL when read_bytes is 16."""
    source, backing = LAYOUTS["partial-read-page2"].build(2)
    slots = np.arange(LAYOUTS["partial-read-page2"].capacity)
    partial = reference.fingerprint([source], slots, mode=RealKvHashMode.PARTIAL)
    as_read_16 = Source(source.data, source.page_size, source.num_bytes_per_token, 16)
    np.testing.assert_array_equal(
        partial, reference.fingerprint([as_read_16], slots, mode=RealKvHashMode.ALL), strict=True
    )
    assert (partial != reference.fingerprint([source], slots, mode=RealKvHashMode.ALL)).all()


def test_source_order_matters():
    """Swapping two sources changes every hash."""
    first, _ = LAYOUTS["dense-page1"].build(0)
    second, _ = LAYOUTS["page4-wide-gap"].build(1)
    slots = np.arange(12)
    forward = reference.fingerprint([first, second], slots)
    backward = reference.fingerprint([second, first], slots)
    assert (forward != backward).all()


def test_hash_follows_live_memory():
    """The hash reads the view's current bytes, not a snapshot taken at construction."""
    layout = LAYOUTS["dense-page1"]
    source, backing = layout.build(4)
    before = reference.fingerprint([source], [3])
    backing[3 * 16] ^= 0xFF
    assert reference.fingerprint([source], [3])[0] != before[0]


@pytest.mark.parametrize("mode", [RealKvHashMode.PARTIAL, RealKvHashMode.ALL])
def test_bytes_spaced_apart_hash_like_the_same_bytes_packed(mode):
    """A source whose bytes are not adjacent (byte stride 2) hashes like a packed copy of them."""
    rng = np.random.default_rng(3)
    backing = rng.integers(1, 256, size=(3, 256), dtype=np.uint8)
    spaced = backing[:, ::2]  # [3, 128], byte stride 2
    packed = np.ascontiguousarray(spaced)
    slots = [5, 0, 3, 4, 1, 2]
    got = reference.fingerprint([Source(spaced, 2, 64, 48)], slots, mode)
    want = reference.fingerprint([Source(packed, 2, 64, 48)], slots, mode)
    assert as_u64(got) == as_u64(want)
    assert as_u64(want) == [slow_fold_one(packed, 2, 64, 48, slot, mode) for slot in slots]


def slow_fold_one(rows: np.ndarray, page_size, nbpt, read_bytes, slot, mode) -> int:
    """One slot of one source, folded with Python ints from CONTRACT §4's words."""
    row, token = divmod(slot, page_size)
    length = 16 if mode is RealKvHashMode.PARTIAL else read_bytes
    window = bytes(rows[row, token * nbpt : token * nbpt + length])
    acc = 0
    for start in range(0, length, 8):
        acc = reference.splitmix64(acc ^ int.from_bytes(window[start : start + 8], "little"))
    return reference.splitmix64(acc)


_ROWS = np.ones((2, 64), dtype=np.uint8)

# (data, page_size, num_bytes_per_token, read_bytes), the error and the words it must say
_UNFOLDABLE = {
    "int16 data": ((_ROWS.astype(np.int16), 1, 16, 16), TypeError, "numpy uint8 array"),
    "int8 data": ((_ROWS.astype(np.int8), 1, 16, 16), TypeError, "numpy uint8 array"),
    "a list": ((_ROWS.tolist(), 1, 16, 16), TypeError, "numpy uint8 array"),
    "1-D data": ((_ROWS[0], 1, 16, 16), ValueError, "must be 2-D, got shape (64,)"),
    "3-D data": ((_ROWS.reshape(2, 4, 16), 1, 16, 16), ValueError, "shape (2, 4, 16)"),
    "bool page_size": ((_ROWS, True, 16, 16), TypeError, "page_size must be an int"),
    "page_size 0": ((_ROWS, 0, 16, 16), ValueError, "page_size must be >= 1, got 0"),
    "num_bytes_per_token 24": ((_ROWS, 1, 24, 16), ValueError, "multiple of 16, got 24"),
    "num_bytes_per_token 0": ((_ROWS, 1, 0, 16), ValueError, "multiple of 16, got 0"),
    "num_bytes_per_token -16": ((_ROWS, 1, -16, 16), ValueError, "multiple of 16, got -16"),
    "read_bytes 48 > 32": ((_ROWS, 1, 32, 48), ValueError, "<= num_bytes_per_token, got 48"),
    "read_bytes 0": ((_ROWS, 1, 32, 0), ValueError, "<= num_bytes_per_token, got 0"),
    "read_bytes -16": ((_ROWS, 1, 32, -16), ValueError, "<= num_bytes_per_token, got -16"),
    "read_bytes 8": ((_ROWS, 1, 32, 8), ValueError, "<= num_bytes_per_token, got 8"),
    "a 96-byte page in 64-byte rows": (
        (_ROWS, 3, 32, 16),
        ValueError,
        "row is 64 bytes but page_size=3 x num_bytes_per_token=32 needs 96",
    ),
}


@pytest.mark.parametrize("case", _UNFOLDABLE, ids=list(_UNFOLDABLE))
def test_source_rejects_layouts_it_cannot_fold(case):
    """Source refuses data and sizes that would make the fold meaningless, saying which."""
    arguments, error, words = _UNFOLDABLE[case]
    with pytest.raises(error) as excinfo:
        Source(*arguments)
    assert words in str(excinfo.value)


def test_source_takes_numpy_integers_as_ints():
    """Sizes may be numpy integers; the source keeps them as Python ints."""
    row = _ROWS
    source = Source(row, np.int64(2), np.int32(32), np.uint8(16))
    assert (source.page_size, source.num_bytes_per_token, source.read_bytes) == (2, 32, 16)
    assert type(source.page_size) is int
    assert source.capacity == 4


def test_huge_unsigned_slot_is_reported_unwrapped():
    """A uint64 slot above 2**63 is out of range as itself, not as a wrapped negative."""
    source, _ = LAYOUTS["dense-page1"].build(0)
    huge = np.array([2**64 - 1], dtype=np.uint64)
    with pytest.raises(IndexError) as excinfo:
        reference.fingerprint([source], huge)
    assert str(excinfo.value) == (
        f"kv-canary: slot {2**64 - 1} is out of range for real_kv_sources[0] with capacity 12 slots"
    )
    np.testing.assert_array_equal(
        reference.fingerprint([source], huge, mode=RealKvHashMode.NONE),
        np.zeros(1, np.int64),
        strict=True,
    )


@pytest.mark.parametrize("shape", [(), (2, 2)], ids=["0-D", "2-D"])
def test_slot_indices_must_be_one_dimensional(shape):
    """A 0-D or 2-D slot array is a ValueError naming its shape, in every reading mode."""
    source, _ = LAYOUTS["dense-page1"].build(0)
    slots = np.ones(shape, dtype=np.int64)
    for mode in MODES:
        with pytest.raises(ValueError) as excinfo:
            reference.fingerprint([source], slots, mode)
        assert str(excinfo.value) == f"kv-canary: slot_indices must be 1-D, got shape {shape}"


def test_more_rows_than_bytes_per_row():
    """A source with more rows than bytes in a row: every row, the last one included, is read."""
    rows = np.arange(1, 40 * 16 + 1, dtype=np.uint32).astype(np.uint8).reshape(40, 16)
    slots = [39, 0, 17, 38]
    got = reference.fingerprint([Source(rows, 1, 16, 16)], slots)
    assert as_u64(got) == [
        slow_fold_one(rows, 1, 16, 16, slot, RealKvHashMode.ALL) for slot in slots
    ]


@pytest.mark.parametrize(
    "view",
    [lambda b: b[:, ::-1], lambda b: np.broadcast_to(b[:, :1], b.shape), lambda b: b[::-1, ::-1]],
    ids=["byte stride -1", "byte stride 0", "both strides negative"],
)
def test_any_byte_stride_hashes_like_a_packed_copy(view):
    """Bytes reached through a negative or zero byte stride hash like a packed copy of them."""
    rng = np.random.default_rng(11)
    backing = rng.integers(1, 256, size=(3, 128), dtype=np.uint8)
    data = view(backing)
    packed = np.ascontiguousarray(data)
    slots = [5, 0, 3, 1]
    for mode in (RealKvHashMode.PARTIAL, RealKvHashMode.ALL):
        got = reference.fingerprint([Source(data, 2, 64, 48)], slots, mode)
        assert as_u64(got) == [slow_fold_one(packed, 2, 64, 48, slot, mode) for slot in slots]
